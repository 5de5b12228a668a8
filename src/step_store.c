/*
 * step_store.c -- persistence of steps and attempts.
 *
 * Callers have no privileges on the tables of schema durable_steps. Row writes go through
 * direct_write.c, which checks no privileges; the locked read runs through SPI as the tables'
 * owner (the way referential-integrity checks run as the table owner), with every name and
 * operator schema-qualified so that nothing in the caller's search_path can take part in it.
 * Plans are prepared once per backend and kept.
 */
#include "compat.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/fmgroids.h"
#include "utils/syscache.h"

#include "store.h"
#include "policy.h"


#define STEP_KEY_WHERE \
	" WHERE run_id OPERATOR(pg_catalog.=) $1 AND step_id OPERATOR(pg_catalog.=) $2"

/* run_id, step_id and STEP_COLUMNS: the values of a step row, in record_to_params */
#define STEP_NPARAMS 30

static SPIPlanPtr lock_plan = NULL;

typedef struct StoreSession
{
	int			planning_level;	/* of ds_index_planning_begin(); 0 when not used */
	Oid			save_userid;
	int			save_sec_context;
	MemoryContext caller_cxt;
} StoreSession;

/*
 * The internal statements find their rows by key and are planned once, often while the tables
 * are still nearly empty, when a sequential scan is the cheapest plan -- and a kept plan keeps
 * it while the tables grow to millions of rows. Planning them with sequential scans disabled
 * makes every plan (and every re-plan the plan cache makes later) use the indexes.
 */
int
ds_index_planning_begin(void)
{
	int			level = NewGUCNestLevel();

	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

void
ds_index_planning_end(int level)
{
	AtEOXact_GUC(true, level);
}

static void
store_begin(StoreSession *s)
{
	Oid			owner = ds_store_relations()->owner;

	s->caller_cxt = CurrentMemoryContext;
	s->planning_level = 0;
	GetUserIdAndSecContext(&s->save_userid, &s->save_sec_context);
	SetUserIdAndSecContext(owner, s->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
store_end(StoreSession *s)
{
	SPI_finish();
	if (s->planning_level > 0)
		ds_index_planning_end(s->planning_level);
	SetUserIdAndSecContext(s->save_userid, s->save_sec_context);
}

SPIPlanPtr
ds_prepare_kept(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes)
{
	if (*slot == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*slot = plan;
	}
	return *slot;
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

/* Copiers into the caller's memory context, for values read through SPI. */
static char *
get_text(HeapTuple tup, TupleDesc td, int col, MemoryContext cxt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, td, col, &isnull);
	MemoryContext old;
	char	   *s;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(cxt);
	s = TextDatumGetCString(d);
	MemoryContextSwitchTo(old);
	return s;
}

static void *
get_varlena(HeapTuple tup, TupleDesc td, int col, MemoryContext cxt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, td, col, &isnull);
	MemoryContext old;
	struct varlena *v;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(cxt);
	v = PG_DETOAST_DATUM_COPY(d);
	MemoryContextSwitchTo(old);
	return v;
}

static int32
get_int4(HeapTuple tup, TupleDesc td, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, td, col, &isnull);

	return isnull ? 0 : DatumGetInt32(d);
}

static int64
get_interval_usecs(HeapTuple tup, TupleDesc td, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, td, col, &isnull);

	return isnull ? 0 : ds_interval_to_usecs(DatumGetIntervalP(d));
}

static TimestampTz
get_timestamptz(HeapTuple tup, TupleDesc td, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, td, col, &isnull);

	return isnull ? 0 : DatumGetTimestampTz(d);
}

void
ds_store_record_from_tuple(HeapTuple t, TupleDesc td, int offset, MemoryContext cxt,
						StepRecord *out)
{
	bool		isnull;

	memset(out, 0, sizeof(*out));
	out->kind = get_text(t, td, offset + 1, cxt);
	out->sql = get_text(t, td, offset + 2, cxt);
	out->input = get_varlena(t, td, offset + 3, cxt);
	out->fingerprint = get_text(t, td, offset + 4, cxt);
	out->policy = get_varlena(t, td, offset + 5, cxt);
	out->max_attempts = get_int4(t, td, offset + 6);
	out->attempt_base = get_int4(t, td, offset + 7);
	out->attempts = get_int4(t, td, offset + 8);
	out->timeout = get_interval_usecs(t, td, offset + 9);
	out->on_timeout = get_text(t, td, offset + 10, cxt);
	out->retry_on = get_varlena(t, td, offset + 11, cxt);
	out->fail_on = get_varlena(t, td, offset + 12, cxt);
	out->owner = DatumGetObjectId(SPI_getbinval(t, td, offset + 13, &isnull));
	out->search_path = get_text(t, td, offset + 14, cxt);
	out->status = ds_step_status_from_name(get_text(t, td, offset + 15, cxt));
	out->result = get_varlena(t, td, offset + 16, cxt);
	out->error_class = get_text(t, td, offset + 17, cxt);
	out->error_code = get_text(t, td, offset + 18, cxt);
	out->error_message = get_text(t, td, offset + 19, cxt);
	out->error_detail = get_text(t, td, offset + 20, cxt);
	out->remediation = get_text(t, td, offset + 21, cxt);
	out->next_attempt_at = get_timestamptz(t, td, offset + 22);
	out->created_at = get_timestamptz(t, td, offset + 23);
	out->updated_at = get_timestamptz(t, td, offset + 24);
	out->finished_at = get_timestamptz(t, td, offset + 25);
	out->request = get_varlena(t, td, offset + 26, cxt);
	out->lease_expires_at = get_timestamptz(t, td, offset + 27);
	out->claimed_by = get_int4(t, td, offset + 28);
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(t, td, offset + 29, &isnull)),
					&out->tid);
}

bool
ds_store_lock_step(const char *run_id, const char *step_id, StepRecord *out)
{
	static Oid	key_types[2] = {TEXTOID, TEXTOID};
	StoreSession s;
	SPIPlanPtr	plan;
	Datum		values[2];
	int			rc;
	bool		found = false;

	store_begin(&s);
	s.planning_level = ds_index_planning_begin();
	plan = ds_prepare_kept(&lock_plan,
						"SELECT " STEP_COLUMNS ", ctid FROM durable_steps.steps" STEP_KEY_WHERE
						" FOR UPDATE", 2, key_types);
	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	rc = SPI_execute_plan(plan, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "step lookup failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		found = true;
		ds_store_record_from_tuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 0, s.caller_cxt,
								out);
		out->run_id = MemoryContextStrdup(s.caller_cxt, run_id);
		out->step_id = MemoryContextStrdup(s.caller_cxt, step_id);
	}
	store_end(&s);
	return found;
}

static Datum
text_or_null(const char *s, char *null)
{
	*null = s ? ' ' : 'n';
	return s ? CStringGetTextDatum(s) : (Datum) 0;
}

static Datum
pointer_or_null(const void *p, char *null)
{
	*null = p ? ' ' : 'n';
	return PointerGetDatum(p);
}

static Datum
timestamptz_or_null(TimestampTz ts, char *null)
{
	*null = ts ? ' ' : 'n';
	return TimestampTzGetDatum(ts);
}

static void
record_to_params(const StepRecord *r, Datum *v, char *n)
{
	memset(n, ' ', STEP_NPARAMS);
	v[0] = CStringGetTextDatum(r->run_id);
	v[1] = CStringGetTextDatum(r->step_id);
	v[2] = text_or_null(r->kind, &n[2]);
	v[3] = text_or_null(r->sql, &n[3]);
	v[4] = pointer_or_null(r->input, &n[4]);
	v[5] = text_or_null(r->fingerprint, &n[5]);
	v[6] = pointer_or_null(r->policy, &n[6]);
	v[7] = Int32GetDatum(r->max_attempts);
	v[8] = Int32GetDatum(r->attempt_base);
	v[9] = Int32GetDatum(r->attempts);
	v[10] = r->timeout > 0 ? IntervalPGetDatum(ds_usecs_to_interval(r->timeout)) : (Datum) 0;
	n[10] = r->timeout > 0 ? ' ' : 'n';
	v[11] = text_or_null(r->on_timeout, &n[11]);
	v[12] = pointer_or_null(r->retry_on, &n[12]);
	v[13] = pointer_or_null(r->fail_on, &n[13]);
	v[14] = ObjectIdGetDatum(r->owner);
	v[15] = text_or_null(r->search_path, &n[15]);
	v[16] = CStringGetTextDatum(ds_step_status_name(r->status));
	v[17] = pointer_or_null(r->result, &n[17]);
	v[18] = text_or_null(r->error_class, &n[18]);
	v[19] = text_or_null(r->error_code, &n[19]);
	v[20] = text_or_null(r->error_message, &n[20]);
	v[21] = text_or_null(r->error_detail, &n[21]);
	v[22] = text_or_null(r->remediation, &n[22]);
	v[23] = timestamptz_or_null(r->next_attempt_at, &n[23]);
	v[24] = timestamptz_or_null(r->created_at, &n[24]);
	v[25] = timestamptz_or_null(r->updated_at, &n[25]);
	v[26] = timestamptz_or_null(r->finished_at, &n[26]);
	v[27] = pointer_or_null(r->request, &n[27]);
	v[28] = timestamptz_or_null(r->lease_expires_at, &n[28]);
	v[29] = Int32GetDatum(r->claimed_by);
	n[29] = r->claimed_by != 0 ? ' ' : 'n';
}

/* attempt_to_params' values: identity, number, class, error, finish and start times */
#define ATTEMPT_NPARAMS 9

static void
attempt_to_params(const StepRecord *rec, int attempt, const AttemptOutcome *o, Datum *v, char *n)
{
	bool		failed = o->cls != ATTEMPT_COMPLETED;

	memset(n, ' ', ATTEMPT_NPARAMS);
	v[0] = CStringGetTextDatum(rec->run_id);
	v[1] = CStringGetTextDatum(rec->step_id);
	v[2] = Int32GetDatum(attempt);
	v[3] = CStringGetTextDatum(ds_attempt_class_name(o->cls));
	v[4] = text_or_null(failed ? unpack_sql_state(o->sqlerrcode) : NULL, &n[4]);
	v[5] = text_or_null(failed ? o->message : NULL, &n[5]);
	v[6] = text_or_null(failed ? o->detail : NULL, &n[6]);
	v[7] = timestamptz_or_null(o->finished_at, &n[7]);
	v[8] = TimestampTzGetDatum(o->started_at);
}

/* The columns of record_to_params' values, in order: run_id, step_id, then STEP_COLUMNS. */
static const char *const step_param_columns[STEP_NPARAMS] = {
	"run_id", "step_id", "kind", "sql", "input", "fingerprint", "policy", "max_attempts",
	"attempt_base", "attempts", "timeout", "on_timeout", "retry_on", "fail_on", "owner",
	"search_path", "status", "result", "error_class", "error_code", "error_message",
	"error_detail", "remediation", "next_attempt_at", "created_at", "updated_at", "finished_at",
	"request", "lease_expires_at", "claimed_by"
};

/* The columns of attempt_to_params' $1..$9, then the three a caller's attempt adds. */
#define ATTEMPT_NCOLUMNS (ATTEMPT_NPARAMS + 4)
static const char *const attempt_columns[ATTEMPT_NCOLUMNS] = {
	"run_id", "step_id", "attempt", "class", "error_code", "error_message", "error_detail",
	"finished_at", "started_at", "claimed_at", "executor", "backend_pid", "role"
};

/*
 * The one row of a finished attempt. A caller's attempt is claimed when it starts; a worker's
 * was claimed (the step row committed as running) before it started.
 */
static void
insert_attempt(const StepRecord *rec, int attempt, const AttemptOutcome *o, bool by_worker,
			   TimestampTz claimed_at)
{
	Datum		av[ATTEMPT_NCOLUMNS];
	char		an[ATTEMPT_NCOLUMNS];
	bool		a_isnull[ATTEMPT_NCOLUMNS];

	attempt_to_params(rec, attempt, o, av, an);
	av[ATTEMPT_NPARAMS] = by_worker ? TimestampTzGetDatum(claimed_at) : av[8];
	an[ATTEMPT_NPARAMS] = ' ';
	av[ATTEMPT_NPARAMS + 1] = CStringGetTextDatum(by_worker ? "worker" : "caller");
	av[ATTEMPT_NPARAMS + 2] = Int32GetDatum(by_worker ? rec->claimed_by : MyProcPid);
	av[ATTEMPT_NPARAMS + 3] = ObjectIdGetDatum(rec->owner);
	an[ATTEMPT_NPARAMS + 1] = an[ATTEMPT_NPARAMS + 2] = an[ATTEMPT_NPARAMS + 3] = ' ';
	for (int i = 0; i < ATTEMPT_NCOLUMNS; i++)
		a_isnull[i] = an[i] == 'n';
	ds_direct_insert_row(ds_store_relations()->attempts, attempt_columns, ATTEMPT_NCOLUMNS, av,
					  a_isnull);
}

/* A synchronous caller's new step and its first attempt: the hot path of ds_run_step. */
void
ds_store_insert_step_with_attempt(const StepRecord *rec, int attempt, const AttemptOutcome *o)
{
	Datum		v[STEP_NPARAMS];
	char		n[STEP_NPARAMS];
	bool		isnull[STEP_NPARAMS];

	record_to_params(rec, v, n);
	for (int i = 0; i < STEP_NPARAMS; i++)
		isnull[i] = n[i] == 'n';
	ds_direct_insert_row(ds_store_relations()->steps, step_param_columns, STEP_NPARAMS, v, isnull);
	insert_attempt(rec, attempt, o, false, 0);
}

/* Every column but the key, from the record. */
void
ds_store_update_step(StepRecord *rec)
{
	Datum		v[STEP_NPARAMS];
	char		n[STEP_NPARAMS];
	bool		isnull[STEP_NPARAMS];
	const StoreRelations *r = ds_store_relations();
	static const RegProcedure key_eq[2] = {F_TEXTEQ, F_TEXTEQ};

	record_to_params(rec, v, n);
	for (int i = 0; i < STEP_NPARAMS; i++)
		isnull[i] = n[i] == 'n';
	if (!ds_direct_update_row(r->steps, r->steps_pkey, 2, v, key_eq, &rec->tid,
						   step_param_columns + 2, STEP_NPARAMS - 2, v + 2, isnull + 2))
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
}

void
ds_store_finish_claimed_attempt(StepRecord *rec, int attempt, TimestampTz claimed_at,
							 const AttemptOutcome *o)
{
	/* the attempt row keeps the claimant; the step row names one only while it is running */
	insert_attempt(rec, attempt, o, true, claimed_at);
	rec->claimed_by = 0;
	ds_store_update_step(rec);
}
