/*
 * step_lock.c -- serializing executions of one step identity.
 *
 * A claim is a row in durable_steps.steps, but an uncommitted row is invisible to other
 * transactions, so it cannot by itself make a second caller wait (or, with nowait, refuse).
 * Every executor therefore first takes a heavyweight lock on the identity: an advisory-type lock
 * tag whose fourth field is our own, so it can never collide with the application's
 * pg_advisory_lock() keys (those use 1 and 2 there). It is held to the end of the transaction
 * that will commit the claim, which is exactly as long as the step is "in flight". Waits are
 * visible in pg_locks and take part in deadlock detection like any other lock.
 */
#include "base/compat.h"

#include "access/twophase.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
#include "utils/hsearch.h"

#include "store/step_lock.h"

/* 'DS' in the objsubid column of pg_locks */
#define DS_LOCKTAG_FIELD4 0x4453

/* The lock tag of identity (run_id, step_id). */
static void
step_locktag(LOCKTAG *tag, const char *run_id, const char *step_id)
{
	size_t		run_len = strlen(run_id);
	size_t		step_len = strlen(step_id);
	char	   *buf = palloc(run_len + step_len + 1);
	uint64		hash;

	/* the NUL between the parts keeps ("ab","c") and ("a","bc") apart */
	memcpy(buf, run_id, run_len + 1);
	memcpy(buf + run_len + 1, step_id, step_len);
	hash = hash_bytes_extended((const unsigned char *) buf, (int) (run_len + 1 + step_len), 0);
	pfree(buf);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 DS_LOCKTAG_FIELD4);
}

/*
 * The session locks this process holds (the worker's claimed steps). PostgreSQL's local lock
 * table counts a session lock and a transaction lock of the same tag as one, so without this set
 * a step body run by the worker that calls ds_run_step() on another step of the same claimed
 * batch would "acquire" that step's lock and run it behind the worker's back.
 */
static HTAB *held_session_locks = NULL;

/* The key of a lock tag in held_session_locks. */
static uint64
locktag_key(const LOCKTAG *tag)
{
	return ((uint64) tag->locktag_field2 << 32) | tag->locktag_field3;
}

/* Does this process hold that identity for its session (a claim of the worker)? */
static bool
held_by_this_process(const LOCKTAG *tag)
{
	uint64		key = locktag_key(tag);

	return held_session_locks != NULL &&
		hash_search(held_session_locks, &key, HASH_FIND, NULL) != NULL;
}

/* The step locks this transaction took (ds_step_lock_acquire). */
static int	xact_step_locks = 0;
static LocalTransactionId xact_step_locks_lxid = InvalidLocalTransactionId;

/*
 * One transaction's most: the locks the server's lock table is sized for (lock.c's NLOCKENTS),
 * less one process's share, which the other locks of this transaction and of the others need.
 */
static int
step_locks_per_transaction(void)
{
	return max_locks_per_xact * (MaxBackends + max_prepared_xacts - 1);
}

/*
 * The transaction ends here, with nothing of it stored; `full`: the table filled up (with other
 * sessions' locks too) before this transaction's share did.
 */
pg_noreturn static void
too_many_steps(bool full)
{
	ereport(ERROR,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 full ?
			 errmsg("too many steps for one transaction: the server's lock table is full after %d of them",
					xact_step_locks) :
			 errmsg("too many steps for one transaction: it holds the locks of %d steps, all the server's lock table is sized for",
					xact_step_locks),
			 errdetail("Each step a transaction stores or runs holds a lock until the transaction ends; the lock table is sized for max_locks_per_transaction (%d) locks per server process and prepared transaction (%d), and one transaction holds the locks of %d steps at most.",
					   max_locks_per_xact, MaxBackends + max_prepared_xacts,
					   step_locks_per_transaction()),
			 errhint("Store the steps in batches of a few thousand a transaction, or raise max_locks_per_transaction.")));
}

bool
ds_step_lock_acquire(const char *run_id, const char *step_id, bool nowait)
{
	LOCKTAG		tag;
	LockAcquireResult got = LOCKACQUIRE_NOT_AVAIL;
	MemoryContext cxt = CurrentMemoryContext;

	step_locktag(&tag, run_id, step_id);
	if (held_by_this_process(&tag))
		return false;			/* in flight in this very process: never wait
								 * for ourselves */
	if (xact_step_locks_lxid != DS_MY_LXID)
	{
		xact_step_locks = 0;
		xact_step_locks_lxid = DS_MY_LXID;
	}

	/*
	 * Every step a transaction stores or runs holds its lock until the
	 * transaction ends: one transaction holds no more than the server's lock
	 * table is sized for, so that a statement that stores very many steps
	 * fails here, clearly, before the table is full and any other lock of any
	 * session fails with it (docs/steps.md, "Storing many steps at once").
	 */
	if (xact_step_locks >= step_locks_per_transaction())
		too_many_steps(false);
	PG_TRY();
	{
		got = LockAcquire(&tag, ExclusiveLock, false, nowait);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		if (e->sqlerrcode != ERRCODE_OUT_OF_MEMORY)
			PG_RE_THROW();

		/* the table filled before this transaction's share: the same answer */
		FlushErrorState();
		too_many_steps(true);
	}
	PG_END_TRY();
	if (got == LOCKACQUIRE_NOT_AVAIL)
		return false;
	if (got == LOCKACQUIRE_OK)
		xact_step_locks++;
	return true;
}

bool
ds_step_lock_is_free(const char *run_id, const char *step_id)
{
	LOCKTAG		tag;
	LockAcquireResult got;

	step_locktag(&tag, run_id, step_id);
	if (held_by_this_process(&tag))
		return false;
	got = LockAcquire(&tag, ExclusiveLock, false, true);
	if (got == LOCKACQUIRE_NOT_AVAIL)
		return false;
	/* only taken to look: let go, unless this transaction held it */
	if (got == LOCKACQUIRE_OK)
		LockRelease(&tag, ExclusiveLock, false);
	return true;
}

PG_FUNCTION_INFO_V1(ds_partition_step_idle);

/*
 * durable_steps.ds_partition_step_idle(run_id, step_id) -> boolean: false while an attempt of the
 * step (step_id '': a turn of the run) holds its lock; for ds_partition_export (docs/partitions.md,
 * "Moving a partition").
 *
 * An export must read a partition that nothing changes any more: no attempt or turn still in
 * flight whose outcome would be recorded here after the rows left for another server, where the
 * step would then run again. A worker's attempt and a run's turn hold their identity's lock from
 * the claim's commit to the outcome's commit, so the export tries each running identity's lock:
 * free, nothing runs it (its executor is gone, and the new owner records the attempt as lost),
 * and nothing can start it again, the partition being fenced; held, it is still running, and the
 * export refuses rather than copy a state that is about to change. The lock is let go of at once
 * (ds_step_lock_is_free): a partition may have many running steps, and the lock table is the
 * server's. Before that, every worker process of the database must have taken the fence
 * (ds_partition_workers_behind, ipc/executor_slot.c): one that has not may still claim a step of
 * the partition.
 */
Datum
ds_partition_step_idle(PG_FUNCTION_ARGS)
{
	char	   *run_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *step_id = text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_BOOL(ds_step_lock_is_free(run_id, step_id));
}

/* How often a bounded wait for a step lock tries it again. */
#define STEP_LOCK_POLL_MS 10

bool
ds_step_lock_acquire_until(const char *run_id, const char *step_id, TimestampTz until)
{
	LOCKTAG		tag;

	step_locktag(&tag, run_id, step_id);
	if (held_by_this_process(&tag))
		return false;
	for (;;)
	{
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			return true;
		if (GetCurrentTimestamp() >= until)
			return false;

		/*
		 * the lock manager waits without a time limit: a short sleep between
		 * tries, woken early by a signal
		 */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 STEP_LOCK_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

bool
ds_step_lock_try_session(const char *run_id, const char *step_id)
{
	LOCKTAG		tag;
	uint64		key;

	step_locktag(&tag, run_id, step_id);
	if (held_by_this_process(&tag) ||
		LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	if (held_session_locks == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(uint64);
		held_session_locks = hash_create("durable_steps session locks", 256, &ctl,
										 HASH_ELEM | HASH_BLOBS);
	}
	key = locktag_key(&tag);
	(void) hash_search(held_session_locks, &key, HASH_ENTER, NULL);
	return true;
}

void
ds_step_lock_release_session(const char *run_id, const char *step_id)
{
	LOCKTAG		tag;
	uint64		key;

	step_locktag(&tag, run_id, step_id);
	key = locktag_key(&tag);
	if (held_session_locks != NULL)
		(void) hash_search(held_session_locks, &key, HASH_REMOVE, NULL);
	LockRelease(&tag, ExclusiveLock, true);
}

void
ds_step_lock_pin(const char *run_id, const char *step_id)
{
	LOCKTAG		tag;

	step_locktag(&tag, run_id, step_id);
	/* held already, so granted locally: never waits */
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * The lock of a run_id, to the end of the transaction: ExclusiveLock while ds_start_run stores a
 * run, ShareLock while a new step outside a run's workflow is stored (run_step.c), so that either
 * waits for the other to commit and then sees it. Its own tag ('DR' in objsubid): it never meets
 * the steps' locks.
 */
#define DS_RUN_ID_LOCKTAG_FIELD4 0x4452

/* The lock tag of one name (a run_id, a queue) in the tag space `field4` of this database. */
static void
name_locktag(LOCKTAG *tag, const char *name, uint16 field4)
{
	uint64		hash = hash_bytes_extended((const unsigned char *) name, (int) strlen(name), 0);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash, field4);
}

bool
ds_run_id_lock(const char *run_id, bool exclusive, bool nowait)
{
	LOCKTAG		tag;

	name_locktag(&tag, run_id, DS_RUN_ID_LOCKTAG_FIELD4);
	return LockAcquire(&tag, exclusive ? ExclusiveLock : ShareLock, false, nowait) !=
		LOCKACQUIRE_NOT_AVAIL;
}

/* An event's lock ('DE' in objsubid): the owner's OID and the name, hashed. */
#define DS_EVENT_LOCKTAG_FIELD4 0x4445

bool
ds_event_lock(Oid owner, const char *name, bool exclusive, bool nowait)
{
	LOCKTAG		tag;
	uint64		hash = hash_bytes_extended((const unsigned char *) name, (int) strlen(name), owner);

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 DS_EVENT_LOCKTAG_FIELD4);
	return LockAcquire(&tag, exclusive ? ExclusiveLock : ShareLock, false, nowait) !=
		LOCKACQUIRE_NOT_AVAIL;
}

/*
 * The claim lock of a queue, to the end of the transaction ('DQ' in objsubid). Executors read a
 * queue's due steps without row locks (step_claims.c): two that read the same range at once see
 * the same rows, and the one that loses them reads again, past them. Taking turns to claim from
 * a queue keeps them from reading the same rows at all: the second reads past the steps the
 * first says it takes (executor_slot.c), or after the first's claim committed, when its rows have
 * left the range. Never waits: the caller decides how to wait.
 */
#define DS_QUEUE_CLAIM_LOCKTAG_FIELD4 0x4451

bool
ds_queue_claim_lock_try(const char *queue)
{
	LOCKTAG		tag;

	name_locktag(&tag, queue, DS_QUEUE_CLAIM_LOCKTAG_FIELD4);
	return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

void
ds_queue_claim_lock_release(const char *queue)
{
	LOCKTAG		tag;

	name_locktag(&tag, queue, DS_QUEUE_CLAIM_LOCKTAG_FIELD4);
	LockRelease(&tag, ExclusiveLock, false);
}

void
ds_step_lock_release_all_session(void)
{
	LockReleaseSession(USER_LOCKMETHOD);
	if (held_session_locks != NULL)
	{
		hash_destroy(held_session_locks);
		held_session_locks = NULL;
	}
}
