/*
 * run_step.h -- ds_run_step, ds_retry_step, ds_cancel_step (run_step.c), and the store of a
 * map's items that ds_start_map shares with them.
 */
#ifndef DS_RUN_STEP_H
#define DS_RUN_STEP_H

#include "base/compat.h"
#include "utils/jsonb.h"

/*
 * Store item `step_id` of map `map_step` of run `run_id` as ds_run_step(run_id, step_id, sql,
 * input, policy, timeout, defer => true) would -- the same checks, the run's policy under the
 * item's -- its attempts admitted by limit `limit_name` when not NULL (the map's concurrency,
 * docs/runs.md). An item stored before is left as it is (a conflicting one raises DS422, another
 * role's 42501). The caller checked the arguments, and made the map's row in this transaction:
 * no identity lock is taken.
 */
extern void ds_store_map_item(const char *run_id, const char *step_id, const char *sql,
							  Jsonb *input, Jsonb *policy, int64 timeout, const char *map_step,
							  const char *limit_name);

#endif							/* DS_RUN_STEP_H */
