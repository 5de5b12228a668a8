/*
 * run_control_store.c -- the statements on runs and a run's steps of the runs' SQL functions
 * (run_control_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "ipc/due_floors.h"
#include "ipc/worker_shmem.h"
#include "store/run_control_store.h"
#include "store/run_store.h"
#include "store/step_store.h"
#include "store/store_relations.h"

static SPIPlanPtr in_use_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr existing_plan = NULL;
static SPIPlanPtr foreign_steps_plan = NULL;
static SPIPlanPtr read_plans[2] = {NULL, NULL};
static SPIPlanPtr unfinished_plan = NULL;
static SPIPlanPtr latest_plan = NULL;
static SPIPlanPtr count_plan = NULL;
static SPIPlanPtr cancel_plan = NULL;
static SPIPlanPtr resume_plan = NULL;
static SPIPlanPtr cancel_steps_plan = NULL;

bool
ds_store_insert_run(const char *run_id, const char *workflow, Jsonb *input, const char *run_key,
					Jsonb *policy, Oid owner, const char *search_path)
{
	Oid			insert_types[7] = {TEXTOID, TEXTOID, JSONBOID, TEXTOID, JSONBOID, OIDOID, TEXTOID};
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};

	args[0] = CStringGetTextDatum(run_id);
	args[1] = CStringGetTextDatum(workflow);
	args[2] = JsonbPGetDatum(input);
	args[3] = run_key ? CStringGetTextDatum(run_key) : (Datum) 0;
	nulls[3] = run_key ? ' ' : 'n';
	args[4] = policy ? JsonbPGetDatum(policy) : (Datum) 0;
	nulls[4] = policy ? ' ' : 'n';
	args[5] = ObjectIdGetDatum(owner);
	args[6] = CStringGetTextDatum(search_path);

	/*
	 * due at the statement's clock_timestamp(), no earlier than now
	 * (ipc/due_floors.h)
	 */
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	return ds_store_execute(&insert_plan,
							"INSERT INTO durable_steps.runs (run_id, workflow, input,"
							" run_key, policy, status, owner, search_path, next_wake_at)"
							" VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7,"
							" pg_catalog.clock_timestamp()) ON CONFLICT DO NOTHING",
							7, insert_types, args, nulls, false, 0, SPI_OK_INSERT,
							"storing the run") == 1;
}

bool
ds_store_run_has_foreign_steps(const char *run_id, Oid role)
{
	Oid			foreign_types[2] = {TEXTOID, OIDOID};
	Datum		foreign_args[2] = {CStringGetTextDatum(run_id), ObjectIdGetDatum(role)};
	int			rc;

	(void) ds_store_relations();
	rc = SPI_execute_snapshot(ds_prepare_kept(&foreign_steps_plan,
											  "SELECT FROM durable_steps.steps"
											  " WHERE run_id OPERATOR(pg_catalog.=) $1"
											  " AND NOT pg_catalog.pg_has_role($2, owner::pg_catalog.oid, 'USAGE')"
											  " LIMIT 1",
											  2, foreign_types),
							  foreign_args, NULL, GetLatestSnapshot(), InvalidSnapshot,
							  false, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "looking for steps of run %s failed: %s", run_id,
			 SPI_result_code_string(rc));
	return SPI_processed > 0;
}

bool
ds_store_run_id_in_use(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	bool		isnull;

	(void) ds_store_execute(&in_use_plan,
							"SELECT EXISTS (SELECT FROM durable_steps.runs"
							"  WHERE run_id OPERATOR(pg_catalog.=) $1)"
							" OR EXISTS (SELECT FROM durable_steps.steps"
							"  WHERE run_id OPERATOR(pg_catalog.=) $1)",
							1, types, args, NULL, true, 1, SPI_OK_SELECT,
							"looking for run %s", run_id);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

uint64
ds_store_read_run_definition(const char *run_id)
{
	Oid			key_types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};

	return ds_store_execute(&existing_plan,
							"SELECT workflow, input, owner::pg_catalog.oid, status,"
							" run_key FROM durable_steps.runs"
							" WHERE run_id OPERATOR(pg_catalog.=) $1",
							1, key_types, args, NULL, false, 1, SPI_OK_SELECT,
							"reading run %s", run_id);
}

uint64
ds_store_read_run(const char *run_id, bool lock)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};

	return ds_store_execute(&read_plans[lock],
							lock ?
							"SELECT status, owner::pg_catalog.oid, claimed_by, turns"
							" FROM durable_steps.runs"
							" WHERE run_id OPERATOR(pg_catalog.=) $1 FOR UPDATE" :
							"SELECT status, owner::pg_catalog.oid, claimed_by, turns"
							" FROM durable_steps.runs"
							" WHERE run_id OPERATOR(pg_catalog.=) $1",
							1, types, args, NULL, false, 1, SPI_OK_SELECT, "reading run %s",
							run_id);
}

uint64
ds_store_read_unfinished_run_steps(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};

	return ds_store_execute(&unfinished_plan,
							"SELECT step_id, status OPERATOR(pg_catalog.=) 'running',"
							" claimed_by, attempts FROM durable_steps.steps"
							" WHERE run_id OPERATOR(pg_catalog.=) $1"
							" AND status OPERATOR(pg_catalog.=)"
							"  ANY ('{pending,retrying,running,blocked,uncertain}')"
							" AND pg_catalog.pg_has_role((SELECT r.owner FROM durable_steps.runs r"
							"  WHERE r.run_id OPERATOR(pg_catalog.=) $1)::pg_catalog.oid,"
							"  owner::pg_catalog.oid, 'USAGE')"
							" ORDER BY step_id",
							1, types, args, NULL, false, 0, SPI_OK_SELECT,
							"reading the steps of run %s", run_id);
}

uint64
ds_store_read_run_latest(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	int			rc;

	(void) ds_store_relations();
	rc = SPI_execute_snapshot(ds_prepare_kept(&latest_plan,
											  "SELECT status, output, error_code, error_message,"
											  " owner::pg_catalog.oid FROM durable_steps.runs"
											  " WHERE run_id OPERATOR(pg_catalog.=) $1",
											  1, types),
							  args, NULL, GetLatestSnapshot(), InvalidSnapshot, true, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading a run failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

int64
ds_store_count_run_steps(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;
	bool		isnull;
	int64		n;

	ds_store_spi_begin(&spi);
	if (ds_store_execute(&count_plan,
						 "SELECT pg_catalog.count(*) FROM durable_steps.steps"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1", 1, types,
						 args, NULL, true, 1, SPI_OK_SELECT, "counting the steps of run %s",
						 run_id) != 1)
		elog(ERROR, "counting the steps of run %s failed", run_id);
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	ds_store_spi_end(&spi);
	return n;
}

void
ds_store_cancel_run(const char *run_id)
{
	(void) ds_run_statement(&cancel_plan,
							"UPDATE durable_steps.runs SET status = 'cancelled',"
							" finished_at = pg_catalog.clock_timestamp(),"
							" updated_at = pg_catalog.clock_timestamp(), next_wake_at = NULL,"
							" claimed_by = NULL, lease_expires_at = NULL,"
							" wait_reason = 'cancelled by ds_cancel_run()'"
							" WHERE run_id OPERATOR(pg_catalog.=) $1", run_id);
}

void
ds_store_resume_run(const char *run_id)
{
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	(void) ds_run_statement(&resume_plan,
							"UPDATE durable_steps.runs SET status = 'waiting',"
							" next_wake_at = pg_catalog.clock_timestamp(), finished_at = NULL,"
							" updated_at = pg_catalog.clock_timestamp(), lost_turns = 0,"
							" wait_reason = 'resumed by ds_resume_run()',"
							" error_code = NULL, error_message = NULL, error_detail = NULL"
							" WHERE run_id OPERATOR(pg_catalog.=) $1", run_id);
}

void
ds_store_cancel_run_steps(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;
	uint64		cancelled;

	/*
	 * its tasks among them: no task look of this transaction raises a floor
	 * past them
	 */
	ds_due_floor_note_task_left_waiting();
	ds_store_spi_begin(&spi);
	cancelled = ds_store_execute(&cancel_steps_plan,
								 "UPDATE durable_steps.steps SET status = 'cancelled',"
								 " error_class = 'cancelled', next_attempt_at = NULL,"
								 " limit_not_before = NULL, limit_admitted = NULL,"
								 " finished_at = pg_catalog.clock_timestamp(),"
								 " updated_at = pg_catalog.clock_timestamp()"
								 " WHERE run_id OPERATOR(pg_catalog.=) $1"
								 " AND status OPERATOR(pg_catalog.=) ANY ('{pending,retrying,blocked,uncertain}')"
								 " AND pg_catalog.pg_has_role((SELECT r.owner FROM durable_steps.runs r"
								 "  WHERE r.run_id OPERATOR(pg_catalog.=) $1)::pg_catalog.oid,"
								 "  owner::pg_catalog.oid, 'USAGE')",
								 1, types, args, NULL, false, 0, SPI_OK_UPDATE,
								 "cancelling the steps of run %s", run_id);
	ds_store_spi_end(&spi);
	/* an admitted step among them lets its slot go (docs/limits.md) */
	if (cancelled > 0)
		ds_limit_admission_at_commit();
}

bool
ds_store_link_child_run(const char *child, const char *parent, const char *step_id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		args[3];
	StoreSpi	spi;
	bool		linked;
	static SPIPlanPtr plan_check = NULL;

	args[0] = CStringGetTextDatum(child);
	args[1] = CStringGetTextDatum(parent);
	args[2] = CStringGetTextDatum(step_id);
	ds_store_spi_begin(&spi);
	(void) ds_store_execute(&plan,
							"UPDATE durable_steps.runs SET parent_run_id = $2, parent_step = $3"
							" WHERE run_id OPERATOR(pg_catalog.=) $1 AND parent_run_id IS NULL",
							3, types, args, NULL, false, 0, SPI_OK_UPDATE,
							"linking run %s to its parent", child);
	linked = ds_store_execute(&plan_check,
							  "SELECT FROM durable_steps.runs WHERE run_id OPERATOR(pg_catalog.=) $1"
							  " AND parent_run_id OPERATOR(pg_catalog.=) $2"
							  " AND parent_step OPERATOR(pg_catalog.=) $3",
							  3, types, args, NULL, false, 0, SPI_OK_SELECT,
							  "reading the parent of run %s", child) > 0;
	ds_store_spi_end(&spi);
	return linked;
}

uint64
ds_store_unfinished_children(const char *parent)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(parent)};

	return ds_store_execute(&plan,
							"SELECT run_id, owner::pg_catalog.oid FROM durable_steps.runs"
							" WHERE parent_run_id OPERATOR(pg_catalog.=) $1"
							" AND status OPERATOR(pg_catalog.<>) ALL ('{succeeded,failed,cancelled}')"
							" ORDER BY run_id",
							1, types, args, NULL, false, 0, SPI_OK_SELECT,
							"reading the children of run %s", parent);
}
