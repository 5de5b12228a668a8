/*
 * executor.c -- an executor: claims due steps and runs their attempts (docs/worker.md).
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
 *   3b. record the outcomes of HTTP steps the HTTP worker kept for an executor, with their
 *      outcome hooks, and the attempts of tasks whose lease ran out (docs/tasks.md);
 *   4. claim due runs and take their turns (run_turn.c), several runs' turns to a transaction,
 *      each run's next turn at once, without another claim, while it can go on;
 *   4b. purge what retention allows;
 *   5. sleep until the earliest next attempt, a commit that makes work due (latch), or the
 *      polling backstop.
 */
#include "base/compat.h"

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

#include "store/direct_write.h"
#include "ipc/executor_slot.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "store/retention.h"
#include "store/task_store.h"
#include "runs/run_map.h"
#include "steps/limits.h"
#include "steps/task_lease.h"
#include "steps/run_context.h"
#include "runs/run_turn.h"
#include "steps/step_attempt.h"
#include "worker/step_claims.h"
#include "steps/step_exec.h"
#include "steps/step_hooks.h"
#include "steps/step_isolation.h"
#include "store/step_lock.h"
#include "store/store_relations.h"
#include "ipc/served_databases.h"
#include "worker/executor.h"
#include "worker/worker_session.h"
#include "ipc/worker_shmem.h"

static int	poll_interval_ms = 1000;
static int	batch_size = 1000;

/* the recent pace of this executor's claims of steps, and of run turns (executor_slot.c) */
static ClaimSizer step_claims;
static ClaimSizer turn_claims;

/* the one "queue" of run turns, for turn_claims */
#define TURN_QUEUE "turns"

/* attempts share a transaction until it has been open this long */
#define SHARED_TRANSACTION_MS 20

static int	my_slot = -1;

/*
 * What the loop keeps from one pass to the next (ds_executor_main): when it last looked for lost
 * attempts and turns, and the epoch of lost attempts it last saw (recover_if_due; at least 1: an
 * executor that starts looks at once); the generation of kept HTTP outcomes and the epoch last
 * looked at for them (kept_outcomes_due).
 */
static TimestampTz last_recovery = 0;
static TimestampTz last_turn_recovery = 0;
static uint64 seen_epoch = 0;
static uint64 seen_kept = 0;
static uint64 seen_kept_epoch = 0;

/* an extra executor (launcher.c): runs only steps of roles not busy, leaves once one is free */
static bool my_extra = false;

/* claims this executor began (claim_and_run_batch) */
static uint64 claims_taken = 0;

/* the queue this executor claimed from last (step_claims.c serves the next one first) */
static char last_queue[NAMEDATALEN] = "";
static MemoryContext pass_cxt = NULL;

/* the name of the database this executor serves, for log lines */
static char *my_database = NULL;

void
ds_executor_init_module(void)
{
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
		ExecutorSlot *slot = &shared->executor[my_slot];

		slot->latch = NULL;
		pg_atomic_write_u32(&slot->db, InvalidOid);
		pg_atomic_write_u32(&slot->pid, 0);
		pg_atomic_write_u64(&slot->cancel_request, 0);
		pg_atomic_write_u64(&slot->claiming, 0);

		/*
		 * the slot's next executor must not look busy with this one's last
		 * attempt
		 */
		pg_atomic_write_u32(&slot->attempt_owner, InvalidOid);
		pg_atomic_write_u64(&slot->attempt_since, 0);
	}

	/*
	 * the attempts this executor had claimed and not recorded are for the
	 * others to record
	 */
	ds_attempts_may_be_lost();
}

/*
 * Exit callback, before the session's locks are let go (before_shmem_exit callbacks run last
 * registered first, so this one before PostgreSQL's own): say which claims this executor
 * started, so that whoever takes a claim's lock next gives the others their attempt back.
 */
static void
publish_started_claims(int code, Datum arg)
{
	ds_publish_started_claims(ds_worker_body_ignored_cancel() ? EXECUTOR_END_BODY :
							  ds_hook_end_cause());
}

/* Say in shared memory what this executor found: the launcher reads it (launcher.c). */
static void
set_executor_state(ExecutorState state)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared != NULL && my_slot >= 0)
		pg_atomic_write_u32(&shared->executor[my_slot].state, state);
}

/*
 * Is the extension installed here, at this library's version? When the worker serves every
 * database, an executor that finds none leaves (the launcher then knows this database has no
 * steps); a listed database's missing extension is waited for, with one log line. An extension
 * installed at another version (a new release's library loaded before ALTER EXTENSION
 * durable_steps UPDATE) is waited for too, with one log line: the executor stays, and its state
 * keeps the launcher from starting the database's other executors and its HTTP worker until
 * the versions match (docs/operations.md, "Upgrades").
 */
static bool
extension_ready(void)
{
	static bool said_missing = false;
	static bool said_version = false;
	static bool served = false;
	char	   *installed;
	bool		ready;
	bool		current = false;

	ds_worker_begin_transaction("durable_steps: looking for the extension");
	installed = ds_store_installed_version();
	ready = installed != NULL;
	if (ready)
	{
		current = strcmp(installed, DS_EXTENSION_VERSION) == 0;
		if (!current && !said_version)
			ereport(LOG,
					(errmsg("durable_steps: extension is installed at version %s in database \"%s\", and the server's library is version %s; waiting for the two to match",
							installed, my_database, DS_EXTENSION_VERSION),
					 errhint("%s", ds_store_version_hint(installed))));
	}
	ds_worker_commit();
	if (ready && !current)
	{
		said_version = true;
		said_missing = false;
		set_executor_state(EXECUTOR_STARTING);
		return false;
	}
	if (ready)
	{
		if (said_missing || said_version)
			ereport(LOG, (errmsg("durable_steps: extension found at version %s; running steps",
								 DS_EXTENSION_VERSION)));
		said_missing = false;
		said_version = false;
		served = true;
		set_executor_state(EXECUTOR_SERVING);
		return true;
	}
	said_version = false;
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
		if (!ds_worker_begin_work("durable_steps: recovering lost attempts"))
			return;
		n = ds_recover_lost_attempts(recover_size, pass_cxt, &recovered);
		ds_worker_commit();
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

		if (!ds_worker_begin_work("durable_steps: recovering lost turns"))
			return;
		n = ds_recover_lost_turns(recover_size, pass_cxt, &run_ids);
		ds_worker_commit();
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

	/*
	 * claims select SQL steps only; a row changed by hand must not be run as
	 * SQL
	 */
	if (rec->sql == NULL)
	{
		ds_fail_started_attempt(rec, ERRCODE_DATA_CORRUPTED, "the step has no SQL to run",
								psprintf("Its kind is \"%s\".", ds_step_kinds[rec->kind].name));
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
 * objects, transaction locks -- is then seen by no other role's body. A step whose last attempt
 * was lost runs alone, after the others (claims come sorted so): should it end the executor
 * again, no other step's outcome goes with it, and the claims not reached get their attempt
 * back (executor_slot.c). Each claim's lock is let go once its outcome committed; so are the
 * session-level advisory locks bodies took.
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

		if (!ds_worker_begin_work("durable_steps: running steps"))
		{
			/* the tables went with the extension; nothing is left to record */
			release_session_locks(&claims[done], n - done);
			break;
		}

		/*
		 * a body's pg_advisory_unlock_all() must not free a claim still in
		 * flight
		 */
		for (int i = first; i < n; i++)
			ds_step_lock_pin(claims[i].run_id, claims[i].step_id);

		/*
		 * the outcomes of this transaction's attempts share their writers'
		 * set-up
		 */
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
			ds_slot_attempt_starting(ds_attempt_cancel_key(claims[done].run_id,
														   claims[done].step_id,
														   claims[done].attempt),
									 claims[done].rec.owner);
			run_claimed_attempt(&claims[done]);
			done++;
		} while (done < n && claims[done].rec.owner == claims[first].rec.owner &&
				 !claims[first].alone && !claims[done].alone && ds_claim_start_room() &&
				 !TimestampDifferenceExceeds(opened, GetCurrentTimestamp(), SHARED_TRANSACTION_MS));
		ds_direct_write_batch_end();
		ds_isolation_end_owner(owner_level);

		/*
		 * An attempt of a limited queue that ends makes room in it: another
		 * executor may take the queue's next due step while this one goes on
		 * with the rest of its batch.
		 */
		if (limited_queue)
			ds_worker_wake_at_commit();

		/*
		 * the claims run now go with the commit; those still to run are held
		 * for the session
		 */
		ds_step_lock_release_all_session();
		for (int i = done; i < n; i++)
			if (!ds_step_lock_try_session(claims[i].run_id, claims[i].step_id))
				elog(ERROR, "could not keep the lock of claimed step %s/%s",
					 claims[i].run_id, claims[i].step_id);
		ds_worker_commit();
		ds_claims_settled();
	}
	ds_slot_idle();
	ds_poll_cancel_requests(false);
}

/*
 * Apply a reload of the configuration file, if one was asked for; a changed retention applies
 * at once, not at the next purge pass. Returns whether it did.
 */
static bool
reload_settings_if_asked(void)
{
	return ds_worker_reload_settings_if_asked(ds_retention_purge_done_reset);
}

/*
 * In the middle of a pass, before its next claim: apply a reload asked for meanwhile (a partition
 * fenced is no longer claimed: docs/partitions.md), and say whether the worker must wait now. The
 * pass looked whether to wait at the top of the loop; a reload since may have made the server
 * read-only (default_transaction_read_only), which refuses the writes of every transaction that
 * begins after it (25006): the executor waits there instead.
 */
static bool
reload_and_must_wait(void)
{
	return reload_settings_if_asked() && ds_worker_must_wait();
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
		/*
		 * read before the pass: a process that ends during it moves the epoch
		 * again
		 */
		*seen_epoch = epoch;
		recover_lost_attempts();
		*last_recovery = GetCurrentTimestamp();
	}

	/*
	 * A run whose turn committed its wait for an event emitted meanwhile, and
	 * whose executor ended before it looked once more
	 * (look_for_awaited_events), is woken here.
	 */
	if (moved && ds_worker_begin_work("durable_steps: looking for emitted events"))
	{
		ds_wake_runs_with_emitted_events();
		ds_worker_commit();
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
	Oid			busy[DS_MAX_WORKERS];
	int			n_busy;

	*skipped = 0;
	if (!ds_worker_begin_work_isolated("durable_steps: claiming due steps", XACT_READ_COMMITTED))
		return true;

	/*
	 * Roles whose attempts have held other executors for long are passed by
	 * while others' steps are due; an extra executor never runs theirs
	 * (docs/queues.md, "Fair share between roles").
	 */
	n_busy = ds_busy_owners(MyDatabaseId, my_slot, busy);

	/*
	 * An executor of the database's own passes them by every other claim
	 * only: a busy role's other steps are not kept waiting for as long as
	 * others keep steps due.
	 */
	if (!my_extra && (++claims_taken % 2) == 0)
		n_busy = 0;
	claimed = ds_claim_due_steps(&step_claims, batch_size, last_queue, busy, n_busy, &served,
								 pass_cxt, &claims, skipped);
	if (claimed == 0 && n_busy > 0 && !my_extra)
		claimed = ds_claim_due_steps(&step_claims, batch_size, last_queue, NULL, 0, &served,
									 pass_cxt, &claims, skipped);
	ds_worker_commit();

	/*
	 * the claimed rows have left the due range: no other claim need read past
	 * them
	 */
	ds_claim_announce_end();
	if (claimed > 0)
	{
		/*
		 * the next claim starts from the queue after this one: no queue waits
		 * on another
		 */
		strlcpy(last_queue, served.name, sizeof(last_queue));
		run_claimed(claims, claimed, served.limited);
		ds_claim_size_ran(&step_claims, served.name, claimed, started);
	}
	MemoryContextReset(pass_cxt);
	return claimed > 0;
}

/*
 * Are there kept HTTP outcomes to look for? When one was kept since the last look (the HTTP
 * worker moves the generation after its commit), or a worker process ended since (an executor
 * that had taken a hook and is gone). Both are read before the look, so whatever moves them
 * meanwhile is looked for in the next pass: the look is not a query on every pass.
 */
static bool
kept_outcomes_due(uint64 *seen_kept, uint64 *seen_epoch)
{
	uint64		kept = ds_kept_outcomes_generation();
	uint64		epoch = ds_lost_attempts_epoch();
	bool		due = kept != *seen_kept || epoch != *seen_epoch;

	*seen_kept = kept;
	*seen_epoch = epoch;
	return due;
}

/*
 * Record the outcomes of HTTP steps that the HTTP worker kept for an executor, each with its
 * hook (docs/steps.md, "Outcome hooks"): no user code runs in the HTTP worker. Each hook is first taken
 * in a transaction of its own (the step's claimed_by names this executor), so that a hook whose
 * executor ends -- one that ignored its cancellation -- is not run again by itself but blocks
 * its step (ds_record_kept_outcome); then it runs, alone in its transaction. Returns how many
 * were found, -1 when the extension is gone.
 */
static int
record_kept_outcomes(void)
{
	char	  **run_ids;
	char	  **step_ids;
	int			n;

	if (!ds_worker_begin_work("durable_steps: looking for kept HTTP outcomes"))
		return -1;
	n = ds_find_kept_outcomes(batch_size, pass_cxt, &run_ids, &step_ids);
	ds_worker_commit();
	for (int i = 0; i < n; i++)
	{
		StepRecord	rec;
		bool		take;

		CHECK_FOR_INTERRUPTS();
		if (!ds_step_lock_try_session(run_ids[i], step_ids[i]))
			continue;			/* another executor has it */
		if (!ds_worker_begin_work("durable_steps: taking an HTTP step's hook"))
		{
			ds_step_lock_release_session(run_ids[i], step_ids[i]);
			break;
		}
		take = ds_lock_step_row(run_ids[i], step_ids[i], &rec) &&
			rec.status == STEP_RUNNING && rec.kept_outcome != NULL;
		if (take && rec.claimed_by != 0)
		{
			/* the executor that took its hook is gone */
			ds_record_kept_outcome(&rec, true);
			take = false;
		}
		else if (take)
		{
			rec.claimed_by = MyProcPid;
			ds_store_update_step(&rec);
		}
		ds_worker_commit();
		if (take && ds_worker_begin_work("durable_steps: running an HTTP step's hook"))
		{
			/*
			 * the step's lock outlives the release of the hook's session
			 * advisory locks
			 */
			ds_step_lock_pin(run_ids[i], step_ids[i]);
			if (ds_lock_step_row(run_ids[i], step_ids[i], &rec) &&
				rec.status == STEP_RUNNING && rec.kept_outcome != NULL)
			{
				int			owner_level = ds_isolation_begin_owner(rec.owner);

				pgstat_report_activity(STATE_RUNNING,
									   psprintf("durable_steps: running the hook of %s/%s",
												rec.run_id, rec.step_id));
				ds_record_kept_outcome(&rec, false);
				ds_isolation_end_owner(owner_level);
			}
			ds_step_lock_release_all_session();
			ds_worker_commit();
		}
		else
			ds_step_lock_release_session(run_ids[i], step_ids[i]);
	}
	MemoryContextReset(pass_cxt);
	return n;
}

/* When to look next for task leases that ran out (record_expired_task_leases). */
static TimestampTz next_lease_look = 0;

/*
 * Record the attempts of tasks whose lease ran out: lost (or timed out), retried by their
 * policies, or uncertain when the task says so (ds_record_expired_task_lease). An application
 * worker that pauses, dies or loses its connection stops renewing its lease; this is where its
 * attempt ends. Looked for when the earliest lease ends, and once a poll interval for leases
 * taken since (running tasks are few: steps_limited_running_idx holds them). Returns how many
 * were recorded.
 */
static int
record_expired_task_leases(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next;
	char	  **run_ids;
	char	  **step_ids;
	int			n;
	int			recorded = 0;

	if (now < next_lease_look)
		return 0;
	if (!ds_worker_begin_work("durable_steps: looking for task leases that ran out"))
		return 0;
	n = ds_find_expired_task_leases(now, batch_size, pass_cxt, &run_ids, &step_ids);
	ds_worker_commit();
	for (int i = 0; i < n; i++)
	{
		StepRecord	rec;

		CHECK_FOR_INTERRUPTS();
		if (!ds_worker_begin_work("durable_steps: recording a task lease that ran out"))
			break;

		/*
		 * a worker's outcome or heartbeat in flight holds it: looked at again
		 * next time
		 */
		if (ds_step_lock_acquire(run_ids[i], step_ids[i], true) &&
			ds_lock_step_row(run_ids[i], step_ids[i], &rec))
		{
			/* an outcome hook the loss runs runs as the task's owner */
			int			owner_level = ds_isolation_begin_owner(rec.owner);

			if (ds_record_expired_task_lease(&rec, GetCurrentTimestamp()))
				recorded++;
			ds_isolation_end_owner(owner_level);
		}
		ds_worker_commit();
	}
	MemoryContextReset(pass_cxt);
	if (n >= batch_size)
		return recorded;		/* more may have run out: look again at once */
	if (!ds_worker_begin_work("durable_steps: looking for the next end of a task lease"))
		return recorded;
	next = ds_store_next_task_lease_end();
	ds_worker_commit();
	now = GetCurrentTimestamp();
	next_lease_look = TimestampTzPlusMilliseconds(now, poll_interval_ms);
	if (next != 0 && next < next_lease_look)
		next_lease_look = next;
	return recorded;
}

/* When to look next for held steps to admit (admit_limited_steps), besides when a commit asks. */
static TimestampTz next_admission_look = 0;
static uint64 seen_admissions = 0;

/*
 * Admit the held steps of limits that may now run (docs/limits.md): when a commit held a step
 * or let an admission go (the generation moved; 0 at the start, so an executor that starts
 * looks at once, for steps held before a restart), or when a key's next token, a pause's end or
 * a held step's time comes. Returns how many it admitted.
 */
static int
admit_limited_steps(void)
{
	uint64		generation = ds_limit_admissions_generation();
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next;
	int			admitted;

	if (generation == seen_admissions && (next_admission_look == 0 || now < next_admission_look))
		return 0;
	seen_admissions = generation;
	if (!ds_worker_begin_work("durable_steps: admitting steps of limits"))
		return 0;
	admitted = ds_admit_limited_steps(now, &next);
	ds_worker_commit();

	/*
	 * at the latest a poll interval on: steps held by a write that asked
	 * nobody (ds_partition_import, a restore, an operator's UPDATE) are
	 * admitted too
	 */
	next_admission_look = TimestampTzPlusMilliseconds(now, poll_interval_ms);
	if (next != 0 && next < next_admission_look)
		next_admission_look = next;
	return admitted;
}

static uint64 seen_map_settles = 0;
static TimestampTz next_map_look = 0;

/*
 * Join the maps whose items have all settled (runs/run_map.c): when a commit settled an item of
 * a map (the generation moved; 0 at the start, so an executor that starts looks at once, for
 * items settled before a restart). Returns how many it joined.
 */
static int
join_settled_maps(void)
{
	uint64		generation = ds_map_settles_generation();
	TimestampTz now = GetCurrentTimestamp();
	int			joined;

	/*
	 * and at the latest a poll interval on, should a look have missed a
	 * commit
	 */
	if (generation == seen_map_settles && now < next_map_look)
		return 0;
	seen_map_settles = generation;
	next_map_look = TimestampTzPlusMilliseconds(now, poll_interval_ms);
	if (!ds_worker_begin_work("durable_steps: joining maps"))
		return 0;
	joined = ds_join_settled_maps(batch_size);
	ds_worker_commit();
	/* a full look may have left more: look again in the next pass */
	if (joined >= batch_size)
		seen_map_settles = 0;
	return joined;
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
	if (!any || !ds_worker_begin_work("durable_steps: looking for awaited events"))
		return;
	for (int i = 0; i < n; i++)
		if (awaited[i] != NULL)
			ds_wake_if_event_emitted(runs[i].run_id, runs[i].owner, awaited[i]);
	ds_worker_commit();
}

/*
 * Order held runs by owner, so that one owner's turns can share a transaction, and within an
 * owner's the runs that lost turns before last: each of those takes its turn alone, after the
 * others committed theirs. Then by run id.
 */
static int
compare_held_runs(const void *a, const void *b)
{
	const ClaimedRun *x = (const ClaimedRun *) a;
	const ClaimedRun *y = (const ClaimedRun *) b;

	if (x->owner != y->owner)
		return x->owner < y->owner ? -1 : 1;
	if ((x->lost_turns > 0) != (y->lost_turns > 0))
		return (x->lost_turns > 0) - (y->lost_turns > 0);
	/* an order that does not depend on where the rows happen to lie */
	return strcmp(x->run_id, y->run_id);
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
		if (!ds_worker_begin_work("durable_steps: running workflows"))
		{
			ds_step_lock_release_all_session();
			return -1;
		}

		/*
		 * the runs held now (those still to take their turn, those going on)
		 * stay held ...
		 */
		for (int i = 0; i < n; i++)
			if (i >= first || goes_on[i])
				ds_step_lock_pin(runs[i].run_id, DS_TURN_STEP_ID);

		/*
		 * the runs rows this transaction's turns write share their writer's
		 * set-up
		 */
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
			ds_slot_turn_starting(runs[done].owner);
			goes_on[done] = ds_run_turn(&runs[done], may_continue, &wait_for);
			if (wait_for != NULL)
				awaited[done] = MemoryContextStrdup(pass_cxt, wait_for);
			done++;
		} while (done < n && runs[done].owner == runs[first].owner &&
				 !alone && runs[done].lost_turns == 0 && ds_claim_start_room() &&
				 !TimestampDifferenceExceeds(opened, GetCurrentTimestamp(), SHARED_TRANSACTION_MS));
		ds_direct_write_batch_end();
		ds_isolation_end_owner(owner_level);

		/*
		 * ... through this commit: the session locks of the runs let go (and
		 * any a workflow or a step body took) go with it.
		 */
		ds_step_lock_release_all_session();
		for (int i = 0; i < n; i++)
			if ((i >= done || goes_on[i]) &&
				!ds_step_lock_try_session(runs[i].run_id, DS_TURN_STEP_ID))
				elog(ERROR, "could not keep the lock of claimed run %s", runs[i].run_id);
		ds_worker_commit();
		ds_turn_release();
		ds_slot_idle();

		/*
		 * an event emitted while a turn ran found its run not yet waiting:
		 * look once more
		 */
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

	if (!ds_worker_begin_work("durable_steps: claiming due runs"))
		return true;

	/*
	 * the runs held at once: about a claim's worth of work at their recent
	 * pace
	 */
	capacity = ds_claim_size(&turn_claims, TURN_QUEUE, batch_size, FIRST_TURN_CLAIM_SIZE);
	n_held = ds_claim_due_runs(capacity, pass_cxt, &held);
	ds_worker_commit();
	if (n_held == 0)
		return false;
	claimed = n_held;
	held = repalloc(held, sizeof(ClaimedRun) * capacity);
	ds_poll_cancel_requests(true);
	while (n_held > 0)
	{
		/*
		 * the last round lets every run go: none is left claimed when this
		 * returns
		 */
		bool		last = TimestampDifferenceExceeds(started, GetCurrentTimestamp(), HELD_RUNS_MS);

		n_held = run_turns_round(held, n_held, !last);
		if (n_held <= 0 || last)
			break;
		if (n_held < capacity && ds_worker_begin_work("durable_steps: claiming due runs"))
		{
			ClaimedRun *more;
			int			n_more;

			/*
			 * the held runs' session locks are not touched by this
			 * transaction
			 */
			n_more = ds_claim_due_runs(capacity - n_held, pass_cxt, &more);
			ds_worker_commit();
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
		if (!ds_worker_begin_work("durable_steps: purging finished steps"))
			return;
		purged = ds_retention_purge_batch();
		ds_worker_commit();
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
		return 5;				/* held by a committing caller for a moment:
								 * look again soon */
	if (!ds_worker_begin_work("durable_steps: looking for the next due step"))
		return 0;
	next_due = ds_next_due_time();
	{
		TimestampTz next_run = ds_next_run_wake_time();

		if (next_run != 0 && (next_due == 0 || next_run < next_due))
			next_due = next_run;
	}
	ds_worker_commit();
	/* a task lease that ends first wakes the executor to record it */
	if (next_lease_look != 0 && (next_due == 0 || next_lease_look < next_due))
		next_due = next_lease_look;
	/* and a held step that may be admitted, to admit it */
	if (next_admission_look != 0 && (next_due == 0 || next_admission_look < next_due))
		next_due = next_admission_look;
	if (next_due == 0)
		return poll_interval_ms;
	TimestampDifference(GetCurrentTimestamp(), next_due, &secs, &usecs);
	until_due = secs * 1000 + (usecs + 999) / 1000;

	/*
	 * A step that is due but was not claimed is locked by a transaction
	 * running it (a synchronous caller); its commit wakes us if it leaves
	 * work. Never spin.
	 */
	return until_due > 0 ? Min(poll_interval_ms, until_due) : Min(poll_interval_ms, 25);
}

/* Connect, take the executor's slot and settle the session the steps will run in. */
static void
start_executor(void)
{
	WorkerShared *shared = ds_worker_shared();

	/* an extra executor (launcher.c) says so after the database's OID */
	memcpy(&my_extra, MyBgworkerEntry->bgw_extra + sizeof(Oid), sizeof(bool));
	(void) ds_worker_connect("durable_steps worker", true, true);

	/*
	 * the worker's own statements resolve names in pg_catalog only; steps set
	 * their own path
	 */
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	ds_worker_begin_transaction("durable_steps: starting");
	ds_isolation_init_session();
	my_database = MemoryContextStrdup(TopMemoryContext, get_database_name(MyDatabaseId));
	ds_worker_commit();

	if (shared != NULL && my_slot >= 0 && my_slot < DS_MAX_WORKERS)
	{
		ExecutorSlot *slot = &shared->executor[my_slot];

		slot->latch = MyLatch;
		pg_atomic_write_u64(&slot->cancel_request, 0);

		/*
		 * a slot whose last executor crashed may still say whose attempt it
		 * ran
		 */
		pg_atomic_write_u32(&slot->attempt_owner, InvalidOid);
		pg_atomic_write_u64(&slot->attempt_since, 0);
		pg_atomic_write_u32(&slot->pid, (uint32) MyProcPid);
		pg_atomic_write_u32(&slot->db, MyDatabaseId);
		ds_executor_slot = my_slot;
		/* the partitions it serves: those of the settings it started with */
		ds_fence_note_applied();
		on_shmem_exit(release_slot, (Datum) 0);
		before_shmem_exit(publish_started_claims, (Datum) 0);
	}
	pass_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps worker pass",
									 ALLOCSET_DEFAULT_SIZES);
	if (my_extra)
		ereport(LOG, (errmsg("durable_steps: extra worker %d started in database \"%s\"", my_slot,
							 my_database),
					  errdetail("Every executor of the database has run one attempt for more than %d ms.",
								DS_BUSY_ATTEMPT_MS)));
	else
		ereport(LOG, (errmsg("durable_steps: worker %d started in database \"%s\"", my_slot,
							 my_database)));
}

/* What a pass returns besides a time to sleep (ms): go round again at once; leave. */
#define PASS_AGAIN (-1)
#define PASS_LEAVE (-2)

/*
 * One pass of an extra executor: it records lost attempts and turns when a worker process ended
 * (the database's own executors are busy), and runs the due steps of roles that are not busy;
 * nothing else (no workflow turns, no kept HTTP outcomes, no purge). Returns PASS_LEAVE when it
 * is to leave: it found nothing to run and an executor of its database is free again (or the
 * worker waits, or the extension is gone).
 */
static long
extra_pass(void)
{
	int			skipped = 0;

	reload_settings_if_asked();
	if (ds_worker_must_wait() || !extension_ready())
		return PASS_LEAVE;

	/*
	 * the database's own executors are busy: a process that ends must not
	 * wait for them
	 */
	recover_if_due(&last_recovery, &last_turn_recovery, &seen_epoch);
	if (claim_and_run_batch(&skipped))
		return PASS_AGAIN;
	if (!ds_executors_all_busy(MyDatabaseId, my_slot))
		return PASS_LEAVE;
	return Min(time_until_next_due(skipped), DS_BUSY_ATTEMPT_MS);
}

/*
 * One pass of an executor of the database's own (docs/worker.md, "What an executor does").
 * Returns how long to sleep, or PASS_AGAIN when it worked: there may be more.
 */
static long
executor_pass(void)
{
	int			skipped;
	bool		worked;

	if (ds_worker_must_wait() || !extension_ready())
		return poll_interval_ms;
	recover_if_due(&last_recovery, &last_turn_recovery, &seen_epoch);
	if (reload_and_must_wait())
		return poll_interval_ms;
	worked = admit_limited_steps() > 0;
	worked |= join_settled_maps() > 0;
	worked |= claim_and_run_batch(&skipped);
	worked |= record_expired_task_leases() > 0;
	if (kept_outcomes_due(&seen_kept, &seen_kept_epoch))
	{
		int			kept = record_kept_outcomes();

		/* a full look may have left more: look again in the next pass */
		if (kept != 0)
			seen_kept = 0;
		worked |= kept != 0;
	}
	/* a batch of steps may have taken long: the reload, and the look, again */
	if (reload_and_must_wait())
		return poll_interval_ms;
	if (claim_and_run_turns() || worked)
		return PASS_AGAIN;
	purge_if_due();
	return time_until_next_due(skipped);
}

/*
 * After a write refused by a server turned read-only (ds_worker_caught_read_only rolled back the
 * transaction, every write of the attempts and turns it ran with it): let go of what the pass
 * held, as an executor that ended would, and keep the process. Which of its claims had started in
 * the rolled-back transaction is published first (executor_slot.c), then the claims' locks are
 * let go and the others told: the first look for lost attempts once the server accepts writes
 * records those that may have run as lost (DS007; retried by their policies), and gives the
 * others their attempt back. The claim announced, the owner the executor was busy with, the
 * turn, the cancel poll and the pass's memory are let go too.
 */
static void
let_go_after_read_only(void)
{
	ds_publish_started_claims(EXECUTOR_END_OTHER);
	ds_step_lock_release_all_session();
	ds_claim_announce_end();
	ds_turn_release();
	ds_slot_idle();
	ds_poll_cancel_requests(false);
	ds_isolation_reset_after_abort();
	ds_isolation_reseed_random();
	MemoryContextReset(pass_cxt);
	ds_attempts_may_be_lost();
}

/*
 * One pass, of an extra executor or not. A write refused because the server turned read-only
 * in the middle of the pass (25006) does not end the executor: it lets go of what it held and
 * waits, as at the top of its loop. Any other error ends it, as before.
 */
static long
run_pass(void)
{
	volatile long sleep_ms = PASS_AGAIN;

	PG_TRY();
	{
		sleep_ms = my_extra ? extra_pass() : executor_pass();
	}
	PG_CATCH();
	{
		if (!ds_worker_caught_read_only())
			PG_RE_THROW();
		let_go_after_read_only();
		sleep_ms = PASS_AGAIN;
	}
	PG_END_TRY();
	return sleep_ms;
}

void
ds_executor_main(Datum arg)
{
	my_slot = DatumGetInt32(arg);
	start_executor();
	for (;;)
	{
		long		sleep_ms;

		CHECK_FOR_INTERRUPTS();
		reload_settings_if_asked();
		ds_worker_end_if_outdated();
		/* between passes: it holds no claim */
		if (ds_worker_shared() != NULL &&
			pg_atomic_read_u32(&ds_worker_shared()->executor[my_slot].leave_requested) != 0)
		{
			ereport(LOG, (errmsg("durable_steps: worker %d leaves database \"%s\" for a database without a worker",
								 my_slot, my_database)));
			proc_exit(0);
		}
		sleep_ms = run_pass();
		if (sleep_ms == PASS_LEAVE)
		{
			ereport(LOG, (errmsg("durable_steps: extra worker %d leaves database \"%s\"", my_slot,
								 my_database)));
			proc_exit(0);
		}
		if (sleep_ms == PASS_AGAIN)
			continue;
		/* the backstop of the look for lost attempts (recover_if_due) */
		sleep_ms = Min(sleep_ms, LOST_ATTEMPTS_BACKSTOP_MS);
		if (sleep_ms > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
