/*
 * http_worker.c -- the HTTP worker's process: one per served database, that claims due HTTP
 * steps and sends their requests (docs/http.md, "The HTTP worker"). It owns the loop -- what to
 * claim and when, when to send, when to record, how long to wait, what to do while the worker
 * must wait (paused, read-only) -- and the claims' checks before a request may leave. libcurl's
 * plumbing is http/http_transfer.c's; turning a finished transfer into the step's recorded
 * attempt is http_outcomes.c's.
 *
 * One pass of the loop:
 *   1. let libcurl move every transfer along; no transaction is open while the network is
 *      waited for;
 *   2. in one transaction: record the finished attempts' outcomes, each in a subtransaction
 *      of its own (http_outcomes.c), and -- when woken by a commit or when a step is due, and
 *      slots are free -- claim due HTTP steps as started (status running, attempt counted, this
 *      process the claimant, each step's session lock held); COMMIT; then let go of the
 *      recorded steps' locks and start the claimed requests: an attempt is durable before its
 *      request leaves. Outcomes and claims are batched (a quarter of the slots, or a few
 *      milliseconds), so that one commit serves many steps;
 *   3. wait: on the transfers' sockets while any is in flight, else on the latch until the next
 *      step is due or the polling backstop.
 *
 * A worker that dies leaves its attempts running with their locks gone: the executors' recovery
 * records them as lost (docs/worker.md), and they are sent again with the same idempotency key,
 * or end uncertain when a repeat would not be safe.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/pmsignal.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "base/key.h"
#include "base/worker_attempt_time.h"
#include "http/http_addresses.h"
#include "http/http_request.h"
#include "http/http_transfer.h"
#include "ipc/executor_slot.h"
#include "ipc/served_databases.h"
#include "ipc/step_counters.h"
#include "ipc/worker_shmem.h"
#include "store/step_lock.h"
#include "worker/http_claims.h"
#include "worker/http_outcomes.h"
#include "worker/http_worker.h"
#include "worker/worker_session.h"

static int	max_inflight = 64;
static int	max_inflight_per_role = 48;
static int	http_poll_interval_ms = 1000;

/* Longest wait on the sockets before looking at the latch again. */
#define SOCKET_WAIT_MS 20
/* Longest time a finished transfer waits for others to share its outcome's commit. */
#define RECORD_DELAY_MS 5

void
ds_http_worker_init_module(void)
{
	DefineCustomIntVariable("durable_steps.http_max_inflight",
							"Most HTTP requests the HTTP worker has in flight at once.",
							NULL,
							&max_inflight,
							64,
							1,
							1024,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("durable_steps.http_max_inflight_per_role",
							"Most HTTP requests of one role the HTTP worker has in flight at once.",
							"Keeps the rest of durable_steps.http_max_inflight for the other roles: one role's requests that hang until their timeout cannot take every slot.",
							&max_inflight_per_role,
							48,
							1,
							1024,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
	/* durable_steps.http_max_response_size and http_proxy: the transfers' own */
	ds_http_transfer_init_module();
}

/* A claim batch's memory: freed when its last attempt has been recorded. */
struct ClaimBatch
{
	MemoryContext cxt;
	int			pending;
};

/* The attempts whose requests are in libcurl's hands, and those finished and not yet recorded. */
static dlist_head attempts_in_flight = DLIST_STATIC_INIT(attempts_in_flight);
static dlist_head finished_attempts = DLIST_STATIC_INIT(finished_attempts);
static int	n_in_flight = 0;
static int	n_finished = 0;

/* The memory of one pass's outcomes, reset once they are committed. */
static MemoryContext outcome_cxt = NULL;

/* When the finished attempt that has waited longest for its outcome's commit finished. */
static TimestampTz
oldest_finished_at(void)
{
	HttpAttempt *oldest = dlist_container(HttpAttempt, node, dlist_head_node(&finished_attempts));

	return oldest->transfer.finished_at;
}

/* An attempt is done with: its memory goes with its batch's last one. */
static void
free_attempt(HttpAttempt *attempt)
{
	ClaimBatch *batch = attempt->batch;

	ds_http_transfer_release(&attempt->transfer);
	if (--batch->pending == 0)
	{
		MemoryContextDelete(batch->cxt);
		pfree(batch);
	}
}

/* The idempotency key of the step, header-safe, as ds_idempotency_key() hands it (key.h). */
static char *
step_idempotency_key(const StepRecord *step)
{
	StringInfoData buf;

	initStringInfo(&buf);
	ds_append_step_key(&buf, step->run_id, step->step_id);
	return buf.data;
}

/*
 * In the claim's transaction: read the claimed step's stored request (it may be TOASTed) and
 * check it again; a request that can no longer be sent is refused without sending.
 */
static void
prepare_attempt(HttpAttempt *attempt)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	volatile HostVerdict verdict = HOST_REFUSED;
	StepRecord *step = &attempt->step;
	Jsonb	   *request = DatumGetJsonbP(PointerGetDatum(step->request));

	attempt->repeat_safe = ds_http_repeat_is_safe(step->idempotency_header, request);
	if (step->idempotency_header != NULL)
		attempt->idempotency_key = step_idempotency_key(step);

	/*
	 * the parser only allocates and raises: its error is caught without a
	 * subtransaction
	 */
	PG_TRY();
	{
		ds_http_parse_request(request, &attempt->request);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		ds_http_attempt_refuse(attempt, ATTEMPT_PERMANENT, edata->sqlerrcode,
							   psprintf("stored HTTP request is invalid: %s", edata->message),
							   NULL, NULL);
		return;
	}
	PG_END_TRY();

	/*
	 * The owner's right to send ends with the role or its membership: a step
	 * is sent only while its owner exists and has the privileges of
	 * durable_steps_http, checked as the host is.
	 */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(step->owner)))
		ds_http_attempt_refuse(attempt, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
							   pstrdup("the role that created the step no longer exists"),
							   psprintf("Role OID %u was dropped; nothing was sent.", step->owner),
							   pstrdup("A superuser can give the step to a role that may send it (UPDATE durable_steps.steps SET owner = ...); then re-arm it with ds_retry_step()."));
	else if (!has_privs_of_role(step->owner, get_role_oid("durable_steps_http", true)))
		ds_http_attempt_refuse(attempt, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
							   psprintf("role %s may no longer send HTTP steps",
										GetUserNameFromId(step->owner, false)),
							   pstrdup("It no longer has the privileges of durable_steps_http; nothing was sent."),
							   pstrdup("GRANT durable_steps_http TO the role; then re-arm the step with ds_retry_step()."));
	else if ((verdict = ds_http_host_allowed(attempt->request.host,
											 attempt->request.port)) == HOST_REFUSED)
		ds_http_attempt_refuse(attempt, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
							   psprintf("host \"%s\" is not allowed for HTTP steps",
										attempt->request.host),
							   pstrdup("durable_steps.http_allowed_hosts no longer lists it; nothing was sent."),
							   pstrdup("A superuser can add the host to durable_steps.http_allowed_hosts; then re-arm the step with ds_retry_step()."));

	/*
	 * Through a proxy the connection goes to the proxy, which resolves the
	 * host itself: the address rules cannot see where the request goes, so
	 * only a host allowed by name is sent.
	 */
	else if (verdict == HOST_IF_ADDRESS_ALLOWED && ds_http_proxy_set())
		ds_http_attempt_refuse(attempt, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
							   psprintf("host \"%s\" is not allowed for HTTP steps through a proxy",
										attempt->request.host),
							   pstrdup("durable_steps.http_allowed_hosts allows it only by an address range, which cannot be checked through durable_steps.http_proxy; nothing was sent."),
							   pstrdup("A superuser can list the host by name; then re-arm the step with ds_retry_step()."));
	attempt->by_name = verdict == HOST_ALLOWED;
	attempt->check_addresses = !ds_http_proxy_set();
}

/*
 * In the current transaction: claim up to `free_slots` due HTTP steps and prepare their
 * attempts; returns how many (*attempts is allocated in their batch's memory).
 */
static int
claim_batch(int free_slots, HttpAttempt ***attempts)
{
	ClaimedStep *claims;
	ClaimBatch *batch;
	int			n;

	batch = MemoryContextAllocZero(TopMemoryContext, sizeof(ClaimBatch));
	batch->cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps HTTP claims",
									   ALLOCSET_DEFAULT_SIZES);
	{
		Oid		   *owners = palloc(sizeof(Oid) * (n_in_flight + 1));
		int			n_owners = 0;
		dlist_iter	it;

		dlist_foreach(it, &attempts_in_flight)
			owners[n_owners++] = dlist_container(HttpAttempt, node, it.cur)->step.owner;
		PG_TRY();
		{
			n = ds_claim_due_http_steps(free_slots, owners, n_owners,
										Min(max_inflight_per_role, max_inflight), batch->cxt,
										&claims);
		}
		PG_CATCH();
		{
			/*
			 * the batch's memory goes with a claim that failed: the process
			 * may go on (a server turned read-only, record_and_claim)
			 */
			MemoryContextSwitchTo(TopMemoryContext);
			MemoryContextDelete(batch->cxt);
			pfree(batch);
			PG_RE_THROW();
		}
		PG_END_TRY();
	}
	*attempts = MemoryContextAlloc(batch->cxt, sizeof(HttpAttempt *) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(batch->cxt);
		HttpAttempt *attempt = palloc0(sizeof(HttpAttempt));

		attempt->batch = batch;
		attempt->step = claims[i].rec;
		/* the claim wrote the row last: its updated_at is the claim's time */
		attempt->claimed_at = attempt->step.updated_at;
		prepare_attempt(attempt);
		MemoryContextSwitchTo(oldcxt);
		(*attempts)[i] = attempt;
	}
	batch->pending = n;
	if (n == 0)
	{
		MemoryContextDelete(batch->cxt);
		pfree(batch);
	}
	return n;
}

/* Hand an attempt's request to libcurl; false when libcurl could not take it. */
static bool
send_request(HttpAttempt *attempt)
{
	HttpTransferOptions options;

	options.idempotency_header = attempt->step.idempotency_header;
	options.idempotency_key = attempt->idempotency_key;
	options.repeat_safe = attempt->repeat_safe;
	options.timeout_ms = ds_worker_attempt_limit_usecs(attempt->step.timeout) / 1000;
	options.check_addresses = attempt->check_addresses;
	options.by_name = attempt->by_name;
	return ds_http_transfer_start(&attempt->transfer, &attempt->request, &options, attempt);
}

/* After the claims committed: send their requests (only now may they leave). */
static void
send_claimed_requests(HttpAttempt **attempts, int n)
{
	/* the connection check reads the address settings as they are now */
	ds_http_address_rules_refresh(ds_http_allowed_hosts());
	for (int i = 0; i < n; i++)
	{
		HttpAttempt *attempt = attempts[i];

		if (!attempt->refused && !send_request(attempt))
			ds_http_attempt_refuse(attempt, ATTEMPT_RETRYABLE, ERRCODE_DS_HTTP_NOT_SENT,
								   pstrdup("HTTP request was not sent: libcurl could not set it up"),
								   NULL, NULL);
		if (attempt->refused)
		{
			ds_http_transfer_not_started(&attempt->transfer);
			dlist_push_tail(&finished_attempts, &attempt->node);
			n_finished++;
		}
		else
		{
			dlist_push_tail(&attempts_in_flight, &attempt->node);
			n_in_flight++;
		}
	}
}

/* Let libcurl move every transfer along, and move the attempts it finished to finished_attempts. */
static void
advance_transfers(void)
{
	HttpTransfer *transfer;

	ds_http_transfers_perform();
	while ((transfer = ds_http_transfer_next_finished()) != NULL)
	{
		HttpAttempt *attempt = (HttpAttempt *) transfer->owner;

		dlist_delete(&attempt->node);
		n_in_flight--;

		/*
		 * (ds_stats(): the responses the receivers gave, whatever is recorded
		 * of them)
		 */
		ds_count_http_response(transfer->resp.status);
		dlist_push_tail(&finished_attempts, &attempt->node);
		n_finished++;
	}
}

/*
 * Is the commit that ended at `lsn` as durable as the server promises a commit to be? With
 * synchronous replication, a commit whose wait for the standby was cancelled ("canceling wait
 * for synchronous replication ... committed locally") is not: a failover would lose it.
 */
static bool
commit_is_replicated(XLogRecPtr lsn)
{
	int			mode;
	bool		defined;
	bool		done;

	if (!SyncRepRequested())
		return true;
	mode = synchronous_commit == SYNCHRONOUS_COMMIT_REMOTE_WRITE ? SYNC_REP_WAIT_WRITE :
		synchronous_commit == SYNCHRONOUS_COMMIT_REMOTE_APPLY ? SYNC_REP_WAIT_APPLY :
		SYNC_REP_WAIT_FLUSH;
	LWLockAcquire(SyncRepLock, LW_SHARED);
	defined = (WalSndCtl->sync_standbys_status & SYNC_STANDBY_INIT) ?
		(WalSndCtl->sync_standbys_status & SYNC_STANDBY_DEFINED) != 0 :
		SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
	done = !defined || lsn <= WalSndCtl->lsn[mode];
	LWLockRelease(SyncRepLock);
	return done;
}

/*
 * No request may leave before the claim that records it is as durable as a commit: a request
 * sent on a claim that a failover loses would be sent again by the promoted server under the
 * same attempt (docs/http.md). A cancelled wait for the synchronous standby is waited
 * again; a shutdown ends the process here, before anything is sent.
 */
static void
wait_until_claims_are_durable(void)
{
	XLogRecPtr	lsn = XactLastCommitEnd;

	while (!commit_is_replicated(lsn))
	{
		CHECK_FOR_INTERRUPTS();
		pgstat_report_activity(STATE_RUNNING,
							   "durable_steps: waiting for the synchronous standby before sending");

		/*
		 * as a commit waits: interrupts held, cancel and die seen by the wait
		 * itself
		 */
		HOLD_INTERRUPTS();
		SyncRepWaitForLSN(lsn, false);
		RESUME_INTERRUPTS();
	}
}

/* record_and_claim: a write was refused because the server turned read-only */
#define REFUSED_READ_ONLY (-2)

/*
 * The transaction of record_and_claim: record every finished attempt, and claim up to
 * `claim_slots` due steps into *claimed; *all_recorded says whether every outcome was recorded.
 * Returns how many were claimed; -1 when the extension is not installed.
 */
static int
record_and_claim_transaction(int claim_slots, HttpAttempt ***claimed, bool *all_recorded)
{
	dlist_iter	it;
	MemoryContext oldcxt;
	int			n_claimed;

	if (!ds_worker_begin_work("durable_steps: recording and claiming HTTP steps"))
		return -1;
	oldcxt = MemoryContextSwitchTo(outcome_cxt);
	dlist_foreach(it, &finished_attempts)
	{
		HttpAttempt *attempt = dlist_container(HttpAttempt, node, it.cur);

		CHECK_FOR_INTERRUPTS();
		if (!ds_record_http_attempt(attempt))
			*all_recorded = false;
	}
	MemoryContextSwitchTo(oldcxt);
	n_claimed = claim_slots > 0 ? claim_batch(claim_slots, claimed) : 0;
	ds_worker_commit();
	return n_claimed;
}

/*
 * record_and_claim_transaction, or REFUSED_READ_ONLY when a write of it was refused because the
 * server turned read-only: the transaction is then rolled back, and any other error ends the
 * process as before.
 */
static int
record_and_claim_unless_read_only(int claim_slots, HttpAttempt ***claimed, bool *all_recorded)
{
	volatile int n_claimed = -1;

	PG_TRY();
	{
		n_claimed = record_and_claim_transaction(claim_slots, claimed, all_recorded);
	}
	PG_CATCH();
	{
		if (!ds_worker_caught_read_only())
			PG_RE_THROW();
		n_claimed = REFUSED_READ_ONLY;
	}
	PG_END_TRY();
	return n_claimed;
}

/*
 * The steps' locks of the attempts of `list`: pinned to the open transaction (`pin`), or taken
 * again for the session, which cannot fail while they are pinned.
 */
static void
hold_attempts_locks(dlist_head *list, bool pin)
{
	dlist_iter	it;

	dlist_foreach(it, list)
	{
		StepRecord *step = &dlist_container(HttpAttempt, node, it.cur)->step;

		if (pin)
			ds_step_lock_pin(step->run_id, step->step_id);
		else if (!ds_step_lock_try_session(step->run_id, step->step_id))
			elog(ERROR, "could not keep the lock of HTTP step %s/%s",
				 step->run_id, step->step_id);
	}
}

/*
 * After a write refused by a server turned read-only: the transaction rolled back, with the
 * outcomes it recorded and its claim. The attempts in flight and the finished ones stay this
 * process's, with their steps' locks; a lock the claim took before it failed is let go (each kept
 * lock is pinned meanwhile, so that no other process finds it free, as executor.c does).
 */
static void
keep_only_attempts_locks(void)
{
	ds_worker_begin_transaction("durable_steps: letting go of a refused claim");
	hold_attempts_locks(&attempts_in_flight, true);
	hold_attempts_locks(&finished_attempts, true);
	ds_step_lock_release_all_session();
	hold_attempts_locks(&attempts_in_flight, false);
	hold_attempts_locks(&finished_attempts, false);
	ds_worker_commit();
}

/*
 * One transaction: record every finished attempt (each in its own subtransaction) and, with
 * `claim_slots` > 0, claim that many due steps more; commit; then let go of the recorded steps'
 * locks and memory, and send the new claims' requests. One commit serves both. Returns how many
 * were claimed; -1 when the extension is not installed; REFUSED_READ_ONLY when a write was
 * refused because the server turned read-only: then nothing was recorded nor claimed, and the
 * finished attempts are kept, with their locks, until the server accepts writes (the loop waits,
 * ds_worker_must_wait).
 */
static int
record_and_claim(int claim_slots)
{
	dlist_mutable_iter mit;
	HttpAttempt **claimed = NULL;
	int			n_claimed;
	bool		all_recorded = true;

	n_claimed = record_and_claim_unless_read_only(claim_slots, &claimed, &all_recorded);
	MemoryContextReset(outcome_cxt);
	if (n_claimed == REFUSED_READ_ONLY)
	{
		keep_only_attempts_locks();
		return REFUSED_READ_ONLY;
	}

	/*
	 * the outcomes are committed (or the tables are gone): the steps are no
	 * longer in flight
	 */
	dlist_foreach_modify(mit, &finished_attempts)
	{
		HttpAttempt *attempt = dlist_container(HttpAttempt, node, mit.cur);

		dlist_delete(&attempt->node);
		ds_step_lock_release_session(attempt->step.run_id, attempt->step.step_id);
		free_attempt(attempt);
	}
	n_finished = 0;

	/*
	 * their locks are let go: the executors record the attempts not recorded
	 * here as lost
	 */
	if (!all_recorded)
		ds_attempts_may_be_lost();
	if (n_claimed > 0)
	{
		wait_until_claims_are_durable();
		send_claimed_requests(claimed, n_claimed);
	}
	return n_claimed;
}

/* After a reload of the settings: keep as many connections as requests may be in flight. */
static void
apply_reloaded_settings(void)
{
	ds_http_transfers_set_max_connections((long) max_inflight);
}

/* When to look for due steps next: the next due time, at most a poll interval away. */
static TimestampTz
next_look_time(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz backstop = TimestampTzPlusMilliseconds(now, http_poll_interval_ms);
	TimestampTz next_due;

	if (!ds_worker_begin_work("durable_steps: looking for the next due HTTP step"))
		return backstop;
	next_due = ds_next_http_due_time();
	ds_worker_commit();
	if (next_due == 0 || next_due > backstop)
		return backstop;

	/*
	 * due but not claimed: held by a transaction acting on it; look again
	 * soon, never spin
	 */
	return Max(next_due, TimestampTzPlusMilliseconds(now, 5));
}

/* Connect to the database whose OID is in bgw_extra and set up libcurl. */
static void
start_http_worker(void)
{
	(void) ds_worker_connect("durable_steps http", true, false);

	/*
	 * one HTTP worker per database: a second one (a launcher restarted under
	 * it) leaves
	 */
	if (!ds_http_worker_take_slot())
	{
		ereport(LOG, (errmsg("durable_steps: this database has an HTTP worker already")));
		proc_exit(0);
	}
	/* the partitions it serves: those of the settings it started with */
	ds_fence_note_applied();
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);

	/* every in-flight request may keep its connection for the next one */
	ds_http_transfers_init((long) max_inflight);
	outcome_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps HTTP outcomes",
										ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("durable_steps: HTTP worker started")));
}

void
ds_http_worker_main(Datum arg)
{
	TimestampTz next_look = 0;	/* at once */

	start_http_worker();
	for (;;)
	{
		int			free_slots;
		int			batch = Max(1, max_inflight / 4);
		bool		claim;
		bool		record;
		TimestampTz now;

		CHECK_FOR_INTERRUPTS();
		if (!PostmasterIsAlive())
			proc_exit(1);
		/* a commit that made an HTTP step due (or a signal) set the latch */
		if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_look = 0;
		}
		ds_worker_reload_settings_if_asked(apply_reloaded_settings);
		/* replaced only while it holds no request nor outcome */
		if (n_in_flight == 0 && n_finished == 0)
			ds_worker_end_if_outdated();
		if (n_in_flight > 0)
			advance_transfers();

		/*
		 * Outcomes and claims go in batches, a quarter of the slots at least,
		 * so that a commit serves many steps -- sooner when nothing else is
		 * in flight, or an outcome has waited RECORD_DELAY_MS.
		 */
		now = GetCurrentTimestamp();
		free_slots = max_inflight - n_in_flight;
		record = n_finished > 0 &&
			(n_in_flight == 0 || n_finished >= batch ||
			 TimestampDifferenceExceeds(oldest_finished_at(), now, RECORD_DELAY_MS));
		claim = now >= next_look && free_slots > 0 && (n_in_flight == 0 || free_slots >= batch);
		if ((record || claim) && ds_worker_must_wait())
		{
			/*
			 * Paused, or on a read-only server: nothing is claimed, and the
			 * finished attempts keep their outcomes (and their steps' locks)
			 * in memory until the wait is over.
			 */
			record = claim = false;
			next_look = TimestampTzPlusMilliseconds(now, http_poll_interval_ms);
		}
		if (record || claim)
		{
			int			want = (claim || now >= next_look) ? free_slots : 0;
			int			claimed = record_and_claim(want);

			if (claimed == REFUSED_READ_ONLY)
			{
				/*
				 * the server turned read-only since the look above: the next
				 * look waits, and says so once
				 */
				next_look = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														http_poll_interval_ms);
				continue;
			}
			if (claimed < 0 && ds_serves_every_database() && n_in_flight == 0)
			{
				/*
				 * no extension here (any more): like the executors, leave;
				 * the launcher knows
				 */
				ereport(LOG,
						(errmsg("durable_steps: extension is not installed in this database, or not at the library's version; its HTTP worker stops")));
				proc_exit(0);
			}
			if (claimed < 0)
				next_look = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														http_poll_interval_ms);
			else if (want > 0 && claimed < want)
				next_look = next_look_time();

			/*
			 * a full batch: there may be more due; look again as slots free
			 * up
			 */
			continue;
		}

		if (n_in_flight > 0)
		{
			pgstat_report_activity(STATE_IDLE, NULL);
			ds_http_transfers_wait(n_finished > 0 ? RECORD_DELAY_MS : SOCKET_WAIT_MS);
		}
		else
		{
			long		sleep_ms;

			now = GetCurrentTimestamp();
			sleep_ms = next_look <= now ? 0 :
				(long) ((next_look - now + 999) / 1000);
			if (sleep_ms > 0)
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 Min(sleep_ms, http_poll_interval_ms), PG_WAIT_EXTENSION);
		}
	}
}

BackgroundWorkerHandle *
ds_http_worker_register(Oid dbid, const char *dbname)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "durable_steps");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "ds_http_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "durable_steps http %s", dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "durable_steps http");
	memcpy(worker.bgw_extra, &dbid, sizeof(Oid));
	worker.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}
