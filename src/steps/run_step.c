/*
 * run_step.c -- ds_run_step, ds_retry_step and ds_unwrap: the synchronous durable step
 * (docs/steps.md, "How a step behaves").
 *
 * A call first reads the step without any lock: a finished step, or one whose next attempt is
 * not yet due, is answered from its row at the cost of one index lookup. Only when there is work
 * to do does the call take the step's lock (waiting for, or with nowait refusing, a transaction
 * that has it in flight), read the row again under that lock and execute.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/classify.h"
#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "steps/limits.h"
#include "steps/queues.h"
#include "steps/run_step.h"
#include "steps/task_args.h"
#include "steps/task_lease.h"
#include "store/replay_cache.h"
#include "steps/run_context.h"
#include "store/run_store.h"
#include "steps/step_attempt.h"
#include "steps/step_call.h"
#include "steps/step_context.h"
#include "steps/step_hooks.h"
#include "store/map_store.h"
#include "store/step_lock.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"
#include "base/size_limits.h"
#include "base/sql_text.h"

PG_FUNCTION_INFO_V1(ds_run_step);
PG_FUNCTION_INFO_V1(ds_retry_step);
PG_FUNCTION_INFO_V1(ds_cancel_step);
PG_FUNCTION_INFO_V1(ds_unwrap);

/* The statement's snapshot: rows committed since are found again under the lock. */
static Snapshot
statement_snapshot(void)
{
	return ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot();
}

/* The arguments of one ds_run_step call, checked. */
typedef struct StepCall
{
	char	   *run_id;
	char	   *step_id;
	char	   *sql;
	Jsonb	   *input;
	Jsonb	   *policy;			/* as given; NULL: none */
	int64		timeout;
	bool		nowait;
	ArrayType  *retry_on;
	ArrayType  *fail_on;
	char	   *on_timeout;
	bool		defer;			/* store the step, run nothing now: the worker
								 * runs attempt 1 */
	TimestampTz run_at;			/* with defer: when attempt 1 is due; 0 = at
								 * once */
	char	   *notify;			/* channel to NOTIFY when the step stops; NULL
								 * = none */
	char	   *on_success;		/* outcome hooks (step_hooks.c); NULL = none */
	char	   *on_failure;
	char	   *queue;			/* the worker's queue for its attempts
								 * (docs/queues.md) */
	int			priority;		/* lower numbers run first within the queue */
	bool		expect_row;		/* expect => 'row': no row returned fails */
	char	   *fingerprint;	/* computed when a replay needs it, or for a
								 * new step */
} StepCall;

/*
 * Check every argument: a malformed one is an error whether the call would replay or run, and
 * changes nothing.
 */
static void
parse_step_call(FunctionCallInfo fcinfo, StepCall *call)
{
	RetryPolicy parsed;
	ClassOverrides overrides;

	memset(call, 0, sizeof(*call));
	call->run_id = ds_run_id_arg(fcinfo, 0);
	ds_check_slot_run_id(call->run_id);
	call->step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	call->input = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	call->policy = PG_ARGISNULL(4) ? NULL : PG_GETARG_JSONB_P(4);
	call->timeout = ds_step_timeout_arg(fcinfo, 5);
	call->retry_on = PG_ARGISNULL(7) ? NULL : PG_GETARG_ARRAYTYPE_P_COPY(7);
	call->fail_on = PG_ARGISNULL(8) ? NULL : PG_GETARG_ARRAYTYPE_P_COPY(8);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("sql must not be null")));
	call->sql = text_to_cstring(PG_GETARG_TEXT_PP(2));
	ds_check_size(DS_LIMIT_SQL, "sql", strlen(call->sql));
	if (call->input != NULL)
		ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(call->input));
	if (strspn(call->sql, " \t\r\n\f\v;") == strlen(call->sql))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sql must contain a statement")));
	if (PG_ARGISNULL(6))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("nowait must not be null")));
	call->nowait = PG_GETARG_BOOL(6);
	if (PG_ARGISNULL(9))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("on_timeout must not be null")));
	call->on_timeout = text_to_cstring(PG_GETARG_TEXT_PP(9));
	if (strcmp(call->on_timeout, "retry") != 0 && strcmp(call->on_timeout, "fail") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("on_timeout must be 'retry' or 'fail'")));
	if (PG_ARGISNULL(10))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("defer must not be null")));
	/* a time to run at is a deferred step */
	call->run_at = PG_ARGISNULL(11) ? 0 : PG_GETARG_TIMESTAMPTZ(11);
	call->defer = PG_GETARG_BOOL(10) || !PG_ARGISNULL(11);
	if (!PG_ARGISNULL(11) && TIMESTAMP_NOT_FINITE(call->run_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("run_at must be a finite time")));
	call->notify = PG_ARGISNULL(12) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(12));
	if (call->notify != NULL && (call->notify[0] == '\0' || strlen(call->notify) >= NAMEDATALEN))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("notify must be a channel name of 1 to %d bytes", NAMEDATALEN - 1)));
	call->on_success = PG_ARGISNULL(13) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(13));
	call->on_failure = PG_ARGISNULL(14) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(14));
	ds_check_hook_sql("on_success", call->on_success);
	ds_check_hook_sql("on_failure", call->on_failure);
	call->queue = ds_queue_name_arg(fcinfo, 15, "queue");
	call->priority = ds_priority_arg(fcinfo, 16);
	call->expect_row = ds_expect_row_arg(fcinfo, 17);
	ds_policy_parse(call->policy, &parsed);
	memset(&overrides, 0, sizeof(overrides));
	ds_parse_sqlstate_list(call->retry_on, "retry_on", &overrides.n_retry, &overrides.retry_on,
						   &overrides.retry_is_class);
	ds_parse_sqlstate_list(call->fail_on, "fail_on", &overrides.n_fail, &overrides.fail_on,
						   &overrides.fail_is_class);
	if (ds_step_context_is_executing(call->run_id, call->step_id))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_RECURSION),
				 errmsg("step %s/%s calls itself", call->run_id, call->step_id)));
}

/*
 * The common case, a replay: answered from what this backend remembers of succeeded steps
 * (replay_cache.c), or from the row without any lock. False: there may be work to do.
 *
 * The cache knows a step by its SQL and input only, so calls with hooks neither use nor fill
 * it: an entry then always comes from a call without hooks that matched its row's fingerprint,
 * i.e. a step without hooks, and a call with hooks is compared by fingerprint (DS422 on a
 * difference).
 */
static bool
answer_replay(FunctionCallInfo fcinfo, StepCall *call, Datum *result)
{
	ReplayTicket ticket;
	StepRecord	rec;
	Oid			owner;
	HeapTuple	answer;

	bool		cacheable = call->on_success == NULL && call->on_failure == NULL &&
		!call->expect_row;

	if (cacheable &&
		ds_replay_cache_lookup(call->run_id, call->step_id, call->sql, call->input, &owner,
							   &answer))
	{
		ds_step_check_owner_id(owner, call->run_id, call->step_id);
		*result = HeapTupleGetDatum(answer);
		return true;
	}
	call->fingerprint = ds_sql_step_fingerprint(call->sql, call->expect_row, call->input,
												call->on_success, call->on_failure);
	if (!ds_replay_cache_probe(call->run_id, call->step_id, statement_snapshot(), &rec, &ticket))
		return false;

	/*
	 * before anything about the definition: another role must not learn
	 * whether it guessed it
	 */
	ds_step_check_owner(&rec);
	if (strcmp(rec.fingerprint, call->fingerprint) != 0 ||
		!ds_step_answer_from_store(&rec, call->fingerprint))
		return false;
	*result = ds_step_result_datum(fcinfo, &rec, true);
	if (cacheable)
		ds_replay_cache_remember(&ticket, call->run_id, call->step_id, rec.owner, call->sql,
								 call->input, DatumGetHeapTupleHeader(*result));
	return true;
}

/*
 * A running step whose lock we hold: the worker's executor holds it for as long as an attempt
 * is in flight, so that executor is gone. Record its attempt as lost, as the worker would.
 */
static void
settle_lost_attempt(StepRecord *rec, const char *fingerprint)
{
	if (rec->status != STEP_RUNNING || strcmp(rec->fingerprint, fingerprint) != 0)
		return;
	ds_step_check_owner(rec);
	ds_record_lost_attempt(rec);
}

/* The record of a step this call creates, about to run its first attempt. */
static void
new_step_record(const StepCall *call, StepRecord *rec)
{
	RetryPolicy resolved;
	TimestampTz now = GetCurrentTimestamp();
	Jsonb	   *run_policy = ds_new_step_run_policy(call->run_id, call->nowait);

	/*
	 * a typo is an error at the call, not a stored failure that uses the
	 * identity up
	 */
	ds_check_one_statement("sql", call->sql);
	memset(rec, 0, sizeof(*rec));
	ds_policy_resolve(run_policy, call->policy, &resolved);
	rec->backoff = resolved;
	rec->run_id = call->run_id;
	rec->step_id = call->step_id;
	rec->kind = STEP_KIND_SQL;
	rec->sql = call->sql;
	rec->input = call->input;
	rec->fingerprint = call->fingerprint;
	rec->max_attempts = resolved.max_attempts;
	rec->timeout = call->timeout;
	rec->on_timeout = call->on_timeout;
	rec->retry_on = call->retry_on;
	rec->fail_on = call->fail_on;
	rec->notify = call->notify;
	rec->on_success = call->on_success;
	rec->on_failure = call->on_failure;
	rec->queue = call->queue;
	rec->priority = call->priority;
	rec->expect_row = call->expect_row;
	rec->owner = GetUserId();
	rec->search_path = namespace_search_path;
	rec->status = STEP_RUNNING;
	rec->created_at = now;
	rec->updated_at = now;
	if (call->defer)
	{
		/*
		 * stored with the caller's transaction; the worker runs attempt 1
		 * once it is due
		 */
		rec->status = STEP_PENDING;
		rec->next_attempt_at = call->run_at != 0 ? call->run_at : now;
	}
	if (resolved.limit_name != NULL)
	{
		ds_limit_check_step(resolved.limit_name, !call->defer);
		rec->limit_name = resolved.limit_name;
		rec->limit_key = resolved.limit_key;
	}
}

void
ds_store_map_item(const char *run_id, const char *step_id, const char *sql, Jsonb *input,
				  Jsonb *policy, int64 timeout, const char *map_step, const char *limit_name)
{
	StepCall	call;
	StepRecord	rec;

	memset(&call, 0, sizeof(call));
	call.run_id = (char *) run_id;
	call.step_id = (char *) step_id;
	call.sql = (char *) sql;
	call.input = input;
	call.policy = policy;
	call.timeout = timeout;
	call.on_timeout = "retry";
	call.defer = true;
	call.queue = "default";
	call.fingerprint = ds_sql_step_fingerprint(sql, false, input, NULL, NULL);

	/* no identity lock: see ds_map_item_stored */
	if (ds_map_item_stored(run_id, step_id, call.fingerprint))
		return;
	new_step_record(&call, &rec);
	ds_map_item_insert(&rec, map_step, limit_name);
}

/*
 * ds_run_step(run_id, step_id, sql, input, policy, timeout, nowait, retry_on, fail_on,
 *             on_timeout, defer, run_at, notify, on_success, on_failure, queue, priority)
 *             -> ds_step_result
 */
Datum
ds_run_step(PG_FUNCTION_ARGS)
{
	StepCall	call;
	StepRecord	rec;
	Datum		result;
	bool		found;
	int			n_handed;
	const UnrecordedAttempt *handed;
	int			n_unrecorded = 0;
	int		   *unrecorded;

	parse_step_call(fcinfo, &call);
	if (answer_replay(fcinfo, &call, &result))
		PG_RETURN_DATUM(result);
	found = ds_step_lock_and_read(call.run_id, call.step_id, call.nowait, &rec);
	if (found)
	{
		settle_lost_attempt(&rec, call.fingerprint);

		/*
		 * a deferred call never runs the body itself, due or not: the stored
		 * state answers
		 */

		/*
		 * nor is a step of a limit ever run by its caller: it waits for its
		 * admission (docs/limits.md)
		 */
		if (ds_step_answer_from_store(&rec, call.fingerprint) || call.defer ||
			rec.limit_name != NULL)
			PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, true));
	}
	else
	{
		new_step_record(&call, &rec);
		if (call.defer)
		{
			ds_store_insert_step(&rec);
			ds_worker_wake_at_commit();
			PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
		}
	}

	/*
	 * A run's turn first records what lost or interrupted turns ran of this
	 * step: the attempts that name it, and those that name no step when it is
	 * the one the turn creates.
	 */
	n_handed = ds_turn_take_unrecorded_attempts(call.run_id, call.step_id, &handed);
	unrecorded = n_handed > 0 ? palloc(sizeof(int) * n_handed) : NULL;
	for (int i = 0; i < n_handed; i++)
		if (handed[i].step_id != NULL || !found)
			unrecorded[n_unrecorded++] = handed[i].sqlerrcode;
	if (n_unrecorded > 0)
		ds_record_unrecorded_attempts(&rec, !found, n_unrecorded, unrecorded);
	else
		ds_run_next_attempt(&rec, !found, false);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/*
 * May the current user re-arm this step, which will then run as its owner? Its owner and the
 * roles with its privileges may, with new input or without. A durable_steps_admin member may
 * only have it run again as it was defined, and never a superuser's step: input chosen by
 * another role, or the timing of a superuser's SQL, would be code run with privileges the
 * admin does not have.
 */
static void
check_rearm(const StepRecord *rec, bool new_input)
{
	if (has_privs_of_role(GetUserId(), rec->owner))
		return;
	if (new_input || superuser_arg(rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("step %s/%s belongs to role %s", rec->run_id, rec->step_id,
						GetUserNameFromId(rec->owner, true) ? GetUserNameFromId(rec->owner, true) : "(dropped)"),
				 new_input ?
				 errdetail("Only roles with the privileges of a step's owner can give it a new input or SQL.") :
				 errdetail("Only superusers can re-arm a superuser's step."),
				 new_input && !superuser_arg(rec->owner) ?
				 errhint("Re-arm it as a member of role %s (GRANT %s TO %s, by a role that may grant it), or re-arm it as it was defined.",
						 quote_identifier(GetUserNameFromId(rec->owner, true) ? GetUserNameFromId(rec->owner, true) : "?"),
						 quote_identifier(GetUserNameFromId(rec->owner, true) ? GetUserNameFromId(rec->owner, true) : "?"),
						 quote_identifier(GetUserNameFromId(GetUserId(), true) ? GetUserNameFromId(GetUserId(), true) : "?")) : 0));
}

/*
 * ds_retry_step() of a step blocked by its on_success hook: its body succeeded and its effects
 * are committed, so running it again would do them twice. The hook alone runs again, now, in the
 * caller's transaction and as the step's owner (step_hooks.c); the step is then succeeded, or
 * blocked again by the hook's new error. Returns false (the answer is not a replay).
 */
static bool
rerun_success_hook(StepRecord *rec, bool new_input)
{
	TimestampTz now;

	if (new_input)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s has succeeded and cannot be given a new definition", rec->run_id,
						rec->step_id),
				 errdetail("Only its on_success hook is left to run; ds_retry_step() without input or sql runs it again.")));
	now = GetCurrentTimestamp();
	rec->status = STEP_SUCCEEDED;
	rec->error_class = rec->error_code = rec->error_message = rec->error_detail = NULL;
	rec->remediation = NULL;
	rec->updated_at = now;
	rec->finished_at = now;
	ds_run_step_outcome_hooks(rec);
	ds_notify_step_stopped(rec);
	ds_store_update_step(rec);
	return false;
}

/*
 * ds_retry_step(run_id, step_id, input, sql, request) → ds_step_result: re-arm a failed, blocked,
 * uncertain or cancelled step, with a corrected input or SQL (or an HTTP step's request) if given (a step blocked by its
 * on_success hook runs the hook again instead: rerun_success_hook).
 */
Datum
ds_retry_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	bool		new_input = !PG_ARGISNULL(2);
	char	   *new_sql = PG_NARGS() > 3 && !PG_ARGISNULL(3) ? text_to_cstring(PG_GETARG_TEXT_PP(3)) : NULL;
	Jsonb	   *new_request = PG_NARGS() > 4 && !PG_ARGISNULL(4) ? PG_GETARG_JSONB_P_COPY(4) : NULL;
	bool		redefined = new_input || new_sql != NULL || new_request != NULL;
	StepRecord	rec;

	PreventCommandIfReadOnly("ds_retry_step()");
	PreventCommandIfParallelMode("ds_retry_step()");

	/*
	 * a corrected SQL is checked as a new step's is, before anything is
	 * looked at
	 */
	if (new_sql != NULL)
	{
		ds_check_size(DS_LIMIT_SQL, "sql", strlen(new_sql));
		ds_check_one_statement("sql", new_sql);
	}
	ds_step_lock_visible(run_id, step_id, false, &rec);
	check_rearm(&rec, redefined);
	if (rec.status != STEP_FAILED && rec.status != STEP_BLOCKED && rec.status != STEP_UNCERTAIN &&
		rec.status != STEP_CANCELLED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is %s and cannot be re-armed", run_id, step_id,
						ds_step_status_name(rec.status)),
				 errdetail("Only failed, blocked, uncertain and cancelled steps can be re-armed.")));

	/*
	 * A cancelled HTTP step may have been cancelled uncertain, its request
	 * perhaps received: sending it again is for ds_resolve_step's judgement,
	 * never a re-arm's.
	 */
	if (rec.status == STEP_CANCELLED && !ds_step_kinds[rec.kind].has_sql_body)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is cancelled and cannot be re-armed", run_id, step_id),
				 errdetail("Only SQL steps can be re-armed once cancelled: an HTTP step's request may have reached its receiver, a task's handler may have acted.")));
	if (ds_step_blocked_by_success_hook(&rec))
		PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, rerun_success_hook(&rec, redefined)));
	if (new_request != NULL)
	{
		HttpRequest req;

		if (!ds_step_kinds[rec.kind].sent_by_http_worker)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("request can only be replaced for HTTP steps")));
		if (new_input || new_sql != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s can only be replaced for SQL steps", new_sql ? "sql" : "input")));

		/*
		 * An uncertain step's request may have reached its receiver, which
		 * keeps what it did under the step's key: another request under that
		 * key is for the receiver to refuse, and for nobody to guess.
		 */
		if (rec.status == STEP_UNCERTAIN)
			ereport(ERROR,
					(errcode(ERRCODE_DS_INVALID_STEP_STATE),
					 errmsg("step %s/%s is uncertain and its request cannot be replaced", run_id,
							step_id),
					 errdetail("Its request may have reached its receiver."),
					 errhint("Settle it with ds_resolve_step(), or send it again unchanged with ds_retry_step().")));
		/* checked as a new HTTP step's request is, as the role re-arming it */
		ds_http_step_check_role();
		ds_http_step_check_request(new_request, &req);
		ds_http_step_check_idempotency_header(&req, rec.idempotency_header);
		rec.request = new_request;
		rec.fingerprint = ds_step_fingerprint(DS_HTTP_FINGERPRINT_SQL, rec.request, rec.on_success,
											  rec.on_failure);
	}
	else if (new_input && new_sql == NULL && ds_step_kinds[rec.kind].run_by_app_worker)
	{
		/* a task's corrected input (docs/tasks.md, "Failures") */
		rec.input = PG_GETARG_JSONB_P_COPY(2);
		ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(rec.input));
		rec.fingerprint = ds_task_fingerprint(rec.task, rec.expect_row, rec.input, rec.on_success,
											  rec.on_failure);
	}
	else if (new_input || new_sql != NULL)
	{
		if (!ds_step_kinds[rec.kind].has_sql_body)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s can only be replaced for SQL steps%s", new_sql ? "sql" : "input",
							new_sql ? "" : " and tasks")));
		if (new_input)
		{
			rec.input = PG_GETARG_JSONB_P_COPY(2);
			ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(rec.input));
		}
		if (new_sql != NULL)
			rec.sql = new_sql;
		rec.fingerprint = ds_sql_step_fingerprint(rec.sql, rec.expect_row, rec.input, rec.on_success,
												  rec.on_failure);
	}
	/* a fresh budget of attempts; attempt numbers go on from where they were */
	rec.attempt_base = rec.attempts;
	rec.status = STEP_PENDING;
	rec.next_attempt_at = GetCurrentTimestamp();
	rec.updated_at = rec.next_attempt_at;
	rec.finished_at = 0;
	rec.result = NULL;
	rec.error_class = rec.error_code = rec.error_message = rec.error_detail = NULL;
	rec.remediation = NULL;
	ds_store_update_step(&rec);
	ds_worker_wake_kind_at_commit(rec.kind);
	/* an item of a map: the map waits for it again (docs/runs.md) */
	if (rec.map_step != NULL)
	{
		StoreSpi	spi;

		ds_store_spi_begin(&spi);
		ds_store_map_reopen(run_id, rec.map_step);
		ds_store_spi_end(&spi);
	}
	/* a run waiting for this step, or blocked on it, goes on */
	ds_run_wake_for_step(run_id);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/*
 * ds_cancel_step(run_id, step_id) -> ds_step_result: a step that has not finished becomes
 * cancelled and never runs again. An attempt a worker is running is stopped first (its executor
 * looks for the request every 100 ms and records the attempt as cancelled); one running in a
 * caller's transaction is waited for.
 */
Datum
ds_cancel_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	StepRecord	rec;

	PreventCommandIfReadOnly("ds_cancel_step()");
	PreventCommandIfParallelMode("ds_cancel_step()");
	ds_step_lock_visible(run_id, step_id, true, &rec);
	if (rec.status == STEP_RUNNING && ds_step_kinds[rec.kind].run_by_app_worker)

		/*
		 * an application worker holds its lease: the attempt ends now, and
		 * the worker's next heartbeat or outcome finds the step cancelled
		 */
		ds_cancel_running_task(&rec);
	else if (rec.status == STEP_RUNNING)

		/*
		 * its lock was free: the process running it is gone, so the attempt
		 * is lost
		 */
		ds_record_lost_attempt(&rec);
	if (rec.status == STEP_CANCELLED)
		PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
	if (rec.status == STEP_SUCCEEDED || rec.status == STEP_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is %s and cannot be cancelled", run_id, step_id,
						ds_step_status_name(rec.status)),
				 errdetail("Only steps that have not finished can be cancelled.")));
	ds_cancel_waiting_step(&rec);

	/*
	 * a run waiting for this step (an HTTP step's response, a retry) meets it
	 * cancelled: DS102
	 */
	ds_run_wake_for_step(run_id);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/* attribute numbers in ds_step_result (sql/durable_steps--*.sql) */
#define RESULT_ATT_RUN_ID 1
#define RESULT_ATT_STEP_ID 2
#define RESULT_ATT_STATUS 3
#define RESULT_ATT_RESULT 4
#define RESULT_ATT_ERROR_CODE 9
#define RESULT_ATT_ERROR_MESSAGE 10

/* Text attribute `att` of a ds_step_result, or `if_null`. */
static char *
result_text(HeapTupleHeader row, AttrNumber att, const char *if_null)
{
	bool		isnull;
	Datum		d = GetAttributeByNum(row, att, &isnull);

	return isnull ? (char *) if_null : TextDatumGetCString(d);
}

/* ds_unwrap(ds_step_result) → jsonb: the result of a succeeded step, an error otherwise. */
Datum
ds_unwrap(PG_FUNCTION_ARGS)
{
	HeapTupleHeader row;
	bool		isnull;
	Datum		result;
	char	   *status;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("step result must not be null")));
	row = PG_GETARG_HEAPTUPLEHEADER(0);
	status = result_text(row, RESULT_ATT_STATUS, "unknown");
	if (strcmp(status, ds_step_status_name(STEP_SUCCEEDED)) != 0)
	{
		char	   *code = result_text(row, RESULT_ATT_ERROR_CODE, NULL);

		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_SUCCEEDED),
				 errmsg("step %s/%s has not succeeded: it is %s",
						result_text(row, RESULT_ATT_RUN_ID, "?"),
						result_text(row, RESULT_ATT_STEP_ID, "?"), status),
				 code ? errdetail("Last error %s: %s", code,
								  result_text(row, RESULT_ATT_ERROR_MESSAGE, "")) : 0));
	}
	result = GetAttributeByNum(row, RESULT_ATT_RESULT, &isnull);
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}
