/*
 * step_attempt.h -- run the next attempt of a step and record what it did.
 */
#ifndef DS_STEP_ATTEMPT_H
#define DS_STEP_ATTEMPT_H

#include "compat.h"

#include "step_store.h"

/* From _PG_init: durable_steps.log_outcomes_level. */
extern void ds_step_attempt_init_module(void);

/*
 * Run the next attempt of the step in `rec`, apply its outcome to `rec` and persist both the step
 * (inserted when is_new, else updated) and the attempt, all in the current transaction. The
 * caller holds the step's lock. A synchronous caller runs the body as itself under its own
 * search_path and counts the attempt here; the worker has already committed the attempt as
 * started (rec->attempts is its number) and runs the body as the step's owner under the
 * search_path the step was created with.
 */
extern void ds_run_next_attempt(StepRecord *rec, bool is_new, bool by_worker);

/*
 * The state rules of README, "Outcome classes", for attempt `attempt`: status, result, error,
 * next attempt time; then the step's outcome hook (step_hooks.c, which may block the step), the
 * worker's log line and the NOTIFY of a step that stopped. The caller writes the record.
 */
extern void ds_apply_attempt_outcome(StepRecord *rec, int attempt, const AttemptOutcome *outcome);

/*
 * The worker's attempt `rec->attempts` ended without running its body (its executor was lost, or
 * its role no longer exists): record it as failed with this SQLSTATE and apply the rules.
 */
extern void ds_fail_started_attempt(StepRecord *rec, int sqlerrcode, const char *message,
								 const char *detail);

/* Parse a stored step's retry_on / fail_on / on_timeout into classifier overrides. */
extern void ds_overrides_from_record(const StepRecord *rec, ClassOverrides *out);

/*
 * A running step whose executor is gone (its lock was free): record its attempt as lost (DS007,
 * invocation_lost, retryable by the policy), as the worker's recovery does.
 */
extern void ds_record_lost_attempt(StepRecord *rec);

/*
 * NOTIFY the step's channel, if it has one, that it stopped: {"run_id", "step_id", "status",
 * "attempt"}, sent when the current transaction commits.
 */
extern void ds_notify_step_stopped(const StepRecord *rec);
/*
 * Cancel a step that is not running (its lock held by this transaction): no attempt will run.
 * Written and its channel NOTIFYed; the error fields are left as they are.
 */
extern void ds_cancel_waiting_step(StepRecord *rec);

#endif							/* DS_STEP_ATTEMPT_H */
