/*
 * step_counters.c -- counters of what the steps did since the server started (step_counters.h).
 *
 * A transaction keeps its counts to itself, by subtransaction level, until it commits: a
 * subtransaction that rolls back takes its counts with it, one that commits hands them to its
 * parent. The commit adds them to the shared counters with atomic increments, and to the ring of
 * recent seconds under a spinlock held for a few additions.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "ipc/step_counters.h"

/* One second of the ring: the attempts recorded in it. */
typedef struct RecentSecond
{
	int64		second;			/* seconds since the epoch; the slot's counts
								 * are of this second */
	uint64		n[N_STEP_KINDS][DS_COUNTED_CLASSES];
} RecentSecond;

/* One minute of the ring of the last hour: the attempts recorded in it, by class. */
typedef struct RecentMinute
{
	int64		minute;			/* minutes since the epoch */
	uint64		n[DS_COUNTED_CLASSES];
} RecentMinute;

typedef struct SharedCounters
{
	pg_atomic_uint64 attempts[N_STEP_KINDS][DS_COUNTED_CLASSES];
	pg_atomic_uint64 lost[N_STEP_KINDS];
	pg_atomic_uint64 outcomes[N_STEP_KINDS][DS_COUNTED_STATUSES];
	pg_atomic_uint64 http[DS_COUNTED_HTTP_CLASSES];
	TimestampTz since;
	slock_t		ring_lock;
	RecentSecond ring[DS_RECENT_SECONDS];
	RecentMinute minutes[DS_RECENT_MINUTES];
} SharedCounters;

/* A count not yet committed: n attempts alike, recorded at subtransaction level `level`. */
typedef struct PendingCount
{
	int			level;
	StepKind	kind;
	AttemptClass cls;
	bool		lost;
	int			status;
	int			n;
} PendingCount;

static SharedCounters *counters = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static List *pending = NIL;
static bool callbacks_registered = false;

static void
counters_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(SharedCounters)));
}

static void
counters_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	counters = ShmemInitStruct("durable_steps step counters", sizeof(SharedCounters), &found);
	if (!found)
	{
		memset(counters, 0, sizeof(SharedCounters));
		for (int k = 0; k < N_STEP_KINDS; k++)
		{
			for (int c = 0; c < DS_COUNTED_CLASSES; c++)
				pg_atomic_init_u64(&counters->attempts[k][c], 0);
			for (int s = 0; s < DS_COUNTED_STATUSES; s++)
				pg_atomic_init_u64(&counters->outcomes[k][s], 0);
			pg_atomic_init_u64(&counters->lost[k], 0);
		}
		for (int h = 0; h < DS_COUNTED_HTTP_CLASSES; h++)
			pg_atomic_init_u64(&counters->http[h], 0);
		counters->since = GetCurrentTimestamp();
		SpinLockInit(&counters->ring_lock);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
ds_step_counters_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = counters_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = counters_shmem_startup;
}

/* Add the committed counts to the shared counters and to the ring's current second. */
static void
apply_pending(void)
{
	int64		second = (int64) (GetCurrentTimestamp() / USECS_PER_SEC);
	RecentSecond *slot = &counters->ring[second % DS_RECENT_SECONDS];
	RecentMinute *minute = &counters->minutes[(second / 60) % DS_RECENT_MINUTES];
	uint64		n[N_STEP_KINDS][DS_COUNTED_CLASSES];
	ListCell   *lc;

	memset(n, 0, sizeof(n));
	foreach(lc, pending)
	{
		PendingCount *p = lfirst(lc);

		pg_atomic_fetch_add_u64(&counters->attempts[p->kind][p->cls], p->n);
		if (p->lost)
			pg_atomic_fetch_add_u64(&counters->lost[p->kind], p->n);
		if (p->status >= 0 && p->status < DS_COUNTED_STATUSES)
			pg_atomic_fetch_add_u64(&counters->outcomes[p->kind][p->status], p->n);
		n[p->kind][p->cls] += p->n;
	}
	SpinLockAcquire(&counters->ring_lock);
	if (slot->second != second)
	{
		memset(slot->n, 0, sizeof(slot->n));
		slot->second = second;
	}
	if (minute->minute != second / 60)
	{
		memset(minute->n, 0, sizeof(minute->n));
		minute->minute = second / 60;
	}
	for (int k = 0; k < N_STEP_KINDS; k++)
		for (int c = 0; c < DS_COUNTED_CLASSES; c++)
		{
			slot->n[k][c] += n[k][c];
			minute->n[c] += n[k][c];
		}
	SpinLockRelease(&counters->ring_lock);
}

static void
forget_pending(void)
{
	list_free_deep(pending);
	pending = NIL;
}

/* A commit (or a PREPARE, whose outcome is no longer this session's) counts; an abort does not. */
static void
counters_xact_callback(XactEvent event, void *arg)
{
	if (pending == NIL)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			if (counters != NULL)
				apply_pending();
			forget_pending();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_pending();
			break;
		default:
			break;
	}
}

/* A subtransaction's counts go to its parent when it commits, and away when it rolls back. */
static void
counters_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	ListCell   *lc;

	if (pending == NIL)
		return;
	if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(lc, pending)
		{
			PendingCount *p = lfirst(lc);

			if (p->level >= level)
				p->level = level - 1;
		}
	}
	else if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		foreach(lc, pending)
		{
			PendingCount *p = lfirst(lc);

			if (p->level >= level)
			{
				pending = foreach_delete_current(pending, lc);
				pfree(p);
			}
		}
	}
}

void
ds_count_attempt_at_commit(StepKind kind, AttemptClass cls, bool lost, int status)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingCount *last;
	MemoryContext old;
	ListCell   *lc;

	if (counters == NULL || (int) kind < 0 || kind >= N_STEP_KINDS || (int) cls < 0 ||
		cls >= DS_COUNTED_CLASSES)
		return;
	if (!callbacks_registered)
	{
		RegisterXactCallback(counters_xact_callback, NULL);
		RegisterSubXactCallback(counters_subxact_callback, NULL);
		callbacks_registered = true;
	}

	/*
	 * a drain records many attempts alike in one transaction: one entry
	 * counts them
	 */
	foreach(lc, pending)
	{
		last = lfirst(lc);
		if (last->level == level && last->kind == kind && last->cls == cls &&
			last->lost == lost && last->status == status)
		{
			last->n++;
			return;
		}
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	last = palloc(sizeof(PendingCount));
	last->level = level;
	last->kind = kind;
	last->cls = cls;
	last->lost = lost;
	last->status = status;
	last->n = 1;
	pending = lappend(pending, last);
	MemoryContextSwitchTo(old);
}

void
ds_count_http_response(long status)
{
	int			h = status >= 100 && status < 600 ? (int) (status / 100) : DS_HTTP_NO_RESPONSE;

	if (counters != NULL)
		pg_atomic_fetch_add_u64(&counters->http[h], 1);
}

bool
ds_read_step_counters(StepCounters *out)
{
	int64		now = (int64) (GetCurrentTimestamp() / USECS_PER_SEC);

	memset(out, 0, sizeof(StepCounters));
	if (counters == NULL)
		return false;
	for (int k = 0; k < N_STEP_KINDS; k++)
	{
		for (int c = 0; c < DS_COUNTED_CLASSES; c++)
			out->attempts[k][c] = pg_atomic_read_u64(&counters->attempts[k][c]);
		for (int s = 0; s < DS_COUNTED_STATUSES; s++)
			out->outcomes[k][s] = pg_atomic_read_u64(&counters->outcomes[k][s]);
		out->lost[k] = pg_atomic_read_u64(&counters->lost[k]);
	}
	for (int h = 0; h < DS_COUNTED_HTTP_CLASSES; h++)
		out->http[h] = pg_atomic_read_u64(&counters->http[h]);
	out->since = counters->since;
	for (int i = 0; i < DS_RECENT_SECONDS; i++)
	{
		RecentSecond slot;

		SpinLockAcquire(&counters->ring_lock);
		slot = counters->ring[i];
		SpinLockRelease(&counters->ring_lock);
		/* the last DS_RECENT_SECONDS seconds, this one included */
		if (slot.second > now - DS_RECENT_SECONDS && slot.second <= now)
			for (int k = 0; k < N_STEP_KINDS; k++)
				for (int c = 0; c < DS_COUNTED_CLASSES; c++)
					out->recent[k][c] += slot.n[k][c];
	}
	for (int i = 0; i < DS_RECENT_MINUTES; i++)
	{
		RecentMinute m;

		SpinLockAcquire(&counters->ring_lock);
		m = counters->minutes[i];
		SpinLockRelease(&counters->ring_lock);
		/* the last DS_RECENT_MINUTES minutes, this one included */
		if (m.minute > now / 60 - DS_RECENT_MINUTES && m.minute <= now / 60)
		{
			out->minute_of[i] = m.minute;
			memcpy(out->minutes[i], m.n, sizeof(m.n));
		}
	}
	return true;
}
