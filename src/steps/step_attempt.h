/*
 * step_attempt.h -- run the next attempt of a step and record what it did.
 */
#ifndef DS_STEP_ATTEMPT_H
#define DS_STEP_ATTEMPT_H

#include "base/compat.h"

#include "store/step_store.h"

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
 * The state rules of docs/steps.md, "Outcome classes", for attempt `attempt`: status, result, error,
 * next attempt time; then the step's outcome hook (step_hooks.c, which may block the step), the
 * worker's log line and the NOTIFY of a step that stopped. The caller writes the record.
 */
extern void ds_apply_attempt_outcome(StepRecord *rec, int attempt, const AttemptOutcome *outcome);

/*
 * Would recording this outcome run an outcome hook (the step succeeds with on_success, or
 * fails for good with on_failure)?
 */
extern bool ds_outcome_runs_hook(const StepRecord *rec, int attempt, const AttemptOutcome *outcome);

/*
 * In the HTTP worker, for an outcome that runs a hook: keep it on the step, which stays running,
 * for an executor to record with the hook (ds_record_kept_outcome); no user code runs in the
 * process that holds other roles' requests in flight.
 */
extern void ds_keep_outcome_for_executor(StepRecord *rec, TimestampTz claimed_at,
										 const AttemptOutcome *outcome);

/*
 * Record the outcome kept on `rec` (its lock and row lock held), running its hook -- or, with
 * `hook_lost`, blocking the step as a failed hook does: the process that ran it ended first.
 */
extern void ds_record_kept_outcome(StepRecord *rec, bool hook_lost);

/*
 * The worker's attempt `rec->attempts` ended without running its body (its executor was lost, or
 * its role no longer exists): record it as failed with this SQLSTATE and apply the rules.
 */
extern void ds_fail_started_attempt(StepRecord *rec, int sqlerrcode, const char *message,
									const char *detail);

/*
 * Before a run's turn runs the next attempt of `rec` (its lock held; inserted first when is_new):
 * record the `n` attempts that lost or interrupted turns may have run of it, whose records rolled
 * back with them, each failed with its SQLSTATE in `codes` (DS007 lost, 57014 interrupted) and
 * the rules applied, as the worker records a lost attempt of a plain step. The step then waits
 * for its backoff, or has failed for good: the turn runs no attempt now.
 */
extern void ds_record_unrecorded_attempts(StepRecord *rec, bool is_new, int n, const int *codes);

/* Parse a stored step's retry_on / fail_on / on_timeout into classifier overrides. */
extern void ds_overrides_from_record(const StepRecord *rec, ClassOverrides *out);

/*
 * A running step whose executor is gone (its lock was free): record its attempt as lost (DS007,
 * invocation_lost, retryable by the policy), as the worker's recovery does -- unless the
 * executor is known to have ended before it started the attempt (executor_slot.h): the
 * attempt is then given back, the step waiting again as it was. A step whose HTTP outcome is
 * kept for an executor is not lost: DS409, for the executor records it.
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
