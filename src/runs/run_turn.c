/*
 * run_turn.c -- the worker's side of runs (docs/runs.md): running one turn, recording how it
 * ended (the runs' statements of claims and recovery are run_claims.c's).
 *
 * A turn calls the workflow from its start, as the run's owner and isolated exactly like a worker
 * attempt (step_exec.c, step_isolation.c: session and current user the owner, security-restricted,
 * the run's search_path, bounded by durable_steps.default_timeout and max_worker_attempt_time,
 * stoppable by ds_cancel_run), inside a subtransaction of its own of the executor's transaction
 * (which other runs' turns of the same owner may share, executor.c; never two turns of one run):
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
#include "base/compat.h"

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

#include "store/direct_write.h"
#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/worker_attempt_time.h"
#include "steps/run_context.h"
#include "runs/workflow_calls.h"
#include "runs/run_turn.h"
#include "store/run_control_store.h"
#include "store/run_store.h"
#include "steps/step_exec.h"
#include "store/step_lock.h"
#include "store/store_relations.h"
#include "store/step_store.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"

/* How often a run whose step's queue is paused looks again (ds_set_queue also wakes it). */
#define RUN_QUEUE_PAUSED_RECHECK (60 * USECS_PER_SEC)

/* How often a run whose step is held by a limit, or run as a plain step, looks again. */
#define RUN_STEP_ELSEWHERE_RECHECK (1 * USECS_PER_SEC)




/* How a turn ended, as recorded on the run. */
typedef struct RunOutcome
{
	RunStatus	status;
	bool		interrupted;	/* a cancel stopped the turn: turn_interrupted
								 * records it */
	Jsonb	   *output;
	TimestampTz wake_at;		/* 0 = NULL */
	const char *wait_reason;
	const char *current_step;
	const char *wait_event;
	const char *error_code;
	const char *error_message;
	const char *error_detail;
} RunOutcome;








/*
 * The run's unrecorded attempts go with the turn's outcome when the turn changed them (it handed
 * some to the step it ran, run_step_work) or the run has finished (none can be recorded any
 * more).
 */
static void
write_unrecorded(RunWrite *w, ClaimedRun *run, bool finished)
{
	if (finished && run->n_unrecorded > 0)
	{
		run->n_unrecorded = 0;
		run->unrecorded_changed = true;
	}
	if (!run->unrecorded_changed)
		return;
	ds_run_write_unrecorded(w, run->n_unrecorded, run->unrecorded);
	run->unrecorded_changed = false;
}

static void
record_run(ClaimedRun *run, const RunOutcome *o)
{
	const char *run_id = run->run_id;
	RunWrite	w;
	bool		finished = o->status == RUN_SUCCEEDED || o->status == RUN_FAILED ||
		o->status == RUN_CANCELLED;

	w.n = 0;
	ds_run_write_status(&w, o->status);
	ds_run_write_column(&w, RUN_COL_OUTPUT, o->output ? JsonbPGetDatum(o->output) : (Datum) 0,
						o->output == NULL);
	ds_run_write_column(&w, RUN_COL_NEXT_WAKE_AT, TimestampTzGetDatum(o->wake_at), o->wake_at == 0);
	ds_run_write_text(&w, RUN_COL_WAIT_REASON, o->wait_reason);
	ds_run_write_text(&w, RUN_COL_CURRENT_STEP, o->current_step);
	ds_run_write_text(&w, RUN_COL_WAIT_EVENT, o->wait_event);
	ds_run_write_text(&w, RUN_COL_ERROR_CODE, o->error_code);
	ds_run_write_text(&w, RUN_COL_ERROR_MESSAGE, o->error_message);
	ds_run_write_text(&w, RUN_COL_ERROR_DETAIL, o->error_detail);
	ds_run_write_column(&w, RUN_COL_CLAIMED_BY, (Datum) 0, true);
	ds_run_write_column(&w, RUN_COL_LEASE_EXPIRES_AT, (Datum) 0, true);
	ds_run_write_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(0), false);
	ds_run_write_column(&w, RUN_COL_FINISHED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), !finished);
	write_unrecorded(&w, run, finished);
	ds_run_write_row(run_id, &run->row_tid, &w);
	if (o->wake_at != 0)
		ds_worker_wake_at_commit();
	/* a child run's end: its parent's ds_join_child goes on */
	if (finished)
		ds_run_wake_parent(run_id);

	/*
	 * Waiting for a child run that ended while this turn ran: the child's
	 * wake found the run not yet waiting for it. Read after the row is
	 * written, in the latest snapshot. A child whose end commits after this
	 * read, and whose wake still missed the turn, is caught by the run's own
	 * look again (DS_JOIN_RECHECK_USECS).
	 */
	if (o->status == RUN_WAITING && o->current_step != NULL &&
		o->wait_reason != NULL && strncmp(o->wait_reason, "child ", 6) == 0 &&
		ds_run_child_ended(run_id, o->current_step))
		ds_run_wake_for_step_outcome(run_id, o->current_step);
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
	ds_run_write_column(&w, RUN_COL_TURNS, Int32GetDatum(run->turn + 1), false);
	ds_run_write_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(0), false);
	ds_run_write_text(&w, RUN_COL_CURRENT_STEP, o->current_step);
	ds_run_write_text(&w, RUN_COL_WAIT_REASON, o->wait_reason);
	ds_run_write_column(&w, RUN_COL_LEASE_EXPIRES_AT,
						TimestampTzGetDatum(GetCurrentTimestamp() + ds_worker_attempt_limit_usecs(0)),
						false);
	write_unrecorded(&w, run, false);
	ds_run_write_row(run->run_id, &run->row_tid, &w);
	run->turn++;
	run->lost_turns = 0;
}


/*
 * The steps of a cancelled run that have not finished are cancelled with it: those of roles the
 * run's owner has the privileges of, as in ds_cancel_run (runs.c), not another role's plain steps
 * that share the run_id.
 */
static void
cancel_run_steps(const char *run_id)
{
	ds_store_cancel_run_steps(run_id);
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
 * ones), so that a workflow cancelled every time does not loop for ever. A step attempt the turn
 * was running (`step_ran`) rolled back with its record: the next turn records it on the step
 * (57014), as a worker records a cancelled attempt of a plain step. Lets the run go.
 */
static bool
turn_interrupted(ClaimedRun *run, const AttemptOutcome *outcome, const char *step_id,
				 bool step_ran)
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
	ds_run_write_status(&w, give_up ? RUN_FAILED : RUN_WAITING);
	ds_run_write_column(&w, RUN_COL_OUTPUT, (Datum) 0, true);
	ds_run_write_column(&w, RUN_COL_NEXT_WAKE_AT, TimestampTzGetDatum(now), give_up);
	ds_run_write_text(&w, RUN_COL_WAIT_REASON, psprintf("turn interrupted: %s", message));
	ds_run_write_text(&w, RUN_COL_CURRENT_STEP, step_id);
	ds_run_write_text(&w, RUN_COL_WAIT_EVENT, NULL);
	ds_run_write_text(&w, RUN_COL_ERROR_CODE, give_up ? unpack_sql_state(outcome->sqlerrcode) : NULL);
	ds_run_write_text(&w, RUN_COL_ERROR_MESSAGE, give_up ? message : NULL);
	ds_run_write_text(&w, RUN_COL_ERROR_DETAIL, NULL);
	ds_run_write_column(&w, RUN_COL_CLAIMED_BY, (Datum) 0, true);
	ds_run_write_column(&w, RUN_COL_LEASE_EXPIRES_AT, (Datum) 0, true);
	ds_run_write_column(&w, RUN_COL_LOST_TURNS, Int32GetDatum(lost), false);
	ds_run_write_column(&w, RUN_COL_FINISHED_AT, TimestampTzGetDatum(now), !give_up);
	if (give_up)
		/* a failed run records nothing more; ds_resume_run starts it afresh */
		ds_run_write_unrecorded(&w, 0, NULL);
	else if (step_ran &&
			 !ds_turn_only_records(run->run_id, step_id, run->owner, run->n_unrecorded,
								   run->unrecorded) &&
			 !ds_record_turn_attempt_on_step(run->run_id, step_id, run->owner,
											 ERRCODE_QUERY_CANCELED, 0))
	{
		/*
		 * the attempt of this step, and those handed to it, which rolled back
		 * with the turn
		 */
		UnrecordedAttempt *entries = palloc(sizeof(UnrecordedAttempt) * (run->n_unrecorded + 1));

		memcpy(entries, run->unrecorded, sizeof(UnrecordedAttempt) * run->n_unrecorded);
		entries[run->n_unrecorded].sqlerrcode = ERRCODE_QUERY_CANCELED;
		entries[run->n_unrecorded].step_id = pstrdup(step_id);
		ds_run_write_unrecorded(&w, run->n_unrecorded + 1, entries);
	}
	ds_run_write_row(run->run_id, &run->row_tid, &w);
	ereport(LOG,
			(errmsg("durable_steps: the turn of run %s was interrupted (%s); %s", run->run_id,
					message, give_up ? "failing the run" : "running it again")));
	if (!give_up)
		ds_worker_wake_at_commit();
	else
		ds_run_wake_parent(run->run_id);
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
	o->status = RUN_WAITING;
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
	if (may_continue && o->status == RUN_WAITING && o->wait_event == NULL &&
		o->wake_at != 0 && o->wake_at <= GetCurrentTimestamp())
	{
		record_continuing(run, o);
		return true;
	}
	record_run(run, o);
	if (o->status == RUN_CANCELLED)
		cancel_run_steps(run->run_id);
	return false;
}

/*
 * The turn ended at a step whose attempt is due: run it now, in this transaction, isolated as
 * the role the workflow called it as (like a worker attempt), through ds_run_step -- which
 * records the attempt and the step's new state with the step's effect -- and record the run as
 * the step left it. Or it ended at a new HTTP step (ds_http) or task (ds_task): create it the
 * same way, through ds_http_step or ds_task_step, and the run waits for the HTTP worker or an
 * application worker.
 */
static void
run_step_work(ClaimedRun *run, const TurnSuspension *susp, RunOutcome *o,
			  AttemptOutcome *interrupted)
{
	UnrecordedAttempt *handed = NULL;
	UnrecordedAttempt *kept = NULL;
	int			n_handed;
	int			n_kept;
	bool		http = susp->work == TURN_WORK_HTTP;
	bool		task = susp->work == TURN_WORK_TASK;
	bool		map = susp->work == TURN_WORK_MAP;
	bool		child = susp->work == TURN_WORK_CHILD;

	/*
	 * a step another process runs, which the turn only creates; a map's items
	 * are such steps, a child run is such work
	 */
	bool		created = http || task || map || child;
	StepBody	body;
	ClassOverrides no_overrides;
	AttemptOutcome outcome;
	char	   *status_name;
	StepStatus	status;
	char	   *next_at;
	char	   *paused;

	if (!created && (paused = ds_run_step_paused_queue(run->run_id, susp->step_id)) != NULL)
	{
		/*
		 * ds_set_queue(queue, 0) holds runs' steps too; it wakes the run when
		 * it opens it
		 */
		o->status = RUN_WAITING;
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
	else if (child)
		body.sql = psprintf("SELECT pg_catalog.to_jsonb(r) FROM %s.ds_start_child("
							"parent_run_id => $1 OPERATOR(pg_catalog.->>) 'run_id',"
							" step_id => $1 OPERATOR(pg_catalog.->>) 'step_id',"
							" workflow => $1 OPERATOR(pg_catalog.->>) 'workflow',"
							" input => $1 OPERATOR(pg_catalog.->) 'input',"
							" policy => $1 OPERATOR(pg_catalog.->) 'policy') r",
							quote_identifier(get_namespace_name(ds_extension_schema())));
	else if (map)
		body.sql = psprintf("SELECT pg_catalog.to_jsonb(r) FROM %s.ds_start_map("
							"run_id => $1 OPERATOR(pg_catalog.->>) 'run_id',"
							" step_id => $1 OPERATOR(pg_catalog.->>) 'step_id',"
							" sql => $1 OPERATOR(pg_catalog.->>) 'sql',"
							" inputs => $1 OPERATOR(pg_catalog.->) 'inputs',"
							" concurrency => ($1 OPERATOR(pg_catalog.->>) 'concurrency')::pg_catalog.int4,"
							" policy => $1 OPERATOR(pg_catalog.->) 'policy',"
							" timeout => ($1 OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval,"
							" task => $1 OPERATOR(pg_catalog.->>) 'task',"
							" http => COALESCE(($1 OPERATOR(pg_catalog.->>) 'http')::pg_catalog.bool, false)) r",
							quote_identifier(get_namespace_name(ds_extension_schema())));
	else if (task)
		body.sql = psprintf("SELECT pg_catalog.to_jsonb(r) FROM %s.ds_task_step("
							"run_id => $1 OPERATOR(pg_catalog.->>) 'run_id',"
							" step_id => $1 OPERATOR(pg_catalog.->>) 'step_id',"
							" task => $1 OPERATOR(pg_catalog.->>) 'task',"
							" input => $1 OPERATOR(pg_catalog.->) 'input',"
							" policy => $1 OPERATOR(pg_catalog.->) 'policy',"
							" queue => $1 OPERATOR(pg_catalog.->>) 'queue',"
							" priority => ($1 OPERATOR(pg_catalog.->>) 'priority')::pg_catalog.int4,"
							" timeout => ($1 OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval,"
							" on_lost => $1 OPERATOR(pg_catalog.->>) 'on_lost') r",
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
							" on_timeout => COALESCE($1 OPERATOR(pg_catalog.->>) 'on_timeout', 'retry'),"
							" expect => $1 OPERATOR(pg_catalog.->>) 'expect') r",
							quote_identifier(get_namespace_name(ds_extension_schema())));
	body.input = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(susp->step_call)));

	/*
	 * the step's own timeout stops its attempt first: this bound is the
	 * backstop
	 */
	body.timeout = created ? 0 : susp->step_timeout + 5 * USECS_PER_SEC;
	body.isolate_as = OidIsValid(susp->owner) ? susp->owner : run->owner;
	body.cancel_key = ds_attempt_cancel_key(run->run_id, DS_TURN_STEP_ID, run->turn);
	body.search_path = susp->search_path;
	body.overrides = &no_overrides;
	n_handed = 0;
	n_kept = 0;
	if (!created)
	{
		/*
		 * only the run owner's step: another role's step under the same name
		 * (made by its SECURITY DEFINER code) is never charged
		 */
		bool		owners_step = !OidIsValid(susp->owner) || susp->owner == run->owner;

		/*
		 * The step's body may run from here: an executor that ends now says
		 * so in shared memory (executor_slot.h), and whoever recovers the
		 * turn charges the step an attempt. The attempts earlier turns lost
		 * of it are recorded first, by its ds_run_step: those that name it,
		 * and those that name no step, for a step the turn creates -- when
		 * the run's owner calls it, never a step another role's code makes.
		 */
		ds_claim_starting(body.cancel_key);
		handed = palloc(sizeof(UnrecordedAttempt) * Max(run->n_unrecorded, 1));
		kept = palloc(sizeof(UnrecordedAttempt) * Max(run->n_unrecorded, 1));
		for (int i = 0; i < run->n_unrecorded; i++)
		{
			const UnrecordedAttempt *u = &run->unrecorded[i];

			if (owners_step &&
				(u->step_id == NULL || strcmp(u->step_id, susp->step_id) == 0))
				handed[n_handed++] = *u;
			else if (u->step_id != NULL)
				kept[n_kept++] = *u;
		}
		ds_turn_hand_unrecorded_attempts(run->run_id, susp->step_id, n_handed, handed);
	}
	ds_execute_step_attempt(&body, run->turn, run->turn, &outcome);
	ds_turn_hand_unrecorded_attempts(NULL, NULL, 0, NULL);
	if (!created && outcome.cls != ATTEMPT_CANCELLED && outcome.sqlerrcode != ERRCODE_QUERY_CANCELED &&
		n_kept != run->n_unrecorded)
	{
		/*
		 * recorded by the step, or not its own to record (an unnamed one
		 * where the turn created no step): the others wait for their steps
		 */
		run->n_unrecorded = n_kept;
		run->unrecorded = kept;
		run->unrecorded_changed = true;
	}

	o->current_step = susp->step_id;
	if (outcome.cls == ATTEMPT_CANCELLED)
	{
		stopped_outcome(o);
		return;
	}
	if (outcome.cls != ATTEMPT_COMPLETED && outcome.sqlerrcode == ERRCODE_QUERY_CANCELED)
	{
		/*
		 * stopped by a cancel that was not ds_cancel_run's: the caller's
		 * turn_interrupted
		 */
		*interrupted = outcome;
		o->interrupted = true;
		return;
	}
	if (outcome.cls != ATTEMPT_COMPLETED)
	{
		/*
		 * ds_run_step refused the call (a conflicting definition, ...): the
		 * workflow's error
		 */
		o->status = RUN_FAILED;
		o->error_code = unpack_sql_state(outcome.sqlerrcode);
		o->error_message = outcome.message;
		o->error_detail = outcome.detail;
		return;
	}
	status_name = ds_jsonb_field_text(outcome.result, "status", NULL);
	next_at = ds_jsonb_field_text(outcome.result, "next_attempt_at", NULL);
	o->status = RUN_WAITING;
	o->wake_at = GetCurrentTimestamp();
	if (status_name == NULL)
		elog(ERROR, "ds_run_step answered no status");
	status = ds_step_status_from_name(status_name);
	if (created)
	{
		/*
		 * A new HTTP step (ds_http) or task (ds_task): the HTTP worker sends
		 * it, or an application worker claims it, once this commits, and
		 * wakes the run when it has an outcome the run must see. One created
		 * meanwhile is replayed.
		 */
		if (status == STEP_PENDING || status == STEP_RETRYING || status == STEP_RUNNING)
		{
			/* a map's join also looks again by itself now and then */
			o->wake_at = map ? GetCurrentTimestamp() + DS_JOIN_RECHECK_USECS : 0;
			o->wait_reason = susp->reason;
		}
		else
			o->wait_reason = psprintf("step %s %s", susp->step_id, status_name);
	}
	else if (status == STEP_BLOCKED)
	{
		o->status = RUN_BLOCKED;
		o->wake_at = 0;
		o->wait_reason = psprintf("step %s is blocked: %s", susp->step_id,
								  ds_jsonb_field_text(outcome.result, "remediation",
													  "it needs corrected input"));
	}
	else if ((status == STEP_RETRYING || status == STEP_PENDING) && next_at)
	{
		o->wake_at = DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in,
															 CStringGetDatum(next_at),
															 ObjectIdGetDatum(InvalidOid),
															 Int32GetDatum(-1)));
		o->wait_reason = psprintf("retry of step %s (last error %s: %s)", susp->step_id,
								  ds_jsonb_field_text(outcome.result, "error_code", "?"),
								  ds_jsonb_field_text(outcome.result, "error_message", ""));
	}
	else if (status == STEP_RETRYING || status == STEP_PENDING || status == STEP_RUNNING)
	{
		/*
		 * held by a limit (its caller stored it; docs/limits.md), or run by
		 * an executor as a plain step: looked at again a little later, never
		 * at once (a turn that answers the same at once would spin)
		 */
		o->wake_at = GetCurrentTimestamp() + RUN_STEP_ELSEWHERE_RECHECK;
		o->wait_reason = psprintf("step %s waits for its admission or its attempt", susp->step_id);
	}
	else
		/* succeeded, or failed for good: the next turn replays it */
		o->wait_reason = psprintf("step %s %s", susp->step_id, status_name);
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
	if (!ds_lock_claimed_run(run))
		return false;
	if (GetUserNameFromId(run->owner, true) == NULL)
	{
		/* never run as anybody else: the run fails closed */
		o.status = RUN_FAILED;
		o.error_code = unpack_sql_state(ERRCODE_UNDEFINED_OBJECT);
		o.error_message = "the role that started the run no longer exists";
		return end_turn(run, &o, false);
	}
	if (run->statement == NULL)
	{
		/*
		 * looked up once per claim: the turns of one claim follow each other
		 * closely
		 */
		char	   *sql = turn_statement(run->workflow, &run->returns_value);

		if (sql == NULL)
		{
			o.status = RUN_FAILED;
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

	/*
	 * the turn's own subtransaction: kept when the turn completes, rolled
	 * back when it waits
	 */
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
		o.status = RUN_SUCCEEDED;
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
		if (susp.work == TURN_WORK_STEP || susp.work == TURN_WORK_HTTP ||
			susp.work == TURN_WORK_TASK || susp.work == TURN_WORK_MAP ||
			susp.work == TURN_WORK_CHILD)
		{
			AttemptOutcome interrupted;

			run_step_work(run, &susp, &o, &interrupted);
			if (o.interrupted)
				return turn_interrupted(run, &interrupted, susp.step_id,
										susp.work == TURN_WORK_STEP);
			return end_turn(run, &o, may_continue);
		}
		if (susp.work != TURN_WORK_NONE)
			ds_turn_record_wait(run->run_id, &susp);
		o.status = susp.blocked ? RUN_BLOCKED : RUN_WAITING;
		o.wake_at = susp.wake_at;
		o.wait_reason = susp.reason;
		o.current_step = susp.step_id;
		o.wait_event = susp.work == TURN_WORK_NONE || susp.work == TURN_WORK_EVENT_START ?
			susp.event : NULL;
		if (o.wait_event != NULL)
			*awaited = pstrdup(o.wait_event);

		/*
		 * a wait's record is this turn's work: the run may go on at once (an
		 * event that came)
		 */
		return end_turn(run, &o, may_continue && susp.work != TURN_WORK_NONE);
	}
	if (outcome.sqlerrcode == ERRCODE_QUERY_CANCELED)
		return turn_interrupted(run, &outcome, NULL, false);

	/*
	 * the workflow raised: a step's failure it did not catch, or an error of
	 * its own
	 */
	o.status = RUN_FAILED;
	o.error_code = unpack_sql_state(outcome.sqlerrcode);
	o.error_message = outcome.message;
	o.error_detail = outcome.detail;
	return end_turn(run, &o, false);
}
