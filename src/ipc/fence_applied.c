/*
 * fence_applied.c -- which worker processes have taken the partitions of this server's settings
 * (fence_applied.h).
 */
#include "base/compat.h"

#include "miscadmin.h"

#include "base/partition.h"
#include "ipc/fence_applied.h"
#include "ipc/worker_shmem.h"

void
ds_fence_note_applied(void)
{
	WorkerShared *shared = ds_worker_shared();
	uint64		key = ds_partition_settings_key();

	if (shared == NULL)
		return;
	if (ds_executor_slot >= 0 && ds_executor_slot < DS_MAX_WORKERS)
		pg_atomic_write_u64(&shared->executor[ds_executor_slot].partitions_applied, key);
	if (ds_http_slot >= 0 && ds_http_slot < DS_MAX_HTTP_WORKERS)
		pg_atomic_write_u64(&shared->http[ds_http_slot].partitions_applied, key);
}

/* Count (and note, within `max`) the process of a slot of `dbid` that has not taken `key`. */
static void
note_if_behind(uint32 pid, uint32 db, uint64 applied, Oid dbid, uint64 key,
			   int *pids, int max, int *n)
{
	if (pid == 0 || db != dbid || applied == key)
		return;
	if (*n < max)
		pids[*n] = (int) pid;
	(*n)++;
}

int
ds_fence_workers_behind(Oid dbid, uint64 key, int *pids, int max)
{
	WorkerShared *shared = ds_worker_shared();
	int			n = 0;

	if (shared == NULL)
		return 0;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
		note_if_behind(pg_atomic_read_u32(&shared->executor[i].pid),
					   pg_atomic_read_u32(&shared->executor[i].db),
					   pg_atomic_read_u64(&shared->executor[i].partitions_applied),
					   dbid, key, pids, max, &n);
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
		note_if_behind(pg_atomic_read_u32(&shared->http[i].pid),
					   pg_atomic_read_u32(&shared->http[i].db),
					   pg_atomic_read_u64(&shared->http[i].partitions_applied),
					   dbid, key, pids, max, &n);
	return n;
}
