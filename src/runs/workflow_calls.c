/*
 * workflow_calls.c -- what a workflow calls on its run: ds_step, ds_sleep, ds_await_event; and
 * ds_emit_event, which anybody calls (docs/runs.md).
 *
 * In a turn these only replay: a step that completed before returns its result (through
 * ds_run_step, asked to run nothing now: `defer => true`), one that failed for good raises the
 * step-failed error (DS102) into the workflow, one that must wait -- its retry not due, blocked
 * for a person, a sleep, an event -- suspends the run. A call that has work to do (an attempt
 * that is due, a wait to begin or end) ends the turn and leaves the work to the executor, which
 * does it after the turn's rollback, so that it commits on its own (run_context.c, run_turn.c).
 *
 * Sleeps and event waits are steps too (kind 'sleep' and 'event'), so that their state replays
 * like any step's: a sleep records its wake-up time the first time it is reached (a succeeded
 * step whose result is {"until": ...}); an event wait records when it began (a pending step that
 * no executor claims, its next_attempt_at NULL), then the event's payload or its timeout.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/classify.h"
#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/worker_attempt_time.h"
#include "steps/limits.h"
#include "steps/run_context.h"
#include "runs/workflow_calls.h"
#include "steps/step_call.h"
#include "steps/step_exec.h"
#include "store/event_store.h"
#include "store/run_control_store.h"
#include "store/step_lock.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"
#include "base/size_limits.h"
#include "base/sql_text.h"

PG_FUNCTION_INFO_V1(ds_step);
PG_FUNCTION_INFO_V1(ds_sleep);
PG_FUNCTION_INFO_V1(ds_await_event);
PG_FUNCTION_INFO_V1(ds_emit_event);
PG_FUNCTION_INFO_V1(ds_patched);

#define MAX_NAME_CHARS 255

/* Argument `argno`, a step id or event name: not NULL, not empty, at most 255 characters. */
static char *
name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	char	   *s;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	s = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (s[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (pg_mbstrlen(s) > MAX_NAME_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("The limit is %d characters.", MAX_NAME_CHARS)));
	return s;
}

void
ds_turn_throw_step_failed(const char *run_id, const char *step_id, StepStatus status,
						  const char *error_class, const char *code, const char *message)
{
	bool		failed = status == STEP_FAILED;

	ereport(ERROR,
			(errcode(ERRCODE_DS_STEP_NOT_SUCCEEDED),
			 errmsg("step %s of run %s %s%s%s", step_id, run_id,
					failed ? "failed" : "is ", failed ? "" : ds_step_status_name(status),
					error_class ? psprintf(" (%s)", error_class) : ""),
			 code ? errdetail("SQLSTATE %s: %s", code, message ? message : "") : 0,
			 errhint("Catch SQLSTATE DS102 in the workflow to carry on without the step; re-arm it with ds_retry_step() and resume the run with ds_resume_run().")));
}

/*
 * The plan that calls ds_run_step() by its qualified name, made for the extension's schema, to
 * replay: with defer => true it runs no attempt (a new step is stored pending, and rolled back
 * with the turn).
 */
static SPIPlanPtr step_plan = NULL;
static Oid	step_plan_schema = InvalidOid;

static SPIPlanPtr
run_step_plan(void)
{
	Oid			schema = ds_extension_schema();
	Oid			types[10] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, INTERVALOID,
	TEXTARRAYOID, TEXTARRAYOID, TEXTOID, TEXTOID};

	if (step_plan != NULL && step_plan_schema == schema)
		return step_plan;
	if (step_plan != NULL)
		SPI_freeplan(step_plan);
	step_plan = NULL;
	/* named arguments: ds_run_step's later arguments keep their defaults */
	step_plan_schema = schema;
	return ds_prepare_kept(&step_plan,
						   psprintf("SELECT status, result, next_attempt_at, error_class, error_code,"
									" error_message, remediation"
									" FROM %s.ds_run_step(run_id => $1, step_id => $2, sql => $3,"
									" input => $4, policy => $5, timeout => $6, retry_on => $7,"
									" fail_on => $8, on_timeout => $9, expect => $10, defer => true)",
									quote_identifier(get_namespace_name(schema))),
						   10, types);
}

/* Append `"key": <string>` to a JSON object being built. */
static void
append_string_field(StringInfo buf, const char *key, const char *value)
{
	appendStringInfo(buf, "%s\"%s\": ", buf->len > 1 ? ", " : "", key);
	escape_json(buf, value);
}

/* Append the text[] `arr` as a JSON array under `key`. */
static void
append_text_array(StringInfo buf, const char *key, Datum arr)
{
	Datum	   *elems;
	bool	   *enulls;
	int			n;

	deconstruct_array(DatumGetArrayTypeP(arr), TEXTOID, -1, false, TYPALIGN_INT, &elems, &enulls, &n);
	appendStringInfo(buf, "%s\"%s\": [", buf->len > 1 ? ", " : "", key);
	for (int i = 0; i < n; i++)
	{
		if (i > 0)
			appendStringInfoString(buf, ", ");
		if (enulls[i])
			appendStringInfoString(buf, "null");
		else
			escape_json(buf, TextDatumGetCString(elems[i]));
	}
	appendStringInfoChar(buf, ']');
}

/*
 * ds_run_step's arguments for the attempt the executor runs after the turn, as the text of a
 * jsonb object (a key is left out for SQL NULL, so that a JSON null input stays one). The
 * attempt is bounded like a worker attempt: by its timeout, or durable_steps.default_timeout.
 */
static char *
encode_step_call(Datum *args, char *nulls, int64 *limit)
{
	StringInfoData buf;
	int64		timeout = nulls[5] == ' ' ? ds_interval_to_usecs(DatumGetIntervalP(args[5])) : 0;

	*limit = ds_worker_attempt_limit_usecs(timeout);
	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	append_string_field(&buf, "run_id", TextDatumGetCString(args[0]));
	append_string_field(&buf, "step_id", TextDatumGetCString(args[1]));
	append_string_field(&buf, "sql", TextDatumGetCString(args[2]));
	if (nulls[3] == ' ')
		appendStringInfo(&buf, ", \"input\": %s",
						 JsonbToCString(NULL, &DatumGetJsonbP(args[3])->root, 0));
	if (nulls[4] == ' ')
		appendStringInfo(&buf, ", \"policy\": %s",
						 JsonbToCString(NULL, &DatumGetJsonbP(args[4])->root, 0));
	append_string_field(&buf, "timeout",
						DatumGetCString(DirectFunctionCall1(interval_out,
															IntervalPGetDatum(ds_usecs_to_interval(*limit)))));
	if (nulls[6] == ' ')
		append_text_array(&buf, "retry_on", args[6]);
	if (nulls[7] == ' ')
		append_text_array(&buf, "fail_on", args[7]);
	if (nulls[8] == ' ')
		append_string_field(&buf, "on_timeout", TextDatumGetCString(args[8]));
	if (nulls[9] == ' ')
		append_string_field(&buf, "expect", TextDatumGetCString(args[9]));
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * The checks ds_run_step makes of the arguments ds_step passes it (run_step.c, parse_step_call),
 * for a new step, which ds_step does not hand to ds_run_step in the turn: a malformed argument
 * raises at the call, where the workflow can catch it, not in the executor's work after the turn.
 */
static void
check_new_step_args(FunctionCallInfo fcinfo)
{
	RetryPolicy parsed;
	ClassOverrides overrides;
	char	   *sql;
	char	   *on_timeout;

	/*
	 * in parse_step_call's order: the first malformed argument is the one
	 * reported
	 */
	(void) ds_step_timeout_arg(fcinfo, 4);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("sql must not be null")));
	sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ds_check_one_statement("sql", sql);
	if (PG_ARGISNULL(7))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("on_timeout must not be null")));
	on_timeout = text_to_cstring(PG_GETARG_TEXT_PP(7));
	if (strcmp(on_timeout, "retry") != 0 && strcmp(on_timeout, "fail") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("on_timeout must be 'retry' or 'fail'")));
	ds_policy_parse(PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3), &parsed);
	/* a SQL step of a run runs in its turn: it cannot wait for an admission */
	if (parsed.limit_name != NULL)
		ds_limit_check_step(parsed.limit_name, true);
	memset(&overrides, 0, sizeof(overrides));
	ds_parse_sqlstate_list(PG_ARGISNULL(5) ? NULL : PG_GETARG_ARRAYTYPE_P(5), "retry_on",
						   &overrides.n_retry, &overrides.retry_on, &overrides.retry_is_class);
	ds_parse_sqlstate_list(PG_ARGISNULL(6) ? NULL : PG_GETARG_ARRAYTYPE_P(6), "fail_on",
						   &overrides.n_fail, &overrides.fail_on, &overrides.fail_is_class);
	(void) ds_expect_row_arg(fcinfo, 8);
}

/* The turn ends here: step `step_id`'s attempt is due, and the executor runs it after the turn. */
pg_noreturn static void suspend_for_attempt(const char *step_id, Datum *args, char *nulls);

static void
suspend_for_attempt(const char *step_id, Datum *args, char *nulls)
{
	TurnSuspension work;

	memset(&work, 0, sizeof(work));
	work.work = TURN_WORK_STEP;
	work.wake_at = GetCurrentTimestamp();
	work.reason = psprintf("running step %s", step_id);
	work.step_id = (char *) step_id;
	work.step_call = encode_step_call(args, nulls, &work.step_timeout);
	work.owner = GetUserId();
	work.search_path = namespace_search_path;
	ds_turn_suspend_for_work(&work);
}

/*
 * ds_step(step_id, sql, input, policy, timeout, retry_on, fail_on, on_timeout, expect) -> jsonb:
 * the step's result.
 *
 * The two common calls of a turn are answered here from one look at the step's row: a step the
 * run completed before (as its owner, with this definition: what ds_run_step would replay), and
 * a new one (the turn ends; ds_run_step stores and runs it in the executor's work). Anything else
 * -- a step to retry, re-armed, blocked, another role's, a conflicting definition -- is asked of
 * ds_run_step, with `defer => true` so that it runs nothing now.
 */
Datum
ds_step(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_step", NULL);
	Datum		args[10];
	char		nulls[10];
	int			rc;
	HeapTuple	row;
	TupleDesc	td;
	bool		isnull;
	char	   *step_id;
	StepStatus	status = STEP_PENDING;
	Jsonb	   *result = NULL;
	TimestampTz next_at = 0;
	char	   *error_class;
	char	   *error_code;
	char	   *error_message;
	char	   *remediation;
	MemoryContext caller_cxt = CurrentMemoryContext;
	StepRecord	probe;
	bool		found;

	step_id = name_arg(fcinfo, 0, "step_id");
	args[0] = CStringGetTextDatum(run_id);
	nulls[0] = ' ';
	for (int i = 0; i < 9; i++)
	{
		bool		null = i >= PG_NARGS() || PG_ARGISNULL(i);

		nulls[i + 1] = null ? 'n' : ' ';
		args[i + 1] = null ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	found = ds_probe_step(run_id, step_id, GetLatestSnapshot(), &probe, NULL);
	if (!found)
	{
		check_new_step_args(fcinfo);
		suspend_for_attempt(step_id, args, nulls);
	}
	ds_turn_visit(step_id);
	if (probe.status == STEP_SUCCEEDED && probe.attempt_base == 0 &&
		probe.owner == GetUserId() && probe.kind == STEP_KIND_SQL && !PG_ARGISNULL(1) &&
		probe.on_success == NULL && probe.on_failure == NULL &&
		strcmp(probe.fingerprint,
			   ds_sql_step_fingerprint(text_to_cstring(PG_GETARG_TEXT_PP(1)),
									   ds_expect_row_arg(fcinfo, 8),
									   PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2), NULL, NULL)) == 0)
	{
		if (probe.result == NULL)
			PG_RETURN_NULL();
		PG_RETURN_JSONB_P(probe.result);
	}

	/*
	 * A step that was re-armed (ds_retry_step, maybe with corrected input)
	 * runs as it was armed: the workflow passes what it passed before, and
	 * the correction must not be a conflict. Its definition is read under the
	 * step's lock, taken before its row's, as every writer of a step takes
	 * them: an executor may be running the re-armed step as a plain step, and
	 * its record of the attempt waits for the row; a row lock held here while
	 * ds_run_step waits for the step's lock would deadlock the turn with it
	 * (the run failed with 40P01 though its step succeeded).
	 */
	{
		StepRecord	armed;

		if (probe.attempt_base > 0 && probe.owner == GetUserId() &&
			probe.kind == STEP_KIND_SQL &&
			ds_step_lock_and_read(run_id, step_id, false, &armed) && armed.sql != NULL)
		{
			args[2] = CStringGetTextDatum(armed.sql);
			nulls[2] = ' ';
			args[3] = armed.input ? JsonbPGetDatum(armed.input) : (Datum) 0;
			nulls[3] = armed.input ? ' ' : 'n';
		}
	}
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_plan(run_step_plan(), args, nulls, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "ds_run_step() answered nothing");
	row = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	{
		MemoryContext spi_cxt = MemoryContextSwitchTo(caller_cxt);
		Datum		d;

		status = ds_step_status_from_name(SPI_getvalue(row, td, 1));
		d = SPI_getbinval(row, td, 2, &isnull);
		if (!isnull)
			result = DatumGetJsonbPCopy(d);
		d = SPI_getbinval(row, td, 3, &isnull);
		if (!isnull)
			next_at = DatumGetTimestampTz(d);
		error_class = SPI_getvalue(row, td, 4);
		error_code = SPI_getvalue(row, td, 5);
		error_message = SPI_getvalue(row, td, 6);
		remediation = SPI_getvalue(row, td, 7);
		MemoryContextSwitchTo(spi_cxt);
	}
	SPI_finish();

	if (status == STEP_SUCCEEDED)
	{
		if (result == NULL)
			PG_RETURN_NULL();
		PG_RETURN_JSONB_P(result);
	}
	if ((status == STEP_RETRYING || status == STEP_PENDING) &&
		next_at > GetCurrentTimestamp())
		ds_turn_suspend(false, next_at,
						error_message ?
						psprintf("retry of step %s (last error %s: %s)", step_id,
								 error_code ? error_code : "?", error_message) :
						psprintf("step %s", step_id),
						step_id, NULL);
	if (status == STEP_RETRYING || status == STEP_PENDING)
		/* due: its attempt runs after this turn, and commits on its own */
		suspend_for_attempt(step_id, args, nulls);
	if (status == STEP_BLOCKED)
		ds_turn_suspend(true, 0,
						psprintf("step %s is blocked: %s", step_id,
								 remediation ? remediation : "it needs corrected input"),
						step_id, NULL);
	if (status == STEP_RUNNING)

		/*
		 * an executor holds it (never expected here: ds_run_step waited for
		 * it)
		 */
		ds_turn_suspend(false, GetCurrentTimestamp() + USECS_PER_SEC,
						psprintf("step %s is running elsewhere", step_id), step_id, NULL);
	ds_turn_throw_step_failed(run_id, step_id, status, error_class, error_code, error_message);
	PG_RETURN_NULL();
}

/* A step of the run made by ds_sleep or ds_await_event: its record, before it is written. */
static void
wait_step_record(StepRecord *rec, const char *run_id, const char *step_id, StepKind kind,
				 Oid owner, const char *search_path)
{
	TimestampTz now = GetCurrentTimestamp();

	memset(rec, 0, sizeof(*rec));
	rec->run_id = pstrdup(run_id);
	rec->step_id = pstrdup(step_id);
	rec->kind = kind;
	/* no SQL, no input: the kind is its whole definition */
	rec->fingerprint = pstrdup(ds_step_kinds[kind].name);
	ds_policy_resolve(NULL, NULL, &rec->backoff);
	rec->max_attempts = 1;
	rec->on_timeout = "retry";
	/* never claimed by an executor: the queue only has to be a valid one */
	rec->queue = "default";
	rec->owner = owner;
	rec->search_path = pstrdup(search_path);
	rec->created_at = now;
	rec->updated_at = now;
}

/*
 * Read the sleep or event step `step_id` of the current run; false when it does not exist. One
 * of another kind, or another role's, is a conflict.
 */
static bool
read_wait_step(const char *run_id, const char *step_id, StepKind kind, StepRecord *rec)
{
	if (!ds_store_lock_step(run_id, step_id, rec))
		return false;
	ds_step_check_owner(rec);
	ds_turn_visit(step_id);
	if (rec->kind != kind)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("step %s/%s already exists as a step of kind %s", run_id, step_id,
						ds_step_kinds[rec->kind].name),
				 errhint("Use a new step_id for a different step.")));
	return true;
}

/* {"until": "<ISO 8601 time>"} */
static Jsonb *
until_jsonb(TimestampTz until)
{
	char		buf[MAXDATELEN + 1];
	StringInfoData s;

	initStringInfo(&s);
	appendStringInfoString(&s, "{\"until\": \"");
	appendStringInfoString(&s, JsonEncodeDateTime(buf, TimestampTzGetDatum(until),
												  TIMESTAMPTZOID, NULL));
	appendStringInfoString(&s, "\"}");
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(s.data)));
}

/* The time in the result of a sleep step. */
static TimestampTz
sleep_until(const StepRecord *rec)
{
	char	   *t = ds_jsonb_field_text(rec->result, "until", NULL);

	if (t == NULL)
		elog(ERROR, "sleep step %s/%s has no wake-up time", rec->run_id, rec->step_id);
	return DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in, CStringGetDatum(t),
												   ObjectIdGetDatum(InvalidOid),
												   Int32GetDatum(-1)));
}

/* A wait's work for the executor, as far as the calls below share it. */
static void
wait_work(TurnSuspension *work, TurnWork kind, const char *step_id, const char *reason)
{
	memset(work, 0, sizeof(*work));
	work->work = kind;
	work->step_id = (char *) step_id;
	work->reason = (char *) reason;
	work->owner = GetUserId();
	work->search_path = namespace_search_path;
}

/* ds_sleep(step_id, duration): the run goes on no earlier than `duration` after it first got here. */
Datum
ds_sleep(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_sleep", NULL);
	char	   *step_id = name_arg(fcinfo, 0, "step_id");
	StepRecord	rec;
	TimestampTz until;
	int64		usecs;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("duration must not be null")));
	usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(1));
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("duration must not be negative")));
	if (!read_wait_step(run_id, step_id, STEP_KIND_SLEEP, &rec))
	{
		/* the wake-up time is recorded once, and the run sleeps until it */
		TurnSuspension work;

		wait_work(&work, TURN_WORK_SLEEP, step_id, psprintf("sleep %s", step_id));
		work.until = GetCurrentTimestamp() + usecs;
		work.wake_at = work.until;
		ds_turn_suspend_for_work(&work);
	}
	until = sleep_until(&rec);
	if (GetCurrentTimestamp() < until)
		ds_turn_suspend(false, until, psprintf("sleep %s", step_id), step_id, NULL);
	PG_RETURN_VOID();
}

/* The payload of event `name` emitted by `owner`; false when it has not been emitted. */
static bool
find_event(Oid owner, const char *name, Jsonb **payload)
{
	StoreSpi	spi;
	bool		found;

	ds_store_spi_begin(&spi);
	found = ds_store_read_event(owner, name, spi.caller_cxt, payload);
	ds_store_spi_end(&spi);
	return found;
}

/* {"event": name} */
static Jsonb *
event_request(const char *name)
{
	StringInfoData s;

	initStringInfo(&s);
	appendStringInfoString(&s, "{\"event\": ");
	escape_json(&s, name);
	appendStringInfoChar(&s, '}');
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(s.data)));
}

/*
 * ds_await_event(step_id, name, timeout) -> jsonb: the payload of event `name` emitted by the
 * run's owner; the run waits until it is emitted. A timeout, counted from the first time the run
 * got here, raises DS408.
 */
Datum
ds_await_event(PG_FUNCTION_ARGS)
{
	Oid			owner;
	const char *run_id = ds_turn_require("ds_await_event", &owner);
	char	   *step_id = name_arg(fcinfo, 0, "step_id");
	char	   *name = name_arg(fcinfo, 1, "name");
	int64		timeout = 0;
	StepRecord	rec;
	Jsonb	   *payload;
	TimestampTz deadline = 0;
	TurnSuspension work;

	if (!PG_ARGISNULL(2))
	{
		timeout = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(2));
		if (timeout <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("timeout must be more than 0")));
	}
	if (read_wait_step(run_id, step_id, STEP_KIND_EVENT, &rec))
	{
		char	   *waited_for = ds_jsonb_field_text(rec.request, "event", NULL);

		if (waited_for == NULL || strcmp(waited_for, name) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_DS_STEP_CONFLICT),
					 errmsg("step %s/%s already waits for event %s", run_id, step_id,
							waited_for ? waited_for : "(none)"),
					 errhint("Use a new step_id for a different event.")));
		if (rec.status == STEP_SUCCEEDED)
		{
			if (rec.result == NULL)
				PG_RETURN_NULL();
			PG_RETURN_JSONB_P(rec.result);
		}
		if (rec.status == STEP_FAILED && rec.error_code != NULL &&
			strcmp(rec.error_code, unpack_sql_state(ERRCODE_DS_EVENT_TIMEOUT)) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_DS_EVENT_TIMEOUT),
					 errmsg("step %s of run %s: %s", step_id, run_id, rec.error_message)));
		if (rec.status != STEP_PENDING)
			ds_turn_throw_step_failed(run_id, step_id, rec.status,
									  rec.error_class, rec.error_code, rec.error_message);

		/*
		 * the wait began when the step was recorded: the timeout counts from
		 * there
		 */
		if (rec.timeout > 0)
			deadline = rec.created_at + rec.timeout;
		if (find_event(owner, name, &payload))
		{
			wait_work(&work, TURN_WORK_EVENT_DONE, step_id, psprintf("event %s arrived", name));
			work.wake_at = GetCurrentTimestamp();
			work.payload = payload ? JsonbToCString(NULL, &payload->root, 0) : NULL;
			work.event = name;
			ds_turn_suspend_for_work(&work);
		}
		if (deadline != 0 && GetCurrentTimestamp() >= deadline)
		{
			wait_work(&work, TURN_WORK_EVENT_TIMEOUT, step_id,
					  psprintf("event %s timed out", name));
			work.wake_at = GetCurrentTimestamp();
			work.event = name;
			ds_turn_suspend_for_work(&work);
		}
		ds_turn_suspend(false, deadline, psprintf("event %s", name), step_id, name);
	}

	/*
	 * the first time here: the wait begins (and, if the event is there, ends
	 * at once)
	 */
	wait_work(&work, TURN_WORK_EVENT_START, step_id, psprintf("event %s", name));
	work.event = name;
	work.event_timeout = timeout;
	work.wake_at = timeout > 0 ? GetCurrentTimestamp() + timeout : 0;
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}

/* How many steps run `run_id` has recorded, of every kind. */
static int64
recorded_steps(const char *run_id)
{
	return ds_store_count_run_steps(run_id);
}

/*
 * ds_patched(change_id) -> boolean (docs/runs.md, "Changing a workflow"): whether this run takes
 * the code of change `change_id`. The first time a run reaches the call, the answer is true
 * when the run's history goes no further than this point -- every step it has recorded was
 * found by a call of this turn before it, so the run reaches the change as new code -- and false
 * when it recorded steps this turn has not reached yet: its history went past this point under
 * the code before the change, which it must replay. The answer is recorded as a step of kind
 * `patch` named `change_id` (after the turn, as a wait is), and every later turn answers it.
 */
Datum
ds_patched(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_patched", NULL);
	char	   *step_id = name_arg(fcinfo, 0, "change_id");
	StepRecord	rec;
	TurnSuspension work;

	if (read_wait_step(run_id, step_id, STEP_KIND_PATCH, &rec))
	{
		char	   *patched = ds_jsonb_field_text(rec.result, "patched", NULL);

		if (patched == NULL)
			elog(ERROR, "patch step %s/%s has no answer", run_id, step_id);
		PG_RETURN_BOOL(strcmp(patched, "true") == 0);
	}
	wait_work(&work, TURN_WORK_PATCH, step_id, psprintf("patch %s", step_id));
	work.patched = recorded_steps(run_id) <= ds_turn_visited();
	work.wake_at = GetCurrentTimestamp();
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}

void
ds_turn_record_wait(const char *run_id, TurnSuspension *work)
{
	StepRecord	rec;
	TimestampTz now = GetCurrentTimestamp();

	switch (work->work)
	{
		case TURN_WORK_SLEEP:
			wait_step_record(&rec, run_id, work->step_id, STEP_KIND_SLEEP, work->owner, work->search_path);
			rec.status = STEP_SUCCEEDED;
			rec.result = until_jsonb(work->until);
			rec.finished_at = rec.created_at;
			ds_store_insert_step(&rec);
			break;
		case TURN_WORK_EVENT_START:

			/*
			 * pending with no next attempt time: no executor claims it; the
			 * run waits
			 */
			wait_step_record(&rec, run_id, work->step_id, STEP_KIND_EVENT, work->owner, work->search_path);
			rec.request = event_request(work->event);
			rec.status = STEP_PENDING;
			rec.timeout = work->event_timeout;
			ds_store_insert_step(&rec);
			break;
		case TURN_WORK_EVENT_DONE:
		case TURN_WORK_EVENT_TIMEOUT:
			if (!ds_store_lock_step(run_id, work->step_id, &rec) || rec.status != STEP_PENDING)
				return;			/* cancelled meanwhile */
			rec.updated_at = now;
			rec.finished_at = now;
			rec.next_attempt_at = 0;
			if (work->work == TURN_WORK_EVENT_DONE)
			{
				rec.status = STEP_SUCCEEDED;
				rec.result = work->payload ?
					DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(work->payload))) :
					NULL;
			}
			else
			{
				rec.status = STEP_FAILED;
				rec.error_class = "timeout";
				rec.error_code = pstrdup(unpack_sql_state(ERRCODE_DS_EVENT_TIMEOUT));
				rec.error_message = psprintf("event %s was not emitted in time", work->event);
			}
			ds_store_update_step(&rec);
			break;
		case TURN_WORK_PATCH:
			wait_step_record(&rec, run_id, work->step_id, STEP_KIND_PATCH, work->owner, work->search_path);
			rec.status = STEP_SUCCEEDED;
			rec.result = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
															CStringGetDatum(work->patched ?
																			"{\"patched\": true}" :
																			"{\"patched\": false}")));
			rec.finished_at = rec.created_at;
			ds_store_insert_step(&rec);
			break;
		default:
			elog(ERROR, "not a wait to record");
	}
}

/*
 * ds_emit_event(name, payload) -> boolean: record event `name` of the current role, first write
 * wins (true when this call recorded it), and wake its runs that wait for it, at commit.
 */
Datum
ds_emit_event(PG_FUNCTION_ARGS)
{
	char	   *name = name_arg(fcinfo, 0, "name");
	Jsonb	   *payload = PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1);
	Oid			owner = GetUserId();	/* the caller's, not the tables' owner
										 * the statements run as */
	StoreSpi	spi;
	bool		recorded;

	PreventCommandIfReadOnly("ds_emit_event()");
	PreventCommandIfParallelMode("ds_emit_event()");
	if (payload != NULL)
		ds_check_size(DS_LIMIT_EVENT_PAYLOAD, "payload", VARSIZE_ANY(payload));

	/*
	 * held to the commit: an executor that looks once more for the event a
	 * turn just began to wait for waits for this emit, or comes after it
	 * (ds_wake_if_event_emitted); either way one of the two wakes the run
	 */
	ds_event_lock(owner, name, true, false);
	ds_store_spi_begin(&spi);
	recorded = ds_store_insert_event(owner, name, payload);
	if (ds_store_wake_event_waiters(owner, name) > 0)
		ds_worker_wake_at_commit();
	ds_store_spi_end(&spi);
	PG_RETURN_BOOL(recorded);
}
