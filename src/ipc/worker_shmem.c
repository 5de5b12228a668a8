/*
 * worker_shmem.c -- the workers' shared memory: its layout set up at start, the executors' and
 * HTTP workers' slots, cancel requests, and the commit-time wake-up.
 *
 * A transaction that leaves a step pending or retrying sets a flag; a resource-release callback
 * that runs after the transaction's locks are released sets an executor's latch. Waking only
 * after the locks are gone matters: the executor's claim must find the step's lock free, or it
 * would skip the step and sleep until the polling backstop.
 */
#include "base/compat.h"

#include "common/hashfn.h"

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/resowner.h"

#include "ipc/served_databases.h"
#include "ipc/worker_shmem.h"

static WorkerShared *shared = NULL;
static bool preloaded = false;
static bool wake_pending = false;
static bool wake_http_pending = false;
static bool wake_tasks_pending = false;

/* this transaction kept an HTTP outcome for the executors (ds_worker_kept_outcome_at_commit) */
static bool kept_pending = false;

/* this transaction held a step of a limit or let an admission go (ds_limit_admission_at_commit) */
static bool admission_pending = false;

/* this transaction settled an item of a map (ds_map_settled_at_commit) */
static bool map_settle_pending = false;
static bool callback_registered = false;
static bool warned_not_preloaded = false;
static uint32 warned_starved = 0;	/* DS_STARVED_* said in this session */

static void warn_if_starved(uint32 needed);

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
			ExecutorSlot *slot = &shared->executor[i];

			pg_atomic_init_u32(&slot->pid, 0);
			pg_atomic_init_u32(&slot->db, InvalidOid);
			pg_atomic_init_u32(&slot->state, EXECUTOR_STARTING);
			pg_atomic_init_u64(&slot->cancel_request, 0);
			pg_atomic_init_u64(&slot->claiming, 0);
			pg_atomic_init_u32(&slot->attempt_owner, InvalidOid);
			pg_atomic_init_u64(&slot->attempt_since, 0);
			pg_atomic_init_u32(&slot->ended.pid, 0);
			pg_atomic_init_u64(&slot->partitions_applied, 0);
			pg_atomic_init_u32(&slot->leave_requested, 0);
		}
		for (int i = 0; i < DS_SERVE_REQUESTS; i++)
			pg_atomic_init_u32(&shared->serve_request[i], InvalidOid);
		for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
		{
			pg_atomic_init_u32(&shared->http[i].db, InvalidOid);
			pg_atomic_init_u32(&shared->http[i].pid, 0);
			pg_atomic_init_u64(&shared->http[i].partitions_applied, 0);
		}

		/*
		 * after a crash, the attempts that were running are lost: executors
		 * look at once
		 */
		pg_atomic_init_u64(&shared->lost_epoch, 1);

		/*
		 * at 1, as the epoch: an executor that starts looks for kept outcomes
		 * at once
		 */
		pg_atomic_init_u64(&shared->kept_outcomes, 1);
		pg_atomic_init_u64(&shared->tasks_generation, 1);
		pg_atomic_init_u64(&shared->limit_admissions, 1);
		pg_atomic_init_u64(&shared->map_settles, 1);
		for (int i = 0; i < DS_STARVED_DATABASES; i++)
		{
			pg_atomic_init_u32(&shared->starved[i].dboid, InvalidOid);
			pg_atomic_init_u32(&shared->starved[i].lacks, 0);
		}
		ConditionVariableInit(&shared->tasks_cv);
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

	/*
	 * with every entry taken, the launcher still wakes and serves the
	 * databases it knows of
	 */
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
	TimestampTz now;

	if (shared == NULL)
		return;
	start = pg_atomic_fetch_add_u32(&shared->next_executor, 1);
	now = GetCurrentTimestamp();

	/*
	 * one that is not busy in a long attempt first (executor_slot.h), else
	 * any
	 */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < DS_MAX_WORKERS; i++)
		{
			int			slot = (start + i) % DS_MAX_WORKERS;
			Latch	   *latch = shared->executor[slot].latch;

			/*
			 * a latch of an exited executor belongs to a PGPROC: a spurious
			 * wake-up is harmless
			 */
			if (latch != NULL && pg_atomic_read_u32(&shared->executor[slot].db) == MyDatabaseId &&
				pg_atomic_read_u32(&shared->executor[slot].state) == EXECUTOR_SERVING &&
				(pass == 1 || !OidIsValid(ds_slot_busy_owner(shared, slot, MyDatabaseId, now))))
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
		Latch	   *latch = shared->http[i].latch;

		if (latch != NULL && pg_atomic_read_u32(&shared->http[i].db) == MyDatabaseId)
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
		Latch	   *latch = shared->executor[i].latch;

		/*
		 * a latch of an exited executor belongs to a PGPROC: a spurious
		 * wake-up is harmless
		 */
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

	shared->http[slot].latch = NULL;
	pg_atomic_write_u32(&shared->http[slot].pid, 0);
	ds_http_slot = -1;
	pg_atomic_write_u32(&shared->http[slot].db, InvalidOid);
	ds_attempts_may_be_lost();
}

bool
ds_http_worker_take_slot(void)
{
	if (shared == NULL)
		return true;
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
		if (pg_atomic_read_u32(&shared->http[i].db) == MyDatabaseId)
			return false;
	for (int i = 0; i < DS_MAX_HTTP_WORKERS; i++)
	{
		uint32		expected = InvalidOid;

		if (pg_atomic_compare_exchange_u32(&shared->http[i].db, &expected, MyDatabaseId))
		{
			shared->http[i].latch = MyLatch;
			pg_atomic_write_u32(&shared->http[i].pid, (uint32) MyProcPid);
			ds_http_slot = i;
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

	/*
	 * after the commit: an executor that reads the new value finds the kept
	 * outcome
	 */
	if (kept_pending && isCommit)
		pg_atomic_fetch_add_u64(&shared->kept_outcomes, 1);
	kept_pending = false;
	if (admission_pending && isCommit)
		pg_atomic_fetch_add_u64(&shared->limit_admissions, 1);
	admission_pending = false;
	if (map_settle_pending && isCommit)
		pg_atomic_fetch_add_u64(&shared->map_settles, 1);
	map_settle_pending = false;
	if (wake_pending && isCommit)
		wake_one_executor();
	if (wake_http_pending && isCommit)
		wake_http_worker();
	if (wake_tasks_pending && isCommit)
	{
		pg_atomic_fetch_add_u64(&shared->tasks_generation, 1);
		ConditionVariableBroadcast(&shared->tasks_cv);
	}
	wake_pending = false;
	wake_http_pending = false;
	wake_tasks_pending = false;
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
	warn_if_starved(DS_STARVED_EXECUTOR);
	ds_worker_serve_at_commit();
}

void
ds_worker_kept_outcome_at_commit(void)
{
	ds_worker_wake_at_commit();
	kept_pending = preloaded;
}

void
ds_limit_admission_at_commit(void)
{
	ds_worker_wake_at_commit();
	admission_pending = preloaded;
}

void
ds_map_settled_at_commit(void)
{
	ds_worker_wake_at_commit();
	map_settle_pending = preloaded;
}

uint64
ds_map_settles_generation(void)
{
	return shared != NULL ? pg_atomic_read_u64(&shared->map_settles) : 0;
}

uint64
ds_limit_admissions_generation(void)
{
	return shared != NULL ? pg_atomic_read_u64(&shared->limit_admissions) : 0;
}

uint64
ds_kept_outcomes_generation(void)
{
	return shared != NULL ? pg_atomic_read_u64(&shared->kept_outcomes) : 0;
}

void
ds_note_starved_database(int i, Oid dbid, uint32 lacks)
{
	if (shared == NULL || i < 0 || i >= DS_STARVED_DATABASES)
		return;
	if (pg_atomic_read_u32(&shared->starved[i].dboid) != dbid)
		pg_atomic_write_u32(&shared->starved[i].dboid, dbid);
	if (pg_atomic_read_u32(&shared->starved[i].lacks) != lacks)
		pg_atomic_write_u32(&shared->starved[i].lacks, lacks);
}

/*
 * Work stored in this database that no worker process of it (`needed`, DS_STARVED_*) will take,
 * because the launcher found no slot for one: said once a session, with what to raise (README,
 * "Requirements").
 */
static void
warn_if_starved(uint32 needed)
{
	uint32		lacks = 0;

	if (shared == NULL || (warned_starved & needed) != 0)
		return;
	for (int i = 0; i < DS_STARVED_DATABASES; i++)
		if (pg_atomic_read_u32(&shared->starved[i].dboid) == MyDatabaseId)
			lacks = pg_atomic_read_u32(&shared->starved[i].lacks);
	if ((lacks & needed) == 0)
		return;
	warned_starved |= needed;
	ereport(WARNING,
			(errmsg(needed == DS_STARVED_HTTP ?
					"no durable_steps HTTP worker runs in this database: its HTTP steps will not be sent" :
					"no durable_steps executor runs in this database: its deferred steps, retries and runs will not run"),
			 errdetail("The launcher found no free slot for it: every slot of max_worker_processes (%d) is taken, or the executors' 32.", max_worker_processes),
			 errhint("Raise max_worker_processes to at least the databases served times (durable_steps.max_workers + 1), plus what other extensions and parallel queries use, and restart the server.")));
}

void
ds_worker_wake_kind_at_commit(StepKind kind)
{
	bool		executor_pending = wake_pending;

	if (preloaded && ds_step_kinds[kind].sent_by_http_worker)
		warn_if_starved(DS_STARVED_HTTP);

	if (!ds_step_kinds[kind].sent_by_http_worker && !ds_step_kinds[kind].run_by_app_worker)
	{
		ds_worker_wake_at_commit();
		return;
	}

	/*
	 * its warnings and callback; the HTTP worker or the task waiters, not an
	 * executor, are to be woken
	 */
	ds_worker_wake_at_commit();
	wake_pending = executor_pending;
	if (preloaded && ds_step_kinds[kind].sent_by_http_worker)
		wake_http_pending = true;
	if (preloaded && ds_step_kinds[kind].run_by_app_worker)
		wake_tasks_pending = true;
}

uint64
ds_tasks_generation(void)
{
	return shared != NULL ? pg_atomic_read_u64(&shared->tasks_generation) : 0;
}

bool
ds_tasks_wait(uint64 seen, long timeout_ms)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	bool		moved = false;

	if (shared == NULL)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		return false;
	}
	ConditionVariablePrepareToSleep(&shared->tasks_cv);
	for (;;)
	{
		long		left;

		if (pg_atomic_read_u64(&shared->tasks_generation) != seen)
		{
			moved = true;
			break;
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		if (left <= 0)
			break;
		/* serves interrupts: a cancel or a terminate ends the wait */
		(void) ConditionVariableTimedSleep(&shared->tasks_cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return moved;
}

PG_FUNCTION_INFO_V1(ds_serve_this_database);

/*
 * ds_serve_this_database(): called by the install script, so that the launcher starts this
 * database's executors as soon as CREATE EXTENSION commits (docs/worker.md).
 */
Datum
ds_serve_this_database(PG_FUNCTION_ARGS)
{
	ds_worker_serve_at_commit();
	PG_RETURN_VOID();
}

int			ds_executor_slot = -1;
int			ds_http_slot = -1;

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
		if (pg_atomic_read_u32(&shared->executor[i].pid) == (uint32) pid)
		{
			pg_atomic_write_u64(&shared->executor[i].cancel_request, key);
			return true;
		}
	return false;
}

bool
ds_cancel_requested(uint64 key)
{
	return shared != NULL && ds_executor_slot >= 0 &&
		pg_atomic_read_u64(&shared->executor[ds_executor_slot].cancel_request) == key;
}

void
ds_cancel_request_clear(uint64 key)
{
	uint64		expected = key;

	if (shared != NULL && ds_executor_slot >= 0)
		(void) pg_atomic_compare_exchange_u64(&shared->executor[ds_executor_slot].cancel_request,
											  &expected, 0);
}
