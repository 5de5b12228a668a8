/*
 * run_step.c -- ds_run_step, ds_retry_step and ds_unwrap: the synchronous durable step
 * (README, "How a step behaves").
 *
 * A call first reads the step without any lock: a finished step, or one whose next attempt is
 * not yet due, is answered from its row at the cost of one index lookup. Only when there is work
 * to do does the call take the step's lock (waiting for, or with nowait refusing, a transaction
 * that has it in flight), read the row again under that lock and execute.
 */
#include "compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "classify.h"
#include "ds_errcodes.h"
#include "policy.h"
#include "queues.h"
#include "replay_cache.h"
#include "run_context.h"
#include "runs.h"
#include "step_attempt.h"
#include "step_call.h"
#include "step_context.h"
#include "step_hooks.h"
#include "step_lock.h"
#include "store.h"
#include "worker_wakeup.h"
#include "size_limits.h"

/* Longest run_id or step_id, in characters. */
#define DS_MAX_IDENTITY_CHARS 255

PG_FUNCTION_INFO_V1(ds_run_step);
PG_FUNCTION_INFO_V1(ds_retry_step);
PG_FUNCTION_INFO_V1(ds_cancel_step);
PG_FUNCTION_INFO_V1(ds_unwrap);

/* Argument `argno`, a run_id or step_id: not NULL, not empty, at most 255 characters. */
static char *
identity_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text	   *t;
	char	   *s;
	int			chars;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	t = PG_GETARG_TEXT_PP(argno);
	s = text_to_cstring(t);
	if (s[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	/* characters never outnumber bytes: count them only when the bytes could be too many */
	chars = VARSIZE_ANY_EXHDR(t) > DS_MAX_IDENTITY_CHARS ? pg_mbstrlen(s) : 0;
	if (chars > DS_MAX_IDENTITY_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", name),
				 errdetail("It has %d characters; the limit is %d.", chars,
						   DS_MAX_IDENTITY_CHARS)));
	return s;
}

/*
 * The step's definition: its SQL, its input and its outcome hooks (policy and timeout are not
 * part of it), as 128 bits of two independently seeded hashes. It tells definitions apart,
 * which needs no cryptographic strength (a caller can only ever match steps of roles it acts
 * for), and every call computes it, replays included. A step without hooks hashes as it did
 * before hooks existed.
 */
static char *
step_fingerprint(const char *sql, Jsonb *input, const char *on_success, const char *on_failure)
{
	size_t		sql_len = strlen(sql) + 1;	/* the NUL separates SQL from input */
	uint64		a = hash_bytes_extended((const unsigned char *) sql, (int) sql_len,
										UINT64CONST(0x6473716c66700001));
	uint64		b = hash_bytes_extended((const unsigned char *) sql, (int) sql_len,
										UINT64CONST(0x9e3779b97f4a7c15));

	if (input != NULL)
	{
		char	   *text = JsonbToCString(NULL, &input->root, VARSIZE(input));
		int			len = (int) strlen(text);

		a = hash_bytes_extended((const unsigned char *) text, len, a);
		b = hash_bytes_extended((const unsigned char *) text, len, b ^ UINT64CONST(0xc2b2ae3d27d4eb4f));
	}
	if (on_success != NULL || on_failure != NULL)
	{
		/* a tag byte tells a missing hook from an empty one and the two hooks apart */
		StringInfoData hooks;

		initStringInfo(&hooks);
		appendStringInfoChar(&hooks, on_success ? 'S' : 's');
		if (on_success)
			appendBinaryStringInfo(&hooks, on_success, strlen(on_success) + 1);
		appendStringInfoChar(&hooks, on_failure ? 'F' : 'f');
		if (on_failure)
			appendBinaryStringInfo(&hooks, on_failure, strlen(on_failure) + 1);
		a = hash_bytes_extended((const unsigned char *) hooks.data, hooks.len,
								a ^ UINT64CONST(0x686f6f6b73000001));
		b = hash_bytes_extended((const unsigned char *) hooks.data, hooks.len,
								b ^ UINT64CONST(0x686f6f6b73000002));
	}
	return psprintf("%016" DS_UINT64_HEX "%016" DS_UINT64_HEX, a, b);
}

/* The ds_step_result of the step as `rec` holds it. */
static Datum
step_result_datum(FunctionCallInfo fcinfo, const StepRecord *rec, bool replayed)
{
	TupleDesc	tupdesc;
	Datum		values[13];
	bool		nulls[13];

	/* looked up once per call site: the type of ds_step_result does not change under us */
	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;
	if (tupdesc == NULL)
	{
		MemoryContext oldcxt;

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "ds_step_result must be a composite type");
		oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		MemoryContextSwitchTo(oldcxt);
		fcinfo->flinfo->fn_extra = tupdesc;
	}
	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(rec->run_id);
	values[1] = CStringGetTextDatum(rec->step_id);
	values[2] = CStringGetTextDatum(ds_step_status_name(rec->status));
	values[3] = PointerGetDatum(rec->result);
	nulls[3] = rec->result == NULL;
	values[4] = Int32GetDatum(rec->attempts);
	values[5] = Int32GetDatum(rec->attempt_base + rec->max_attempts);
	values[6] = TimestampTzGetDatum(rec->next_attempt_at);
	nulls[6] = rec->next_attempt_at == 0;
#define TEXT_OR_NULL(i, s) \
	do { nulls[i] = (s) == NULL; values[i] = (s) ? CStringGetTextDatum(s) : (Datum) 0; } while (0)
	TEXT_OR_NULL(7, rec->error_class);
	TEXT_OR_NULL(8, rec->error_code);
	TEXT_OR_NULL(9, rec->error_message);
	TEXT_OR_NULL(10, rec->error_detail);
	TEXT_OR_NULL(11, rec->remediation);
#undef TEXT_OR_NULL
	values[12] = BoolGetDatum(replayed);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/* The statement's snapshot: rows committed since are found again under the lock. */
static Snapshot
statement_snapshot(void)
{
	return ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot();
}

/*
 * A step is answered only to the role that created it (README, "Security model"): not to an
 * admin, not to a superuser. Its stored result is what its owner's SQL did under its owner's
 * search_path and privileges; handed to another role "as if it were its own", it would answer a
 * question that role never asked. The identity is one namespace for every role (one identity,
 * one idempotency key, whoever calls), so another role learns only that it is taken.
 */
static void
check_owner(Oid owner, const char *run_id, const char *step_id)
{
	if (owner != GetUserId())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("step %s/%s belongs to another role", run_id, step_id),
				 errhint("Only the role that created a step can run or replay it; choose another run_id or step_id.")));
}

/* check_owner for the step in `rec`. */
static void
check_access(const StepRecord *rec)
{
	check_owner(rec->owner, rec->run_id, rec->step_id);
}

/*
 * The rows of the table in README, "How a step behaves", that do not run the body. Returns true
 * when the stored state is the answer; raises on a conflict; false means there is an attempt to
 * run now.
 */
static bool
answer_from_store(const StepRecord *rec, const char *fingerprint)
{
	check_access(rec);
	if (strcmp(rec->fingerprint, fingerprint) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("step %s/%s already exists with a different definition",
						rec->run_id, rec->step_id),
				 errdetail("The stored step (status %s) was created with other SQL, input or hooks.",
						   ds_step_status_name(rec->status)),
				 rec->status == STEP_BLOCKED ?
				 errhint("Give a blocked step corrected input with ds_retry_step().") :
				 errhint("Use a new step_id for a different step.")));
	if (ds_step_status_is_settled(rec->status))
		return true;
	if ((rec->status == STEP_RETRYING || rec->status == STEP_PENDING) &&
		rec->next_attempt_at > GetCurrentTimestamp())
		return true;
	return false;
}

/* Argument `argno`, a step timeout, in microseconds: 0 for NULL, else in (0, 24 hours]. */
static int64
timeout_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		return 0;
	usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs <= 0 || usecs > DS_MAX_DELAY_USECS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be more than 0 and at most 24 hours")));
	return usecs;
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
	bool		defer;			/* store the step, run nothing now: the worker runs attempt 1 */
	TimestampTz run_at;			/* with defer: when attempt 1 is due; 0 = at once */
	char	   *notify;			/* channel to NOTIFY when the step stops; NULL = none */
	char	   *on_success;		/* outcome hooks (step_hooks.c); NULL = none */
	char	   *on_failure;
	char	   *queue;			/* the worker's queue for its attempts (README, "Queues") */
	int			priority;		/* lower numbers run first within the queue */
	char	   *fingerprint;	/* computed when a replay needs it, or for a new step */
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
	call->run_id = identity_arg(fcinfo, 0, "run_id");
	call->step_id = identity_arg(fcinfo, 1, "step_id");
	call->input = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	call->policy = PG_ARGISNULL(4) ? NULL : PG_GETARG_JSONB_P(4);
	call->timeout = timeout_arg(fcinfo, 5);
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
	if (PG_ARGISNULL(16))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("priority must not be null")));
	call->priority = PG_GETARG_INT32(16);
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

	bool		cacheable = call->on_success == NULL && call->on_failure == NULL;

	if (cacheable &&
		ds_replay_cache_lookup(call->run_id, call->step_id, call->sql, call->input, &owner,
							   &answer))
	{
		check_owner(owner, call->run_id, call->step_id);
		*result = HeapTupleGetDatum(answer);
		return true;
	}
	call->fingerprint = step_fingerprint(call->sql, call->input, call->on_success,
										 call->on_failure);
	if (!ds_replay_cache_probe(call->run_id, call->step_id, statement_snapshot(), &rec, &ticket))
		return false;
	/* before anything about the definition: another role must not learn whether it guessed it */
	check_access(&rec);
	if (strcmp(rec.fingerprint, call->fingerprint) != 0 ||
		!answer_from_store(&rec, call->fingerprint))
		return false;
	*result = step_result_datum(fcinfo, &rec, true);
	if (cacheable)
		ds_replay_cache_remember(&ticket, call->run_id, call->step_id, rec.owner, call->sql,
							 call->input, DatumGetHeapTupleHeader(*result));
	return true;
}

/*
 * Take the step's lock (waiting for, or with nowait refusing, a transaction that has it in
 * flight) and read the row again under it, locked; false when there is no step yet.
 */
static bool
lock_and_read(const StepCall *call, StepRecord *rec)
{
	bool		found;

	/* from here on the call may write: refuse where writing is not allowed, before anything */
	PreventCommandIfReadOnly("ds_run_step()");
	PreventCommandIfParallelMode("ds_run_step()");
	if (!ds_step_lock_acquire(call->run_id, call->step_id, call->nowait))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("step %s/%s is in progress in another transaction", call->run_id,
						call->step_id),
				 errhint("Retry after a moment, or call without nowait to wait for it.")));

	/*
	 * Under the lock, the latest snapshot sees whatever the previous holder committed. Most
	 * often there is nothing: a new step, inserted without reading the row again.
	 */
	found = ds_probe_step(call->run_id, call->step_id, GetLatestSnapshot(), rec, NULL);
	if (found && IsolationUsesXactSnapshot() &&
		!ds_probe_step(call->run_id, call->step_id, GetTransactionSnapshot(), rec, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent creation of step %s/%s",
						call->run_id, call->step_id),
				 errhint("Retry the transaction.")));
	return found && ds_store_lock_step(call->run_id, call->step_id, rec);
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
	check_access(rec);
	ds_record_lost_attempt(rec);
}

/*
 * A new step under the run_id of a run belongs to that run: it takes the run's policy, the run's
 * workflow replays it as its own step, ds_cancel_run cancels it (run_id names the business fact,
 * so the application may add steps of the same order to its run). So only the run's own turn (its
 * workflow, and the step work the executor does for it: the innermost step context is the turn's)
 * and roles with the privileges of the run's owner may create one. Anybody else could otherwise
 * squat a step id the owner's workflow will reach, which then fails the run with "belongs to
 * another role" (README, "Security model").
 *
 * ds_start_run holds the run_id's lock exclusively until it commits, and refuses a run_id with
 * another role's steps; a new step takes it shared and only then looks for the run, in the latest
 * snapshot. So a run and a step created at the same time meet as they would one after the other,
 * whichever comes first: the second waits for the first to commit, then sees it.
 */
Jsonb *
ds_new_step_run_policy(const char *run_id, bool nowait)
{
	const StepContext *ctx = ds_step_context_innermost();
	Oid			run_owner;
	Jsonb	   *policy;

	/* in the turn, a SECURITY DEFINER function of the workflow makes steps of its definer */
	if (ctx != NULL && strcmp(ctx->run_id, run_id) == 0 &&
		strcmp(ctx->step_id, DS_TURN_STEP_ID) == 0)
		return ds_probe_run_policy(run_id, GetActiveSnapshot(), &run_owner);
	if (!ds_run_id_lock(run_id, false, nowait))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("run %s is being started in another transaction", run_id),
				 errhint("Retry after a moment, or call without nowait to wait for it.")));
	policy = ds_probe_run_policy(run_id, GetLatestSnapshot(), &run_owner);
	if (OidIsValid(run_owner) && run_owner != GetUserId() &&
		!has_privs_of_role(GetUserId(), run_owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to another role", run_id),
				 errdetail("Only the run's workflow and roles with the privileges of its owner can add steps to it."),
				 errhint("Choose another run_id.")));
	return policy;
}

/* The record of a step this call creates, about to run its first attempt. */
static void
new_step_record(const StepCall *call, StepRecord *rec)
{
	RetryPolicy resolved;
	TimestampTz now = GetCurrentTimestamp();
	Jsonb	   *run_policy = ds_new_step_run_policy(call->run_id, call->nowait);

	memset(rec, 0, sizeof(*rec));
	ds_policy_resolve(run_policy, call->policy, &resolved);
	rec->backoff = resolved;
	rec->run_id = call->run_id;
	rec->step_id = call->step_id;
	rec->kind = "sql";
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
	rec->owner = GetUserId();
	rec->search_path = namespace_search_path;
	rec->status = STEP_RUNNING;
	rec->created_at = now;
	rec->updated_at = now;
	if (call->defer)
	{
		/* stored with the caller's transaction; the worker runs attempt 1 once it is due */
		rec->status = STEP_PENDING;
		rec->next_attempt_at = call->run_at != 0 ? call->run_at : now;
	}
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

	parse_step_call(fcinfo, &call);
	if (answer_replay(fcinfo, &call, &result))
		PG_RETURN_DATUM(result);
	found = lock_and_read(&call, &rec);
	if (found)
	{
		settle_lost_attempt(&rec, call.fingerprint);
		/* a deferred call never runs the body itself, due or not: the stored state answers */
		if (answer_from_store(&rec, call.fingerprint) || call.defer)
			PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, true));
	}
	else
	{
		new_step_record(&call, &rec);
		if (call.defer)
		{
			ds_store_insert_step(&rec);
			ds_worker_wake_at_commit();
			PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, false));
		}
	}
	ds_run_next_attempt(&rec, !found, false);
	PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, false));
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
				 errdetail("Only roles with the privileges of a step's owner can give it new input.") :
				 errdetail("Only superusers can re-arm a superuser's step.")));
}

/*
 * Take the lock of step (run_id, step_id), waiting for a transaction that has it in flight, and
 * read it locked. A step the caller may not see answers as one that does not exist, at once:
 * neither the answer nor a wait for its lock tells anything about it.
 */
static void
lock_visible_step(const char *run_id, const char *step_id, bool stop_running, StepRecord *rec)
{
	if (!ds_probe_step(run_id, step_id, GetLatestSnapshot(), rec, NULL) ||
		!ds_store_may_access(rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("step %s/%s does not exist", run_id, step_id)));
	/* an attempt a worker runs is asked to stop, so that its lock comes free soon */
	if (stop_running && rec->status == STEP_RUNNING && rec->claimed_by != 0 &&
		rec->claimed_by != MyProcPid)
		(void) ds_request_cancel(rec->claimed_by,
								 ds_attempt_cancel_key(run_id, step_id, rec->attempts));
	if (!ds_step_lock_acquire(run_id, step_id, false))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("step %s/%s is in progress in this process", run_id, step_id)));
	if (!ds_store_lock_step(run_id, step_id, rec) || !ds_store_may_access(rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("step %s/%s does not exist", run_id, step_id)));
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
				 errmsg("step %s/%s has succeeded and cannot be given new input", rec->run_id,
						rec->step_id),
				 errdetail("Only its on_success hook is left to run; ds_retry_step() without input runs it again.")));
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
 * ds_retry_step(run_id, step_id, input) → ds_step_result: re-arm a failed or blocked step (a
 * step blocked by its on_success hook runs the hook again instead: rerun_success_hook).
 */
Datum
ds_retry_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = identity_arg(fcinfo, 0, "run_id");
	char	   *step_id = identity_arg(fcinfo, 1, "step_id");
	StepRecord	rec;

	PreventCommandIfReadOnly("ds_retry_step()");
	PreventCommandIfParallelMode("ds_retry_step()");
	lock_visible_step(run_id, step_id, false, &rec);
	check_rearm(&rec, !PG_ARGISNULL(2));
	if (rec.status != STEP_FAILED && rec.status != STEP_BLOCKED && rec.status != STEP_UNCERTAIN)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is %s and cannot be re-armed", run_id, step_id,
						ds_step_status_name(rec.status)),
				 errdetail("Only failed, blocked and uncertain steps can be re-armed.")));
	if (ds_step_blocked_by_success_hook(&rec))
		PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, rerun_success_hook(&rec, !PG_ARGISNULL(2))));
	if (!PG_ARGISNULL(2))
	{
		if (strcmp(rec.kind, "sql") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("input can only be replaced for SQL steps")));
		rec.input = PG_GETARG_JSONB_P_COPY(2);
		ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(rec.input));
		rec.fingerprint = step_fingerprint(rec.sql, rec.input, rec.on_success, rec.on_failure);
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
	/* a run waiting for this step, or blocked on it, goes on */
	ds_run_wake_for_step(run_id);
	PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, false));
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
	char	   *run_id = identity_arg(fcinfo, 0, "run_id");
	char	   *step_id = identity_arg(fcinfo, 1, "step_id");
	StepRecord	rec;

	PreventCommandIfReadOnly("ds_cancel_step()");
	PreventCommandIfParallelMode("ds_cancel_step()");
	lock_visible_step(run_id, step_id, true, &rec);
	if (rec.status == STEP_RUNNING)
		/* its lock was free: the process running it is gone, so the attempt is lost */
		ds_record_lost_attempt(&rec);
	if (rec.status == STEP_CANCELLED)
		PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, false));
	if (rec.status == STEP_SUCCEEDED || rec.status == STEP_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is %s and cannot be cancelled", run_id, step_id,
						ds_step_status_name(rec.status)),
				 errdetail("Only steps that have not finished can be cancelled.")));
	ds_cancel_waiting_step(&rec);
	/* a run waiting for this step (an HTTP step's response, a retry) meets it cancelled: DS102 */
	ds_run_wake_for_step(run_id);
	PG_RETURN_DATUM(step_result_datum(fcinfo, &rec, false));
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

/*
 * The rules above, shared with the other kinds of steps (step_call.h): every kind answers
 * replays, conflicts and other roles' calls the same way.
 */
char *
ds_step_identity_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	return identity_arg(fcinfo, argno, name);
}

int64
ds_step_timeout_arg(FunctionCallInfo fcinfo, int argno)
{
	return timeout_arg(fcinfo, argno);
}

char *
ds_step_fingerprint(const char *sql, Jsonb *input, const char *on_success, const char *on_failure)
{
	return step_fingerprint(sql, input, on_success, on_failure);
}

Datum
ds_step_result_datum(FunctionCallInfo fcinfo, const StepRecord *rec, bool replayed)
{
	return step_result_datum(fcinfo, rec, replayed);
}

bool
ds_step_answer_from_store(const StepRecord *rec, const char *fingerprint)
{
	return answer_from_store(rec, fingerprint);
}

void
ds_step_check_owner(const StepRecord *rec)
{
	check_access(rec);
}

bool
ds_step_lock_and_read(const char *run_id, const char *step_id, bool nowait, StepRecord *rec)
{
	StepCall	call;

	memset(&call, 0, sizeof(call));
	call.run_id = (char *) run_id;
	call.step_id = (char *) step_id;
	call.nowait = nowait;
	return lock_and_read(&call, rec);
}

void
ds_step_lock_visible(const char *run_id, const char *step_id, StepRecord *rec)
{
	lock_visible_step(run_id, step_id, false, rec);
}
