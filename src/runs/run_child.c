/*
 * run_child.c -- child runs (docs/runs.md, "Child runs"): ds_start_child_run and ds_join_child
 * in a workflow, and ds_start_child, what the turn calls to start one.
 *
 * A child run's id is "<parent run id>/<step id>", its run key: starting it again answers the
 * same run, so a turn that replays ds_start_child_run never starts a second. The first turn to
 * reach it ends there, and the executor starts the child in the turn's transaction, as the
 * workflow's role, through ds_start_child (ds_start_run, so every check of ds_start_run applies),
 * with the parent's link (runs.parent_run_id, parent_step); the parent goes on at once.
 * ds_join_child(step_id) replays the child's output once it succeeded, raises DS102 when it
 * failed or was cancelled, and otherwise suspends the parent at that step: the child's end wakes
 * it (ds_run_wake_parent). ds_cancel_run of the parent cancels its unfinished children.
 */
#include "base/compat.h"

#include "catalog/namespace.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "runs/run_child.h"
#include "runs/workflow_calls.h"
#include "steps/run_context.h"
#include "steps/step_call.h"
#include "store/run_control_store.h"
#include "store/run_store.h"
#include "store/step_store.h"

PG_FUNCTION_INFO_V1(ds_start_child_run);
PG_FUNCTION_INFO_V1(ds_join_child);
PG_FUNCTION_INFO_V1(ds_start_child);

/* A child run as the latest snapshot sees it. */
typedef struct ChildRun
{
	bool		exists;
	RunStatus	status;
	Jsonb	   *output;
	char	   *error_code;
	char	   *error_message;
	Oid			owner;
} ChildRun;

static char *
child_run_id(const char *parent, const char *step_id)
{
	return psprintf("%s/%s", parent, step_id);
}

static void
read_child(const char *child, ChildRun *out)
{
	StoreSpi	spi;

	memset(out, 0, sizeof(*out));
	ds_store_spi_begin(&spi);
	if (ds_store_read_run_latest(child) == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;
		char	   *s;

		out->exists = true;
		out->status = ds_run_status_from_name(SPI_getvalue(row, td, 1));
		d = SPI_getbinval(row, td, 2, &isnull);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(spi.caller_cxt);

			out->output = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		s = SPI_getvalue(row, td, 3);
		out->error_code = s ? MemoryContextStrdup(spi.caller_cxt, s) : NULL;
		s = SPI_getvalue(row, td, 4);
		out->error_message = s ? MemoryContextStrdup(spi.caller_cxt, s) : NULL;
		out->owner = DatumGetObjectId(SPI_getbinval(row, td, 5, &isnull));
	}
	ds_store_spi_end(&spi);
}

/*
 * ds_start_child_run(step_id, workflow, input, policy) -> text: the child run's id; the run is
 * started with the parent's turn (once: the same call in a later turn answers the same run).
 */
Datum
ds_start_child_run(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_start_child_run", NULL);
	char	   *step_id = ds_step_identity_arg(fcinfo, 0, "step_id");
	char	   *workflow;
	Jsonb	   *input;
	Jsonb	   *policy = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	char	   *child = child_run_id(run_id, step_id);
	ChildRun	found;
	RetryPolicy parsed;
	TurnSuspension work;
	StringInfoData buf;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("workflow must not be null")));
	workflow = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("input must not be null"),
				 errhint("Pass '{}' for a workflow without input.")));
	input = PG_GETARG_JSONB_P(2);
	ds_policy_parse(policy, &parsed);
	ds_policy_refuse_limit(&parsed, "a run's policy");

	read_child(child, &found);
	if (found.exists)
	{
		if (!has_privs_of_role(GetUserId(), found.owner))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("run %s belongs to another role", child)));
		ds_turn_visit(step_id);
		PG_RETURN_TEXT_P(cstring_to_text(child));
	}

	/*
	 * new: the executor starts it in this turn's transaction, and the run
	 * goes on
	 */
	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"run_id\": ");
	escape_json(&buf, run_id);
	appendStringInfoString(&buf, ", \"step_id\": ");
	escape_json(&buf, step_id);
	appendStringInfoString(&buf, ", \"workflow\": ");
	escape_json(&buf, workflow);
	appendStringInfo(&buf, ", \"input\": %s", JsonbToCString(NULL, &input->root, 0));
	if (policy != NULL)
		appendStringInfo(&buf, ", \"policy\": %s", JsonbToCString(NULL, &policy->root, 0));
	appendStringInfoChar(&buf, '}');
	memset(&work, 0, sizeof(work));
	work.work = TURN_WORK_CHILD;
	work.step_id = step_id;
	work.reason = psprintf("child %s: starting run %s", step_id, child);
	work.step_call = buf.data;
	work.owner = GetUserId();
	work.search_path = namespace_search_path;
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}

/*
 * ds_join_child(step_id) -> jsonb: the output of the child run started at step `step_id`, once
 * it succeeded; DS102 when it failed or was cancelled; the run waits meanwhile.
 */
Datum
ds_join_child(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_join_child", NULL);
	char	   *step_id = ds_step_identity_arg(fcinfo, 0, "step_id");
	char	   *child = child_run_id(run_id, step_id);
	ChildRun	found;

	read_child(child, &found);
	if (!found.exists)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("no child run was started at step %s", step_id),
				 errhint("Start it with ds_start_child_run('%s', ...) first.", step_id)));
	if (!has_privs_of_role(GetUserId(), found.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to another role", child)));
	switch (found.status)
	{
		case RUN_SUCCEEDED:
			ds_turn_visit(step_id);
			if (found.output == NULL)
				PG_RETURN_NULL();
			PG_RETURN_JSONB_P(found.output);
		case RUN_FAILED:
		case RUN_CANCELLED:
			ds_turn_visit(step_id);
			ds_turn_throw_step_failed(run_id, step_id,
									  found.status == RUN_FAILED ? STEP_FAILED : STEP_CANCELLED,
									  found.status == RUN_FAILED ? "permanent" : "cancelled",
									  found.error_code, found.error_message);
		default:

			/*
			 * woken by the child's end; and looks again now and then, should
			 * that wake have missed a turn in flight
			 */
			ds_turn_suspend(false, GetCurrentTimestamp() + DS_JOIN_RECHECK_USECS,
							psprintf("child %s: waits for run %s (%s)", step_id, child,
									 ds_run_status_name(found.status)),
							step_id, NULL);
	}
	PG_RETURN_NULL();
}

/*
 * ds_start_child(parent_run_id, step_id, workflow, input, policy) -> ds_step_result: start the
 * child run of step `step_id` of run `parent_run_id` (a run of the caller's, or of a role it has
 * the privileges of), linked to it; succeeded, its result the child's run id.
 */
Datum
ds_start_child(PG_FUNCTION_ARGS)
{
	char	   *parent = ds_step_identity_arg(fcinfo, 0, "parent_run_id");
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	char	   *child = child_run_id(parent, step_id);
	ChildRun	parent_run;
	StepRecord	rec;
	Oid			types[4] = {TEXTOID, JSONBOID, TEXTOID, JSONBOID};
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	char	   *sql;
	int			rc;

	if (PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("workflow and input must not be null")));
	PreventCommandIfReadOnly("ds_start_child()");
	read_child(parent, &parent_run);
	if (!parent_run.exists)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("run %s does not exist", parent)));
	if (!has_privs_of_role(GetUserId(), parent_run.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to another role", parent),
				 errdetail("Only the run's workflow and roles with the privileges of its owner can start its children.")));

	/*
	 * as the caller: its EXECUTE on the workflow, and every check of
	 * ds_start_run
	 */
	args[0] = PG_GETARG_DATUM(2);
	args[1] = PG_GETARG_DATUM(3);
	args[2] = CStringGetTextDatum(child);
	args[3] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	if (PG_ARGISNULL(4))
		nulls[3] = 'n';
	sql = psprintf("SELECT run_id FROM %s.ds_start_run($1, $2, run_key => $3, policy => $4)",
				   quote_identifier(get_namespace_name(ds_extension_schema())));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(sql, 4, types, args, nulls, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "ds_start_run of child run %s failed: %s", child, SPI_result_code_string(rc));
	SPI_finish();
	if (!ds_store_link_child_run(child, parent, step_id))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("run %s is another run's child, or no child of step %s of run %s", child,
						step_id, parent)));

	memset(&rec, 0, sizeof(rec));
	rec.run_id = parent;
	rec.step_id = step_id;
	rec.kind = STEP_KIND_SQL;
	rec.status = STEP_SUCCEEDED;
	rec.max_attempts = 1;
	{
		JsonbValue	v;

		v.type = jbvString;
		v.val.string.val = child;
		v.val.string.len = strlen(child);
		rec.result = JsonbValueToJsonb(&v);
	}
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}
