/*
 * executor_load.c -- which roles' work occupies the executors (executor_load.h).
 *
 * Each slot's owner and start time are written by its executor alone, without a lock: a reader
 * may see an owner with the start of the attempt before, or the other way round, for one pass.
 * Both only steer which steps are claimed first and when an extra executor starts; no step's
 * state depends on them.
 */
#include "base/compat.h"

#include "utils/timestamp.h"

#include "ipc/executor_load.h"
#include "ipc/worker_shmem.h"

void
ds_attempt_began(Oid owner)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared == NULL || ds_executor_slot < 0 || ds_executor_slot >= DS_MAX_WORKERS)
		return;

	/*
	 * One owner's attempts in a row are one stretch of work: steps just under
	 * the threshold, one after another in a batch, hold the executor as long
	 * as one slow step.
	 */
	if (pg_atomic_read_u32(&shared->executor[ds_executor_slot].attempt_owner) == owner)
		return;
	pg_atomic_write_u64(&shared->executor[ds_executor_slot].attempt_since, (uint64) GetCurrentTimestamp());
	pg_atomic_write_u32(&shared->executor[ds_executor_slot].attempt_owner, owner);
}

void
ds_attempt_ended(void)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared == NULL || ds_executor_slot < 0 || ds_executor_slot >= DS_MAX_WORKERS)
		return;
	pg_atomic_write_u32(&shared->executor[ds_executor_slot].attempt_owner, InvalidOid);
	pg_atomic_write_u64(&shared->executor[ds_executor_slot].attempt_since, 0);
}

int
ds_busy_owners(Oid dbid, int except_slot, Oid *out)
{
	WorkerShared *shared = ds_worker_shared();
	TimestampTz now = GetCurrentTimestamp();
	int			n = 0;

	if (shared == NULL)
		return 0;
	for (int slot = 0; slot < DS_MAX_WORKERS; slot++)
	{
		Oid			owner;
		bool		seen = false;

		if (slot == except_slot ||
			!OidIsValid(owner = ds_slot_busy_owner(shared, slot, dbid, now)))
			continue;
		for (int i = 0; i < n && !seen; i++)
			seen = out[i] == owner;
		if (!seen)
			out[n++] = owner;
	}
	return n;
}

bool
ds_executors_all_busy(Oid dbid, int except_slot)
{
	WorkerShared *shared = ds_worker_shared();
	TimestampTz now = GetCurrentTimestamp();
	int			running = 0;

	if (shared == NULL)
		return false;
	for (int slot = 0; slot < DS_MAX_WORKERS; slot++)
	{
		if (slot == except_slot || pg_atomic_read_u32(&shared->executor[slot].pid) == 0 ||
			pg_atomic_read_u32(&shared->executor[slot].db) != dbid)
			continue;
		if (!OidIsValid(ds_slot_busy_owner(shared, slot, dbid, now)))
			return false;
		running++;
	}
	return running > 0;
}
