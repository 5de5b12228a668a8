/*
 * task_step.h -- ds_task_step (task_step.c), and the store of a map's task items that
 * ds_start_map shares with it.
 */
#ifndef DS_TASK_STEP_H
#define DS_TASK_STEP_H

#include "base/compat.h"
#include "utils/jsonb.h"

/*
 * Store item `step_id` of map `map_step` of run `run_id` as ds_task_step(run_id, step_id, task,
 * input, policy, timeout => timeout) would -- the run's policy under the item's, queue
 * 'default' -- its attempts admitted by limit `limit_name` when not NULL. An item stored before
 * is left as it is (a conflicting one raises DS422, another role's 42501). The caller checked
 * the arguments and made the map's row in this transaction: no identity lock is taken.
 */
extern void ds_store_map_task_item(const char *run_id, const char *step_id, const char *task,
								   Jsonb *input, Jsonb *policy, int64 timeout,
								   const char *map_step, const char *limit_name);

#endif							/* DS_TASK_STEP_H */
