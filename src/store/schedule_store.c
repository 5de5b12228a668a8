/*
 * schedule_store.c -- the statements on durable_steps.schedules (schedule_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "store/schedule_store.h"
#include "store/step_store.h"

static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr store_plan = NULL;
static SPIPlanPtr delete_plan = NULL;
static SPIPlanPtr fired_plan = NULL;

uint64
ds_store_lock_schedule(const char *job_name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(job_name)};

	return ds_store_execute(&read_plan,
							"SELECT owner::pg_catalog.oid, schedule, workflow, input, sql,"
							" backfill, jobid, created_at FROM durable_steps.schedules"
							" WHERE job_name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
							1, types, args, NULL, false, 1, SPI_OK_SELECT,
							"reading schedule %s", job_name);
}

void
ds_store_put_schedule(const char *job_name, Oid owner, const char *schedule,
					  const char *workflow, Jsonb *input, const char *sql, Interval *backfill,
					  int64 jobid)
{
	Oid			types[8] = {TEXTOID, OIDOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INTERVALOID,
	INT8OID};
	Datum		store_args[8];
	char		store_nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

	store_args[0] = CStringGetTextDatum(job_name);
	store_args[1] = ObjectIdGetDatum(owner);
	store_args[2] = CStringGetTextDatum(schedule);
	store_args[3] = workflow ? CStringGetTextDatum(workflow) : (Datum) 0;
	store_nulls[3] = workflow ? ' ' : 'n';
	store_args[4] = JsonbPGetDatum(input);
	store_args[5] = sql ? CStringGetTextDatum(sql) : (Datum) 0;
	store_nulls[5] = sql ? ' ' : 'n';
	store_args[6] = IntervalPGetDatum(backfill);
	store_args[7] = Int64GetDatum(jobid);
	(void) ds_store_execute(&store_plan,
							"INSERT INTO durable_steps.schedules (job_name, owner, schedule,"
							" workflow, input, sql, backfill, jobid, created_at)"
							" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, pg_catalog.clock_timestamp())"
							" ON CONFLICT (job_name) DO UPDATE SET schedule = EXCLUDED.schedule,"
							" workflow = EXCLUDED.workflow, input = EXCLUDED.input,"
							" sql = EXCLUDED.sql, backfill = EXCLUDED.backfill,"
							" jobid = EXCLUDED.jobid, created_at = EXCLUDED.created_at",
							8, types, store_args, store_nulls, false, 0, SPI_OK_INSERT,
							"storing schedule %s", job_name);
}

void
ds_store_delete_schedule(const char *job_name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(job_name)};

	(void) ds_store_execute(&delete_plan,
							"DELETE FROM durable_steps.schedules WHERE job_name OPERATOR(pg_catalog.=) $1",
							1, types, args, NULL, false, 0, SPI_OK_DELETE,
							"removing schedule %s", job_name);
}

void
ds_store_record_schedule_firing(const char *job_name, TimestampTz latest, bool has_latest)
{
	Oid			fired_types[2] = {TEXTOID, TIMESTAMPTZOID};
	Datum		fired_args[2];

	fired_args[0] = CStringGetTextDatum(job_name);
	fired_args[1] = TimestampTzGetDatum(has_latest ? latest : 0);
	(void) ds_store_execute(&fired_plan,
							"UPDATE durable_steps.schedules SET last_fired_at = pg_catalog.clock_timestamp(),"
							" last_slot = GREATEST(last_slot, $2)"
							" WHERE job_name OPERATOR(pg_catalog.=) $1",
							2, fired_types, fired_args, has_latest ? "  " : " n", false, 0,
							SPI_OK_UPDATE, "recording the firing of %s", job_name);
}
