/*
 * unstarted_claims.c -- which of a gone executor's claims never started (unstarted_claims.h).
 *
 * The record of an ended executor lives in its slot of the shared state until that slot's next
 * executor ends: the next executor records its predecessor's lost claims as soon as it starts
 * (executor.c looks for lost attempts first), so a record is read before it is written again. It
 * is written without a lock by one process and read by others: the pid is cleared while the
 * rest is written and set last, and a reader that sees it change meanwhile knows nothing.
 */
#include "base/compat.h"

#include "miscadmin.h"
#include "port/atomics.h"

#include "ipc/unstarted_claims.h"
#include "ipc/worker_shmem.h"

/* the attempts this executor started in its open transaction */
static uint64 started[DS_STARTED_CLAIMS_MAX];
static int	n_started = 0;

void
ds_claim_starting(uint64 key)
{
	Assert(n_started < DS_STARTED_CLAIMS_MAX);
	if (n_started < DS_STARTED_CLAIMS_MAX)
		started[n_started++] = key;
}

bool
ds_claim_start_room(void)
{
	return n_started < DS_STARTED_CLAIMS_MAX;
}

void
ds_claims_settled(void)
{
	n_started = 0;
}

void
ds_publish_started_claims(ExecutorEndCause cause)
{
	WorkerShared *shared = ds_worker_shared();
	EndedExecutor *e;

	if (shared == NULL || ds_executor_slot < 0 || ds_executor_slot >= DS_MAX_WORKERS)
		return;
	e = &shared->executor[ds_executor_slot].ended;
	pg_atomic_write_u32(&e->pid, 0);
	pg_write_barrier();
	e->started_at = MyStartTimestamp;
	e->ended_at = GetCurrentTimestamp();
	e->end_cause = n_started > 0 ? (int) cause : (int) EXECUTOR_END_OTHER;
	e->n_started = n_started;
	memcpy(e->started, started, sizeof(uint64) * n_started);
	pg_write_barrier();
	pg_atomic_write_u32(&e->pid, (uint32) MyProcPid);
}

/*
 * The fate of a claim an executor started, by why it ended: the last one started is the one
 * whose code ended it, if any did; the others of its transaction rolled back for its sake.
 */
static ClaimFate
claim_fate_of_end(int cause, bool last)
{
	switch ((ExecutorEndCause) cause)
	{
		case EXECUTOR_END_BODY:
			return last ? CLAIM_IGNORED_CANCEL : CLAIM_ROLLED_BACK_BY_ANOTHER;
		case EXECUTOR_END_SUCCESS_HOOK:
			return last ? CLAIM_SUCCESS_HOOK_IGNORED_CANCEL : CLAIM_ROLLED_BACK_BY_ANOTHER;
		case EXECUTOR_END_FAILURE_HOOK:
			return last ? CLAIM_FAILURE_HOOK_IGNORED_CANCEL : CLAIM_ROLLED_BACK_BY_ANOTHER;
		case EXECUTOR_END_OTHER:
			break;
	}
	return CLAIM_STARTED;
}

ClaimFate
ds_lost_claim_fate(int pid, TimestampTz claimed_at, uint64 key)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared == NULL || pid <= 0)
		return CLAIM_FATE_UNKNOWN;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		EndedExecutor *e = &shared->executor[i].ended;
		ClaimFate	fate = CLAIM_NEVER_STARTED;
		int			n;

		if (pg_atomic_read_u32(&e->pid) != (uint32) pid)
			continue;
		pg_read_barrier();
		if (claimed_at < e->started_at || claimed_at > e->ended_at)
			continue;			/* another process that had the same pid */
		n = Min(e->n_started, DS_STARTED_CLAIMS_MAX);
		for (int k = 0; k < n; k++)
			if (e->started[k] == key)
				fate = claim_fate_of_end(e->end_cause, k == n - 1);
		pg_read_barrier();
		if (pg_atomic_read_u32(&e->pid) != (uint32) pid)
			return CLAIM_FATE_UNKNOWN;	/* written again meanwhile */
		return fate;
	}
	return CLAIM_FATE_UNKNOWN;
}
