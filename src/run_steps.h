/*
 * run_steps.h -- what a workflow calls on its run (README, "Runs").
 */
#ifndef DS_RUN_STEPS_H
#define DS_RUN_STEPS_H

#include "compat.h"

#include "run_context.h"

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
												  const char *status, const char *error_class,
												  const char *code, const char *message);

#endif							/* DS_RUN_STEPS_H */
