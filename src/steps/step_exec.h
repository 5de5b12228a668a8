/*
 * step_exec.h -- running one attempt of a SQL step body in its own subtransaction.
 */
#ifndef DS_STEP_EXEC_H
#define DS_STEP_EXEC_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "base/classify.h"
#include "base/attempt_outcome.h"

/* What an attempt needs to know about the step it runs. */
typedef struct StepBody
{
	const char *run_id;
	const char *step_id;
	const char *sql;
	Jsonb	   *input;			/* bound to $1; NULL binds SQL NULL */
	int64		timeout;		/* microseconds; 0 = none */

	/*
	 * The worker's attempts: the step's owner, whom the body runs as in
	 * isolation (see step_isolation.c), and under
	 * durable_steps.max_worker_attempt_time. InvalidOid: a caller's attempt,
	 * run as the caller in the caller's session.
	 */
	Oid			isolate_as;
	uint64		cancel_key;		/* worker: this attempt's key for
								 * ds_cancel_step(); 0 = none */
	const char *search_path;	/* search_path to run under; NULL = the
								 * current one */
	const ClassOverrides *overrides;
	bool		expect_row;		/* a body that returns no row fails (DS008,
								 * correctable) */
} StepBody;

extern void ds_step_exec_init_module(void);

/*
 * Around a batch of worker attempts: look every 100 ms for a ds_cancel_step() request of the
 * attempt running (one timer for the batch; each attempt only names its key).
 */
extern void ds_poll_cancel_requests(bool on);

/* In an executor: the attempt running now ignored its cancellation, so the executor is ending. */
extern bool ds_worker_body_ignored_cancel(void);

/* Longest error message, detail or hint an attempt records, in bytes. */
#define DS_MAX_ERROR_TEXT 8192

/* durable_steps.max_result_size: the largest result a step may record, in bytes. */
extern int	ds_max_result_size(void);

/*
 * Run attempt `attempt` of the body. Errors of the body are caught, rolled back with its
 * subtransaction and classified into the outcome; only a cancel that is not the step's own
 * timeout (the caller's statement_timeout, pg_cancel_backend) propagates.
 */
extern void ds_execute_step_attempt(const StepBody *body, int attempt, int max_attempts,
									AttemptOutcome *outcome);


#endif							/* DS_STEP_EXEC_H */
