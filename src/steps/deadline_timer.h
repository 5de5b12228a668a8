/*
 * deadline_timer.h -- the deadline of a role's code that runs in a step's name: a step body
 * (step_exec.c) or an outcome hook (step_hooks.c), cancelled the way statement_timeout cancels a
 * statement (deadline_timer.c).
 *
 * At the deadline the timer cancels the code (QueryCancelPending), and again every
 * CANCEL_REPEAT_MS while the code catches the cancel and goes on. In the worker, past a grace
 * period after the deadline it ends the process, since a FATAL is the one thing the code cannot
 * catch (docs/security.md: no role holds an executor without bound).
 *
 * A timer's handler runs in signal context and takes no argument: each timer has a handler of
 * its own, defined beside it, that calls ds_deadline_timer_fire() on it:
 *
 *		static void body_deadline_passed(void);
 *		static DeadlineTimer body_deadline = DEADLINE_TIMER_INIT(body_deadline_passed);
 *
 *		static void
 *		body_deadline_passed(void)
 *		{
 *			ds_deadline_timer_fire(&body_deadline);
 *		}
 */
#ifndef DS_DEADLINE_TIMER_H
#define DS_DEADLINE_TIMER_H

#include "base/compat.h"

#include <signal.h>

#include "datatype/timestamp.h"
#include "utils/timeout.h"

typedef struct DeadlineTimer
{
	TimeoutId	id;				/* registered on first use; MAX_TIMEOUTS
								 * before */
	timeout_handler_proc handler;	/* calls ds_deadline_timer_fire() on this
									 * timer */

	/*
	 * The deadline passed and the timer cancelled the code: a query_canceled
	 * error is the timer's. The user clears it.
	 */
	volatile sig_atomic_t fired;

	/*
	 * The deadline the grace period counts from: a firing past it by the
	 * grace ends the process. 0: the timer never ends the process.
	 */
	volatile TimestampTz end_process_after;
	volatile sig_atomic_t ended_process;	/* it did so: the process is
											 * ending */
} DeadlineTimer;

#define DEADLINE_TIMER_INIT(handler) {MAX_TIMEOUTS, (handler), false, 0, false}

/* Cancel the code at `deadline`, and every CANCEL_REPEAT_MS after it; 0 disarms. */
extern void ds_deadline_timer_arm(DeadlineTimer *timer, TimestampTz deadline);

/* The timer's handler (signal context): cancel the code, and past the grace end the process. */
extern void ds_deadline_timer_fire(DeadlineTimer *timer);

#endif							/* DS_DEADLINE_TIMER_H */
