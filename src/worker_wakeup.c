/*
 * worker_wakeup.c -- the executors' shared state and the commit-time wake-up.
 *
 * A transaction that leaves a step pending or retrying sets a flag; a resource-release callback
 * that runs after the transaction's locks are released sets an executor's latch. Waking only
 * after the locks are gone matters: the executor's claim must find the step's lock free, or it
 * would skip the step and sleep until the polling backstop.
 */
#include "compat.h"

#include "common/hashfn.h"

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/resowner.h"

#include "served_databases.h"
#include "worker_wakeup.h"

static WorkerShared *shared = NULL;
static bool preloaded = false;
static bool wake_pending = false;
static bool wake_http_pending = false;
static bool callback_registered = false;
static bool warned_not_preloaded = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* shmem_request_hook: reserve the shared state. */
static void
worker_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(WorkerShared)));
}

/* shmem_startup_hook: find or create the shared state. */
static void
worker_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("durable_steps workers", sizeof(WorkerShared), &found);
	if (!found)
	{
		memset(shared, 0, sizeof(WorkerShared));
		pg_atomic_init_u32(&shared->next_executor, 0);
		pg_atomic_init_u64(&shared->replay_generation, 0);
		for (int i = 0; i < DS_MAX_WORKERS; i++)
		{
			pg_atomic_init_u32(&shared->executor_pid[i], 0);
			pg_atomic_init_u64(&shared->cancel_request[i], 0);
			pg_atomic_init_u64(&shared->claiming[i], 0);
			pg_atomic_init_u32(&shared->executor_db[i], InvalidOid);
			pg_atomic_init_u32(&shared->executor_state[i], EXECUTOR_STARTING);
		}
		for (int i = 0; i < DS_SERVE_REQUESTS; i++)
			pg_atomic_init_u32(&shared->serve_request[i], InvalidOid);
		for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
			pg_atomic_init_u32(&shared->http_db[i], InvalidOid);
		/* after a crash, the attempts that were running are lost: executors look at once */
		pg_atomic_init_u64(&shared->lost_epoch, 1);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
ds_worker_shmem_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	preloaded = true;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = worker_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = worker_shmem_startup;
}

WorkerShared *
ds_worker_shared(void)
{
	return shared;
}

/*
 * Ask the launcher to serve this database: none of its executors runs (the extension was just
 * created here, or the launcher found none when it looked).
 */
static void
ask_launcher_to_serve(void)
{
	Latch	   *launcher = shared->launcher_latch;

	for (int i = 0; i < DS_SERVE_REQUESTS; i++)
	{
		uint32		expected = InvalidOid;

		if (pg_atomic_read_u32(&shared->serve_request[i]) == MyDatabaseId ||
			pg_atomic_compare_exchange_u32(&shared->serve_request[i], &expected, MyDatabaseId))
			break;
	}
	/* with every entry taken, the launcher still wakes and serves the databases it knows of */
	if (launcher != NULL)
		SetLatch(launcher);
}

/*
 * Set the latch of one live executor of this database, a different one each time. When none of
 * them has found the extension yet (none runs, or one is still looking), ask the launcher too:
 * an executor that looked before this commit may be about to leave.
 */
static void
wake_one_executor(void)
{
	uint32		start;

	if (shared == NULL)
		return;
	start = pg_atomic_fetch_add_u32(&shared->next_executor, 1);
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		int			slot = (start + i) % DS_MAX_WORKERS;
		Latch	   *latch = shared->executor_latch[slot];

		/* a latch of an exited executor belongs to a PGPROC: a spurious wake-up is harmless */
		if (latch != NULL && pg_atomic_read_u32(&shared->executor_db[slot]) == MyDatabaseId &&
			pg_atomic_read_u32(&shared->executor_state[slot]) == EXECUTOR_SERVING)
		{
			SetLatch(latch);
			return;
		}
	}
	ask_launcher_to_serve();
}

/*
 * Set the latch of this database's HTTP worker; when there is none yet, ask the launcher to
 * serve the database (it starts the HTTP worker with the executors).
 */
static void
wake_http_worker(void)
{
	if (shared == NULL)
		return;
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
	{
		Latch	   *latch = shared->http_latch[i];

		if (latch != NULL && pg_atomic_read_u32(&shared->http_db[i]) == MyDatabaseId)
		{
			SetLatch(latch);
			return;
		}
	}
	ask_launcher_to_serve();
}

void
ds_attempts_may_be_lost(void)
{
	if (shared == NULL)
		return;
	pg_atomic_fetch_add_u64(&shared->lost_epoch, 1);
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		Latch	   *latch = shared->executor_latch[i];

		/* a latch of an exited executor belongs to a PGPROC: a spurious wake-up is harmless */
		if (latch != NULL)
			SetLatch(latch);
	}
}

uint64
ds_lost_attempts_epoch(void)
{
	return shared == NULL ? 0 : pg_atomic_read_u64(&shared->lost_epoch);
}

/*
 * Exit callback of the HTTP worker: its slot is free again, and the requests it had in flight
 * (its session locks are gone by now) are for the executors to record as lost.
 */
static void
release_http_slot(int code, Datum arg)
{
	int			slot = DatumGetInt32(arg);

	shared->http_latch[slot] = NULL;
	pg_atomic_write_u32(&shared->http_db[slot], InvalidOid);
	ds_attempts_may_be_lost();
}

bool
ds_http_worker_take_slot(void)
{
	if (shared == NULL)
		return true;
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
		if (pg_atomic_read_u32(&shared->http_db[i]) == MyDatabaseId)
			return false;
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
	{
		uint32		expected = InvalidOid;

		if (pg_atomic_compare_exchange_u32(&shared->http_db[i], &expected, MyDatabaseId))
		{
			shared->http_latch[i] = MyLatch;
			on_shmem_exit(release_http_slot, Int32GetDatum(i));
			return true;
		}
	}
	return false;
}

Oid
ds_take_serve_request(void)
{
	if (shared == NULL)
		return InvalidOid;
	for (int i = 0; i < DS_SERVE_REQUESTS; i++)
	{
		Oid			dbid = pg_atomic_exchange_u32(&shared->serve_request[i], InvalidOid);

		if (OidIsValid(dbid))
			return dbid;
	}
	return InvalidOid;
}

/* Resource release callback: after a commit that made work due, wake an executor. */
static void
wake_after_locks_released(ResourceReleasePhase phase, bool isCommit, bool isTopLevel, void *arg)
{
	if (phase != RESOURCE_RELEASE_AFTER_LOCKS || !isTopLevel)
		return;
	if (wake_pending && isCommit)
		wake_one_executor();
	if (wake_http_pending && isCommit)
		wake_http_worker();
	wake_pending = false;
	wake_http_pending = false;
}

void
ds_worker_serve_at_commit(void)
{
	if (!preloaded)
		return;
	if (!callback_registered)
	{
		RegisterResourceReleaseCallback(wake_after_locks_released, NULL);
		callback_registered = true;
	}
	wake_pending = true;
}

void
ds_worker_wake_at_commit(void)
{
	if (!preloaded)
	{
		if (!warned_not_preloaded)
		{
			warned_not_preloaded = true;
			ereport(WARNING,
					(errmsg("durable_steps is not in shared_preload_libraries: retries will not run until it is"),
					 errhint("Add durable_steps to shared_preload_libraries and restart the server.")));
		}
		return;
	}
	ds_warn_if_database_not_served();
	ds_worker_serve_at_commit();
}

void
ds_worker_wake_kind_at_commit(const char *kind)
{
	if (kind == NULL || strcmp(kind, "http") != 0)
	{
		ds_worker_wake_at_commit();
		return;
	}
	{
		bool		executor_pending = wake_pending;

		/* its warnings and callback; the HTTP worker, not an executor, is to be woken */
		ds_worker_wake_at_commit();
		wake_pending = executor_pending;
		if (preloaded)
			wake_http_pending = true;
	}
}

PG_FUNCTION_INFO_V1(ds_serve_this_database);

/*
 * ds_serve_this_database(): called by the install script, so that the launcher starts this
 * database's executors as soon as CREATE EXTENSION commits (README, "The background worker").
 */
Datum
ds_serve_this_database(PG_FUNCTION_ARGS)
{
	ds_worker_serve_at_commit();
	PG_RETURN_VOID();
}

int			ds_executor_slot = -1;

uint64
ds_attempt_cancel_key(const char *run_id, const char *step_id, int attempt)
{
	uint64		h = hash_bytes_extended((const unsigned char *) run_id, (int) strlen(run_id), attempt);

	h = hash_bytes_extended((const unsigned char *) step_id, (int) strlen(step_id), h);
	return h != 0 ? h : 1;
}

bool
ds_request_cancel(int pid, uint64 key)
{
	if (shared == NULL || pid <= 0)
		return false;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
		if (pg_atomic_read_u32(&shared->executor_pid[i]) == (uint32) pid)
		{
			pg_atomic_write_u64(&shared->cancel_request[i], key);
			return true;
		}
	return false;
}

bool
ds_cancel_requested(uint64 key)
{
	return shared != NULL && ds_executor_slot >= 0 &&
		pg_atomic_read_u64(&shared->cancel_request[ds_executor_slot]) == key;
}

void
ds_cancel_request_clear(uint64 key)
{
	uint64		expected = key;

	if (shared != NULL && ds_executor_slot >= 0)
		(void) pg_atomic_compare_exchange_u64(&shared->cancel_request[ds_executor_slot],
											  &expected, 0);
}
