/*
 * runs.h -- starting and steering runs (README, "Runs").
 */
#ifndef DS_RUNS_H
#define DS_RUNS_H

#include "compat.h"

/*
 * A step of run `run_id` was re-armed (ds_retry_step): a run that waits for it, or is blocked
 * on it, takes its next turn now.
 */
extern void ds_run_wake_for_step(const char *run_id);

/*
 * HTTP step `step_id` of run `run_id` has an outcome the run must see (it succeeded, failed,
 * or waits for a person): a run waiting for it takes its next turn now. A turn of that run in
 * flight is waited for (its row lock), so that a turn that read the step before this outcome
 * committed is woken once it has recorded its wait.
 */
extern void ds_run_wake_for_http_step(const char *run_id, const char *step_id);

#endif							/* DS_RUNS_H */
