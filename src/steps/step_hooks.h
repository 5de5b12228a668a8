/*
 * step_hooks.h -- outcome hooks: a step's on_success / on_failure SQL, run as its owner in the
 * transaction that records the outcome (docs/steps.md, "Outcome hooks").
 */
#ifndef DS_STEP_HOOKS_H
#define DS_STEP_HOOKS_H

#include "base/compat.h"
#include "utils/elog.h"
#include "utils/jsonb.h"

#include "ipc/executor_slot.h"
#include "store/step_store.h"

/* One hook to run: whose it is, what it runs and what it is given. */
typedef struct OutcomeHook
{
	const char *run_id;
	const char *step_id;
	const char *name;			/* "on_success" or "on_failure", for messages */
	const char *sql;			/* one statement; $1 is `arg` */
	Oid			owner;			/* runs as this role, security-restricted */
	const char *search_path;	/* the step's, as it was created (NULL: none);
								 * pg_temp last */
	int64		timeout;		/* the step's own timeout, microseconds; 0 =
								 * none */
	int			attempt;		/* for ds_attempt_number() inside the hook */
	int			max_attempts;
	Jsonb	   *arg;			/* bound to $1 */
} OutcomeHook;

/*
 * Run the hook in a subtransaction of the current transaction, as its owner: in the worker with
 * the isolation of an attempt body (step_isolation.c), in a caller's session as a
 * security-restricted operation of the owner. True when it succeeded (its writes are part of
 * the transaction); false when it failed: its writes are rolled back and *error (allocated in
 * the caller's memory context) says why. A cancel of the caller's own statement propagates.
 */
extern bool ds_run_outcome_hook(const OutcomeHook *hook, ErrorData **error);

/*
 * The $1 of a step's hooks: {"run_id", "step_id", "status", "attempt", "result", "error_class",
 * "error_code", "error_message", "error_detail"}, from the step's recorded outcome.
 */
extern Jsonb *ds_outcome_hook_arg(const StepRecord *rec);

/*
 * The step in `rec` has just reached an outcome (not yet written): run its on_success hook if it
 * succeeded, its on_failure hook if it failed. A failing hook makes the step blocked with the
 * hook's error (the result of a success is kept). Any kind of step (SQL or HTTP) calls this.
 */
extern void ds_run_step_outcome_hooks(StepRecord *rec);

/*
 * Instead of running it: the hook of the step's status was taken by a process that ended before
 * it finished; the step is blocked by it (DS007), as by a hook that failed.
 */
extern void ds_block_step_by_lost_hook(StepRecord *rec);

/* Make `rec` blocked by its hook `name`, which failed with `error`. */
extern void ds_block_step_by_hook(StepRecord *rec, const char *name, const ErrorData *error);

/*
 * Is `rec` a step blocked by its on_success hook: its body succeeded (the result is kept), and
 * only the hook is left to do? ds_retry_step() runs the hook again instead of the step.
 */
static inline bool
ds_step_blocked_by_success_hook(const StepRecord *rec)
{
	return rec->status == STEP_BLOCKED && rec->result != NULL;
}

/*
 * Check a hook argument at call time: NULL, or one SQL statement that parses. Malformed SQL is
 * SQLSTATE 42601, an empty one 22023.
 */
extern void ds_check_hook_sql(const char *name, const char *sql);

/*
 * In an executor: EXECUTOR_END_SUCCESS_HOOK or EXECUTOR_END_FAILURE_HOOK when the hook running
 * now ignored its cancellation, so that the executor is ending; else EXECUTOR_END_OTHER.
 */
extern ExecutorEndCause ds_hook_end_cause(void);

#endif							/* DS_STEP_HOOKS_H */
