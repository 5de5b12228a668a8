/*
 * runs.c -- starting and steering runs: ds_start_run, ds_cancel_run, ds_resume_run (README,
 * "Runs").
 *
 * A run is stored with the caller's transaction and starts after it commits: the commit wakes
 * an executor, which runs the workflow's turns (run_turn.c). Everything here writes the runs
 * table through SPI as the tables' owner, with every name and operator qualified.
 */
#include "compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "ds_errcodes.h"
#include "policy.h"
#include "runs.h"
#include "step_claims.h"
#include "store.h"
#include "worker_wakeup.h"

PG_FUNCTION_INFO_V1(ds_start_run);
PG_FUNCTION_INFO_V1(ds_cancel_run);
PG_FUNCTION_INFO_V1(ds_resume_run);

#define MAX_RUN_ID_CHARS 255

/* Argument `argno`, a run id or run key: not empty, at most 255 characters (NULL checked by caller). */
static char *
run_id_text(FunctionCallInfo fcinfo, int argno, const char *what)
{
	char	   *s = text_to_cstring(PG_GETARG_TEXT_PP(argno));

	if (s[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (pg_mbstrlen(s) > MAX_RUN_ID_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("The limit is %d characters.", MAX_RUN_ID_CHARS)));
	return s;
}

/* The run id argument of the controls. */
static char *
run_id_arg(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("run_id must not be null")));
	return run_id_text(fcinfo, 0, "run_id");
}

/*
 * The workflow named by `name`: a signature ("checkout(text, jsonb)") or a name, which then
 * means the one taking (text, jsonb). It must be a plain function or procedure of that
 * signature, returning one value, and the caller must be allowed to execute it.
 */
static Oid
resolve_workflow(const char *name)
{
	LOCAL_FCINFO(lookup, 1);
	const char *signature = strchr(name, '(') ? name : psprintf("%s(text, jsonb)", name);
	Datum		found;
	Oid			oid;
	HeapTuple	tuple;
	Form_pg_proc proc;
	AclResult	acl;
	bool		fits;

	InitFunctionCallInfoData(*lookup, NULL, 1, InvalidOid, NULL, NULL);
	lookup->args[0].value = CStringGetTextDatum(signature);
	lookup->args[0].isnull = false;
	found = to_regprocedure(lookup);
	if (lookup->isnull)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("workflow %s does not exist", signature),
				 errhint("A workflow is a function or procedure taking (run_id text, input jsonb).")));
	oid = DatumGetObjectId(found);
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(oid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for function %u", oid);
	proc = (Form_pg_proc) GETSTRUCT(tuple);
	fits = proc->pronargs == 2 && proc->proargtypes.values[0] == TEXTOID &&
		proc->proargtypes.values[1] == JSONBOID && !proc->proretset &&
		(proc->prokind == PROKIND_FUNCTION || proc->prokind == PROKIND_PROCEDURE);
	ReleaseSysCache(tuple);
	if (!fits)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s cannot be a workflow", format_procedure(oid)),
				 errdetail("A workflow is a function returning one value, or a procedure, taking (run_id text, input jsonb).")));
	acl = pg_proc_aclcheck(oid, GetUserId(), ACL_EXECUTE);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_FUNCTION, format_procedure(oid));
	return oid;
}

/* A new run id: a random UUID (version 4). */
static char *
generated_run_id(void)
{
	unsigned char b[16];

	if (!pg_strong_random(b, sizeof(b)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random run id")));
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	return psprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
					b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
					b[12], b[13], b[14], b[15]);
}

/*
 * ds_start_run(workflow, input, run_key, policy) -> (run_id, status, created)
 */
Datum
ds_start_run(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr insert_plan = NULL;
	static SPIPlanPtr existing_plan = NULL;
	static SPIPlanPtr foreign_steps_plan = NULL;
	Oid			insert_types[7] = {TEXTOID, TEXTOID, JSONBOID, TEXTOID, JSONBOID, OIDOID, TEXTOID};
	Oid			key_types[1] = {TEXTOID};
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	char	   *workflow;
	char	   *run_key = NULL;
	char	   *run_id;
	Jsonb	   *input;
	Jsonb	   *policy = NULL;
	RetryPolicy parsed;
	StoreSpi	spi;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		isnull[3] = {false, false, false};
	char	   *status = "pending";
	bool		created;
	int			rc;
	Oid			caller = GetUserId();

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("workflow must not be null")));
	workflow = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (workflow[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("workflow must not be empty")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("input must not be null"),
				 errhint("Pass '{}' for a workflow without input.")));
	input = PG_GETARG_JSONB_P(1);
	if (!PG_ARGISNULL(2))
		run_key = run_id_text(fcinfo, 2, "run_key");
	if (!PG_ARGISNULL(3))
		policy = PG_GETARG_JSONB_P(3);
	ds_policy_parse(policy, &parsed);
	PreventCommandIfReadOnly("ds_start_run()");
	PreventCommandIfParallelMode("ds_start_run()");
	/* the stored name is the qualified signature: the search_path of later turns cannot change it */
	workflow = format_procedure_qualified(resolve_workflow(workflow));
	run_id = run_key ? run_key : generated_run_id();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "ds_start_run must return a composite type");

	args[0] = CStringGetTextDatum(run_id);
	args[1] = CStringGetTextDatum(workflow);
	args[2] = JsonbPGetDatum(input);
	args[3] = run_key ? CStringGetTextDatum(run_key) : (Datum) 0;
	nulls[3] = run_key ? ' ' : 'n';
	args[4] = policy ? JsonbPGetDatum(policy) : (Datum) 0;
	nulls[4] = policy ? ' ' : 'n';
	args[5] = ObjectIdGetDatum(caller);
	args[6] = CStringGetTextDatum(namespace_search_path);
	ds_store_spi_begin(&spi);
	/* a concurrent start of the same key is waited for; then its run answers this one */
	rc = SPI_execute_plan(ds_prepare_kept(&insert_plan,
										  "INSERT INTO durable_steps.runs (run_id, workflow, input,"
										  " run_key, policy, status, owner, search_path, next_wake_at)"
										  " VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7,"
										  " pg_catalog.clock_timestamp()) ON CONFLICT DO NOTHING",
										  7, insert_types),
						  args, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "storing the run failed: %s", SPI_result_code_string(rc));
	created = SPI_processed == 1;
	if (created)
	{
		Oid			foreign_types[2] = {TEXTOID, OIDOID};
		Datum		foreign_args[2] = {args[0], args[5]};

		/*
		 * Steps are found by run_id: steps of a role the caller lacks the privileges of under
		 * this run id would be replayed by the workflow as its own ("belongs to another role",
		 * the run fails). The id is taken, as by another role's run (README, "Security model").
		 */
		rc = SPI_execute_plan(ds_prepare_kept(&foreign_steps_plan,
											  "SELECT FROM durable_steps.steps"
											  " WHERE run_id OPERATOR(pg_catalog.=) $1"
											  " AND NOT pg_catalog.pg_has_role($2, owner::pg_catalog.oid, 'USAGE')"
											  " LIMIT 1",
											  2, foreign_types),
							  foreign_args, NULL, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "looking for steps of run %s failed: %s", run_id,
				 SPI_result_code_string(rc));
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("run %s belongs to another role", run_id),
					 errdetail("Another role has steps under this run id."),
					 errhint("Only the role that started a run can start it again; choose another run_key.")));
	}
	else
	{
		HeapTuple	row;
		TupleDesc	td;
		bool		n;
		Oid			owner;
		bool		same;

		rc = SPI_execute_plan(ds_prepare_kept(&existing_plan,
											  "SELECT workflow, input, owner::pg_catalog.oid, status,"
											  " run_key FROM durable_steps.runs"
											  " WHERE run_id OPERATOR(pg_catalog.=) $1",
											  1, key_types),
							  args, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			ereport(ERROR,
					(errcode(ERRCODE_DS_STEP_CONFLICT),
					 errmsg("run key %s is taken", run_id)));
		row = SPI_tuptable->vals[0];
		td = SPI_tuptable->tupdesc;
		owner = DatumGetObjectId(SPI_getbinval(row, td, 3, &n));
		/* before anything about the definition: another role learns only that the key is taken */
		if (owner != caller)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("run %s belongs to another role", run_id),
					 errhint("Only the role that started a run can start it again; choose another run_key.")));
		same = SPI_getvalue(row, td, 5) != NULL &&
			strcmp(SPI_getvalue(row, td, 1), workflow) == 0 &&
			DatumGetBool(DirectFunctionCall2(jsonb_eq, SPI_getbinval(row, td, 2, &n),
											 JsonbPGetDatum(input)));
		if (!same)
			ereport(ERROR,
					(errcode(ERRCODE_DS_STEP_CONFLICT),
					 errmsg("run key %s already names a run of another workflow or input", run_id),
					 errdetail("The existing run is %s of %s.", SPI_getvalue(row, td, 4),
							   SPI_getvalue(row, td, 1)),
					 errhint("Use a new run_key for a different run.")));
		status = MemoryContextStrdup(spi.caller_cxt, SPI_getvalue(row, td, 4));
	}
	ds_store_spi_end(&spi);
	if (created)
		ds_worker_wake_at_commit();
	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(status);
	values[2] = BoolGetDatum(created);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, isnull)));
}

/* A run as the controls see it. */
typedef struct RunState
{
	char	   *status;
	Oid			owner;
	int			claimed_by;
	int			turns;
} RunState;

/*
 * Read run `run_id` (locking its row with `lock`); a run the caller may not see answers as one
 * that does not exist.
 */
static void
read_visible_run(const char *run_id, bool lock, RunState *out)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;
	bool		found;
	int			rc;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_plan(ds_prepare_kept(&plans[lock],
										  lock ?
										  "SELECT status, owner::pg_catalog.oid, claimed_by, turns"
										  " FROM durable_steps.runs"
										  " WHERE run_id OPERATOR(pg_catalog.=) $1 FOR UPDATE" :
										  "SELECT status, owner::pg_catalog.oid, claimed_by, turns"
										  " FROM durable_steps.runs"
										  " WHERE run_id OPERATOR(pg_catalog.=) $1",
										  1, types),
						  args, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading run %s failed", run_id);
	found = SPI_processed == 1;
	if (found)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		n;

		out->status = MemoryContextStrdup(spi.caller_cxt, SPI_getvalue(row, td, 1));
		out->owner = DatumGetObjectId(SPI_getbinval(row, td, 2, &n));
		out->claimed_by = DatumGetInt32(SPI_getbinval(row, td, 3, &n));
		if (n)
			out->claimed_by = 0;
		out->turns = DatumGetInt32(SPI_getbinval(row, td, 4, &n));
	}
	ds_store_spi_end(&spi);
	if (!found || !ds_store_may_access(out->owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("run %s does not exist", run_id)));
}

/* Run one statement of the controls with $1 = the run id. */
static uint64
run_statement(SPIPlanPtr *slot, const char *sql, const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;
	uint64		n;
	int			rc;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_plan(ds_prepare_kept(slot, sql, 1, types), args, NULL, false, 0);
	if (rc < 0)
		elog(ERROR, "updating run %s failed: %s", run_id, SPI_result_code_string(rc));
	n = SPI_processed;
	ds_store_spi_end(&spi);
	return n;
}

/*
 * ds_cancel_run(run_id) -> text: a run that has not finished becomes cancelled, and so do its
 * steps that have not finished. A turn running now is stopped first (its executor looks for the
 * request every 100 ms): the turn rolls back, so a step it was running takes no effect.
 */
Datum
ds_cancel_run(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr cancel_plan = NULL;
	static SPIPlanPtr steps_plan = NULL;
	char	   *run_id = run_id_arg(fcinfo);
	RunState	run;

	PreventCommandIfReadOnly("ds_cancel_run()");
	PreventCommandIfParallelMode("ds_cancel_run()");
	read_visible_run(run_id, false, &run);
	if (strcmp(run.status, "running") == 0 && run.claimed_by != 0 && run.claimed_by != MyProcPid)
		(void) ds_request_cancel(run.claimed_by,
								 ds_attempt_cancel_key(run_id, "", run.turns));
	/* waits for a turn in flight to end */
	read_visible_run(run_id, true, &run);
	if (strcmp(run.status, "cancelled") == 0)
		PG_RETURN_TEXT_P(cstring_to_text("cancelled"));
	if (strcmp(run.status, "succeeded") == 0 || strcmp(run.status, "failed") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("run %s is %s and cannot be cancelled", run_id, run.status),
				 errdetail("Only runs that have not finished can be cancelled.")));
	(void) run_statement(&cancel_plan,
						 "UPDATE durable_steps.runs SET status = 'cancelled',"
						 " finished_at = pg_catalog.clock_timestamp(),"
						 " updated_at = pg_catalog.clock_timestamp(), next_wake_at = NULL,"
						 " claimed_by = NULL, lease_expires_at = NULL,"
						 " wait_reason = 'cancelled by ds_cancel_run()'"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1", run_id);
	/*
	 * its steps waiting for a retry, a person or an event will not run. Only those of roles the
	 * run's owner has the privileges of: steps are found by run_id, and any role can start a run
	 * under a run_id where other roles' plain steps already are (run keys name runs, not steps);
	 * cancelling those would let it stop another role's work.
	 */
	(void) run_statement(&steps_plan,
						 "UPDATE durable_steps.steps SET status = 'cancelled',"
						 " error_class = 'cancelled', next_attempt_at = NULL,"
						 " finished_at = pg_catalog.clock_timestamp(),"
						 " updated_at = pg_catalog.clock_timestamp()"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1"
						 " AND status OPERATOR(pg_catalog.=) ANY ('{pending,retrying,blocked}')"
						 " AND pg_catalog.pg_has_role((SELECT r.owner FROM durable_steps.runs r"
						 "  WHERE r.run_id OPERATOR(pg_catalog.=) $1)::pg_catalog.oid,"
						 "  owner::pg_catalog.oid, 'USAGE')",
						 run_id);
	PG_RETURN_TEXT_P(cstring_to_text("cancelled"));
}

/*
 * ds_resume_run(run_id) -> text: a failed, blocked or waiting run takes its next turn now. Its
 * completed steps replay; a step that failed for good fails again unless it was re-armed with
 * ds_retry_step().
 */
Datum
ds_resume_run(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr resume_plan = NULL;
	char	   *run_id = run_id_arg(fcinfo);
	RunState	run;

	PreventCommandIfReadOnly("ds_resume_run()");
	PreventCommandIfParallelMode("ds_resume_run()");
	read_visible_run(run_id, true, &run);
	/* as for re-arming a step: an admin may not make a superuser's workflow run again */
	if (!has_privs_of_role(GetUserId(), run.owner) && superuser_arg(run.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to a superuser", run_id),
				 errdetail("Only superusers can resume a superuser's run.")));
	if (strcmp(run.status, "pending") == 0 || strcmp(run.status, "running") == 0)
		PG_RETURN_TEXT_P(cstring_to_text(run.status));
	if (strcmp(run.status, "succeeded") == 0 || strcmp(run.status, "cancelled") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("run %s is %s and cannot be resumed", run_id, run.status),
				 errdetail("Only failed, blocked and waiting runs can be resumed.")));
	(void) run_statement(&resume_plan,
						 "UPDATE durable_steps.runs SET status = 'waiting',"
						 " next_wake_at = pg_catalog.clock_timestamp(), finished_at = NULL,"
						 " updated_at = pg_catalog.clock_timestamp(), lost_turns = 0,"
						 " wait_reason = 'resumed by ds_resume_run()',"
						 " error_code = NULL, error_message = NULL, error_detail = NULL"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1", run_id);
	ds_worker_wake_at_commit();
	PG_RETURN_TEXT_P(cstring_to_text("waiting"));
}

void
ds_run_wake_for_step(const char *run_id)
{
	static SPIPlanPtr wake_plan = NULL;

	if (run_statement(&wake_plan,
					  "UPDATE durable_steps.runs SET status = 'waiting',"
					  " next_wake_at = pg_catalog.clock_timestamp(),"
					  " updated_at = pg_catalog.clock_timestamp()"
					  " WHERE run_id OPERATOR(pg_catalog.=) $1"
					  " AND status OPERATOR(pg_catalog.=) ANY ('{waiting,blocked}')", run_id) > 0)
		ds_worker_wake_at_commit();
}
