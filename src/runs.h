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

/*
 * The queue of the run's step `step_id` ('default' for a new one) when it is paused
 * (ds_set_queue(name, 0)), else NULL: a turn then leaves the step's attempt for later.
 */
extern char *ds_run_step_paused_queue(const char *run_id, const char *step_id);

/* The reason a run waits for its step's paused queue `queue`, which ds_set_queue wakes. */
#define DS_RUN_QUEUE_PAUSED_REASON "queue %s is paused"

/* Wake the runs waiting for queue `queue` to be opened again (ds_set_queue), at commit. */
extern void ds_run_wake_for_queue(const char *queue);

#endif							/* DS_RUNS_H */
