/*
 * run_turn.c -- the worker's side of runs (README, "Runs"): claiming due turns, running one,
 * recording how it ended, recovering turns whose executor is gone.
 *
 * A turn calls the workflow from its start, as the run's owner and isolated exactly like a worker
 * attempt (step_exec.c, step_isolation.c: session and current user the owner, security-restricted,
 * the run's search_path, bounded by durable_steps.default_timeout and max_worker_attempt_time,
 * stoppable by ds_cancel_run), inside a subtransaction of its own of the executor's transaction
 * (which other runs' turns of the same owner may share, worker.c; never two turns of one run):
 *
 *   - the workflow returned and nothing suspended: the subtransaction is kept (the workflow's own
 *     writes commit), and the run succeeds with the workflow's value as its output;
 *   - a call ended the turn (run_context.c): the subtransaction rolls back, and the one piece of
 *     work the call left is done in the turn's transaction -- the next attempt of a step (run
 *     isolated as the workflow's role, through ds_run_step, so that its effect and its record
 *     commit together), or a wait's record -- and the run is recorded waiting (due at once when
 *     it can go on), blocked, or failed when the workflow raised.
 *
 * So each step's effect commits once, as soon as it completed, whatever the run waits for later.
 *
 * A claim commits the turn as started (status running, turns counted, claimant recorded) and
 * holds the run's session lock until the turn's outcome commits, as claims of steps do; the
 * turn's transaction also holds the run's row. A run that can go on at once may stay claimed:
 * its turn's transaction then counts the next turn instead of letting the run go, and the
 * executor runs that turn after the commit (record_continuing). A run found running whose lock
 * and row are free lost its executor: the crash rolled the turn back (or the executor died
 * between two turns), and the run is simply due again.
 *
 * The run's row is written without a statement (direct_write.c): the turn holds its row lock.
 */
#include "compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/syscache.h"

#include "direct_write.h"
#include "ds_errcodes.h"
#include "policy.h"
#include "run_context.h"
#include "run_steps.h"
#include "run_turn.h"
#include "runs.h"
#include "step_exec.h"
#include "step_lock.h"
#include "store.h"
#include "worker_wakeup.h"

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr cancel_steps_plan = NULL;
static SPIPlanPtr event_plan = NULL;
static SPIPlanPtr emitted_events_plan = NULL;
static SPIPlanPtr running_plan = NULL;
static SPIPlanPtr lost_plan = NULL;
static SPIPlanPtr next_wake_plan = NULL;

/* How often a run whose step's queue is paused looks again (ds_set_queue also wakes it). */
#define RUN_QUEUE_PAUSED_RECHECK (60 * USECS_PER_SEC)

int
ds_claim_due_runs(int limit, MemoryContext cxt, ClaimedRun **runs)
{
	Oid			due_types[1] = {INT4OID};
	Oid			claim_types[3] = {TEXTARRAYOID, INT4OID, INTERVALOID};
	Datum		args[3];
	Datum	   *ids;
	int			n_locked = 0;
	int			n = 0;
	int			rc;
	StoreSpi	spi;

	*runs = NULL;
	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	rc = SPI_execute_plan(ds_prepare_kept(&due_plan,
										  "SELECT run_id FROM durable_steps.runs"
										  " WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')"
										  " AND next_wake_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()"
										  " ORDER BY next_wake_at LIMIT $1 FOR UPDATE SKIP LOCKED",
										  1, due_types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "due run query failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	ids = palloc(sizeof(Datum) * SPI_processed);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *run_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		if (ds_step_lock_try_session(run_id, DS_TURN_STEP_ID))
			ids[n_locked++] = CStringGetTextDatum(run_id);
	}
	if (n_locked > 0)
	{
		args[0] = PointerGetDatum(construct_array(ids, n_locked, TEXTOID, -1, false, TYPALIGN_INT));
		args[1] = Int32GetDatum(MyProcPid);
		args[2] = IntervalPGetDatum(ds_usecs_to_interval(ds_worker_attempt_limit_usecs(0)));
		rc = SPI_execute_plan(ds_prepare_kept(&claim_plan,
											  "UPDATE durable_steps.runs SET status = 'running',"
											  " turns = turns OPERATOR(pg_catalog.+) 1, claimed_by = $2,"
											  " updated_at = pg_catalog.clock_timestamp(),"
											  " lease_expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3"
											  " WHERE run_id OPERATOR(pg_catalog.=) ANY ($1)"
											  " RETURNING run_id, workflow, input, policy,"
											  " owner::pg_catalog.oid, search_path, turns, lost_turns",
											  3, claim_types),
							  args, NULL, false, 0);
		if (rc != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "claiming runs failed: %s", SPI_result_code_string(rc));
		n = (int) SPI_processed;
		*runs = MemoryContextAlloc(cxt, sizeof(ClaimedRun) * Max(n, 1));
		for (int i = 0; i < n; i++)
		{
			HeapTuple	t = SPI_tuptable->vals[i];
			TupleDesc	td = SPI_tuptable->tupdesc;
			ClaimedRun *r = &(*runs)[i];
			MemoryContext old = MemoryContextSwitchTo(cxt);
			bool		isnull;
			Datum		d;

			r->run_id = SPI_getvalue(t, td, 1);
			r->workflow = SPI_getvalue(t, td, 2);
			r->input = DatumGetJsonbPCopy(SPI_getbinval(t, td, 3, &isnull));
			d = SPI_getbinval(t, td, 4, &isnull);
			r->policy = isnull ? NULL : DatumGetJsonbPCopy(d);
			r->owner = DatumGetObjectId(SPI_getbinval(t, td, 5, &isnull));
			r->search_path = SPI_getvalue(t, td, 6);
			r->turn = DatumGetInt32(SPI_getbinval(t, td, 7, &isnull));
			r->lost_turns = DatumGetInt32(SPI_getbinval(t, td, 8, &isnull));
			r->cxt = cxt;
			r->statement = NULL;
			r->returns_value = false;
			MemoryContextSwitchTo(old);
		}
	}
	ds_store_spi_end(&spi);
	return n;
}

/* How a turn ended, as recorded on the run. */
typedef struct RunOutcome
{
	const char *status;
	Jsonb	   *output;
	TimestampTz wake_at;		/* 0 = NULL */
	const char *wait_reason;
	const char *current_step;
	const char *wait_event;
	const char *error_code;
	const char *error_message;
	const char *error_detail;
} RunOutcome;

/* The columns of durable_steps.runs the end of a turn writes. */
typedef enum RunColumn
{
	RUN_COL_STATUS,
	RUN_COL_OUTPUT,
	RUN_COL_NEXT_WAKE_AT,
	RUN_COL_WAIT_REASON,
	RUN_COL_CURRENT_STEP,
	RUN_COL_WAIT_EVENT,
	RUN_COL_ERROR_CODE,
	RUN_COL_ERROR_MESSAGE,
	RUN_COL_ERROR_DETAIL,
	RUN_COL_CLAIMED_BY,
	RUN_COL_LEASE_EXPIRES_AT,
	RUN_COL_LOST_TURNS,
	RUN_COL_UPDATED_AT,
	RUN_COL_FINISHED_AT,
	RUN_COL_TURNS,
	N_RUN_COLUMNS
} RunColumn;

static const char *const run_column_names[N_RUN_COLUMNS] = {
	[RUN_COL_STATUS] = "status",
	[RUN_COL_OUTPUT] = "output",
	[RUN_COL_NEXT_WAKE_AT] = "next_wake_at",
	[RUN_COL_WAIT_REASON] = "wait_reason",
	[RUN_COL_CURRENT_STEP] = "current_step",
	[RUN_COL_WAIT_EVENT] = "wait_event",
	[RUN_COL_ERROR_CODE] = "error_code",
	[RUN_COL_ERROR_MESSAGE] = "error_message",
	[RUN_COL_ERROR_DETAIL] = "error_detail",
	[RUN_COL_CLAIMED_BY] = "claimed_by",
	[RUN_COL_LEASE_EXPIRES_AT] = "lease_expires_at",
	[RUN_COL_LOST_TURNS] = "lost_turns",
	[RUN_COL_UPDATED_AT] = "updated_at",
	[RUN_COL_FINISHED_AT] = "finished_at",
	[RUN_COL_TURNS] = "turns",
};

/* Where the row of the turn's run is: found by lock_claimed_run, moved by each write. */
static ItemPointerData run_row_tid;

/* A new row version being written: the columns set so far and their values. */
typedef struct RunWrite
{
	int			n;
	AttrNumber	attnums[N_RUN_COLUMNS];
	Datum		values[N_RUN_COLUMNS];
	bool		nulls[N_RUN_COLUMNS];
} RunWrite;

/* Set column `col` of the write (text columns from a C string, NULL for NULL). */
static void
set_column(RunWrite *w, RunColumn col, Datum value, bool isnull)
{
	static Oid	attnums_relid = InvalidOid;
	static AttrNumber attnums[N_RUN_COLUMNS];
	Oid			relid = ds_store_relations()->runs;

	if (attnums_relid != relid)
	{
		/* looked up again when the table is another (the extension was created anew) */
		for (int i = 0; i < N_RUN_COLUMNS; i++)
		{
			attnums[i] = get_attnum(relid, run_column_names[i]);
			if (attnums[i] == InvalidAttrNumber)
				elog(ERROR, "durable_steps.runs has no column %s", run_column_names[i]);
		}
		attnums_relid = relid;
	}
	w->attnums[w->n] = attnums[col];
	w->values[w->n] = value;
	w->nulls[w->n] = isnull;
	w->n++;
}

static void
set_text(RunWrite *w, RunColumn col, const char *text)
{
	set_column(w, col, text ? CStringGetTextDatum(text) : (Datum) 0, text == NULL);
}

/*
 * Write the run's new row version, without a statement (direct_write.c): the turn holds the
 * row's lock (lock_claimed_run), the one that serializes its writers.
 */
static void
write_run(const char *run_id, RunWrite *w)
{
	const StoreRelations *r = ds_store_relations();
	Datum		key = CStringGetTextDatum(run_id);
	RegProcedure eq = F_TEXTEQ;

	set_column(w, RUN_COL_UPDATED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
	if (!ds_direct_update_row(r->runs, r->runs_pkey, 1, &key, &eq, &run_row_tid,
							  w->attnums, w->n, w->values, w->nulls))
		elog(ERROR, "run %s is gone", run_id);
}

static void
record_run(const char *run_id, const RunOutcome *o)
{
	RunWrite	w;
	bool		finished = strcmp(o->status, "succeeded") == 0 ||
		strcmp(o->status, "failed") == 0 || strcmp(o->status, "cancelled") == 0;

	w.n = 0;
	set_text(&w, RUN_COL_STATUS, o->status);
	set_column(&w, RUN_COL_OUTPUT, o->output ? JsonbPGetDatum(o->output) : (Datum) 0,
			   o->output == NULL);
	set_column(&w, RUN_COL_NEXT_WAKE_AT, TimestampTzGetDatum(o->wake_at), o->wake_at == 0);
	set_text(&w, RUN_COL_WAIT_REASON, o->wait_reason);
	set_text(&w, RUN_COL_CURRENT_STEP, o->current_step);
	set_text(&w, RUN_COL_WAIT_EVENT, o->wait_event);
	set_text(&w, RUN_COL_ERROR_CODE, o->error_code);
	set_text(&w, RUN_COL_ERROR_MESSAGE, o->error_message);
	set_text(&w, RUN_COL_ERROR_DETAIL, o->error_detail);
	set_column(&w, RUN_COL_CLAIMED_BY, (Datum) 0, true);
	set_column(&w, RUN_COL_LEASE_EXPIRES_AT, (Datum) 0, true);
	set_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(0), false);
	set_column(&w, RUN_COL_FINISHED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), !finished);
	write_run(run_id, &w);
	if (o->wake_at != 0)
		ds_worker_wake_at_commit();
}

/*
 * The turn ended and the run can go on at once: it stays running and claimed by this executor,
 * and its next turn is counted now, with this turn's work, so that the next turn -- which the
 * executor runs right after this commits, without a claim -- is counted before it runs, as a
 * claim counts the turn it starts (a turn that kills its executor every time still ends in
 * DS007). Only columns no index covers change: the update can stay on the row's page (HOT).
 */
static void
record_continuing(ClaimedRun *run, const RunOutcome *o)
{
	RunWrite	w;

	w.n = 0;
	set_column(&w, RUN_COL_TURNS, Int32GetDatum(run->turn + 1), false);
	set_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(0), false);
	set_text(&w, RUN_COL_CURRENT_STEP, o->current_step);
	set_text(&w, RUN_COL_WAIT_REASON, o->wait_reason);
	set_column(&w, RUN_COL_LEASE_EXPIRES_AT,
			   TimestampTzGetDatum(GetCurrentTimestamp() + ds_worker_attempt_limit_usecs(0)),
			   false);
	write_run(run->run_id, &w);
	run->turn++;
	run->lost_turns = 0;
}

/* Is the run still this claim's (not cancelled meanwhile)? Locks its row for the turn. */
static bool
lock_claimed_run(const ClaimedRun *run)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run->run_id)};
	StoreSpi	spi;
	bool		ours;
	bool		isnull;
	int			rc;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_plan(ds_prepare_kept(&lock_plan,
										  "SELECT status, claimed_by, turns, ctid FROM durable_steps.runs"
										  " WHERE run_id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
										  1, types),
						  args, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "locking run %s failed", run->run_id);
	ours = SPI_processed == 1 &&
		strcmp(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1), "running") == 0 &&
		DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)) == MyProcPid &&
		!isnull &&
		DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull)) == run->turn;
	if (ours)
		ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
														  SPI_tuptable->tupdesc, 4, &isnull)),
						&run_row_tid);
	ds_store_spi_end(&spi);
	return ours;
}

/*
 * The steps of a cancelled run that have not finished are cancelled with it: those of roles the
 * run's owner has the privileges of, as in ds_cancel_run (runs.c), not another role's plain steps
 * that share the run_id.
 */
static void
cancel_run_steps(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	if (SPI_execute_plan(ds_prepare_kept(&cancel_steps_plan,
										 "UPDATE durable_steps.steps SET status = 'cancelled',"
										 " error_class = 'cancelled', next_attempt_at = NULL,"
										 " finished_at = pg_catalog.clock_timestamp(),"
										 " updated_at = pg_catalog.clock_timestamp()"
										 " WHERE run_id OPERATOR(pg_catalog.=) $1"
										 " AND status OPERATOR(pg_catalog.=) ANY ('{pending,retrying,blocked,uncertain}')"
										 " AND pg_catalog.pg_has_role((SELECT r.owner FROM durable_steps.runs r"
										 "  WHERE r.run_id OPERATOR(pg_catalog.=) $1)::pg_catalog.oid,"
										 "  owner::pg_catalog.oid, 'USAGE')",
										 1, types),
						 args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "cancelling the steps of run %s failed", run_id);
	ds_store_spi_end(&spi);
}

/*
 * The statement that calls the workflow: its qualified name, the run id from the turn's
 * context, the input as $1. NULL when the workflow no longer exists.
 */
static char *
turn_statement(const char *workflow, bool *returns_value)
{
	LOCAL_FCINFO(lookup, 1);
	Datum		found;
	Oid			oid;
	HeapTuple	tuple;
	Form_pg_proc proc;
	char	   *sql;
	Oid			ext_schema = ds_extension_schema();
	char	   *run_id_call = psprintf("%s.ds_run_id()",
									   quote_identifier(get_namespace_name(ext_schema)));

	InitFunctionCallInfoData(*lookup, NULL, 1, InvalidOid, NULL, NULL);
	lookup->args[0].value = CStringGetTextDatum(workflow);
	lookup->args[0].isnull = false;
	found = to_regprocedure(lookup);
	if (lookup->isnull)
		return NULL;
	oid = DatumGetObjectId(found);
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(oid));
	if (!HeapTupleIsValid(tuple))
		return NULL;
	proc = (Form_pg_proc) GETSTRUCT(tuple);
	sql = psprintf("%s %s(%s, $1)", proc->prokind == PROKIND_PROCEDURE ? "CALL" : "SELECT",
				   quote_qualified_identifier(get_namespace_name(proc->pronamespace),
											  NameStr(proc->proname)),
				   run_id_call);
	*returns_value = proc->prokind != PROKIND_PROCEDURE && proc->prorettype != VOIDOID;
	ReleaseSysCache(tuple);
	return sql;
}

/*
 * A query cancel that was not ds_cancel_run's stopped the turn (an operator's pg_cancel_backend()
 * of the executor, a statement_timeout the workflow set): like a lost turn, not the workflow's
 * failure. The turn rolled back with everything it did; the run is due again, and fails with the
 * cancel's error only after max_attempts of its policy such turns in a row (counted with the lost
 * ones), so that a workflow cancelled every time does not loop for ever. Lets the run go.
 */
static bool
turn_interrupted(ClaimedRun *run, const AttemptOutcome *outcome, const char *step_id)
{
	RetryPolicy policy;
	RunWrite	w;
	int			lost = run->lost_turns + 1;
	const char *message = outcome->message ? outcome->message : "";
	bool		give_up;
	TimestampTz now = GetCurrentTimestamp();

	ds_policy_resolve(run->policy, NULL, &policy);
	give_up = lost >= policy.max_attempts;
	w.n = 0;
	set_text(&w, RUN_COL_STATUS, give_up ? "failed" : "waiting");
	set_column(&w, RUN_COL_OUTPUT, (Datum) 0, true);
	set_column(&w, RUN_COL_NEXT_WAKE_AT, TimestampTzGetDatum(now), give_up);
	set_text(&w, RUN_COL_WAIT_REASON, psprintf("turn interrupted: %s", message));
	set_text(&w, RUN_COL_CURRENT_STEP, step_id);
	set_text(&w, RUN_COL_WAIT_EVENT, NULL);
	set_text(&w, RUN_COL_ERROR_CODE, give_up ? unpack_sql_state(outcome->sqlerrcode) : NULL);
	set_text(&w, RUN_COL_ERROR_MESSAGE, give_up ? message : NULL);
	set_text(&w, RUN_COL_ERROR_DETAIL, NULL);
	set_column(&w, RUN_COL_CLAIMED_BY, (Datum) 0, true);
	set_column(&w, RUN_COL_LEASE_EXPIRES_AT, (Datum) 0, true);
	set_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(lost), false);
	set_column(&w, RUN_COL_FINISHED_AT, TimestampTzGetDatum(now), !give_up);
	write_run(run->run_id, &w);
	ereport(LOG,
			(errmsg("durable_steps: the turn of run %s was interrupted (%s); %s", run->run_id,
					message, give_up ? "failing the run" : "running it again")));
	if (!give_up)
		ds_worker_wake_at_commit();
	return false;
}

/*
 * ds_cancel_run stopped the turn, and waits for the run's row to cancel the run and its steps in
 * its own transaction: a call that rolls back leaves the run going on. Until then the run waits,
 * out of the executors' reach for a little while (the call is already waiting for the row).
 */
#define STOPPED_TURN_RESUME_USECS (1 * USECS_PER_SEC)

static void
stopped_outcome(RunOutcome *o)
{
	memset(o, 0, sizeof(*o));
	o->status = "waiting";
	o->wake_at = GetCurrentTimestamp() + STOPPED_TURN_RESUME_USECS;
	o->wait_reason = "turn stopped by ds_cancel_run()";
}

/*
 * Record how the turn ended. A run that can go on at once stays with this executor when
 * `may_continue` allows it (record_continuing); true then. Any other outcome lets the run go.
 */
static bool
end_turn(ClaimedRun *run, const RunOutcome *o, bool may_continue)
{
	if (may_continue && strcmp(o->status, "waiting") == 0 && o->wait_event == NULL &&
		o->wake_at != 0 && o->wake_at <= GetCurrentTimestamp())
	{
		record_continuing(run, o);
		return true;
	}
	record_run(run->run_id, o);
	if (strcmp(o->status, "cancelled") == 0)
		cancel_run_steps(run->run_id);
	return false;
}

/*
 * The turn ended at a step whose attempt is due: run it now, in this transaction, isolated as
 * the role the workflow called it as (like a worker attempt), through ds_run_step -- which
 * records the attempt and the step's new state with the step's effect -- and record the run as
 * the step left it. Or it ended at a new HTTP step (ds_http): create it the same way, through
 * ds_http_step, and the run waits for the HTTP worker.
 */
static void
run_step_work(const ClaimedRun *run, const TurnSuspension *susp, RunOutcome *o,
			  AttemptOutcome *interrupted)
{
	bool		http = susp->work == TURN_WORK_HTTP;
	StepBody	body;
	ClassOverrides no_overrides;
	AttemptOutcome outcome;
	char	   *status;
	char	   *next_at;
	char	   *paused;

	if (!http && (paused = ds_run_step_paused_queue(run->run_id, susp->step_id)) != NULL)
	{
		/* ds_set_queue(queue, 0) holds runs' steps too; it wakes the run when it opens it */
		o->status = "waiting";
		o->current_step = susp->step_id;
		o->wake_at = GetCurrentTimestamp() + RUN_QUEUE_PAUSED_RECHECK;
		o->wait_reason = psprintf(DS_RUN_QUEUE_PAUSED_REASON, paused);
		return;
	}
	memset(&no_overrides, 0, sizeof(no_overrides));
	memset(&body, 0, sizeof(body));
	body.run_id = run->run_id;
	body.step_id = DS_TURN_STEP_ID;
	if (http)
		body.sql = psprintf("SELECT pg_catalog.to_jsonb(r) FROM %s.ds_http_step("
							"run_id => $1 OPERATOR(pg_catalog.->>) 'run_id',"
							" step_id => $1 OPERATOR(pg_catalog.->>) 'step_id',"
							" request => $1 OPERATOR(pg_catalog.->) 'request',"
							" policy => $1 OPERATOR(pg_catalog.->) 'policy',"
							" idempotency_header => $1 OPERATOR(pg_catalog.->>) 'idempotency_header',"
							" timeout => ($1 OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval) r",
							quote_identifier(get_namespace_name(ds_extension_schema())));
	else
		body.sql = psprintf("SELECT pg_catalog.to_jsonb(r) FROM %s.ds_run_step("
							"run_id => $1 OPERATOR(pg_catalog.->>) 'run_id',"
							" step_id => $1 OPERATOR(pg_catalog.->>) 'step_id',"
							" sql => $1 OPERATOR(pg_catalog.->>) 'sql',"
							" input => $1 OPERATOR(pg_catalog.->) 'input',"
							" policy => $1 OPERATOR(pg_catalog.->) 'policy',"
							" timeout => ($1 OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval,"
							" retry_on => (SELECT pg_catalog.array_agg(e) FROM"
							"  pg_catalog.jsonb_array_elements_text($1 OPERATOR(pg_catalog.->) 'retry_on') e),"
							" fail_on => (SELECT pg_catalog.array_agg(e) FROM"
							"  pg_catalog.jsonb_array_elements_text($1 OPERATOR(pg_catalog.->) 'fail_on') e),"
							" on_timeout => COALESCE($1 OPERATOR(pg_catalog.->>) 'on_timeout', 'retry')) r",
							quote_identifier(get_namespace_name(ds_extension_schema())));
	body.input = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(susp->step_call)));
	/* the step's own timeout stops its attempt first: this bound is the backstop */
	body.timeout = http ? 0 : susp->step_timeout + 5 * USECS_PER_SEC;
	body.isolate_as = OidIsValid(susp->owner) ? susp->owner : run->owner;
	body.cancel_key = ds_attempt_cancel_key(run->run_id, DS_TURN_STEP_ID, run->turn);
	body.search_path = susp->search_path;
	body.overrides = &no_overrides;
	ds_execute_step_attempt(&body, run->turn, run->turn, &outcome);

	o->current_step = susp->step_id;
	if (outcome.cls == ATTEMPT_CANCELLED)
	{
		stopped_outcome(o);
		return;
	}
	if (outcome.cls != ATTEMPT_COMPLETED && outcome.sqlerrcode == ERRCODE_QUERY_CANCELED)
	{
		/* stopped by a cancel that was not ds_cancel_run's: the caller's turn_interrupted */
		*interrupted = outcome;
		o->status = NULL;
		return;
	}
	if (outcome.cls != ATTEMPT_COMPLETED)
	{
		/* ds_run_step refused the call (a conflicting definition, ...): the workflow's error */
		o->status = "failed";
		o->error_code = unpack_sql_state(outcome.sqlerrcode);
		o->error_message = outcome.message;
		o->error_detail = outcome.detail;
		return;
	}
	status = ds_jsonb_field_text(outcome.result, "status", NULL);
	next_at = ds_jsonb_field_text(outcome.result, "next_attempt_at", NULL);
	o->status = "waiting";
	o->wake_at = GetCurrentTimestamp();
	if (status == NULL)
		elog(ERROR, "ds_run_step answered no status");
	if (http)
	{
		/*
		 * A new HTTP step (ds_http): the HTTP worker sends it once this commits, and wakes the
		 * run when it has an outcome the run must see. One created meanwhile is replayed.
		 */
		if (strcmp(status, "pending") == 0 || strcmp(status, "retrying") == 0 ||
			strcmp(status, "running") == 0)
		{
			o->wake_at = 0;
			o->wait_reason = susp->reason;
		}
		else
			o->wait_reason = psprintf("step %s %s", susp->step_id, status);
	}
	else if (strcmp(status, "blocked") == 0)
	{
		o->status = "blocked";
		o->wake_at = 0;
		o->wait_reason = psprintf("step %s is blocked: %s", susp->step_id,
								  ds_jsonb_field_text(outcome.result, "remediation",
													  "it needs corrected input"));
	}
	else if ((strcmp(status, "retrying") == 0 || strcmp(status, "pending") == 0) && next_at)
	{
		o->wake_at = DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in,
															 CStringGetDatum(next_at),
															 ObjectIdGetDatum(InvalidOid),
															 Int32GetDatum(-1)));
		o->wait_reason = psprintf("retry of step %s (last error %s: %s)", susp->step_id,
								  ds_jsonb_field_text(outcome.result, "error_code", "?"),
								  ds_jsonb_field_text(outcome.result, "error_message", ""));
	}
	else
		/* succeeded, or failed for good: the next turn replays it */
		o->wait_reason = psprintf("step %s %s", susp->step_id, status);
}

bool
ds_run_turn(ClaimedRun *run, bool may_continue, char **awaited)
{
	RunOutcome	o;
	StepBody	body;
	ClassOverrides no_overrides;
	AttemptOutcome outcome;
	TurnSuspension susp;
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;

	*awaited = NULL;
	memset(&o, 0, sizeof(o));
	if (!lock_claimed_run(run))
		return false;
	if (GetUserNameFromId(run->owner, true) == NULL)
	{
		/* never run as anybody else: the run fails closed */
		o.status = "failed";
		o.error_code = unpack_sql_state(ERRCODE_UNDEFINED_OBJECT);
		o.error_message = "the role that started the run no longer exists";
		return end_turn(run, &o, false);
	}
	if (run->statement == NULL)
	{
		/* looked up once per claim: the turns of one claim follow each other closely */
		char	   *sql = turn_statement(run->workflow, &run->returns_value);

		if (sql == NULL)
		{
			o.status = "failed";
			o.error_code = unpack_sql_state(ERRCODE_UNDEFINED_FUNCTION);
			o.error_message = psprintf("workflow %s no longer exists", run->workflow);
			return end_turn(run, &o, false);
		}
		run->statement = MemoryContextStrdup(run->cxt, sql);
	}

	memset(&no_overrides, 0, sizeof(no_overrides));
	memset(&body, 0, sizeof(body));
	body.run_id = run->run_id;
	body.step_id = DS_TURN_STEP_ID;
	body.sql = run->statement;
	body.input = run->input;
	body.timeout = 0;			/* durable_steps.default_timeout */
	body.isolate_as = run->owner;
	body.cancel_key = ds_attempt_cancel_key(run->run_id, DS_TURN_STEP_ID, run->turn);
	/* as for a worker attempt: pg_temp last */
	body.search_path = strspn(run->search_path, " \t\r\n") == strlen(run->search_path) ?
		"pg_temp" : psprintf("%s, pg_temp", run->search_path);
	body.overrides = &no_overrides;

	/* the turn's own subtransaction: kept when the turn completes, rolled back when it waits */
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	ds_turn_begin(run->run_id, run->owner);
	ds_execute_step_attempt(&body, run->turn, run->turn, &outcome);
	ds_turn_end(&susp);
	if (outcome.cls == ATTEMPT_COMPLETED && !susp.suspended)
		ReleaseCurrentSubTransaction();
	else
		RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(oldcxt);
	CurrentResourceOwner = oldowner;

	if (outcome.cls == ATTEMPT_COMPLETED && !susp.suspended)
	{
		o.status = "succeeded";
		o.output = run->returns_value ? outcome.result : NULL;
		return end_turn(run, &o, false);
	}
	if (outcome.cls == ATTEMPT_CANCELLED)
	{
		stopped_outcome(&o);
		return end_turn(run, &o, false);
	}
	if (susp.suspended)
	{
		if (susp.work == TURN_WORK_STEP || susp.work == TURN_WORK_HTTP)
		{
			AttemptOutcome interrupted;

			run_step_work(run, &susp, &o, &interrupted);
			if (o.status == NULL)
				return turn_interrupted(run, &interrupted, susp.step_id);
			return end_turn(run, &o, may_continue);
		}
		if (susp.work != TURN_WORK_NONE)
			ds_turn_record_wait(run->run_id, &susp);
		o.status = susp.blocked ? "blocked" : "waiting";
		o.wake_at = susp.wake_at;
		o.wait_reason = susp.reason;
		o.current_step = susp.step_id;
		o.wait_event = susp.work == TURN_WORK_NONE || susp.work == TURN_WORK_EVENT_START ?
			susp.event : NULL;
		if (o.wait_event != NULL)
			*awaited = pstrdup(o.wait_event);
		/* a wait's record is this turn's work: the run may go on at once (an event that came) */
		return end_turn(run, &o, may_continue && susp.work != TURN_WORK_NONE);
	}
	if (outcome.sqlerrcode == ERRCODE_QUERY_CANCELED)
		return turn_interrupted(run, &outcome, NULL);
	/* the workflow raised: a step's failure it did not catch, or an error of its own */
	o.status = "failed";
	o.error_code = unpack_sql_state(outcome.sqlerrcode);
	o.error_message = outcome.message;
	o.error_detail = outcome.detail;
	return end_turn(run, &o, false);
}

void
ds_wake_runs_with_emitted_events(void)
{
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	/* through runs_event_idx: the runs that wait for an event */
	if (SPI_execute_plan(ds_prepare_kept(&emitted_events_plan,
										 "UPDATE durable_steps.runs r"
										 " SET next_wake_at = pg_catalog.clock_timestamp()"
										 " WHERE r.status OPERATOR(pg_catalog.=) 'waiting'"
										 " AND r.wait_event IS NOT NULL"
										 " AND (r.next_wake_at IS NULL"
										 "  OR r.next_wake_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())"
										 " AND EXISTS (SELECT FROM durable_steps.events e"
										 "  WHERE e.owner OPERATOR(pg_catalog.=) r.owner"
										 "  AND e.name OPERATOR(pg_catalog.=) r.wait_event)",
										 0, NULL),
						 NULL, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "looking for emitted events failed");
	ds_store_spi_end(&spi);
}

void
ds_wake_if_event_emitted(const char *run_id, const char *event)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(run_id), CStringGetTextDatum(event)};
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	if (SPI_execute_plan(ds_prepare_kept(&event_plan,
										 "UPDATE durable_steps.runs r"
										 " SET next_wake_at = pg_catalog.clock_timestamp()"
										 " WHERE r.run_id OPERATOR(pg_catalog.=) $1"
										 " AND r.status OPERATOR(pg_catalog.=) 'waiting'"
										 " AND r.wait_event OPERATOR(pg_catalog.=) $2"
										 " AND EXISTS (SELECT FROM durable_steps.events e"
										 "  WHERE e.owner OPERATOR(pg_catalog.=) r.owner"
										 "  AND e.name OPERATOR(pg_catalog.=) $2)",
										 2, types),
						 args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "looking for event %s failed", event);
	ds_store_spi_end(&spi);
}

int
ds_recover_lost_turns(int limit, MemoryContext cxt, char ***run_ids)
{
	Oid			types[1] = {INT4OID};
	Oid			lost_types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		args[3];
	StoreSpi	spi;
	int			n = 0;
	int			rc;
	uint64		n_running;
	char	  **ids;
	int		   *lost;
	Jsonb	  **policies;

	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	/* a turn in flight holds its row: SKIP LOCKED passes over it */
	rc = SPI_execute_plan(ds_prepare_kept(&running_plan,
										  "SELECT run_id, lost_turns, policy FROM durable_steps.runs"
										  " WHERE status OPERATOR(pg_catalog.=) 'running'"
										  " LIMIT $1 FOR UPDATE SKIP LOCKED", 1, types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "running run query failed: %s", SPI_result_code_string(rc));
	n_running = SPI_processed;
	ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n_running, 1));
	lost = palloc(sizeof(int) * Max(n_running, 1));
	policies = palloc(sizeof(Jsonb *) * Max(n_running, 1));
	for (uint64 i = 0; i < n_running; i++)
	{
		bool		isnull;
		Datum		d;

		ids[i] = MemoryContextStrdup(cxt, SPI_getvalue(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 1));
		lost[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2,
											  &isnull));
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3, &isnull);
		policies[i] = isnull ? NULL : DatumGetJsonbPCopy(d);
	}
	for (uint64 i = 0; i < n_running; i++)
	{
		RetryPolicy policy;
		bool		give_up;

		/* a free lock on a running run means its executor is gone */
		if (!ds_step_lock_try_session(ids[i], DS_TURN_STEP_ID))
			continue;
		ids[n++] = ids[i];
		ds_policy_resolve(policies[i], NULL, &policy);
		/* a turn that kills its executor every time must not be retried forever */
		give_up = lost[i] + 1 >= policy.max_attempts;
		ereport(LOG,
				(errmsg("durable_steps: the turn of run %s was lost with its executor; %s",
						ids[i], give_up ? "failing the run" : "running it again")));
		args[0] = CStringGetTextDatum(ids[i]);
		args[1] = CStringGetTextDatum(give_up ? "failed" : "waiting");
		args[2] = CStringGetTextDatum(unpack_sql_state(ERRCODE_DS_INVOCATION_LOST));
		rc = SPI_execute_plan(ds_prepare_kept(&lost_plan,
											  "UPDATE durable_steps.runs SET status = $2,"
											  " lost_turns = lost_turns OPERATOR(pg_catalog.+) 1,"
											  " claimed_by = NULL, lease_expires_at = NULL,"
											  " updated_at = pg_catalog.clock_timestamp(),"
											  " next_wake_at = CASE WHEN $2 OPERATOR(pg_catalog.=) 'waiting'"
											  "  THEN pg_catalog.clock_timestamp() END,"
											  " finished_at = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed'"
											  "  THEN pg_catalog.clock_timestamp() END,"
											  " wait_reason = 'turn lost with its executor',"
											  " error_code = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed' THEN $3 END,"
											  " error_message = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed'"
											  "  THEN 'invocation_lost: every turn lost its executor' END"
											  " WHERE run_id OPERATOR(pg_catalog.=) $1",
											  3, lost_types),
							  args, NULL, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "recovering run %s failed", ids[i]);
		if (!give_up)
			ds_worker_wake_at_commit();
	}
	ds_store_spi_end(&spi);
	*run_ids = ids;
	return n;
}

TimestampTz
ds_next_run_wake_time(void)
{
	return ds_store_query_time(&next_wake_plan,
							   "SELECT pg_catalog.min(next_wake_at) FROM durable_steps.runs"
							   " WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')",
							   "next run wake");
}
