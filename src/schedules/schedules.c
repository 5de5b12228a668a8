/*
 * schedules.c -- schedules over pg_cron (docs/schedules.md).
 *
 * ds_schedule stores a schedule in durable_steps.schedules, owned by the caller, and registers a
 * pg_cron job of the same name, as the caller, whose command is ds_schedule_fire(job_name). A
 * firing at time T is for the slots of the schedule (base/cron_schedule.c): the latest one at or
 * before T, and with a backfill B every one in [T - B, T], none before the schedule was created.
 * Each slot starts one run of the workflow (or one deferred step of the SQL) under the key
 * ds_key('schedule', job_name, slot): the slot's identity is its key, so a slot whose run or step
 * exists is not started again, whatever input it was started with, and a duplicate or late
 * firing starts nothing new.
 *
 * The firings of one schedule are serialized by its row's lock (FOR UPDATE), so that two firings
 * cannot both find a slot not yet started. Runs and steps are started as the caller through the
 * ordinary functions: every check of ds_start_run and ds_run_step applies, and a run key that a
 * run of another role holds is refused there (42501). A slot that cannot be started for its key
 * (42501, DS422) is skipped with a WARNING, so that one taken key does not stop the slots after
 * it; any other error ends the firing, and pg_cron records it in cron.job_run_details.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "base/cron_schedule.h"
#include "base/ds_errcodes.h"
#include "base/interval_bounds.h"
#include "base/partition.h"
#include "base/size_limits.h"
#include "base/sql_text.h"
#include "base/subtransaction.h"
#include "runs/runs.h"
#include "schedules/schedules.h"
#include "store/schedule_store.h"
#include "store/step_store.h"

PG_FUNCTION_INFO_V1(ds_schedule);
PG_FUNCTION_INFO_V1(ds_unschedule);
PG_FUNCTION_INFO_V1(ds_schedule_fire);

/*
 * The step id of a schedule's SQL step: its run id is the slot's key. (A workflow's run has the
 * key as its run id, and so never a step of this id unless its workflow makes one.)
 */
#define DS_SCHEDULE_STEP_ID "scheduled"

/* A schedule as stored. */
typedef struct ScheduleRow
{
	bool		found;
	Oid			owner;
	char	   *schedule;
	char	   *workflow;		/* NULL for an SQL schedule */
	Jsonb	   *input;
	char	   *sql;			/* NULL for a workflow's schedule */
	Interval   *backfill;
	int64		jobid;
	TimestampTz created_at;
} ScheduleRow;

/* The job name: 1 to 63 bytes, pg_cron's `name` column stores it whole. */
static char *
job_name_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *s;
	size_t		len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("job_name must not be null")));
	s = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	len = strlen(s);
	if (len < 1 || len > NAMEDATALEN - 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("job_name must be 1 to %d bytes long, not %zu", NAMEDATALEN - 1, len),
				 errdetail("pg_cron keeps a job's name in a column of type name.")));
	return s;
}

/* The schema of this extension's functions: the one the job's command calls into. */
static char *
own_schema(FunctionCallInfo fcinfo)
{
	return get_namespace_name(get_func_namespace(fcinfo->flinfo->fn_oid));
}

/*
 * pg_cron's schema (always `cron`, whatever pg_extension says: its script creates it); InvalidOid
 * when pg_cron is not installed in this database.
 */
static Oid
cron_namespace(void)
{
	Oid			nsp = InvalidOid;
	bool		isnull;
	int			rc;

	SPI_connect();
	rc = SPI_execute("SELECT n.oid FROM pg_catalog.pg_extension e, pg_catalog.pg_namespace n"
					 " WHERE e.extname OPERATOR(pg_catalog.=) 'pg_cron'"
					 " AND n.nspname OPERATOR(pg_catalog.=) 'cron'", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "looking for pg_cron failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
		nsp = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											 &isnull));
	SPI_finish();
	return nsp;
}

/*
 * The schema pg_cron is installed in, with the caller's USAGE on it; raises when pg_cron is not
 * installed in this database.
 */
static char *
cron_schema(void)
{
	Oid			nsp = cron_namespace();
	AclResult	acl;

	if (!OidIsValid(nsp))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cron is not installed in database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errdetail("ds_schedule registers its firings as pg_cron jobs."),
				 errhint("Add pg_cron to shared_preload_libraries, set cron.database_name to this database, restart, and run CREATE EXTENSION pg_cron.")));
	acl = ds_namespace_aclcheck(nsp, GetUserId(), ACL_USAGE);
	if (acl != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for schema %s", get_namespace_name(nsp)),
				 errhint("A role that schedules needs USAGE on pg_cron's schema: GRANT USAGE ON SCHEMA %s TO %s.",
						 quote_identifier(get_namespace_name(nsp)),
						 quote_identifier(GetUserNameFromId(GetUserId(), false)))));
	return get_namespace_name(nsp);
}

/* Read the schedule `job_name` as the tables' owner, its row locked (FOR UPDATE). */
static ScheduleRow
read_schedule(const char *job_name)
{
	ScheduleRow row = {0};
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	if (ds_store_lock_schedule(job_name) == 1)
	{
		HeapTuple	t = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		MemoryContext old = MemoryContextSwitchTo(spi.caller_cxt);
		bool		isnull;
		Datum		d;

		row.found = true;
		row.owner = DatumGetObjectId(SPI_getbinval(t, td, 1, &isnull));
		row.schedule = TextDatumGetCString(SPI_getbinval(t, td, 2, &isnull));
		d = SPI_getbinval(t, td, 3, &isnull);
		row.workflow = isnull ? NULL : TextDatumGetCString(d);
		row.input = DatumGetJsonbPCopy(SPI_getbinval(t, td, 4, &isnull));
		d = SPI_getbinval(t, td, 5, &isnull);
		row.sql = isnull ? NULL : TextDatumGetCString(d);
		row.backfill = DatumGetIntervalP(datumCopy(SPI_getbinval(t, td, 6, &isnull), false,
												   sizeof(Interval)));
		row.jobid = DatumGetInt64(SPI_getbinval(t, td, 7, &isnull));
		row.created_at = DatumGetTimestampTz(SPI_getbinval(t, td, 8, &isnull));
		MemoryContextSwitchTo(old);
	}
	ds_store_spi_end(&spi);
	return row;
}

/* The pg_cron job of the caller named `job_name`, or 0. */
static int64
cron_job_of_caller(const char *cron_nsp, const char *job_name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(job_name)};
	int64		jobid = 0;
	int			rc;

	SPI_connect();
	rc = SPI_execute_with_args(psprintf("SELECT jobid FROM %s.job WHERE jobname OPERATOR(pg_catalog.=) $1"
										" AND username OPERATOR(pg_catalog.=) CURRENT_USER",
										quote_identifier(cron_nsp)),
							   1, types, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading pg_cron's jobs failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		bool		isnull;

		jobid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											&isnull));
	}
	SPI_finish();
	return jobid;
}

static bool before_first_timestamp(TimestampTz t, Interval *i);

/* Has role `roleid` the LOGIN attribute? */
static bool
role_can_login(Oid roleid)
{
	HeapTuple	tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(roleid));
	bool		can;

	if (!HeapTupleIsValid(tuple))
		return false;
	can = ((Form_pg_authid) GETSTRUCT(tuple))->rolcanlogin;
	ReleaseSysCache(tuple);
	return can;
}

/*
 * ds_schedule(job_name, schedule, workflow, input, sql, backfill) -> bigint, the pg_cron job id.
 * Scheduling a name of the caller's again replaces its schedule: it counts as created now.
 */
Datum
ds_schedule(PG_FUNCTION_ARGS)
{
	Oid			cron_types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		cron_args[3];
	char	   *job_name = job_name_arg(fcinfo, 0);
	char	   *schedule;
	char	   *workflow = NULL;
	char	   *sql = NULL;
	Jsonb	   *input;
	Interval   *backfill;
	Interval   *zero = palloc0(sizeof(Interval));
	CronSchedule parsed;
	char	   *cron_nsp;
	char	   *command;
	ScheduleRow existing;
	int64		cron_job;
	int64		jobid;
	bool		isnull;
	StoreSpi	spi;
	int			rc;
	Oid			caller = GetUserId();

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schedule must not be null")));
	schedule = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ds_cron_parse(schedule, &parsed);
	if (!PG_ARGISNULL(2))
		workflow = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (!PG_ARGISNULL(4))
		sql = text_to_cstring(PG_GETARG_TEXT_PP(4));
	if ((workflow == NULL) == (sql == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a schedule starts either a workflow or a step of SQL"),
				 errhint("Pass exactly one of workflow and sql.")));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("input must not be null"),
				 errhint("Pass '{}' for no input.")));
	input = PG_GETARG_JSONB_P(3);
	if (!JB_ROOT_IS_OBJECT(input) || JB_ROOT_IS_SCALAR(input))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("input must be a JSON object"),
				 errdetail("Each firing adds the slot to it as \"scheduled_at\".")));
	ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(input));
	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("backfill must not be null"),
				 errhint("Pass '0' for no backfill.")));
	backfill = PG_GETARG_INTERVAL_P(5);
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(backfill),
										  IntervalPGetDatum(zero))) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("backfill must be zero or positive")));
	if (before_first_timestamp(GetCurrentTimestamp(), backfill))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("backfill is too long: it reaches before the first timestamp"),
				 errhint("No slot before the schedule was created is ever started: a backfill longer than the longest outage to cover starts nothing more.")));

	/*
	 * pg_cron runs the job as the caller: a role that cannot log in never
	 * runs it
	 */
	if (!role_can_login(caller))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" cannot log in, and pg_cron runs a schedule's job as the role that made it",
						GetUserNameFromId(caller, false)),
				 errhint("Schedule as a role with LOGIN, or ALTER ROLE ... LOGIN.")));
	PreventCommandIfReadOnly("ds_schedule()");
	PreventCommandIfParallelMode("ds_schedule()");

	/*
	 * stored as a qualified signature: the firing's search_path cannot change
	 * it
	 */
	if (workflow)
		workflow = format_procedure_qualified(ds_resolve_workflow(workflow));
	else
		ds_check_one_statement("sql", sql);
	cron_nsp = cron_schema();

	existing = read_schedule(job_name);
	if (existing.found && existing.owner != caller)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("job name \"%s\" is taken by another role", job_name),
				 errdetail("A schedule's runs are keyed by its job name, which must be unique in the database."),
				 errhint("Choose another job name.")));
	cron_job = cron_job_of_caller(cron_nsp, job_name);
	if (cron_job != 0 && (!existing.found || existing.jobid != cron_job))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("pg_cron already has a job named \"%s\"", job_name),
				 errdetail("ds_schedule would replace that job's command."),
				 errhint("Choose another job name, or remove the job with cron.unschedule.")));

	/* job name and schema quoted: a name may hold quotes and semicolons */
	command = psprintf("SELECT %s.ds_schedule_fire(%s)", quote_identifier(own_schema(fcinfo)),
					   quote_literal_cstr(job_name));
	cron_args[0] = CStringGetTextDatum(job_name);
	cron_args[1] = CStringGetTextDatum(schedule);
	cron_args[2] = CStringGetTextDatum(command);
	SPI_connect();
	rc = SPI_execute_with_args(psprintf("SELECT %s.schedule($1, $2, $3)", quote_identifier(cron_nsp)),
							   3, cron_types, cron_args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "cron.schedule failed: %s", SPI_result_code_string(rc));
	jobid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();

	ds_store_spi_begin(&spi);
	ds_store_put_schedule(job_name, caller, schedule, workflow, input, sql, backfill, jobid);
	ds_store_spi_end(&spi);
	PG_RETURN_INT64(jobid);
}

/*
 * ds_unschedule(job_name) -> boolean: removes the caller's schedule and its pg_cron job. Another
 * role's schedule is one that does not exist (DS404).
 */
Datum
ds_unschedule(PG_FUNCTION_ARGS)
{
	char	   *job_name = job_name_arg(fcinfo, 0);
	ScheduleRow row;
	StoreSpi	spi;
	int			rc;

	PreventCommandIfReadOnly("ds_unschedule()");
	row = read_schedule(job_name);
	if (!row.found || row.owner != GetUserId())
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("schedule \"%s\" does not exist", job_name)));

	/* pg_cron's job, unless it was removed already (or pg_cron with it) */
	if (OidIsValid(cron_namespace()))
	{
		Oid			job_types[1] = {INT8OID};
		Datum		job_args[1] = {Int64GetDatum(row.jobid)};
		const char *cron_nsp = quote_identifier(cron_schema());

		SPI_connect();
		rc = SPI_execute_with_args(psprintf("SELECT %s.unschedule(jobid) FROM %s.job"
											" WHERE jobid OPERATOR(pg_catalog.=) $1",
											cron_nsp, cron_nsp),
								   1, job_types, job_args, NULL, false, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "cron.unschedule failed: %s", SPI_result_code_string(rc));
		SPI_finish();
	}
	ds_store_spi_begin(&spi);
	ds_store_delete_schedule(job_name);
	ds_store_spi_end(&spi);
	PG_RETURN_BOOL(true);
}

/* t - i */
static TimestampTz
minus_interval(TimestampTz t, Interval *i)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
												   TimestampTzGetDatum(t),
												   IntervalPGetDatum(i)));
}

/*
 * Is t - i before the first timestamp? A backfill that long would make every firing fail
 * (22008): ds_schedule refuses it instead.
 */
static bool
before_first_timestamp(TimestampTz t, Interval *i)
{
	TimestampTz ignored;

	return !ds_timestamptz_shift(t, i, -1, &ignored);
}

/*
 * Start slot `slot` of the schedule as the caller, unless its run (or step) exists. True when
 * this started it. A key the caller cannot start (another role's run, DS422) is skipped with a
 * WARNING; other errors propagate.
 */
static bool
start_slot(const char *nsp, const char *job_name, const ScheduleRow *row, TimestampTz slot)
{
	Oid			types[4] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, JSONBOID};
	Datum		args[4];
	Subtransaction sub;
	volatile bool started = false;
	bool		isnull;
	int			rc;
	const char *key = psprintf("%s.ds_key('schedule', $1, $2)", nsp);
	const char *slot_input = "$4 OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('scheduled_at',"
		" pg_catalog.to_char($2 AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'))";

	args[0] = CStringGetTextDatum(job_name);
	args[1] = TimestampTzGetDatum(slot);
	args[2] = CStringGetTextDatum(row->workflow ? row->workflow : row->sql);
	args[3] = JsonbPGetDatum(row->input);

	/*
	 * partitioned (docs/partitions.md): a slot is started by the server that
	 * owns its key's partition, so that a schedule made on every server
	 * starts each slot once; the others pass it by
	 */
	if (ds_partition_count() > 0)
	{
		rc = SPI_execute_with_args(psprintf("SELECT %s", key), 2, types, args, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "computing the slot's key failed: %s", SPI_result_code_string(rc));
		if (!ds_partition_owns(TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
																 SPI_tuptable->tupdesc, 1,
																 &isnull))))
			return false;
	}

	/*
	 * the slot's identity is its key: a run or step under it, of any input,
	 * is the slot's
	 */
	rc = SPI_execute_with_args(row->workflow ?
							   psprintf("SELECT EXISTS (SELECT FROM %s.ds_runs WHERE run_id OPERATOR(pg_catalog.=) %s)",
										nsp, key) :
							   psprintf("SELECT EXISTS (SELECT FROM %s.ds_steps WHERE run_id OPERATOR(pg_catalog.=) %s"
										" AND step_id OPERATOR(pg_catalog.=) '" DS_SCHEDULE_STEP_ID "')",
										nsp, key),
							   2, types, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "looking for the slot's run failed: %s", SPI_result_code_string(rc));
	if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		return false;

	ds_subtransaction_begin(&sub);
	PG_TRY();
	{
		if (row->workflow)
			rc = SPI_execute_with_args(psprintf("SELECT created FROM %s.ds_start_run($3, %s, %s)",
												nsp, slot_input, key),
									   4, types, args, NULL, false, 1);
		else
			rc = SPI_execute_with_args(psprintf("SELECT status FROM %s.ds_run_step(%s, '" DS_SCHEDULE_STEP_ID "', $3,"
												" input => %s, defer => true)",
												nsp, key, slot_input),
									   4, types, args, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "starting the slot failed: %s", SPI_result_code_string(rc));
		started = true;
		ds_subtransaction_commit(&sub);
	}
	PG_CATCH();
	{
		ErrorData  *edata = ds_subtransaction_rollback(&sub);

		if (edata->sqlerrcode != ERRCODE_INSUFFICIENT_PRIVILEGE &&
			edata->sqlerrcode != ERRCODE_DS_STEP_CONFLICT)
			ReThrowError(edata);
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("schedule \"%s\" did not start its slot %s: %s", job_name,
						timestamptz_to_str(slot), edata->message),
				 errhint("The slot's key is taken by a run or step it cannot start.")));
	}
	PG_END_TRY();
	return started;
}

/*
 * ds_schedule_fire(job_name, fired_at DEFAULT NULL, now DEFAULT false) -> integer: the firing of a
 * schedule's job at fired_at (now when NULL); the number of slots it started. With `now`, a trial
 * instead: one slot, the current second, whatever the schedule says (docs/schedules.md, "Trying
 * a schedule"). Only the schedule's owner may fire it.
 */
Datum
ds_schedule_fire(PG_FUNCTION_ARGS)
{
	char	   *job_name = job_name_arg(fcinfo, 0);
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz fired_at = now;
	TimestampTz lower;
	TimestampTz latest;
	TimestampTz slot;
	bool		has_latest;
	ScheduleRow row;
	CronSchedule parsed;
	const char *nsp;
	int			started = 0;
	StoreSpi	spi;

	bool		trial = PG_NARGS() > 2 && !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);

	if (!PG_ARGISNULL(1))
	{
		fired_at = PG_GETARG_TIMESTAMPTZ(1);
		if (TIMESTAMP_NOT_FINITE(fired_at) || fired_at > now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fired_at must be a finite time not after now")));
		if (trial)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a trial firing (now => true) takes no fired_at")));
	}
	PreventCommandIfReadOnly("ds_schedule_fire()");
	row = read_schedule(job_name);
	if (!row.found || row.owner != GetUserId())
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("schedule \"%s\" does not exist", job_name),
				 errhint("A schedule is fired by its owner's pg_cron job.")));
	ds_cron_parse(row.schedule, &parsed);
	nsp = quote_identifier(own_schema(fcinfo));

	/*
	 * a trial: the slot of this second, started as any slot is (once: its key
	 * is the schedule's); the schedule's record of its firings stays as it is
	 */
	if (trial)
	{
		SPI_connect();
		started = start_slot(nsp, job_name, &row, now - now % USECS_PER_SEC) ? 1 : 0;
		SPI_finish();
		PG_RETURN_INT32(started);
	}

	/*
	 * the latest slot, however late the firing; then the backfill's, none
	 * before creation
	 */
	has_latest = ds_cron_prev(&parsed, row.created_at, fired_at, &latest);
	lower = Max(row.created_at, minus_interval(fired_at, row.backfill));
	SPI_connect();
	if (has_latest && latest < lower && start_slot(nsp, job_name, &row, latest))
		started++;
	for (TimestampTz from = lower; ds_cron_next(&parsed, from, fired_at, &slot);
		 from = slot + USECS_PER_MINUTE)
	{
		if (start_slot(nsp, job_name, &row, slot))
			started++;
	}
	SPI_finish();

	ds_store_spi_begin(&spi);
	ds_store_record_schedule_firing(job_name, latest, has_latest);
	ds_store_spi_end(&spi);
	PG_RETURN_INT32(started);
}
