/*
 * step_probe.h -- reading a step's state straight through its primary key.
 */
#ifndef DS_STEP_PROBE_H
#define DS_STEP_PROBE_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/snapshot.h"

#include "store/step_store.h"

/*
 * Read what an answer needs (status, fingerprint, owner, result, attempt counters, next attempt
 * time, error, remediation, kind) of step (run_id, step_id) as `snapshot` sees it; the
 * definition columns (sql, input, policy, ...) are left NULL. Returns false when there is no
 * such row. With `settled` not NULL, *settled tells whether the row version was committed by
 * another transaction and nobody deletes or updates it, as its header tells now (the replay
 * cache's test: see replay_cache.c).
 */
extern bool ds_probe_step(const char *run_id, const char *step_id, Snapshot snapshot,
						  StepRecord *out, bool *settled);

/*
 * ds_store_lock_step without its statement: every column of step (run_id, step_id), the latest
 * version, locked FOR UPDATE to the end of the transaction. The caller holds the step's identity
 * lock (step_lock.c). Returns false when there is no such row.
 */
extern bool ds_lock_step_row(const char *run_id, const char *step_id, StepRecord *out);

/*
 * The default policy of run `run_id` as `snapshot` sees it, or NULL when there is no such run or
 * it sets none; its owner in *owner (InvalidOid when there is no such run).
 */
extern Jsonb *ds_probe_run_policy(const char *run_id, Snapshot snapshot, Oid *owner);

#endif							/* DS_STEP_PROBE_H */
