/*
 * deadline_timer.c -- the deadline of a step body or an outcome hook (deadline_timer.h): one
 * copy of the cancel at the deadline, the cancel repeated every second, and the end of the
 * process past the grace period, which the step bodies and the hooks share.
 */
#include "base/compat.h"

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

#include "steps/deadline_timer.h"

/* How long code may go on ignoring its cancellation before the process ends. */
#define SWALLOWED_CANCEL_GRACE_USECS (5 * USECS_PER_SEC)
/* How often a deadline that has passed cancels the code again. */
#define CANCEL_REPEAT_MS 1000

void
ds_deadline_timer_arm(DeadlineTimer *timer, TimestampTz deadline)
{
	if (timer->id == MAX_TIMEOUTS)
		timer->id = RegisterTimeout(USER_TIMEOUT, timer->handler);
	if (deadline != 0)
		enable_timeout_every(timer->id, deadline, CANCEL_REPEAT_MS);
	else if (get_timeout_active(timer->id))
		disable_timeout(timer->id, false);
}

void
ds_deadline_timer_fire(DeadlineTimer *timer)
{
	timer->fired = true;
	if (timer->end_process_after != 0 &&
		GetCurrentTimestamp() >= timer->end_process_after + SWALLOWED_CANCEL_GRACE_USECS)
	{
		/*
		 * the code caught every cancel: a FATAL is the one thing it cannot
		 * catch
		 */
		timer->ended_process = true;
		ProcDiePending = true;
	}
	QueryCancelPending = true;
	InterruptPending = true;
	SetLatch(MyLatch);
}
