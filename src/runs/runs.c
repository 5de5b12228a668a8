/*
 * runs.c -- starting and steering runs: ds_start_run, ds_cancel_run, ds_resume_run (docs/runs.md).
 *
 * A run is stored with the caller's transaction and starts after it commits: the commit wakes
 * an executor, which runs the workflow's turns (run_turn.c). Everything here writes the runs
 * table through SPI as the tables' owner, with every name and operator qualified.
 */
#include "base/compat.h"

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
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "steps/run_context.h"
#include "ipc/outcome_waits.h"
#include "store/run_control_store.h"
#include "store/run_store.h"
#include "steps/step_attempt.h"
#include "steps/step_call.h"
#include "store/step_lock.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"
#include "base/size_limits.h"
#include "base/partition.h"
#include "runs/runs.h"

PG_FUNCTION_INFO_V1(ds_start_run);
PG_FUNCTION_INFO_V1(ds_cancel_run);

static void check_child_run_key(const char *run_key, Oid caller);

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
	char	   *run_id;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("run_id must not be null")));
	run_id = run_id_text(fcinfo, 0, "run_id");
	/* this server must own its partition (DS201, docs/partitions.md) */
	ds_partition_check_run(run_id);
	return run_id;
}

/* (runs.h) */
Oid
ds_resolve_workflow(const char *name)
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
	acl = ds_proc_aclcheck(oid, GetUserId(), ACL_EXECUTE);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_FUNCTION, format_procedure(oid));
	return oid;
}

/* A random UUID (version 4). */
static char *
random_run_id(void)
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

/* Does this server own any partition (or is it not partitioned)? */
static bool
owns_any_partition(void)
{
	int			count = ds_partition_count();

	for (int p = 0; p < count; p++)
		if (ds_partition_owns_partition(p))
			return true;
	return false;
}

/*
 * A new run id: a random UUID (version 4), drawn again until it falls in a partition this server
 * owns (docs/partitions.md): on average partition_count / (partitions owned) draws.
 */
static char *
generated_run_id(void)
{
	for (int tries = 0;; tries++)
	{
		char	   *run_id = random_run_id();

		if (ds_partition_owns(run_id))
			return run_id;

		/*
		 * owning nothing, no draw ever fits: say why rather than spin (one
		 * partition of 1024 owned takes 1024 draws on average, and may take
		 * many more)
		 */
		if (tries == 1000 && !owns_any_partition())
			ds_partition_check_run(run_id);
		CHECK_FOR_INTERRUPTS();
		pfree(run_id);
	}
}

/*
 * ds_start_run(workflow, input, run_key, policy) -> (run_id, status, created)
 */
Datum
ds_start_run(PG_FUNCTION_ARGS)
{
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
	ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(input));
	if (!PG_ARGISNULL(2))
		run_key = run_id_text(fcinfo, 2, "run_key");
	if (!PG_ARGISNULL(3))
		policy = PG_GETARG_JSONB_P(3);
	ds_policy_parse(policy, &parsed);
	ds_policy_refuse_limit(&parsed, "a run's policy");
	PreventCommandIfReadOnly("ds_start_run()");
	PreventCommandIfParallelMode("ds_start_run()");

	/*
	 * the stored name is the qualified signature: the search_path of later
	 * turns cannot change it
	 */
	workflow = format_procedure_qualified(ds_resolve_workflow(workflow));
	/* a run key names the run: it must be one of this server's partitions */
	if (run_key != NULL)
	{
		ds_partition_check_run(run_key);
		/* a schedule's slot is its firings' (docs/schedules.md) */
		ds_check_slot_run_id(run_key);

		/*
		 * "<run>/<step>" is a child run's: its parent's owner's
		 * (docs/runs.md)
		 */
		check_child_run_key(run_key, caller);
	}
	run_id = run_key ? run_key : generated_run_id();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "ds_start_run must return a composite type");


	/*
	 * A run key may name steps created outside a run: taken to the end of the
	 * transaction, the run_id's lock makes a step being created under it wait
	 * for this run, or this start wait for that step (run_step.c,
	 * ds_new_step_run_policy); the look for steps below then sees it.
	 */
	if (run_key)
		(void) ds_run_id_lock(run_id, true, false);
	ds_store_spi_begin(&spi);

	/*
	 * a concurrent start of the same key is waited for; then its run answers
	 * this one
	 */
	created = ds_store_insert_run(run_id, workflow, input, run_key, policy, caller,
								  namespace_search_path);
	/* (a fresh random id has nothing under it) */
	if (created && run_key != NULL)
	{
		/*
		 * Steps are found by run_id: steps of a role the caller lacks the
		 * privileges of under this run id would be replayed by the workflow
		 * as its own ("belongs to another role", the run fails). The id is
		 * taken, as by another role's run (docs/security.md). Looked for in
		 * the latest snapshot, taken after the run_id's lock: a step
		 * committed while this start waited for it is seen.
		 */
		if (ds_store_run_has_foreign_steps(run_id, caller))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("run %s belongs to another role", run_id),
					 errdetail("Another role has steps under this run id."),
					 errhint("Only the role that started a run can start it again; choose another run_key.")));
	}
	else if (!created)
	{
		HeapTuple	row;
		TupleDesc	td;
		bool		n;
		Oid			owner;
		bool		same;

		if (ds_store_read_run_definition(run_id) != 1)
			ereport(ERROR,
					(errcode(ERRCODE_DS_STEP_CONFLICT),
					 errmsg("run key %s is taken", run_id)));
		row = SPI_tuptable->vals[0];
		td = SPI_tuptable->tupdesc;
		owner = DatumGetObjectId(SPI_getbinval(row, td, 3, &n));

		/*
		 * before anything about the definition: another role learns only that
		 * the key is taken
		 */
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
	RunStatus	status;
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
	StoreSpi	spi;
	bool		found;

	ds_store_spi_begin(&spi);
	found = ds_store_read_run(run_id, lock) == 1;
	if (found)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		n;

		out->status = ds_run_status_from_name(SPI_getvalue(row, td, 1));
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

/* An unfinished step of a run, as ds_cancel_run finds it. */
typedef struct UnfinishedStep
{
	char	   *step_id;
	bool		running;
	int			claimed_by;
	int			attempts;
} UnfinishedStep;

/*
 * The steps of run `run_id` that have not finished (pending, retrying, running, blocked,
 * uncertain), in step_id order. Only those of roles the run's owner has the privileges of: steps
 * are found by run_id, and another role's plain steps under the same id are not the run's to
 * stop (docs/security.md).
 */
static int
unfinished_run_steps(const char *run_id, UnfinishedStep **out)
{
	StoreSpi	spi;
	int			n;

	ds_store_spi_begin(&spi);
	n = (int) ds_store_read_unfinished_run_steps(run_id);
	*out = MemoryContextAlloc(spi.caller_cxt, sizeof(UnfinishedStep) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		isnull;

		(*out)[i].step_id = MemoryContextStrdup(spi.caller_cxt, SPI_getvalue(row, td, 1));
		(*out)[i].running = DatumGetBool(SPI_getbinval(row, td, 2, &isnull));
		(*out)[i].claimed_by = DatumGetInt32(SPI_getbinval(row, td, 3, &isnull));
		if (isnull)
			(*out)[i].claimed_by = 0;
		(*out)[i].attempts = DatumGetInt32(SPI_getbinval(row, td, 4, &isnull));
	}
	ds_store_spi_end(&spi);
	return n;
}

/* Is `step_id` in the list of step ids `held`? */
static bool
step_held(List *held, const char *step_id)
{
	ListCell   *lc;

	foreach(lc, held)
	{
		if (strcmp((const char *) lfirst(lc), step_id) == 0)
			return true;
	}
	return false;
}

/*
 * Take the lock of every unfinished step of the run not in `held` yet, to the end of the
 * transaction, and return `held` with them: a step whose lock we hold cannot be claimed by an
 * executor or the HTTP worker, nor re-armed. An attempt a worker is running is asked to stop
 * first (an HTTP request in flight is waited for); so is one the caller's own transaction runs.
 */
static List *
hold_unfinished_steps(const char *run_id, List *held)
{
	UnfinishedStep *steps;
	int			n = unfinished_run_steps(run_id, &steps);

	for (int i = 0; i < n; i++)
	{
		if (step_held(held, steps[i].step_id))
			continue;
		if (steps[i].running && steps[i].claimed_by != 0 && steps[i].claimed_by != MyProcPid)
			(void) ds_request_cancel(steps[i].claimed_by,
									 ds_attempt_cancel_key(run_id, steps[i].step_id,
														   steps[i].attempts));
		if (!ds_step_lock_acquire(run_id, steps[i].step_id, false))
			ereport(ERROR,
					(errcode(ERRCODE_DS_IN_PROGRESS),
					 errmsg("step %s/%s is in progress in this process", run_id, steps[i].step_id),
					 errhint("Cancel the run from outside its own steps.")));
		held = lappend(held, pstrdup(steps[i].step_id));
	}
	return held;
}

/* Does the run have an unfinished step whose lock is not in `held`? */
static bool
unheld_steps_left(const char *run_id, List *held)
{
	UnfinishedStep *steps;
	int			n = unfinished_run_steps(run_id, &steps);

	for (int i = 0; i < n; i++)
	{
		if (!step_held(held, steps[i].step_id))
			return true;
	}
	return false;
}

/* Ask the executor running the run's turn, if one does, to stop it. */
static void
stop_turn(const char *run_id)
{
	RunState	run;

	read_visible_run(run_id, false, &run);
	if (run.status == RUN_RUNNING && run.claimed_by != 0 && run.claimed_by != MyProcPid)
		(void) ds_request_cancel(run.claimed_by,
								 ds_attempt_cancel_key(run_id, DS_TURN_STEP_ID, run.turns));
}

/* How often ds_cancel_run takes the run again when a turn added steps meanwhile. */
#define CANCEL_RUN_ROUNDS 100

/*
 * Hold every unfinished step of the run, then stop the run's turn if one runs, then take the
 * run's row (waiting for the turn to end), in that order: a worker recording an HTTP step's
 * outcome wakes the run, so it may wait for the run's row while holding the step, and the step
 * must never be waited for while the row is held; and a turn stopped by this call records the
 * run cancelled itself, which must not happen while an executor may still start an attempt of
 * one of its steps (claimed before, run later in its batch). A turn that ended meanwhile may have
 * added steps: then the row is let go (it was taken in a subtransaction) and the new steps are
 * taken first. Returns the held step ids; the run, locked, in *run.
 */
static List *
hold_run_and_steps(const char *run_id, RunState *run)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	List	   *held = NIL;

	for (int round = 0;; round++)
	{
		bool		complete;

		CHECK_FOR_INTERRUPTS();
		if (round == CANCEL_RUN_ROUNDS)
			ereport(ERROR,
					(errcode(ERRCODE_DS_IN_PROGRESS),
					 errmsg("run %s kept adding steps while it was being cancelled", run_id),
					 errhint("Call ds_cancel_run() again.")));
		held = hold_unfinished_steps(run_id, held);

		/*
		 * not before: a stopped turn lets the run go, while attempts may
		 * still start
		 */
		stop_turn(run_id);
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(oldcxt);
		/* waits for a turn in flight to end */
		read_visible_run(run_id, true, run);
		complete = !unheld_steps_left(run_id, held);
		if (complete)
			ReleaseCurrentSubTransaction();
		else
			RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		if (complete)
			return held;
	}
}

/*
 * Cancel the run's step `step_id`, whose lock this transaction holds, unless it finished. One
 * still running was left by a process that is gone: its attempt is lost, recorded as such first.
 */
static void
cancel_held_step(const char *run_id, const char *step_id)
{
	StepRecord	rec;

	if (!ds_store_lock_step(run_id, step_id, &rec))
		return;
	if (rec.status == STEP_RUNNING)
		ds_record_lost_attempt(&rec);
	if (rec.status != STEP_PENDING && rec.status != STEP_RETRYING && rec.status != STEP_BLOCKED &&
		rec.status != STEP_UNCERTAIN)
		return;
	rec.error_class = "cancelled";
	ds_cancel_waiting_step(&rec);
}

/*
 * A run key "<run id>/<step id>" names the child run of that step of that run
 * (ds_start_child_run): refused (42501) when a run of another role, one `caller` lacks the
 * privileges of, has the id before one of its '/'s, so that no role takes another's child's id
 * before it is started.
 */
static void
check_child_run_key(const char *run_key, Oid caller)
{
	for (const char *slash = strchr(run_key, '/'); slash != NULL; slash = strchr(slash + 1, '/'))
	{
		char	   *parent = pnstrdup(run_key, slash - run_key);
		StoreSpi	spi;
		Oid			owner = InvalidOid;

		ds_store_spi_begin(&spi);
		if (ds_store_read_run_definition(parent) == 1)
		{
			bool		isnull;

			owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
												   3, &isnull));
		}
		ds_store_spi_end(&spi);
		if (OidIsValid(owner) && !has_privs_of_role(caller, owner))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("run key %s is under run %s, which belongs to another role", run_key,
							parent),
					 errdetail("A run key \"<run id>/<step id>\" names a child run of that run (ds_start_child_run)."),
					 errhint("Choose a run key without that prefix.")));
	}
}

/*
 * Cancel the child runs of run `run_id` that have not finished (docs/runs.md, "Child runs"),
 * theirs in turn, each as ds_cancel_run would, by the caller (whose privileges it checks).
 */
static void
cancel_children(const char *run_id)
{
	StoreSpi	spi;
	uint64		n;
	char	  **children;

	Oid		   *owners;

	ds_store_spi_begin(&spi);
	n = ds_store_unfinished_children(run_id);
	children = MemoryContextAlloc(spi.caller_cxt, sizeof(char *) * Max(n, 1));
	owners = MemoryContextAlloc(spi.caller_cxt, sizeof(Oid) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;

		children[i] = MemoryContextStrdup(spi.caller_cxt,
										  SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
		owners[i] = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
												   2, &isnull));
	}
	ds_store_spi_end(&spi);
	for (uint64 i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();

		/*
		 * a child of another role (made by SECURITY DEFINER code) is that
		 * role's to cancel
		 */
		if (has_privs_of_role(GetUserId(), owners[i]))
			(void) DirectFunctionCall1(ds_cancel_run, CStringGetTextDatum(children[i]));
	}
}

/*
 * ds_cancel_run(run_id) -> text: a run that has not finished becomes cancelled, and so do its
 * steps that have not finished, whatever they wait for (a retry, a person, an event, an HTTP
 * outcome someone must settle), so that none of them can act after the cancellation commits:
 * none is claimed, re-armed or resolved again. A turn running now is stopped first (its executor
 * looks for the request every 100 ms): the turn rolls back, so a step it was running takes no
 * effect; an attempt of the run's step a worker runs is stopped and recorded cancelled; an HTTP
 * request in flight is waited for, and its step then cancelled unless it succeeded. The run and
 * its steps are cancelled by this call's transaction alone: stopped turns and attempts leave
 * them waiting, so that a rollback of the call cancels nothing.
 */
Datum
ds_cancel_run(PG_FUNCTION_ARGS)
{
	char	   *run_id = run_id_arg(fcinfo);
	RunState	run;
	List	   *held;
	ListCell   *lc;

	PreventCommandIfReadOnly("ds_cancel_run()");
	PreventCommandIfParallelMode("ds_cancel_run()");
	read_visible_run(run_id, false, &run);
	if (run.status == RUN_SUCCEEDED || run.status == RUN_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("run %s is %s and cannot be cancelled", run_id,
						ds_run_status_name(run.status)),
				 errdetail("Only runs that have not finished can be cancelled.")));
	held = hold_run_and_steps(run_id, &run);
	if (run.status == RUN_SUCCEEDED || run.status == RUN_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("run %s is %s and cannot be cancelled", run_id,
						ds_run_status_name(run.status)),
				 errdetail("Only runs that have not finished can be cancelled.")));

	/*
	 * a run cancelled meanwhile by another call: its steps are still ours to
	 * make sure of
	 */
	if (run.status != RUN_CANCELLED)
		ds_store_cancel_run(run_id);
	foreach(lc, held)
		cancel_held_step(run_id, (const char *) lfirst(lc));
	cancel_children(run_id);
	/* waiters on the run and its steps read them again when this commits */
	ds_outcome_wake_at_commit(run_id);
	/* a child run: its parent's ds_join_child raises */
	ds_run_wake_parent(run_id);
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
	char	   *run_id = run_id_arg(fcinfo);
	RunState	run;

	PreventCommandIfReadOnly("ds_resume_run()");
	PreventCommandIfParallelMode("ds_resume_run()");
	read_visible_run(run_id, true, &run);

	/*
	 * as for re-arming a step: an admin may not make a superuser's workflow
	 * run again
	 */
	if (!has_privs_of_role(GetUserId(), run.owner) && superuser_arg(run.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to a superuser", run_id),
				 errdetail("Only superusers can resume a superuser's run.")));
	if (run.status == RUN_PENDING || run.status == RUN_RUNNING)
		PG_RETURN_TEXT_P(cstring_to_text(ds_run_status_name(run.status)));
	if (run.status == RUN_SUCCEEDED || run.status == RUN_CANCELLED)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("run %s is %s and cannot be resumed", run_id,
						ds_run_status_name(run.status)),
				 errdetail("Only failed, blocked and waiting runs can be resumed.")));
	ds_store_resume_run(run_id);
	ds_worker_wake_at_commit();
	PG_RETURN_TEXT_P(cstring_to_text("waiting"));
}
