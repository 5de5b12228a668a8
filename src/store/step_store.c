/*
 * step_store.c -- persistence of steps and attempts.
 *
 * Callers have no privileges on the tables of schema durable_steps. Row writes go through
 * direct_write.c, which checks no privileges; the extension's statements run through SPI as the
 * tables' owner (the way referential-integrity checks run as the table owner), with every name
 * and operator schema-qualified so that nothing in the caller's search_path can take part in
 * them. Plans are prepared once per backend and kept.
 *
 * The layout of both tables is described once (ds_step_columns, ds_attempt_column_names); the
 * column list of the statements, the values of direct writes and the readers of rows all come
 * from those descriptions.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "store/kept_plan.h"
#include "store/store_relations.h"
#include "store/direct_write.h"
#include "ipc/due_floors.h"
#include "store/step_store.h"
#include "base/policy.h"
#include "base/ds_errcodes.h"
#include "ipc/step_counters.h"
#include "ipc/worker_shmem.h"


#define STEP_KEY_WHERE \
	" WHERE run_id OPERATOR(pg_catalog.=) $1 AND step_id OPERATOR(pg_catalog.=) $2"

#define STEP_FIELD(col, type, field) {col, type, offsetof(StepRecord, field)}

const StepColumnDesc ds_step_columns[N_STEP_COLUMNS] = {
	[STEP_COL_RUN_ID] = STEP_FIELD("run_id", FIELD_TEXT, run_id),
	[STEP_COL_STEP_ID] = STEP_FIELD("step_id", FIELD_TEXT, step_id),
	[STEP_COL_KIND] = STEP_FIELD("kind", FIELD_KIND, kind),
	[STEP_COL_SQL] = STEP_FIELD("sql", FIELD_TEXT, sql),
	[STEP_COL_INPUT] = STEP_FIELD("input", FIELD_VARLENA, input),
	[STEP_COL_REQUEST] = STEP_FIELD("request", FIELD_VARLENA, request),
	[STEP_COL_IDEMPOTENCY_HEADER] = STEP_FIELD("idempotency_header", FIELD_TEXT, idempotency_header),
	[STEP_COL_FINGERPRINT] = STEP_FIELD("fingerprint", FIELD_TEXT, fingerprint),
	[STEP_COL_MAX_ATTEMPTS] = STEP_FIELD("max_attempts", FIELD_INT4, max_attempts),
	[STEP_COL_RETRY_INITIAL_DELAY] = STEP_FIELD("retry_initial_delay", FIELD_INT8, backoff.initial_delay),
	[STEP_COL_RETRY_MAX_DELAY] = STEP_FIELD("retry_max_delay", FIELD_INT8, backoff.max_delay),
	[STEP_COL_RETRY_MULTIPLIER] = STEP_FIELD("retry_multiplier", FIELD_FLOAT8, backoff.multiplier),
	[STEP_COL_RETRY_JITTER] = STEP_FIELD("retry_jitter", FIELD_FLOAT8, backoff.jitter),
	[STEP_COL_RETRY_EXPONENTIAL] = STEP_FIELD("retry_exponential", FIELD_BOOL, backoff.exponential),
	[STEP_COL_ATTEMPT_BASE] = STEP_FIELD("attempt_base", FIELD_INT4, attempt_base),
	[STEP_COL_ATTEMPTS] = STEP_FIELD("attempts", FIELD_INT4, attempts),
	[STEP_COL_TIMEOUT] = STEP_FIELD("timeout", FIELD_USECS, timeout),
	[STEP_COL_ON_TIMEOUT] = STEP_FIELD("on_timeout", FIELD_TEXT, on_timeout),
	[STEP_COL_RETRY_ON] = STEP_FIELD("retry_on", FIELD_VARLENA, retry_on),
	[STEP_COL_FAIL_ON] = STEP_FIELD("fail_on", FIELD_VARLENA, fail_on),
	[STEP_COL_OWNER] = STEP_FIELD("owner", FIELD_OID, owner),
	[STEP_COL_SEARCH_PATH] = STEP_FIELD("search_path", FIELD_TEXT, search_path),
	[STEP_COL_NOTIFY] = STEP_FIELD("notify", FIELD_TEXT, notify),
	[STEP_COL_ON_SUCCESS] = STEP_FIELD("on_success", FIELD_TEXT, on_success),
	[STEP_COL_ON_FAILURE] = STEP_FIELD("on_failure", FIELD_TEXT, on_failure),
	[STEP_COL_QUEUE] = STEP_FIELD("queue", FIELD_TEXT, queue),
	[STEP_COL_PRIORITY] = STEP_FIELD("priority", FIELD_INT4, priority),
	[STEP_COL_STATUS] = STEP_FIELD("status", FIELD_STATUS, status),
	[STEP_COL_RESULT] = STEP_FIELD("result", FIELD_VARLENA, result),
	[STEP_COL_ERROR_CLASS] = STEP_FIELD("error_class", FIELD_TEXT, error_class),
	[STEP_COL_ERROR_CODE] = STEP_FIELD("error_code", FIELD_TEXT, error_code),
	[STEP_COL_ERROR_MESSAGE] = STEP_FIELD("error_message", FIELD_TEXT, error_message),
	[STEP_COL_ERROR_DETAIL] = STEP_FIELD("error_detail", FIELD_TEXT, error_detail),
	[STEP_COL_REMEDIATION] = STEP_FIELD("remediation", FIELD_TEXT, remediation),
	[STEP_COL_NEXT_ATTEMPT_AT] = STEP_FIELD("next_attempt_at", FIELD_TIMESTAMPTZ, next_attempt_at),
	[STEP_COL_LEASE_EXPIRES_AT] = STEP_FIELD("lease_expires_at", FIELD_TIMESTAMPTZ, lease_expires_at),
	[STEP_COL_CLAIMED_BY] = STEP_FIELD("claimed_by", FIELD_INT4_ZERO_NULL, claimed_by),
	[STEP_COL_ATTEMPT_CLAIMED_AT] = STEP_FIELD("attempt_claimed_at", FIELD_TIMESTAMPTZ, attempt_claimed_at),
	[STEP_COL_ATTEMPT_STARTED_AT] = STEP_FIELD("attempt_started_at", FIELD_TIMESTAMPTZ, attempt_started_at),
	[STEP_COL_RUNNING_QUEUE] = STEP_FIELD("running_queue", FIELD_TEXT, running_queue),
	[STEP_COL_CREATED_AT] = STEP_FIELD("created_at", FIELD_TIMESTAMPTZ, created_at),
	[STEP_COL_UPDATED_AT] = STEP_FIELD("updated_at", FIELD_TIMESTAMPTZ, updated_at),
	[STEP_COL_FINISHED_AT] = STEP_FIELD("finished_at", FIELD_TIMESTAMPTZ, finished_at),
	[STEP_COL_KEPT_OUTCOME] = STEP_FIELD("kept_outcome", FIELD_VARLENA, kept_outcome),
	[STEP_COL_TASK] = STEP_FIELD("task", FIELD_TEXT, task),
	[STEP_COL_ON_LOST] = STEP_FIELD("on_lost", FIELD_TEXT, on_lost),
	[STEP_COL_WORKER] = STEP_FIELD("worker", FIELD_TEXT, worker),
	[STEP_COL_EXPECT_ROW] = STEP_FIELD("expect_row", FIELD_BOOL_FALSE_NULL, expect_row),
	[STEP_COL_LIMIT_NAME] = STEP_FIELD("limit_name", FIELD_TEXT, limit_name),
	[STEP_COL_LIMIT_KEY] = STEP_FIELD("limit_key", FIELD_TEXT, limit_key),
	[STEP_COL_LIMIT_NOT_BEFORE] = STEP_FIELD("limit_not_before", FIELD_TIMESTAMPTZ, limit_not_before),
	[STEP_COL_LIMIT_ADMITTED] = STEP_FIELD("limit_admitted", FIELD_INT4_ZERO_NULL, limit_admitted),
	[STEP_COL_MAP_STEP] = STEP_FIELD("map_step", FIELD_TEXT, map_step),
};

const char *const ds_attempt_column_names[N_ATTEMPT_COLUMNS] = {
	[ATTEMPT_COL_RUN_ID] = "run_id",
	[ATTEMPT_COL_STEP_ID] = "step_id",
	[ATTEMPT_COL_ATTEMPT] = "attempt",
	[ATTEMPT_COL_CLASS] = "class",
	[ATTEMPT_COL_ERROR_CODE] = "error_code",
	[ATTEMPT_COL_ERROR_MESSAGE] = "error_message",
	[ATTEMPT_COL_ERROR_DETAIL] = "error_detail",
	[ATTEMPT_COL_EXECUTOR] = "executor",
	[ATTEMPT_COL_BACKEND_PID] = "backend_pid",
	[ATTEMPT_COL_ROLE] = "role",
	[ATTEMPT_COL_CLAIMED_AT] = "claimed_at",
	[ATTEMPT_COL_STARTED_AT] = "started_at",
	[ATTEMPT_COL_FINISHED_AT] = "finished_at",
};

void
ds_step_store_init_module(void)
{
	static const char *step_names[N_STEP_COLUMNS];

	StaticAssertStmt(N_STEP_COLUMNS <= DS_STORE_MAX_COLUMNS &&
					 N_ATTEMPT_COLUMNS <= DS_STORE_MAX_COLUMNS,
					 "DS_STORE_MAX_COLUMNS is too small for the tables' layouts");
	for (int i = 0; i < N_STEP_COLUMNS; i++)
		step_names[i] = ds_step_columns[i].name;
	ds_store_register_columns(STORE_TABLE_STEPS, step_names, N_STEP_COLUMNS);
	ds_store_register_columns(STORE_TABLE_ATTEMPTS, ds_attempt_column_names, N_ATTEMPT_COLUMNS);
}

static SPIPlanPtr lock_plan = NULL;

const char *
ds_step_column_list(void)
{
	static char *list = NULL;

	if (list == NULL)
	{
		StringInfoData buf;
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		initStringInfo(&buf);
		for (int i = 0; i < N_STEP_COLUMNS; i++)
			appendStringInfo(&buf, "%s%s", i > 0 ? ", " : "", ds_step_columns[i].name);
		MemoryContextSwitchTo(old);
		list = buf.data;
	}
	return list;
}

void
ds_step_set_field(StepRecord *rec, StepColumn col, Datum value, bool isnull, MemoryContext cxt)
{
	const StepColumnDesc *c = &ds_step_columns[col];
	char	   *field = (char *) rec + c->field;
	MemoryContext old;

	switch (c->type)
	{
		case FIELD_TEXT:
			old = MemoryContextSwitchTo(cxt);
			*(char **) field = isnull ? NULL : TextDatumGetCString(value);
			MemoryContextSwitchTo(old);
			break;
		case FIELD_STATUS:
			*(StepStatus *) field = ds_step_status_from_name(isnull ? NULL :
															 TextDatumGetCString(value));
			break;
		case FIELD_KIND:
			*(StepKind *) field = ds_step_kind_from_name(isnull ? NULL :
														 TextDatumGetCString(value));
			break;
		case FIELD_VARLENA:

			/*
			 * As stored, compressed or out of line: a claimed batch must not
			 * hold every input decompressed at once, and an update that
			 * writes the value back as it was keeps its TOAST data instead of
			 * writing it again. Users detoast what they read.
			 */
			old = MemoryContextSwitchTo(cxt);
			*(struct varlena **) field = isnull ? NULL :
				(struct varlena *) DatumGetPointer(datumCopy(value, false, -1));
			MemoryContextSwitchTo(old);
			break;
		case FIELD_INT4:
		case FIELD_INT4_ZERO_NULL:
			*(int *) field = isnull ? 0 : DatumGetInt32(value);
			break;
		case FIELD_OID:
			*(Oid *) field = isnull ? InvalidOid : DatumGetObjectId(value);
			break;
		case FIELD_INT8:
			*(int64 *) field = isnull ? 0 : DatumGetInt64(value);
			break;
		case FIELD_FLOAT8:
			*(double *) field = isnull ? 0.0 : DatumGetFloat8(value);
			break;
		case FIELD_BOOL:
		case FIELD_BOOL_FALSE_NULL:
			*(bool *) field = isnull ? false : DatumGetBool(value);
			break;
		case FIELD_USECS:
			*(int64 *) field = isnull ? 0 : ds_interval_to_usecs(DatumGetIntervalP(value));
			break;
		case FIELD_TIMESTAMPTZ:
			*(TimestampTz *) field = isnull ? 0 : DatumGetTimestampTz(value);
			break;
	}
}

/* The value of the field of `col` in *rec, as a column value. */
static Datum
step_field_value(const StepRecord *rec, StepColumn col, bool *isnull)
{
	const StepColumnDesc *c = &ds_step_columns[col];
	const char *field = (const char *) rec + c->field;

	*isnull = false;
	switch (c->type)
	{
		case FIELD_TEXT:
			*isnull = *(char *const *) field == NULL;
			return *isnull ? (Datum) 0 : CStringGetTextDatum(*(char *const *) field);
		case FIELD_STATUS:
			return CStringGetTextDatum(ds_step_status_name(*(const StepStatus *) field));
		case FIELD_KIND:
			return CStringGetTextDatum(ds_step_kinds[*(const StepKind *) field].name);
		case FIELD_VARLENA:
			*isnull = *(void *const *) field == NULL;
			return PointerGetDatum(*(void *const *) field);
		case FIELD_INT4:
			return Int32GetDatum(*(const int *) field);
		case FIELD_INT4_ZERO_NULL:
			*isnull = *(const int *) field == 0;
			return Int32GetDatum(*(const int *) field);
		case FIELD_OID:
			return ObjectIdGetDatum(*(const Oid *) field);
		case FIELD_INT8:
			return Int64GetDatum(*(const int64 *) field);
		case FIELD_FLOAT8:
			return Float8GetDatum(*(const double *) field);
		case FIELD_BOOL:
			return BoolGetDatum(*(const bool *) field);
		case FIELD_BOOL_FALSE_NULL:
			*isnull = !*(const bool *) field;
			return BoolGetDatum(*(const bool *) field);
		case FIELD_USECS:
			*isnull = *(const int64 *) field == 0;
			return *isnull ? (Datum) 0 :
				IntervalPGetDatum(ds_usecs_to_interval(*(const int64 *) field));
		case FIELD_TIMESTAMPTZ:
			*isnull = *(const TimestampTz *) field == 0;
			return TimestampTzGetDatum(*(const TimestampTz *) field);
	}
	pg_unreachable();
}

/* Every column of the step row, in StepColumn order. */
static void
step_to_values(const StepRecord *rec, Datum *values, bool *nulls)
{
	for (int i = 0; i < N_STEP_COLUMNS; i++)
		values[i] = step_field_value(rec, (StepColumn) i, &nulls[i]);
}

void
ds_store_record_from_tuple(HeapTuple t, TupleDesc td, int offset, MemoryContext cxt,
						   StepRecord *out)
{
	/*
	 * one pass over the tuple: reading its columns one by one walks it again
	 * for each
	 */
	Datum	   *values = palloc(sizeof(Datum) * td->natts);
	bool	   *nulls = palloc(sizeof(bool) * td->natts);

	Assert(td->natts >= offset + N_STEP_COLUMNS + 1);
	heap_deform_tuple(t, td, values, nulls);
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < N_STEP_COLUMNS; i++)
		ds_step_set_field(out, (StepColumn) i, values[offset + i], nulls[offset + i], cxt);
	ItemPointerCopy((ItemPointer) DatumGetPointer(values[offset + N_STEP_COLUMNS]), &out->tid);
	pfree(values);
	pfree(nulls);
}

/*
 * The internal statements find their rows by key and are planned once, often while the tables
 * are still nearly empty, when a sequential scan is the cheapest plan -- and a kept plan keeps
 * it while the tables grow to millions of rows. Planning them with sequential scans disabled
 * makes every plan (and every re-plan the plan cache makes later) use the indexes; and they
 * keep their generic plan.
 */
void
ds_store_spi_begin(StoreSpi *s)
{
	Oid			owner = ds_store_relations()->owner;

	s->caller_cxt = CurrentMemoryContext;
	GetUserIdAndSecContext(&s->save_userid, &s->save_sec_context);
	SetUserIdAndSecContext(owner, s->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	s->planning_level = NewGUCNestLevel();
	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);

	/*
	 * Their parameters are bounds and limits of index ranges: a plan made for
	 * one value serves every other, and the plan cache would otherwise
	 * re-plan the claims (their LIMIT makes each custom plan look cheaper
	 * than the generic one) on every call, a few percent of a drain.
	 */
	(void) set_config_option("plan_cache_mode", "force_generic_plan", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);

	/*
	 * A plan left with a sequential scan costs more than jit_above_cost once
	 * enable_seqscan is off, and JIT compiles it again at every execution
	 * (tens of milliseconds) for statements that read a few rows: never worth
	 * it here.
	 */
	(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

void
ds_store_spi_end(StoreSpi *s)
{
	SPI_finish();
	AtEOXact_GUC(true, s->planning_level);
	SetUserIdAndSecContext(s->save_userid, s->save_sec_context);
}

TimestampTz
ds_store_query_time(SPIPlanPtr *slot, const char *sql, int nargs, Oid *types, Datum *args,
					const char *nulls, const char *what)
{
	StoreSpi	spi;
	TimestampTz answer = 0;
	bool		isnull;
	int			rc;

	ds_store_spi_begin(&spi);
	(void) ds_store_relations();
	rc = SPI_execute_snapshot(ds_prepare_kept(slot, sql, nargs, types), args, nulls,
							  GetLatestSnapshot(), InvalidSnapshot, true, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "%s query failed: %s", what, SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			answer = DatumGetTimestampTz(d);
	}
	ds_store_spi_end(&spi);
	return answer;
}

static const char *const step_status_names[] = {
	[STEP_PENDING] = "pending",
	[STEP_RUNNING] = "running",
	[STEP_RETRYING] = "retrying",
	[STEP_SUCCEEDED] = "succeeded",
	[STEP_FAILED] = "failed",
	[STEP_BLOCKED] = "blocked",
	[STEP_UNCERTAIN] = "uncertain",
	[STEP_CANCELLED] = "cancelled"
};

const char *
ds_step_status_name(StepStatus status)
{
	Assert(status >= STEP_PENDING && status <= STEP_CANCELLED);
	return step_status_names[status];
}

StepStatus
ds_step_status_from_name(const char *name)
{
	for (int i = 0; i < lengthof(step_status_names); i++)
		if (name != NULL && strcmp(step_status_names[i], name) == 0)
			return (StepStatus) i;
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("durable_steps.steps holds an unknown step status \"%s\"",
					name ? name : "(null)")));
	pg_unreachable();
}

bool
ds_store_may_access(Oid owner)
{
	Oid			user = GetUserId();
	Oid			admin;

	if (has_privs_of_role(user, owner))
		return true;
	admin = get_role_oid("durable_steps_admin", true);
	return OidIsValid(admin) && has_privs_of_role(user, admin);
}

bool
ds_store_lock_step(const char *run_id, const char *step_id, StepRecord *out)
{
	static Oid	key_types[2] = {TEXTOID, TEXTOID};
	StoreSpi	s;
	Datum		values[2];
	bool		found = false;

	ds_store_spi_begin(&s);
	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	if (ds_store_execute(&lock_plan,
						 lock_plan ? NULL :
						 psprintf("SELECT %s, ctid FROM durable_steps.steps" STEP_KEY_WHERE
								  " FOR UPDATE", ds_step_column_list()),
						 2, key_types, values, NULL, false, 1, SPI_OK_SELECT,
						 "step lookup") == 1)
	{
		found = true;
		ds_store_record_from_tuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 0, s.caller_cxt,
								   out);
	}
	ds_store_spi_end(&s);
	return found;
}

/*
 * The one row of a finished attempt. A caller's attempt is claimed when it starts; a worker's
 * was claimed (the step row committed as running) before it started.
 */
typedef enum AttemptExecutor
{
	EXECUTOR_CALLER,
	EXECUTOR_WORKER,
	EXECUTOR_OPERATOR			/* recorded by ds_resolve_step: its message
								 * says who and what */
} AttemptExecutor;

static void
insert_attempt_by(const StepRecord *rec, int attempt, const AttemptOutcome *o,
				  AttemptExecutor executor, TimestampTz claimed_at)
{
	Datum		v[N_ATTEMPT_COLUMNS];
	bool		n[N_ATTEMPT_COLUMNS];
	bool		by_worker = executor == EXECUTOR_WORKER;
	bool		failed = o->cls != ATTEMPT_COMPLETED;

	/*
	 * a completed attempt has no error code; an operator's resolution keeps
	 * its message (who resolved it) either way
	 */
	bool		says = failed || executor == EXECUTOR_OPERATOR;
	const char *texts[3] = {!failed ? NULL : o->error_code ? o->error_code :
		unpack_sql_state(o->sqlerrcode),
	says ? o->message : NULL, says ? o->detail : NULL};

	memset(n, false, sizeof(n));
	v[ATTEMPT_COL_RUN_ID] = CStringGetTextDatum(rec->run_id);
	v[ATTEMPT_COL_STEP_ID] = CStringGetTextDatum(rec->step_id);
	v[ATTEMPT_COL_ATTEMPT] = Int32GetDatum(attempt);
	v[ATTEMPT_COL_CLASS] = CStringGetTextDatum(ds_attempt_class_name(o->cls));
	for (int i = 0; i < 3; i++)
	{
		n[ATTEMPT_COL_ERROR_CODE + i] = texts[i] == NULL;
		v[ATTEMPT_COL_ERROR_CODE + i] = texts[i] ? CStringGetTextDatum(texts[i]) : (Datum) 0;
	}
	v[ATTEMPT_COL_EXECUTOR] = CStringGetTextDatum(by_worker ? "worker" :
												  executor == EXECUTOR_OPERATOR ? "operator" : "caller");
	v[ATTEMPT_COL_BACKEND_PID] = Int32GetDatum(by_worker ? rec->claimed_by : MyProcPid);
	v[ATTEMPT_COL_ROLE] = ObjectIdGetDatum(rec->owner);
	v[ATTEMPT_COL_CLAIMED_AT] = TimestampTzGetDatum(by_worker ? claimed_at : o->started_at);
	v[ATTEMPT_COL_STARTED_AT] = TimestampTzGetDatum(o->started_at);
	v[ATTEMPT_COL_FINISHED_AT] = TimestampTzGetDatum(o->finished_at);
	ds_direct_insert_row(ds_store_relations()->attempts, ds_store_relations()->attempt_attnums,
						 N_ATTEMPT_COLUMNS, v, n);
}

static void
insert_attempt(const StepRecord *rec, int attempt, const AttemptOutcome *o, bool by_worker,
			   TimestampTz claimed_at)
{
	insert_attempt_by(rec, attempt, o, by_worker ? EXECUTOR_WORKER : EXECUTOR_CALLER, claimed_at);
}

/*
 * Every recorded attempt passes here, with the status it leaves its step in: counted for
 * ds_stats() if the transaction commits (step_counters.h).
 */
static void
count_attempt(const StepRecord *rec, const AttemptOutcome *o)
{
	StaticAssertStmt(STEP_CANCELLED + 1 == DS_COUNTED_STATUSES,
					 "the counted statuses are the step statuses");
	ds_count_attempt_at_commit(rec->kind, o->cls,
							   o->cls != ATTEMPT_COMPLETED && o->sqlerrcode == ERRCODE_DS_INVOCATION_LOST,
							   (int) rec->status);
}

void
ds_store_update_step_insert_operator_attempt(StepRecord *rec, int attempt, const AttemptOutcome *o)
{
	ds_store_update_step(rec);
	insert_attempt_by(rec, attempt, o, EXECUTOR_OPERATOR, 0);
	count_attempt(rec, o);
}

/*
 * Every write of a step row passes here first: a step about to wait is noted before its row is
 * written, so that no claim's floor passes it (ipc/due_floors.h).
 */
static void
note_if_waiting(const StepRecord *rec)
{
	if ((rec->status != STEP_PENDING && rec->status != STEP_RETRYING) ||
		rec->next_attempt_at == 0)
	{
		/* a task that leaves the waiting states, or may have */
		if (rec->task != NULL)
			ds_due_floor_note_task_left_waiting();
		return;
	}
	/* tasks wait in an index of their own, in a group per name and owner */
	if (rec->task != NULL)
		ds_due_floor_note_waiting_task(rec->task, rec->owner, rec->priority, rec->next_attempt_at);
	else
		ds_due_floor_note_waiting(rec->queue, rec->priority, rec->next_attempt_at);
}

/*
 * A step of a limit waits held, out of every claim's sight, until the admission makes it due
 * (docs/limits.md, steps/limits.c); every write of a step row passes here, so that no path
 * that makes a step wait -- a store, a retry, a lost attempt, a re-arm -- lets one through
 * unadmitted. A waiting step keeps its admission until the attempt it was admitted for is
 * claimed (a claim given back uncounted keeps it); any other wait is a new hold. A step that
 * stops waiting or running lets its admission go. The executors look for admissions after the
 * commit when a step was held or let its admission go (a slot of the key's concurrency).
 */
static void
hold_for_limit(StepRecord *rec)
{
	bool		was_admitted;

	if (rec->limit_name == NULL)
		return;
	was_admitted = rec->limit_admitted != 0;
	if (rec->status == STEP_RUNNING)
		return;
	if (rec->status == STEP_PENDING || rec->status == STEP_RETRYING)
	{
		if (rec->next_attempt_at == 0 || rec->limit_admitted == rec->attempts + 1)
			return;				/* held already, or admitted and not claimed */
		rec->limit_not_before = rec->next_attempt_at;
		rec->next_attempt_at = 0;
		rec->limit_admitted = 0;
		ds_limit_admission_at_commit();
		return;
	}
	rec->limit_not_before = 0;
	rec->limit_admitted = 0;
	if (was_admitted)
		ds_limit_admission_at_commit();
}

/*
 * An item of a map that settles (leaves the waiting and running states) may be its map's last:
 * the executors look after the commit (runs/run_map.c).
 */
static void
note_map_item(const StepRecord *rec)
{
	if (rec->map_step != NULL && rec->status != STEP_PENDING && rec->status != STEP_RETRYING &&
		rec->status != STEP_RUNNING)
		ds_map_settled_at_commit();
}

/* A deferred step: its row only, no attempt yet. */
void
ds_store_insert_step(StepRecord *rec)
{
	Datum		v[N_STEP_COLUMNS];
	bool		isnull[N_STEP_COLUMNS];

	/* held in the record too: the caller's answer says so */
	hold_for_limit(rec);
	note_if_waiting(rec);
	step_to_values(rec, v, isnull);
	ds_direct_insert_row(ds_store_relations()->steps, ds_store_relations()->step_attnums,
						 N_STEP_COLUMNS, v, isnull);
}

/* A synchronous caller's new step and its first attempt: the hot path of ds_run_step. */
void
ds_store_insert_step_with_attempt(const StepRecord *rec, int attempt, const AttemptOutcome *o)
{
	/* its attempt ran in the caller: never a step of a limit (steps/limits.h) */
	StepRecord	copy = *rec;

	Assert(rec->limit_name == NULL);
	ds_store_insert_step(&copy);
	insert_attempt(rec, attempt, o, false, 0);
	count_attempt(rec, o);
}

/* Every column but the key, from the record. */
void
ds_store_update_step(StepRecord *rec)
{
	Datum		v[N_STEP_COLUMNS];
	bool		isnull[N_STEP_COLUMNS];
	const StoreRelations *r = ds_store_relations();
	static const RegProcedure key_eq[N_STEP_KEY_COLUMNS] = {F_TEXTEQ, F_TEXTEQ};

	/*
	 * a step that is not running counts against no queue's limit
	 * (step_claims.c)
	 */
	if (rec->status != STEP_RUNNING)
		rec->running_queue = NULL;
	hold_for_limit(rec);
	note_map_item(rec);
	note_if_waiting(rec);
	step_to_values(rec, v, isnull);
	if (!ds_direct_update_row(r->steps, r->steps_pkey, N_STEP_KEY_COLUMNS, v, key_eq, &rec->tid,
							  r->step_attnums + N_STEP_KEY_COLUMNS,
							  N_STEP_COLUMNS - N_STEP_KEY_COLUMNS, v + N_STEP_KEY_COLUMNS,
							  isnull + N_STEP_KEY_COLUMNS))
		elog(ERROR, "step %s/%s to update was not found", rec->run_id, rec->step_id);
}

/*
 * A caller's later attempt of an existing step: the step row updated, a finished attempt row
 * added.
 */
void
ds_store_update_step_insert_attempt(StepRecord *rec, int attempt, const AttemptOutcome *o)
{
	ds_store_update_step(rec);
	insert_attempt(rec, attempt, o, false, 0);
	count_attempt(rec, o);
}

void
ds_store_finish_claimed_attempt(StepRecord *rec, int attempt, TimestampTz claimed_at,
								const AttemptOutcome *o)
{
	if (rec->status == STEP_SUCCEEDED && o->cls == ATTEMPT_COMPLETED)
	{
		/*
		 * The step row already holds the attempt's number, backend
		 * (claimed_by), role and end (finished_at); with its claim and start
		 * it is the attempt's record, and the new row version the outcome
		 * writes anyway carries them. An attempt row and its index entry were
		 * a fifth of a drained step's WAL and a tenth of an executor's CPU
		 * (README, "Benchmarks"). A succeeded step never changes state again,
		 * so nothing has to move this record to the attempts table later. A
		 * success its on_success hook turned into blocked is not one: it may
		 * run its hook again and succeed later, so its attempt gets its row.
		 */
		rec->attempt_claimed_at = claimed_at;
		rec->attempt_started_at = o->started_at;
	}
	else
	{
		/*
		 * the attempt row keeps the claimant; the step row names one only
		 * while it is running
		 */
		insert_attempt(rec, attempt, o, true, claimed_at);
		rec->claimed_by = 0;
		rec->attempt_claimed_at = 0;
		rec->attempt_started_at = 0;
	}
	ds_store_update_step(rec);
	count_attempt(rec, o);
}
