/*
 * workflow_calls.h -- what a workflow calls on its run (docs/runs.md).
 */
#ifndef DS_WORKFLOW_CALLS_H
#define DS_WORKFLOW_CALLS_H

#include "base/compat.h"

#include "steps/run_context.h"
#include "store/step_store.h"

/*
 * After a turn that ended to begin or end a wait (sleep, event), in the turn's transaction:
 * write that wait's step as `work` describes it.
 */
extern void ds_turn_record_wait(const char *run_id, TurnSuspension *work);

/*
 * The step-failed error (DS102), thrown into the workflow at the call of step `step_id`, which
 * ended `status` (failed, cancelled) with that error.
 */
pg_noreturn extern void ds_turn_throw_step_failed(const char *run_id, const char *step_id,
												  StepStatus status, const char *error_class,
												  const char *code, const char *message);

#endif							/* DS_WORKFLOW_CALLS_H */
