/*
 * partition_holds.c -- whether an attempt of a fenced partition is still in flight, for
 * ds_partition_export (docs/partitions.md, "Moving a partition").
 *
 * An export must read a partition that nothing changes any more: no attempt or turn still in
 * flight whose outcome would be recorded here after the rows left for another server, where the
 * step would then run again. A worker's attempt and a run's turn hold their identity's lock from
 * the claim's commit to the outcome's commit (step_lock.c), so the export tries each running
 * identity's lock: free, nothing runs it (its executor is gone, and the new owner records the
 * attempt as lost), and nothing can start it again, the partition being fenced; held, it is still
 * running, and the export refuses rather than copy a state that is about to change. The lock is
 * let go of at once: a partition may have many running steps, and the lock table is the server's.
 * Before that, every worker process of the database must have taken the fence
 * (ipc/executor_slot.h): one that has not may still claim a step of the partition.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/partition.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"
#include "store/step_lock.h"

PG_FUNCTION_INFO_V1(ds_partition_step_idle);
PG_FUNCTION_INFO_V1(ds_partition_workers_behind);

/*
 * durable_steps.ds_partition_step_idle(run_id, step_id) -> boolean: false while an attempt of the
 * step (step_id '': a turn of the run) holds its lock.
 */
Datum
ds_partition_step_idle(PG_FUNCTION_ARGS)
{
	char	   *run_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *step_id = text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_BOOL(ds_step_lock_is_free(run_id, step_id));
}

/*
 * durable_steps.ds_partition_workers_behind() -> integer[]: the worker processes of this
 * database that serve other partitions than this session's settings say (they have not taken
 * the reload yet); empty when all have.
 */
Datum
ds_partition_workers_behind(PG_FUNCTION_ARGS)
{
	int			pids[DS_MAX_WORKERS + DS_MAX_HTTP_WORKERS];
	Datum		elems[DS_MAX_WORKERS + DS_MAX_HTTP_WORKERS];
	int			n = ds_fence_workers_behind(MyDatabaseId, ds_partition_settings_key(), pids,
											lengthof(pids));

	n = Min(n, (int) lengthof(pids));
	for (int i = 0; i < n; i++)
		elems[i] = Int32GetDatum(pids[i]);
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, n, INT4OID, sizeof(int32), true, TYPALIGN_INT));
}
