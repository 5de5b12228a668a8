/*
 * claim_size.c -- how much work an executor claims at a time (docs/worker.md).
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
 * (claim_size.h): one step, so that a burst of slow steps is spread over the executors at once
 * (three 20-second steps on two executors end by +40 s, not +60 s), and a backlog of fast ones
 * reaches full-size claims with its second claim. A pace learnt on fast steps still sizes the claim that meets the
 * first of a run of slow steps in the same queue without a pause in between: keep steps of very
 * different durations in different queues (docs/queues.md).
 */
#include "base/compat.h"

#include "access/twophase.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"

#include "ipc/claim_size.h"
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
