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

#endif							/* DS_RUNS_H */
