/*
 * executor_slot.c -- what an executor says in its slot of the workers' shared memory, and what
 * the others read there (executor_slot.h).
 *
 * Claim sizes.
 *
 * A claim costs about the same whether it takes 10 steps or 1,000: its statements, its commit,
 * the transaction its attempts share. Fast steps drain fastest in large claims (measured: no-op
 * steps about 1.5 times as fast at 1,000 as at 100, README "Benchmarks"). Large claims have two
 * costs, and the size is bounded by both:
 *
 *   - every claimed step holds its step lock (step_lock.c) until its outcome commits, and the
 *     locks come from the server's one lock table, shared by every backend of every database:
 *     the executors of the whole server keep to a quarter of it, shared equally among those
 *     running;
 *   - steps claimed by one executor wait for it even while another executor is idle, and show
 *     as running: a claim takes about CLAIM_BUDGET_MS of work at the pace of the executor's
 *     recent claims, so slow steps are claimed a few at a time and spread over the executors,
 *     and fast ones a thousand at a time.
 *
 * The pace is the queue's, as this executor last saw it within PACE_MEMORY_MS. A claim whose pace
 * is not known -- a queue's first, or its first after a pause -- takes the caller's first size
 * (executor_slot.h): one step, so that a burst of slow steps is spread over the executors at once
 * (three 20-second steps on two executors end by +40 s, not +60 s), and a backlog of fast ones
 * reaches full-size claims with its second claim. A pace learnt on fast steps still sizes the
 * claim that meets the first of a run of slow steps in the same queue without a pause in
 * between: keep steps of very different durations in different queues (docs/queues.md).
 */
#include "base/compat.h"

#include "access/twophase.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "base/partition.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"

/* Work one claim should hold, at the recent pace. */
#define CLAIM_BUDGET_MS 100
/* Share of the server's lock table all executors' claims may hold together: 1/LOCK_TABLE_PART. */
#define LOCK_TABLE_PART 4
/* How long a queue's pace is remembered after its last claim. */
#define PACE_MEMORY_MS 10000
/* Weight of the latest claim in the moving average of the pace. */
#define PACE_WEIGHT 0.5

int
ds_claim_lock_share(void)
{
	WorkerShared *shared = ds_worker_shared();

	/* the lock table's size, as lock.c computes it */
	int64		lock_table = (int64) max_locks_per_xact * (MaxBackends + max_prepared_xacts);
	int			running = 0;

	if (shared != NULL)
		for (int i = 0; i < DS_MAX_WORKERS; i++)
			if (pg_atomic_read_u32(&shared->executor[i].pid) != 0)
				running++;
	return (int) Max(1, lock_table / LOCK_TABLE_PART / Max(running, 1));
}

/* The entry of `queue`, however old, or NULL. */
static QueuePace *
entry_of(const ClaimSizer *sizer, const char *queue)
{
	for (int i = 0; i < CLAIM_SIZER_QUEUES; i++)
		if (sizer->queues[i].queue[0] != '\0' &&
			strncmp(sizer->queues[i].queue, queue, NAMEDATALEN - 1) == 0)
			return (QueuePace *) &sizer->queues[i];
	return NULL;
}

/* Whether the entry's pace is recent enough to size a claim by. */
static bool
pace_known(const QueuePace *e, TimestampTz now)
{
	return e != NULL && !TimestampDifferenceExceeds(e->last_claim, now, PACE_MEMORY_MS);
}

int
ds_claim_size(const ClaimSizer *sizer, const char *queue, int most, int first)
{
	const QueuePace *pace = entry_of(sizer, queue);
	int			size = Min(most, ds_claim_lock_share());

	if (!pace_known(pace, GetCurrentTimestamp()))
		size = Min(size, first);
	else if (pace->usecs_per_item * size > CLAIM_BUDGET_MS * 1000.0)
		size = (int) (CLAIM_BUDGET_MS * 1000.0 / Max(pace->usecs_per_item, 1.0));
	return Max(size, 1);
}

void
ds_claim_size_ran(ClaimSizer *sizer, const char *queue, int n, TimestampTz started)
{
	QueuePace  *entry = entry_of(sizer, queue);
	TimestampTz now = GetCurrentTimestamp();
	double		pace;

	if (n <= 0)
		return;
	pace = (double) Max(now - started, 0) / n;
	if (pace_known(entry, now))
		pace = PACE_WEIGHT * pace + (1 - PACE_WEIGHT) * entry->usecs_per_item;
	else if (entry == NULL)
	{
		/* a free entry, or the one claimed from longest ago */
		for (int i = 0; i < CLAIM_SIZER_QUEUES; i++)
		{
			QueuePace  *e = &sizer->queues[i];

			if (e->queue[0] == '\0')
			{
				entry = e;
				break;
			}
			if (entry == NULL || e->last_claim < entry->last_claim)
				entry = e;
		}
		strlcpy(entry->queue, queue, NAMEDATALEN);
	}
	entry->usecs_per_item = pace;
	entry->last_claim = now;
}

/* The announcement key of `queue` in this database: never 0. */
static uint32
claim_key(const char *queue)
{
	uint32		key = hash_bytes_uint32_extended(MyDatabaseId,
												 hash_bytes((const unsigned char *) queue,
															(int) strlen(queue)));

	return key == 0 ? 1 : key;
}

void
ds_claim_announce(const char *queue, int n)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared != NULL && ds_executor_slot >= 0)
		pg_atomic_write_u64(&shared->executor[ds_executor_slot].claiming,
							((uint64) claim_key(queue) << 32) | (uint32) Max(n, 0));
}

void
ds_claim_announce_end(void)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared != NULL && ds_executor_slot >= 0)
		pg_atomic_write_u64(&shared->executor[ds_executor_slot].claiming, 0);
}

int
ds_claims_in_progress(const char *queue)
{
	WorkerShared *shared = ds_worker_shared();
	uint32		key = claim_key(queue);
	int64		n = 0;

	if (shared == NULL)
		return 0;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		uint64		c = pg_atomic_read_u64(&shared->executor[i].claiming);

		if (i != ds_executor_slot && c != 0 && (uint32) (c >> 32) == key)
			n += (uint32) c;
	}
	return (int) Min(n, PG_INT32_MAX);
}

/*
 * Executor load. Each slot's owner and start time are written by its executor alone, without a
 * lock: a reader may see an owner with the start of the attempt before, or the other way round,
 * for one pass. Both only steer which steps are claimed first and when an extra executor starts;
 * no step's state depends on them.
 */

/* This executor runs an attempt or a turn of role `owner` from now on. */
static void
busy_with(Oid owner)
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

/* This executor runs nobody's attempt any more. */
static void
busy_with_nobody(void)
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

void
ds_count_workers(Oid dbid, int *executors, int *executors_busy, int *http_workers)
{
	WorkerShared *shared = ds_worker_shared();

	*executors = 0;
	*executors_busy = 0;
	*http_workers = 0;
	if (shared == NULL)
		return;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		ExecutorSlot *slot = &shared->executor[i];

		if (pg_atomic_read_u32(&slot->pid) == 0 || pg_atomic_read_u32(&slot->db) != dbid)
			continue;
		(*executors)++;
		if (pg_atomic_read_u32(&slot->attempt_owner) != InvalidOid)
			(*executors_busy)++;
	}
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
		if (pg_atomic_read_u32(&shared->http[i].db) == dbid)
			(*http_workers)++;
}

/*
 * Unstarted claims. The record of an ended executor lives in its slot of the shared state until
 * that slot's next executor ends: the next executor records its predecessor's lost claims as
 * soon as it starts (executor.c looks for lost attempts first), so a record is read before it is
 * written again. It is written without a lock by one process and read by others: the pid is
 * cleared while the rest is written and set last, and a reader that sees it change meanwhile
 * knows nothing.
 */

/* the attempts this executor started in its open transaction */
static uint64 started[DS_STARTED_CLAIMS_MAX];
static int	n_started = 0;

/*
 * Where the claims the next record speaks for begin: at the process's start (0), or, for an
 * executor that published a record and went on (executor.c, after a write refused by a server
 * turned read-only), just after that record's end. A record never speaks for the claims of an
 * earlier one it overwrote: those are charged.
 */
static TimestampTz record_from = 0;

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
ds_slot_attempt_starting(uint64 key, Oid owner)
{
	ds_claim_starting(key);
	busy_with(owner);
}

void
ds_slot_turn_starting(Oid owner)
{
	busy_with(owner);
}

void
ds_slot_idle(void)
{
	ds_claims_settled();
	busy_with_nobody();
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
	e->started_at = record_from != 0 ? record_from : MyStartTimestamp;
	e->ended_at = GetCurrentTimestamp();
	record_from = e->ended_at + 1;
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

/*
 * Fences: which worker processes have taken the partitions of this server's settings.
 */

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

PG_FUNCTION_INFO_V1(ds_partition_workers_behind);

/*
 * durable_steps.ds_partition_workers_behind() -> integer[]: the worker processes of this
 * database that serve other partitions than this session's settings say (they have not taken
 * the reload yet); empty when all have. ds_partition_export refuses while it is not, before it
 * looks whether a step of the partition is still in flight (ds_partition_step_idle,
 * store/step_lock.c): a worker that has not taken the fence may still claim one.
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
