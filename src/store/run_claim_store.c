/*
 * run_claim_store.c -- the statements of the worker's claims of runs (run_claim_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "ipc/due_floors.h"
#include "store/run_claim_store.h"
#include "store/step_store.h"

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr running_plan = NULL;
static SPIPlanPtr lost_plan = NULL;
static SPIPlanPtr next_wake_plan = NULL;
static SPIPlanPtr first_waiting_plan = NULL;

uint64
ds_store_lock_due_runs(int limit, TimestampTz floor)
{
	Oid			due_types[2] = {INT4OID, TIMESTAMPTZOID};
	Datum		args[2];

	args[0] = Int32GetDatum(limit);
	args[1] = TimestampTzGetDatum(floor);
	return ds_store_execute(&due_plan,
							"SELECT run_id FROM durable_steps.runs"
							" WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')"
							" AND next_wake_at OPERATOR(pg_catalog.>=) $2"
							" AND next_wake_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()"
							" AND durable_steps.ds_partition_owned(run_id)"
							" ORDER BY next_wake_at LIMIT $1 FOR UPDATE SKIP LOCKED",
							2, due_types, args, NULL, false, 0, SPI_OK_SELECT, "due run query");
}

TimestampTz
ds_store_first_waiting_run_time(TimestampTz floor, TimestampTz upto)
{
	Oid			types[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[2];
	TimestampTz first;

	args[0] = TimestampTzGetDatum(floor);
	args[1] = TimestampTzGetDatum(upto);
	/* every waiting run, of any partition: no floor passes one */
	first = ds_store_query_time(&first_waiting_plan,
								"SELECT pg_catalog.min(next_wake_at) FROM durable_steps.runs"
								" WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')"
								" AND next_wake_at OPERATOR(pg_catalog.>=) $1"
								" AND next_wake_at OPERATOR(pg_catalog.<=) $2",
								2, types, args, NULL, "first waiting run");
	return first != 0 ? first : DT_NOEND;
}

uint64
ds_store_claim_runs(ArrayType *run_ids, int pid, Interval *lease)
{
	Oid			claim_types[3] = {TEXTARRAYOID, INT4OID, INTERVALOID};
	Datum		args[3];

	args[0] = PointerGetDatum(run_ids);
	args[1] = Int32GetDatum(pid);
	args[2] = IntervalPGetDatum(lease);
	return ds_store_execute(&claim_plan,
							"UPDATE durable_steps.runs SET status = 'running',"
							" turns = turns OPERATOR(pg_catalog.+) 1, claimed_by = $2,"
							" updated_at = pg_catalog.clock_timestamp(),"
							" lease_expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3"
							" WHERE run_id OPERATOR(pg_catalog.=) ANY ($1)"
							" RETURNING run_id, workflow, input, policy,"
							" owner::pg_catalog.oid, search_path, turns, lost_turns,"
							" unrecorded_attempts",
							3, claim_types, args, NULL, false, 0, SPI_OK_UPDATE_RETURNING,
							"claiming runs");
}

uint64
ds_store_lock_run_row(const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};

	return ds_store_execute(&lock_plan,
							"SELECT status, claimed_by, turns, ctid FROM durable_steps.runs"
							" WHERE run_id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
							1, types, args, NULL, false, 1, SPI_OK_SELECT, "locking run %s",
							run_id);
}

uint64
ds_store_lock_running_runs(int limit)
{
	Oid			types[1] = {INT4OID};
	Datum		args[1];

	args[0] = Int32GetDatum(limit);
	/* a turn in flight holds its row: SKIP LOCKED passes over it */
	return ds_store_execute(&running_plan,
							"SELECT run_id, lost_turns, policy, claimed_by, updated_at, turns,"
							" current_step, owner::pg_catalog.oid, unrecorded_attempts"
							" FROM durable_steps.runs"
							" WHERE status OPERATOR(pg_catalog.=) 'running'"
	/* only the owner records a lost turn (docs/partitions.md) */
							" AND durable_steps.ds_partition_owned(run_id)"
							" LIMIT $1 FOR UPDATE SKIP LOCKED", 1, types,
							args, NULL, false, 0, SPI_OK_SELECT, "running run query");
}

void
ds_store_record_lost_turn(const char *run_id, const char *status, const char *sqlstate,
						  bool step_ran, bool counted)
{
	Oid			lost_types[5] = {TEXTOID, TEXTOID, TEXTOID, BOOLOID, BOOLOID};
	Datum		args[5];

	args[0] = CStringGetTextDatum(run_id);
	args[1] = CStringGetTextDatum(status);
	args[2] = CStringGetTextDatum(sqlstate);
	args[3] = BoolGetDatum(step_ran);
	args[4] = BoolGetDatum(counted);
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	(void) ds_store_execute(&lost_plan,
							"UPDATE durable_steps.runs SET status = $2,"
							" lost_turns = lost_turns OPERATOR(pg_catalog.+) CASE WHEN $5 THEN 1 ELSE 0 END,"
							" claimed_by = NULL, lease_expires_at = NULL,"
							" updated_at = pg_catalog.clock_timestamp(),"
							" next_wake_at = CASE WHEN $2 OPERATOR(pg_catalog.=) 'waiting'"
							"  THEN pg_catalog.clock_timestamp() END,"
							" finished_at = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed'"
							"  THEN pg_catalog.clock_timestamp() END,"
							" wait_reason = CASE WHEN $5 THEN 'turn lost with its executor' ELSE 'turn rolled back with another' END,"
							" unrecorded_attempts = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed' THEN NULL"
							"  WHEN $4 THEN pg_catalog.array_append("
							"  COALESCE(unrecorded_attempts, '{}'), $3) ELSE unrecorded_attempts END,"
							" error_code = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed' THEN $3 END,"
							" error_message = CASE WHEN $2 OPERATOR(pg_catalog.=) 'failed'"
							"  THEN 'invocation_lost: every turn lost its executor' END"
							" WHERE run_id OPERATOR(pg_catalog.=) $1",
							5, lost_types, args, NULL, false, 0, SPI_OK_UPDATE,
							"recovering run %s", run_id);
}

TimestampTz
ds_store_next_run_wake_time(TimestampTz floor)
{
	Oid			types[1] = {TIMESTAMPTZOID};
	Datum		args[1];

	args[0] = TimestampTzGetDatum(floor);
	return ds_store_query_time(&next_wake_plan,
							   "SELECT pg_catalog.min(next_wake_at) FROM durable_steps.runs"
							   " WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')"
							   " AND next_wake_at OPERATOR(pg_catalog.>=) $1"
							   " AND durable_steps.ds_partition_owned(run_id)",
							   1, types, args, NULL, "next run wake");
}
