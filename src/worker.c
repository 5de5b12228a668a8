/*
 * worker.c -- an executor: claims due steps and runs their attempts (README, "The background
 * worker").
 *
 * One pass of the loop:
 *   1. find attempts whose executor is gone and record them as lost (invocation_lost);
 *   2. claim a batch of due steps of one queue -- the next one, in turn, with due steps and room
 *      under its concurrency limit (step_claims.c) -- and COMMIT them as started (status
 *      running, attempt number counted, claiming process recorded, each step's session lock
 *      held) -- an attempt is durable before it runs; its attempt row is written once, with its
 *      outcome;
 *   3. run the claimed attempts, each in its own subtransaction and as the step's owner, and
 *      commit their outcomes; several attempts share one transaction for throughput, for at most
 *      a few milliseconds, so that a failed commit loses nothing but time: the attempts stay
 *      running, their locks are released, and step 1 retries them by their policies;
 *   4. claim due runs and take their turns (run_turn.c), several runs' turns to a transaction,
 *      each run's next turn at once, without another claim, while it can go on;
 *   4b. purge what retention allows;
 *   5. sleep until the earliest next attempt, a commit that makes work due (latch), or the
 *      polling backstop.
 */
#include "compat.h"

#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "utils/lsyscache.h"	/* get_database_name() from 19 */
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "claim_size.h"
#include "direct_write.h"
#include "store.h"
#include "retention.h"
#include "run_context.h"
#include "run_turn.h"
#include "step_attempt.h"
#include "step_claims.h"
#include "step_exec.h"
#include "step_isolation.h"
#include "step_lock.h"
#include "served_databases.h"
#include "worker.h"
#include "worker_wakeup.h"

static int	poll_interval_ms = 1000;
static int	batch_size = 1000;
/* the recent pace of this executor's claims of steps, and of run turns (claim_size.c) */
static ClaimSizer step_claims;
static ClaimSizer turn_claims;
/* the one "queue" of run turns, for turn_claims */
#define TURN_QUEUE "turns"

/* attempts share a transaction until it has been open this long */
#define SHARED_TRANSACTION_MS 20

static int	my_slot = -1;
/* the queue this executor claimed from last (step_claims.c serves the next one first) */
static char last_queue[NAMEDATALEN] = "";
static MemoryContext pass_cxt = NULL;
/* the name of the database this executor serves, for log lines */
static char *my_database = NULL;

/* durable_steps.paused */
static bool worker_paused = false;

void
ds_executor_init_module(void)
{
	DefineCustomBoolVariable("durable_steps.paused",
							 "Keeps the background worker from running steps and sending HTTP requests.",
							 "For a restored copy of a cluster: set it before the copy first starts, so that nothing due acts before it is looked at. Callers' own attempts still run.",
							 &worker_paused,
							 false,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("durable_steps.poll_interval",
							"Longest time the worker sleeps before looking for due steps again.",
							"Commits that make steps due wake the worker at once; this is the backstop.",
							&poll_interval_ms,
							1000,
							10,
							3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("durable_steps.batch_size",
							"Most due steps one executor claims at a time.",
							"Claims are smaller when steps are slow (about 100 ms of work each) and keep to a share of the server's lock table.",
							&batch_size,
							1000,
							1,
							10000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/* Exit callback: this executor's latch is no longer one to wake. */
static void
release_slot(int code, Datum arg)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared != NULL && my_slot >= 0)
	{
		shared->executor_latch[my_slot] = NULL;
		pg_atomic_write_u32(&shared->executor_db[my_slot], InvalidOid);
		pg_atomic_write_u32(&shared->executor_pid[my_slot], 0);
		pg_atomic_write_u64(&shared->cancel_request[my_slot], 0);
		pg_atomic_write_u64(&shared->claiming[my_slot], 0);
	}
	/* the attempts this executor had claimed and not recorded are for the others to record */
	ds_attempts_may_be_lost();
}

/*
 * Isolation level of the next transaction begin_transaction starts: -1 for the default, or
 * XACT_READ_COMMITTED for a claim (whose count of a queue's running steps must see the claims
 * committed before it took the queue's lock, whatever default_transaction_isolation says).
 */
static int	next_isolation = -1;

/* Start a transaction with a snapshot, and say so in pg_stat_activity. */
static void
begin_transaction(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (next_isolation >= 0)
		XactIsoLevel = next_isolation;
	next_isolation = -1;
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/* Commit the transaction begun by begin_transaction, and report its statistics. */
static void
commit_transaction(void)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * A transaction that works on the extension's tables. It first takes a shared lock on the
 * extension itself: DROP EXTENSION takes that lock exclusively before it locks any table, so it
 * waits for this transaction instead of deadlocking with it (the executor would otherwise hold
 * one table while the DROP held another). Returns false, with no transaction open, when the
 * extension is gone (a DROP committed meanwhile): the loop then waits for it again.
 */
static bool
begin_work(const char *activity)
{
	Oid			ext;

	begin_transaction(activity);
	ext = get_extension_oid("durable_steps", true);
	if (OidIsValid(ext))
	{
		LockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock);
		/* the lock's wait may have been for a DROP that committed: look again */
		if (get_extension_oid("durable_steps", true) != ext)
			ext = InvalidOid;
	}
	if (!OidIsValid(ext))
	{
		commit_transaction();
		return false;
	}
	return true;
}


/* Say in shared memory what this executor found: the launcher reads it (launcher.c). */
static void
set_executor_state(ExecutorState state)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared != NULL && my_slot >= 0)
		pg_atomic_write_u32(&shared->executor_state[my_slot], state);
}

/*
 * Is the extension installed here? When the worker serves every database, an executor that
 * finds none leaves (the launcher then knows this database has no steps); a listed database's
 * missing extension is waited for, with one log line.
 */
static bool
extension_ready(void)
{
	static bool said_missing = false;
	static bool served = false;
	bool		ready;

	begin_transaction("durable_steps: looking for the extension");
	ready = OidIsValid(get_extension_oid("durable_steps", true));
	commit_transaction();
	if (ready)
	{
		if (said_missing)
			ereport(LOG, (errmsg("durable_steps: extension found; running steps")));
		said_missing = false;
		served = true;
		set_executor_state(EXECUTOR_SERVING);
		return true;
	}
	if (ds_serves_every_database())
	{
		ereport(served ? LOG : DEBUG1,
				(errmsg("durable_steps: extension is not installed in database \"%s\"; its worker stops",
						my_database)));
		set_executor_state(EXECUTOR_NO_EXTENSION);
		proc_exit(0);
	}
	if (!said_missing)
		ereport(LOG,
				(errmsg("durable_steps: extension is not installed in database \"%s\"; waiting for it",
						my_database),
				 errhint("Run CREATE EXTENSION durable_steps in that database.")));
	said_missing = true;
	return false;
}

/* Release the session locks of claims steps[0..n-1]. */
static void
release_session_locks(ClaimedStep *steps, int n)
{
	for (int i = 0; i < n; i++)
		ds_step_lock_release_session(steps[i].run_id, steps[i].step_id);
}

/*
 * Record the attempts of worker processes that are gone, in batches, each batch one
 * transaction.
 */
static void
recover_lost_attempts(void)
{
	ClaimedStep *recovered;
	int			n;
	/* each recovered step is locked until its batch commits */
	int			recover_size = Min(batch_size, ds_claim_lock_share());

	do
	{
		if (!begin_work("durable_steps: recovering lost attempts"))
			return;
		n = ds_recover_lost_attempts(recover_size, pass_cxt, &recovered);
		commit_transaction();
		release_session_locks(recovered, n);
		MemoryContextReset(pass_cxt);
	} while (n >= recover_size);
}

/* Record the turns of executors that are gone, in batches, each batch one transaction. */
static void
recover_lost_turns(void)
{
	int			n;
	int			recover_size = Min(batch_size, ds_claim_lock_share());

	do
	{
		char	  **run_ids;

		if (!begin_work("durable_steps: recovering lost turns"))
			return;
		n = ds_recover_lost_turns(recover_size, pass_cxt, &run_ids);
		commit_transaction();
		for (int i = 0; i < n; i++)
			ds_step_lock_release_session(run_ids[i], DS_TURN_STEP_ID);
		MemoryContextReset(pass_cxt);
	} while (n >= recover_size);
}

/* Run one claimed attempt as its owner; a step whose owner is gone fails closed. */
static void
run_claimed_attempt(ClaimedStep *claim)
{
	StepRecord *rec = &claim->rec;

	/* claims select SQL steps only; a row changed by hand must not be run as SQL */
	if (rec->sql == NULL)
	{
		ds_fail_started_attempt(rec, ERRCODE_DATA_CORRUPTED, "the step has no SQL to run",
								psprintf("Its kind is \"%s\".", rec->kind ? rec->kind : "(null)"));
		return;
	}
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(rec->owner)))
	{
		/* never run as anybody else: the step fails closed */
		ds_fail_started_attempt(rec, ERRCODE_UNDEFINED_OBJECT, "the role that created the step no longer exists",
							 psprintf("Role OID %u was dropped.", rec->owner));
		return;
	}
	ds_run_next_attempt(rec, false, true);
}

/*
 * Run the claimed attempts, several to a transaction, each transaction one owner's (claims come
 * sorted by owner): whatever a body leaves to its transaction -- uncommitted rows, open large
 * objects, transaction locks -- is then seen by no other role's body. Each claim's lock is let
 * go once its outcome committed; so are the session-level advisory locks bodies took.
 */
static void
run_claimed(ClaimedStep *claims, int n, bool limited_queue)
{
	int			done = 0;

	ds_poll_cancel_requests(true);
	while (done < n)
	{
		int			first = done;
		int			owner_level;
		TimestampTz opened;

		if (!begin_work("durable_steps: running steps"))
		{
			/* the tables went with the extension; nothing is left to record */
			release_session_locks(&claims[done], n - done);
			break;
		}
		/* a body's pg_advisory_unlock_all() must not free a claim still in flight */
		for (int i = first; i < n; i++)
			ds_step_lock_pin(claims[i].run_id, claims[i].step_id);
		/* the outcomes of this transaction's attempts share their writers' set-up */
		ds_direct_write_batch_begin();
		owner_level = ds_isolation_begin_owner(claims[first].rec.owner);
		opened = GetCurrentTimestamp();
		do
		{
			CHECK_FOR_INTERRUPTS();
			/* pgstat clips the text on a character boundary */
			pgstat_report_activity(STATE_RUNNING,
								   psprintf("durable_steps: running %s/%s attempt %d",
											claims[done].run_id, claims[done].step_id,
											claims[done].attempt));
			run_claimed_attempt(&claims[done]);
			done++;
		} while (done < n && claims[done].rec.owner == claims[first].rec.owner &&
				 !TimestampDifferenceExceeds(opened, GetCurrentTimestamp(), SHARED_TRANSACTION_MS));
		ds_direct_write_batch_end();
		ds_isolation_end_owner(owner_level);
		/*
		 * An attempt of a limited queue that ends makes room in it: another executor may take
		 * the queue's next due step while this one goes on with the rest of its batch.
		 */
		if (limited_queue)
			ds_worker_wake_at_commit();
		/* the claims run now go with the commit; those still to run are held for the session */
		ds_step_lock_release_all_session();
		for (int i = done; i < n; i++)
			if (!ds_step_lock_try_session(claims[i].run_id, claims[i].step_id))
				elog(ERROR, "could not keep the lock of claimed step %s/%s",
					 claims[i].run_id, claims[i].step_id);
		commit_transaction();
	}
	ds_poll_cancel_requests(false);
}

/* Apply a reload of the configuration file, if one was asked for. */
static void
reload_settings_if_asked(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	/* a changed retention applies at once, not at the next purge pass */
	ds_retention_purge_done_reset();
}

/*
 * Record the attempts of worker processes that are gone when one has ended (the epoch of lost
 * attempts moved), and at least once a minute: a running step is in no index of its own (its
 * claim is a HOT update, sql/durable_steps--0.1.0.sql), so looking for lost attempts reads every
 * waiting and running step, too much for every poll interval. A process that ends, however it
 * ends, or that could not record an outcome, moves the epoch (ds_attempts_may_be_lost); a crash
 * restarts the server with a new one. The minute (an executor sleeps no longer than that) is a
 * backstop for a lost attempt no process said anything about, such as a running step restored
 * from a dump. Lost turns have an index (runs_running_idx): once a poll interval, and when the
 * epoch moved.
 */
#define LOST_ATTEMPTS_BACKSTOP_MS (60 * 1000)

static void
recover_if_due(TimestampTz *last_recovery, TimestampTz *last_turn_recovery, uint64 *seen_epoch)
{
	uint64		epoch = ds_lost_attempts_epoch();
	bool		moved = epoch != *seen_epoch;

	if (moved ||
		TimestampDifferenceExceeds(*last_recovery, GetCurrentTimestamp(), LOST_ATTEMPTS_BACKSTOP_MS))
	{
		/* read before the pass: a process that ends during it moves the epoch again */
		*seen_epoch = epoch;
		recover_lost_attempts();
		*last_recovery = GetCurrentTimestamp();
	}
	/*
	 * A run whose turn committed its wait for an event emitted meanwhile, and whose executor
	 * ended before it looked once more (look_for_awaited_events), is woken here.
	 */
	if (moved && begin_work("durable_steps: looking for emitted events"))
	{
		ds_wake_runs_with_emitted_events();
		commit_transaction();
	}
	if (moved ||
		TimestampDifferenceExceeds(*last_turn_recovery, GetCurrentTimestamp(), poll_interval_ms))
	{
		recover_lost_turns();
		*last_turn_recovery = GetCurrentTimestamp();
	}
}

/*
 * Claim a batch of due steps and run it. Returns whether anything was claimed (or the
 * extension went away meanwhile: look again at once); *skipped counts due steps others held.
 */
static bool
claim_and_run_batch(int *skipped)
{
	ClaimedStep *claims;
	ClaimedQueue served;
	int			claimed;
	TimestampTz started = GetCurrentTimestamp();

	*skipped = 0;
	next_isolation = XACT_READ_COMMITTED;
	if (!begin_work("durable_steps: claiming due steps"))
		return true;
	claimed = ds_claim_due_steps(&step_claims, batch_size, last_queue, &served, pass_cxt, &claims,
								 skipped);
	commit_transaction();
	/* the claimed rows have left the due range: no other claim need read past them */
	ds_claim_announce_end();
	if (claimed > 0)
	{
		/* the next claim starts from the queue after this one: no queue waits on another */
		strlcpy(last_queue, served.name, sizeof(last_queue));
		run_claimed(claims, claimed, served.limited);
		ds_claim_size_ran(&step_claims, served.name, claimed, started);
	}
	MemoryContextReset(pass_cxt);
	return claimed > 0;
}

/*
 * How long an executor keeps taking turns of the runs it claimed before it lets those that go on
 * back to the queue (where any executor claims them again): long enough for a short run's every
 * turn, short enough that due steps, other runs and the other loop phases are not kept waiting.
 */
#define HELD_RUNS_MS 250

/* Look once more for the events runs[i] now wait for (awaited[i]): emits that came meanwhile. */
static void
look_for_awaited_events(ClaimedRun *runs, char **awaited, int n)
{
	bool		any = false;

	for (int i = 0; i < n && !any; i++)
		any = awaited[i] != NULL;
	if (!any || !begin_work("durable_steps: looking for awaited events"))
		return;
	for (int i = 0; i < n; i++)
		if (awaited[i] != NULL)
			ds_wake_if_event_emitted(runs[i].run_id, awaited[i]);
	commit_transaction();
}

/*
 * Order held runs by owner, so that one owner's turns can share a transaction, and within an
 * owner's the runs that lost turns before last: each of those takes its turn alone, after the
 * others committed theirs.
 */
static int
compare_held_runs(const void *a, const void *b)
{
	const ClaimedRun *x = (const ClaimedRun *) a;
	const ClaimedRun *y = (const ClaimedRun *) b;

	if (x->owner != y->owner)
		return x->owner < y->owner ? -1 : 1;
	return (x->lost_turns > 0) - (y->lost_turns > 0);
}

/*
 * One round over the runs this executor holds: one turn of each. Turns share transactions the
 * way attempts do (run_claimed): one owner's, for at most a few milliseconds, so that commits --
 * the cost of a turn, each one flushing the WAL -- serve several runs; never two turns of one
 * run, whose next turn must find its last turn's work committed. A run that lost turns before
 * runs alone: a workflow that ends its executor takes no other run's turn with it. Runs that go
 * on (may_continue) stay in runs[], the others are let go after their turn committed. Returns
 * how many are held afterwards, or -1 when the extension is gone (every lock let go).
 */
static int
run_turns_round(ClaimedRun *runs, int n, bool may_continue)
{
	bool	   *goes_on = MemoryContextAllocZero(pass_cxt, sizeof(bool) * n);
	char	  **awaited = MemoryContextAllocZero(pass_cxt, sizeof(char *) * n);
	int			done = 0;
	int			kept = 0;

	qsort(runs, n, sizeof(ClaimedRun), compare_held_runs);
	while (done < n)
	{
		int			first = done;
		bool		alone = runs[first].lost_turns > 0;
		int			owner_level;
		TimestampTz opened;

		CHECK_FOR_INTERRUPTS();
		if (!begin_work("durable_steps: running workflows"))
		{
			ds_step_lock_release_all_session();
			return -1;
		}
		/* the runs held now (those still to take their turn, those going on) stay held ... */
		for (int i = 0; i < n; i++)
			if (i >= first || goes_on[i])
				ds_step_lock_pin(runs[i].run_id, DS_TURN_STEP_ID);
		/* the runs rows this transaction's turns write share their writer's set-up */
		ds_direct_write_batch_begin();
		owner_level = ds_isolation_begin_owner(runs[first].owner);
		opened = GetCurrentTimestamp();
		do
		{
			char	   *wait_for = NULL;

			CHECK_FOR_INTERRUPTS();
			pgstat_report_activity(STATE_RUNNING,
								   psprintf("durable_steps: run %s turn %d", runs[done].run_id,
											runs[done].turn));
			goes_on[done] = ds_run_turn(&runs[done], may_continue, &wait_for);
			if (wait_for != NULL)
				awaited[done] = MemoryContextStrdup(pass_cxt, wait_for);
			done++;
		} while (done < n && runs[done].owner == runs[first].owner &&
				 !alone && runs[done].lost_turns == 0 &&
				 !TimestampDifferenceExceeds(opened, GetCurrentTimestamp(), SHARED_TRANSACTION_MS));
		ds_direct_write_batch_end();
		ds_isolation_end_owner(owner_level);

		/*
		 * ... through this commit: the session locks of the runs let go (and any a workflow or a
		 * step body took) go with it.
		 */
		ds_step_lock_release_all_session();
		for (int i = 0; i < n; i++)
			if ((i >= done || goes_on[i]) &&
				!ds_step_lock_try_session(runs[i].run_id, DS_TURN_STEP_ID))
				elog(ERROR, "could not keep the lock of claimed run %s", runs[i].run_id);
		commit_transaction();
		ds_turn_release();
		/* an event emitted while a turn ran found its run not yet waiting: look once more */
		look_for_awaited_events(&runs[first], &awaited[first], done - first);
	}
	for (int i = 0; i < n; i++)
		if (goes_on[i])
			runs[kept++] = runs[i];
	return kept;
}

/*
 * Claim due runs and take their turns, each run's turns one after another without another claim
 * for as long as it can go on at once (a step done, the next one due), for about HELD_RUNS_MS;
 * runs that came due meanwhile join while there is room. Returns whether anything was claimed.
 */
static bool
claim_and_run_turns(void)
{
	ClaimedRun *held;
	int			n_held;
	int			capacity;
	int			claimed;
	TimestampTz started = GetCurrentTimestamp();

	if (!begin_work("durable_steps: claiming due runs"))
		return true;
	/* the runs held at once: about a claim's worth of work at their recent pace */
	capacity = ds_claim_size(&turn_claims, TURN_QUEUE, batch_size);
	n_held = ds_claim_due_runs(capacity, pass_cxt, &held);
	commit_transaction();
	if (n_held == 0)
		return false;
	claimed = n_held;
	held = repalloc(held, sizeof(ClaimedRun) * capacity);
	ds_poll_cancel_requests(true);
	while (n_held > 0)
	{
		/* the last round lets every run go: none is left claimed when this returns */
		bool		last = TimestampDifferenceExceeds(started, GetCurrentTimestamp(), HELD_RUNS_MS);

		n_held = run_turns_round(held, n_held, !last);
		if (n_held <= 0 || last)
			break;
		if (n_held < capacity && begin_work("durable_steps: claiming due runs"))
		{
			ClaimedRun *more;
			int			n_more;

			/* the held runs' session locks are not touched by this transaction */
			n_more = ds_claim_due_runs(capacity - n_held, pass_cxt, &more);
			commit_transaction();
			if (n_more > 0)
				memcpy(&held[n_held], more, sizeof(ClaimedRun) * n_more);
			n_held += n_more;
			claimed += n_more;
		}
	}
	ds_poll_cancel_requests(false);
	ds_claim_size_ran(&turn_claims, TURN_QUEUE, claimed, started);
	MemoryContextReset(pass_cxt);
	return true;
}

/* Purge what retention allows, in batches, when a purge is due. */
static void
purge_if_due(void)
{
	int			purged;

	if (!ds_retention_purge_due())
		return;
	do
	{
		CHECK_FOR_INTERRUPTS();
		if (!begin_work("durable_steps: purging finished steps"))
			return;
		purged = ds_retention_purge_batch();
		commit_transaction();
	} while (purged >= RETENTION_BATCH);
	ds_retention_purge_done();
}

/* How long to sleep: until the next step is due, at most a poll interval. */
static long
time_until_next_due(int skipped)
{
	TimestampTz next_due;
	long		secs;
	int			usecs;
	long		until_due;

	if (skipped > 0)
		return 5;				/* held by a committing caller for a moment: look again soon */
	if (!begin_work("durable_steps: looking for the next due step"))
		return 0;
	next_due = ds_next_due_time();
	{
		TimestampTz next_run = ds_next_run_wake_time();

		if (next_run != 0 && (next_due == 0 || next_run < next_due))
			next_due = next_run;
	}
	commit_transaction();
	if (next_due == 0)
		return poll_interval_ms;
	TimestampDifference(GetCurrentTimestamp(), next_due, &secs, &usecs);
	until_due = secs * 1000 + (usecs + 999) / 1000;

	/*
	 * A step that is due but was not claimed is locked by a transaction running it (a
	 * synchronous caller); its commit wakes us if it leaves work. Never spin.
	 */
	return until_due > 0 ? Min(poll_interval_ms, until_due) : Min(poll_interval_ms, 25);
}

/* Connect, take the executor's slot and settle the session the steps will run in. */
static void
start_executor(void)
{
	WorkerShared *shared = ds_worker_shared();
	Oid			dbid;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGINT, StatementCancelHandler);
	BackgroundWorkerUnblockSignals();
	memcpy(&dbid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	pgstat_report_appname("durable_steps worker");

	/* the worker's own statements resolve names in pg_catalog only; steps set their own path */
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	begin_transaction("durable_steps: starting");
	ds_isolation_init_session();
	my_database = MemoryContextStrdup(TopMemoryContext, get_database_name(MyDatabaseId));
	commit_transaction();

	if (shared != NULL && my_slot >= 0 && my_slot < DS_MAX_WORKERS)
	{
		shared->executor_latch[my_slot] = MyLatch;
		pg_atomic_write_u64(&shared->cancel_request[my_slot], 0);
		pg_atomic_write_u32(&shared->executor_pid[my_slot], (uint32) MyProcPid);
		pg_atomic_write_u32(&shared->executor_db[my_slot], MyDatabaseId);
		ds_executor_slot = my_slot;
		on_shmem_exit(release_slot, (Datum) 0);
	}
	pass_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps worker pass",
									 ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("durable_steps: worker %d started in database \"%s\"", my_slot,
						 my_database)));
}

void
ds_executor_main(Datum arg)
{
	TimestampTz last_recovery = 0;
	TimestampTz last_turn_recovery = 0;
	/* the epoch is at least 1: an executor that starts looks for lost attempts at once */
	uint64		seen_epoch = 0;

	my_slot = DatumGetInt32(arg);
	start_executor();
	for (;;)
	{
		long		sleep_ms = poll_interval_ms;
		int			skipped;

		CHECK_FOR_INTERRUPTS();
		reload_settings_if_asked();
		if (!ds_worker_must_wait() && extension_ready())
		{
			bool		worked;

			recover_if_due(&last_recovery, &last_turn_recovery, &seen_epoch);
			worked = claim_and_run_batch(&skipped);
			if (claim_and_run_turns() || worked)
				continue;
			purge_if_due();
			sleep_ms = time_until_next_due(skipped);
		}
		/* the backstop of the look for lost attempts (recover_if_due) */
		sleep_ms = Min(sleep_ms, LOST_ATTEMPTS_BACKSTOP_MS);
		if (sleep_ms > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* Log once when a reason to wait comes or goes: *said holds what was last logged. */
static void
log_wait_change(bool now, bool *said, const char *begins, const char *ends)
{
	if (now != *said)
		ereport(LOG, errmsg("durable_steps: %s", now ? begins : ends));
	*said = now;
}

bool
ds_worker_must_wait(void)
{
	static bool said_paused = false;
	static bool said_refused = false;

	log_wait_change(worker_paused, &said_paused,
					"the worker is paused (durable_steps.paused); nothing due runs until it is turned off",
					"the worker is no longer paused; running steps");
	log_wait_change(DefaultXactReadOnly, &said_refused,
					"the server is read-only (default_transaction_read_only); waiting for it to accept writes",
					"the server accepts writes again; running steps");
	return worker_paused || DefaultXactReadOnly;
}

/* begin_work and its commit, for the other workers of a database (http_worker.c). */
bool
ds_worker_begin_work(const char *activity)
{
	return begin_work(activity);
}

void
ds_worker_commit(void)
{
	commit_transaction();
}
