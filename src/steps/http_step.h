/*
 * http_step.h -- ds_http_step and ds_resolve_step (http_step.c), and the store of a map's HTTP
 * items that ds_start_map shares with them.
 */
#ifndef DS_HTTP_STEP_H
#define DS_HTTP_STEP_H

#include "base/compat.h"
#include "utils/jsonb.h"

/* A map's HTTP items carry their idempotency key in this header, and time out as ds_http's. */
#define DS_MAP_HTTP_IDEMPOTENCY_HEADER "Idempotency-Key"
#define DS_MAP_HTTP_TIMEOUT_USECS ((int64) 30 * USECS_PER_SEC)

/*
 * Store item `step_id` of map `map_step` of run `run_id` as ds_http_step(run_id, step_id,
 * request, policy, timeout => timeout) would -- every check of its request, the run's policy
 * under the item's, the idempotency key in Idempotency-Key -- its attempts admitted by limit
 * `limit_name` when not NULL. An item stored before is left as it is (a conflicting one raises
 * DS422, another role's 42501). The caller checked the role (ds_http_step_check_role) and made
 * the map's row in this transaction: no identity lock is taken.
 */
extern void ds_store_map_http_item(const char *run_id, const char *step_id, Jsonb *request,
								   Jsonb *policy, int64 timeout, const char *map_step,
								   const char *limit_name);

#endif							/* DS_HTTP_STEP_H */
