/*
 * step_exec.c -- one attempt of a SQL step body.
 *
 * The body runs the way PL/pgSQL runs an exception block: in an internal subtransaction
 * (subtransaction.h), so that a failure rolls back exactly the body's writes and leaves the
 * caller's transaction usable for recording the failure. The step's SETs are contained by a GUC
 * nest level, a worker's attempt runs isolated as the step's owner (step_isolation.c), and the
 * step's timeout is a deadline timer (deadline_timer.h) that cancels the body the way
 * statement_timeout cancels a statement -- again every second while a body that caught the
 * cancel goes on, and in the worker, past a grace period, by ending the executor
 * (docs/security.md: no role holds an executor without bound).
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/typcache.h"

#include "base/ds_errcodes.h"
#include "base/subtransaction.h"
#include "base/worker_attempt_time.h"
#include "steps/deadline_timer.h"
#include "steps/step_context.h"
#include "steps/step_exec.h"
#include "steps/step_isolation.h"
#include "ipc/worker_shmem.h"

static int	max_result_size = 1024 * 1024;

int
ds_max_result_size(void)
{
	return max_result_size;
}

/* How often a worker attempt looks for a ds_cancel_step() request. */
#define CANCEL_POLL_MS 100

/*
 * The step bodies' deadline timer, armed at the earliest deadline of the bodies executing now
 * (nested steps). It ends the executor past the grace after the deadline of the worker attempt
 * running now (end_process_after; 0 = none), and then says so (ended_process).
 */
static void body_deadline_passed(void);
static DeadlineTimer body_deadline_timer = DEADLINE_TIMER_INIT(body_deadline_passed);

/* The deadline body_deadline_timer is armed at; 0 = none. */
typedef enum DeadlineSource
{
	DEADLINE_STEP,				/* the step's own timeout */
	DEADLINE_DEFAULT,			/* durable_steps.default_timeout (worker, no
								 * timeout of its own) */
	DEADLINE_CEILING			/* durable_steps.max_worker_attempt_time */
} DeadlineSource;

static TimestampTz armed_body_deadline = 0;

/* what set it: the log line of an executor a body made end names it */
static DeadlineSource armed_source = DEADLINE_STEP;

/* The running worker attempt's key for ds_cancel_step() (0 = none), and whether it was asked. */
static TimeoutId cancel_poll_id = MAX_TIMEOUTS;
static volatile uint64 polled_cancel_key = 0;
static volatile sig_atomic_t cancelled_by_request = false;

/* Timeout handler (signal context): stop the body when ds_cancel_step() asked for it. */
static void
cancel_poll_handler(void)
{
	if (polled_cancel_key != 0 && ds_cancel_requested(polled_cancel_key))
	{
		cancelled_by_request = true;
		QueryCancelPending = true;
		InterruptPending = true;
		SetLatch(MyLatch);
	}
}

void
ds_poll_cancel_requests(bool on)
{
	if (cancel_poll_id == MAX_TIMEOUTS)
		cancel_poll_id = RegisterTimeout(USER_TIMEOUT, cancel_poll_handler);
	polled_cancel_key = 0;
	if (on)
		enable_timeout_every(cancel_poll_id,
							 TimestampTzPlusMilliseconds(GetCurrentTimestamp(), CANCEL_POLL_MS),
							 CANCEL_POLL_MS);
	else if (get_timeout_active(cancel_poll_id))
		disable_timeout(cancel_poll_id, false);
}

/* Attempt `key` is the one the poll looks for (0: none, between attempts). */
static void
poll_for_attempt(uint64 key)
{
	cancelled_by_request = false;
	polled_cancel_key = key;
}

/* Timeout handler (signal context): cancel the body, and past the grace period end the executor. */
static void
body_deadline_passed(void)
{
	ds_deadline_timer_fire(&body_deadline_timer);
}

/* Log, as the executor ends, that a body made it end by ignoring its cancellation. */
static void
log_ignored_cancel(int code, Datum arg)
{
	if (body_deadline_timer.ended_process)
		ereport(LOG,
				(errmsg("durable_steps: a step body ignored its cancellation at %s; ending the executor",
						armed_source == DEADLINE_CEILING ? "durable_steps.max_worker_attempt_time" :
						armed_source == DEADLINE_DEFAULT ? "its deadline, durable_steps.default_timeout" :
						"its own timeout"),
				 errdetail("The attempt is recorded as lost and retried by its policy.")));
}

bool
ds_worker_body_ignored_cancel(void)
{
	return body_deadline_timer.ended_process;
}

/* Cut an error text at DS_MAX_ERROR_TEXT bytes, on a character boundary. */
static char *
capped_error_text(char *text)
{
	int			len;

	if (text == NULL || strlen(text) <= DS_MAX_ERROR_TEXT)
		return text;

	len = pg_mbcliplen(text, strlen(text), DS_MAX_ERROR_TEXT - 4);
	return psprintf("%.*s ...", len, text);
}

/* The jsonb value null. */
static Jsonb *
jsonb_null(void)
{
	JsonbValue	v;

	v.type = jbvNull;
	return JsonbValueToJsonb(&v);
}

/* to_jsonb() learns its argument's type from the call expression; give it one. */
static Jsonb *
datum_to_jsonb(Datum value, Oid type)
{
	FmgrInfo	flinfo;
	FuncExpr   *call;

	fmgr_info(F_TO_JSONB, &flinfo);
	call = makeFuncExpr(F_TO_JSONB, JSONBOID,
						list_make1(makeNullConst(type, -1, InvalidOid)),
						InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
	flinfo.fn_expr = (Node *) call;
	return DatumGetJsonbP(FunctionCall1Coll(&flinfo, InvalidOid, value));
}

/* One column: that value. Several: an object of the columns. No row or no column: JSON null. */
static Jsonb *
result_to_jsonb(SPITupleTable *tuptable, uint64 processed)
{
	TupleDesc	tupdesc;
	HeapTuple	tuple;

	if (tuptable == NULL || processed == 0)
		return jsonb_null();
	if (processed > 1)
		ereport(ERROR,
				(errcode(ERRCODE_DS_TOO_MANY_ROWS),
				 errmsg("step returned more than one row"),
				 errdetail("A step's result is the single row it returns."),
				 errhint("Aggregate the rows, for example with jsonb_agg, or add a LIMIT.")));
	tupdesc = tuptable->tupdesc;
	tuple = tuptable->vals[0];
	if (tupdesc->natts == 0)
		return jsonb_null();
	if (tupdesc->natts == 1)
	{
		bool		isnull;
		Datum		value = SPI_getbinval(tuple, tupdesc, 1, &isnull);

		if (isnull)
			return jsonb_null();
		return datum_to_jsonb(value, SPI_gettypeid(tupdesc, 1));
	}
	else
	{
		TupleDesc	blessed = BlessTupleDesc(CreateTupleDescCopy(tupdesc));

		return datum_to_jsonb(heap_copy_tuple_as_datum(tuple, blessed), RECORDOID);
	}
}

/*
 * Bodies are parsed and planned once per backend: the same step SQL runs again and again (every
 * order's "reserve-stock" step, every retry). Plans are kept by SQL text *and role*: the plan
 * cache re-plans them when the objects they use, their privileges or the search_path change,
 * but some permissions are checked only when a statement is parsed or planned (USAGE on the
 * schemas it names, EXECUTE on an SQL function it inlines), so a plan made for one role must
 * never run for another. Kept plans are never freed, since a nested step may be running one:
 * past MAX_BODY_PLANS (or on a hash collision) a body is planned for the one attempt only.
 */
#define MAX_BODY_PLANS 256

typedef struct BodyPlan
{
	uint64		hash;			/* key: hash of the SQL text and the role */
	char	   *sql;			/* in TopMemoryContext, to tell hash
								 * collisions apart */
	Oid			role;
	SPIPlanPtr	plan;
} BodyPlan;

static HTAB *body_plans = NULL;

/* Called inside the body's SPI connection: a failure to prepare is the attempt's failure. */
static SPIPlanPtr
body_plan(const char *sql)
{
	Oid			argtypes[1] = {JSONBOID};
	Oid			role = GetUserId();
	uint64		hash = hash_bytes_extended((const unsigned char *) sql, strlen(sql), role);
	BodyPlan   *entry;
	bool		found;
	SPIPlanPtr	plan;

	if (body_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(BodyPlan);
		body_plans = hash_create("durable_steps body plans", MAX_BODY_PLANS, &ctl,
								 HASH_ELEM | HASH_BLOBS);
	}
	entry = hash_search(body_plans, &hash, HASH_FIND, NULL);
	if (entry != NULL && entry->role == role && strcmp(entry->sql, sql) == 0)
		return entry->plan;

	plan = SPI_prepare(sql, 1, argtypes);
	if (plan == NULL)
		elog(ERROR, "could not prepare step SQL: %s", SPI_result_code_string(SPI_result));
	if (list_length(SPI_plan_get_plan_sources(plan)) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("step SQL must be exactly one statement"),
				 errdetail("It has %d.", list_length(SPI_plan_get_plan_sources(plan)))));
	if (entry != NULL || hash_get_num_entries(body_plans) >= MAX_BODY_PLANS)
		return plan;			/* freed with this attempt's SPI connection */
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	entry = hash_search(body_plans, &hash, HASH_ENTER, &found);
	entry->sql = MemoryContextStrdup(TopMemoryContext, sql);
	entry->role = role;
	entry->plan = plan;
	return plan;
}

/*
 * Runs inside the subtransaction; any error here is the attempt's failure. `result_limit` is
 * durable_steps.max_result_size as it was before the body could change it.
 */
static Jsonb *
run_body(const StepBody *body, int result_limit, MemoryContext result_cxt)
{
	Datum		values[1];
	char		nulls[1];
	SPIPlanPtr	plan;
	int			rc;
	Jsonb	   *result;
	Jsonb	   *copy;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = body_plan(body->sql);
	values[0] = body->input ? JsonbPGetDatum(body->input) : (Datum) 0;
	nulls[0] = body->input ? ' ' : 'n';
	/* two rows are enough to tell "more than one" */
	rc = SPI_execute_plan(plan, values, nulls, false, 2);
	if (rc < 0)
		elog(ERROR, "step SQL failed: %s", SPI_result_code_string(rc));
	if (body->expect_row && SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_NO_ROW),
				 errmsg("step returned no row"),
				 errdetail("The step expects a row (expect => 'row'): its statement found none."),
				 errhint("Correct the step's input or the data it depends on, then re-arm it with ds_retry_step().")));
	result = result_to_jsonb(SPI_tuptable, SPI_processed);
	if (VARSIZE(result) > (Size) result_limit)
		ereport(ERROR,
				(errcode(ERRCODE_DS_RESULT_TOO_LARGE),
				 errmsg("step result is too large"),
				 errdetail("The result has %u bytes; durable_steps.max_result_size is %d bytes.",
						   (unsigned) VARSIZE(result), result_limit)));
	copy = MemoryContextAlloc(result_cxt, VARSIZE(result));
	memcpy(copy, result, VARSIZE(result));
	SPI_finish();
	return copy;
}

/* What set an attempt's deadline, for its timeout message. */
/*
 * The attempt's deadline, 0 = none: its own timeout; in the worker, durable_steps.default_timeout
 * when it has none, and never past durable_steps.max_worker_attempt_time.
 */
static TimestampTz
attempt_deadline(const StepBody *body, TimestampTz started_at, DeadlineSource *source)
{
	int64		limit = body->timeout;

	*source = DEADLINE_STEP;
	if (OidIsValid(body->isolate_as))
	{
		limit = ds_worker_attempt_limit_usecs(body->timeout);
		if (limit == ds_max_worker_attempt_usecs() && body->timeout != limit)
			*source = DEADLINE_CEILING;
		else if (body->timeout == 0)
			*source = DEADLINE_DEFAULT;
	}
	return limit > 0 ? started_at + limit : 0;
}

/* The recorded error of an attempt its own deadline cancelled. */
static void
describe_timeout(ErrorData *edata, int64 usecs, DeadlineSource source)
{
	Interval	length = {.time = usecs};
	char	   *span = DatumGetCString(DirectFunctionCall1(interval_out,
														   IntervalPGetDatum(&length)));

	edata->sqlerrcode = ERRCODE_DS_STEP_TIMEOUT;
	edata->message =
		source == DEADLINE_CEILING ?
		psprintf("step attempt stopped after %s by durable_steps.max_worker_attempt_time", span) :
		source == DEADLINE_DEFAULT ?
		psprintf("step timed out after %s (durable_steps.default_timeout)", span) :
		psprintf("step timed out after %s", span);
	edata->detail = NULL;
	edata->hint = NULL;
}

void
ds_execute_step_attempt(const StepBody *body, int attempt, int max_attempts,
						AttemptOutcome *outcome)
{
	MemoryContext caller_cxt = CurrentMemoryContext;
	TimestampTz outer_deadline = armed_body_deadline;
	DeadlineSource outer_source = armed_source;
	volatile TimestampTz my_deadline = 0;
	DeadlineSource deadline_source;
	bool		isolated = OidIsValid(body->isolate_as);

	/* read before the body runs: a body cannot raise its own limit */
	int			result_limit = max_result_size;
	Oid			save_userid;
	int			save_sec_context;
	Subtransaction sub;

	memset(outcome, 0, sizeof(*outcome));
	/* pushed first: if it fails (nesting too deep) no timer is left armed */
	ds_step_context_push(body->run_id, body->step_id, attempt, max_attempts);
	outcome->started_at = GetCurrentTimestamp();
	my_deadline = attempt_deadline(body, outcome->started_at, &deadline_source);
	if (my_deadline != 0 && (outer_deadline == 0 || my_deadline < outer_deadline))
	{
		armed_body_deadline = my_deadline;
		armed_source = deadline_source;
		body_deadline_timer.fired = false;
		ds_deadline_timer_arm(&body_deadline_timer, my_deadline);
	}
	if (isolated)
	{
		static bool exit_logger_registered = false;

		if (!exit_logger_registered)
		{
			on_proc_exit(log_ignored_cancel, (Datum) 0);
			exit_logger_registered = true;
		}
		body_deadline_timer.end_process_after = my_deadline;
		if (body->cancel_key != 0)
			poll_for_attempt(body->cancel_key);
	}
	ds_retry_after_clear();
	GetUserIdAndSecContext(&save_userid, &save_sec_context);

	ds_subtransaction_begin(&sub);
	PG_TRY();
	{
		int			guc_level = NewGUCNestLevel();

		if (isolated)
			ds_isolation_enter(body->isolate_as, save_sec_context);
		if (body->search_path != NULL)
			(void) set_config_option("search_path", body->search_path,
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_SAVE, true, 0, false);

		outcome->result = run_body(body, result_limit, caller_cxt);
		if (isolated)
			ds_isolation_reset_session();

		/*
		 * every SET of the step, LOCAL or not, ends with the step: pop as an
		 * abort would
		 */
		SetUserIdAndSecContext(save_userid, save_sec_context);
		AtEOXact_GUC(false, guc_level);
		ds_subtransaction_commit(&sub);
		outcome->cls = ATTEMPT_COMPLETED;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/*
		 * no second cancel from our timers while we clean up: it would escape
		 * this handler
		 */
		if (armed_body_deadline != outer_deadline)
			ds_deadline_timer_arm(&body_deadline_timer, 0);
		if (body->cancel_key != 0)
			polled_cancel_key = 0;

		/*
		 * rolls back the body's writes, its SETs, its SPI connection and the
		 * role switch
		 */
		edata = ds_subtransaction_rollback(&sub);
		if (isolated)
			ds_isolation_reset_after_abort();

		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && body->cancel_key != 0 &&
			cancelled_by_request)
		{
			/*
			 * ds_cancel_step() asked for this attempt: the step ends
			 * cancelled, never retried. (A step nested in its body is
			 * cancelled with it: it rethrows below, as a caller.)
			 */
			outcome->cls = ATTEMPT_CANCELLED;
			edata->message = pstrdup("cancelled by ds_cancel_step()");
			edata->detail = edata->hint = NULL;
		}
		else if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && body_deadline_timer.fired &&
				 my_deadline != 0 && GetCurrentTimestamp() >= my_deadline)
		{
			/* our own timer cancelled the body: that is the step's timeout */
			describe_timeout(edata, my_deadline - outcome->started_at, deadline_source);
		}
		else if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && !isolated)
		{
			/*
			 * somebody cancelled the caller, or an outer step's timer fired:
			 * not ours to record
			 */
			armed_body_deadline = outer_deadline;
			armed_source = outer_source;
			ds_deadline_timer_arm(&body_deadline_timer, outer_deadline);
			ds_step_context_pop();
			ReThrowError(edata);
		}

		/*
		 * In the worker, any other cancel is the attempt's outcome, recorded
		 * like any error: an operator's pg_cancel_backend() stops the
		 * attempt, not the executor, and a body that raises query_canceled
		 * itself cannot end the executor (and lose the claims it holds).
		 */
		if (outcome->cls != ATTEMPT_CANCELLED)
			outcome->cls = ds_classify_sqlstate(edata->sqlerrcode, body->overrides);
		outcome->sqlerrcode = edata->sqlerrcode;
		outcome->message = capped_error_text(edata->message);
		outcome->detail = capped_error_text(edata->detail);
		outcome->hint = capped_error_text(edata->hint);
		if (edata->sqlerrcode == ERRCODE_DS_RETRY_AFTER)
			outcome->has_retry_after = ds_retry_after_get(&outcome->retry_after);
	}
	PG_END_TRY();

	ds_step_context_pop();
	if (isolated)
		body_deadline_timer.end_process_after = 0;
	if (body->cancel_key != 0)
	{
		/*
		 * a request that came as the body ended is over too; its cancel must
		 * not outlive it
		 */
		polled_cancel_key = 0;
		if (cancelled_by_request && outcome->cls != ATTEMPT_CANCELLED)
			QueryCancelPending = false;
		cancelled_by_request = false;
		ds_cancel_request_clear(body->cancel_key);
	}
	if (armed_body_deadline != outer_deadline)
	{
		armed_body_deadline = outer_deadline;
		armed_source = outer_source;
		ds_deadline_timer_arm(&body_deadline_timer, outer_deadline);

		/*
		 * a timer that fired just as the body finished must not cancel the
		 * caller afterwards
		 */
		if (body_deadline_timer.fired &&
			(outer_deadline == 0 || GetCurrentTimestamp() < outer_deadline))
		{
			body_deadline_timer.fired = false;
			QueryCancelPending = false;
		}
	}
	outcome->finished_at = GetCurrentTimestamp();
}

void
ds_step_exec_init_module(void)
{
	DefineCustomIntVariable("durable_steps.max_result_size",
							"Largest result, in bytes of jsonb, that a step may persist.",
							"A larger result fails the attempt permanently with SQLSTATE DS005.",
							&max_result_size,
							1024 * 1024,
							64,
							256 * 1024 * 1024,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}
