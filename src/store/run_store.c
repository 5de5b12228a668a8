/*
 * run_store.c -- the owner of durable_steps.runs (run_store.h): its statuses, the column table
 * and writer a turn uses (the runs' counterpart of step_store.c's StepColumn), and the statements
 * on a run's row that the steps' layers make: waking a run when a step it waits for changes, and
 * the paused queue a run's step waits on.
 *
 * They sit below the step state machine (step_attempt.c), which calls them, and below runs.c,
 * the SQL functions that start and steer runs: a lower layer never calls up into the runs.
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "ipc/outcome_waits.h"
#include "ipc/due_floors.h"
#include "store/direct_write.h"
#include "store/run_store.h"
#include "store/store_relations.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"

static const char *const run_status_names[] = {
	[RUN_PENDING] = "pending",
	[RUN_RUNNING] = "running",
	[RUN_WAITING] = "waiting",
	[RUN_BLOCKED] = "blocked",
	[RUN_SUCCEEDED] = "succeeded",
	[RUN_FAILED] = "failed",
	[RUN_CANCELLED] = "cancelled",
};

const char *
ds_run_status_name(RunStatus status)
{
	Assert(status >= 0 && status < lengthof(run_status_names));
	return run_status_names[status];
}

RunStatus
ds_run_status_from_name(const char *name)
{
	for (int i = 0; i < lengthof(run_status_names); i++)
		if (name != NULL && strcmp(run_status_names[i], name) == 0)
			return (RunStatus) i;
	elog(ERROR, "durable_steps.runs holds a run of unknown status \"%s\"", name ? name : "(null)");
	pg_unreachable();
}

void
ds_run_write_status(RunWrite *w, RunStatus status)
{
	ds_run_write_text(w, RUN_COL_STATUS, ds_run_status_name(status));
}

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
	[RUN_COL_UNRECORDED_ATTEMPTS] = "unrecorded_attempts",
};

void
ds_run_write_column(RunWrite *w, RunColumn col, Datum value, bool isnull)
{
	static Oid	attnums_relid = InvalidOid;
	static AttrNumber attnums[N_RUN_COLUMNS];
	Oid			relid = ds_store_relations()->runs;

	if (attnums_relid != relid)
	{
		/*
		 * looked up again when the table is another (the extension was
		 * created anew)
		 */
		for (int i = 0; i < N_RUN_COLUMNS; i++)
		{
			attnums[i] = get_attnum(relid, run_column_names[i]);
			if (attnums[i] == InvalidAttrNumber)
				elog(ERROR, "durable_steps.runs has no column %s", run_column_names[i]);
		}
		attnums_relid = relid;
	}
	/* a run about to wait: no claim's floor passes it (ipc/due_floors.h) */
	if (col == RUN_COL_NEXT_WAKE_AT && !isnull)
		ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, DatumGetTimestampTz(value));
	w->attnums[w->n] = attnums[col];
	w->values[w->n] = value;
	w->nulls[w->n] = isnull;
	w->n++;
}

void
ds_run_write_text(RunWrite *w, RunColumn col, const char *text)
{
	ds_run_write_column(w, col, text ? CStringGetTextDatum(text) : (Datum) 0, text == NULL);
}

void
ds_run_write_row(const char *run_id, ItemPointer tid, RunWrite *w)
{
	const StoreRelations *r = ds_store_relations();
	Datum		key = CStringGetTextDatum(run_id);
	RegProcedure eq = F_TEXTEQ;

	ds_run_write_column(w, RUN_COL_UPDATED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
	/* ds_wait_run reads the run again when this commits */
	ds_outcome_wake_at_commit(run_id);
	if (!ds_direct_update_row(r->runs, r->runs_pkey, 1, &key, &eq, tid,
							  w->attnums, w->n, w->values, w->nulls))
		elog(ERROR, "run %s is gone", run_id);
}

int
ds_run_unrecorded_from_array(ArrayType *array, UnrecordedAttempt **entries)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			k = 0;

	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	*entries = palloc0(sizeof(UnrecordedAttempt) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		char	   *s = nulls[i] ? NULL : TextDatumGetCString(elems[i]);

		if (s == NULL || strlen(s) < 5 || (s[5] != '\0' && s[5] != ':'))
			continue;
		(*entries)[k].sqlerrcode = MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
		(*entries)[k].step_id = s[5] == ':' ? pstrdup(s + 6) : NULL;
		k++;
	}
	return k;
}

void
ds_run_write_unrecorded(RunWrite *w, int n, const UnrecordedAttempt *entries)
{
	Datum	   *elems;

	if (n == 0)
	{
		ds_run_write_column(w, RUN_COL_UNRECORDED_ATTEMPTS, (Datum) 0, true);
		return;
	}
	elems = palloc(sizeof(Datum) * n);
	for (int i = 0; i < n; i++)
		elems[i] = CStringGetTextDatum(entries[i].step_id == NULL ?
									   unpack_sql_state(entries[i].sqlerrcode) :
									   psprintf("%s:%s", unpack_sql_state(entries[i].sqlerrcode),
												entries[i].step_id));
	ds_run_write_column(w, RUN_COL_UNRECORDED_ATTEMPTS,
						PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false,
														TYPALIGN_INT)),
						false);
}

uint64
ds_run_statement(SPIPlanPtr *slot, const char *sql, const char *run_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(run_id)};
	StoreSpi	spi;
	uint64		n;

	ds_store_spi_begin(&spi);
	n = ds_store_execute(slot, sql, 1, types, args, NULL, false, 0, DS_SPI_OK_ANY,
						 "updating run %s", run_id);
	ds_store_spi_end(&spi);
	return n;
}

void
ds_run_wake_for_step(const char *run_id)
{
	static SPIPlanPtr wake_plan = NULL;

	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	if (ds_run_statement(&wake_plan,
						 "UPDATE durable_steps.runs SET status = 'waiting',"
						 " next_wake_at = pg_catalog.clock_timestamp(),"
						 " updated_at = pg_catalog.clock_timestamp()"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1"
						 " AND status OPERATOR(pg_catalog.=) ANY ('{waiting,blocked}')", run_id) > 0)
		ds_worker_wake_at_commit();
}

char *
ds_run_step_paused_queue(const char *run_id, const char *step_id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(run_id), CStringGetTextDatum(step_id)};
	StoreSpi	spi;
	char	   *queue = NULL;

	ds_store_spi_begin(&spi);
	if (ds_store_execute(&plan,
						 "SELECT q.name FROM durable_steps.queues q"
						 " WHERE q.concurrency OPERATOR(pg_catalog.=) 0"
						 " AND q.name OPERATOR(pg_catalog.=) COALESCE((SELECT s.queue"
						 "  FROM durable_steps.steps s WHERE s.run_id OPERATOR(pg_catalog.=) $1"
						 "  AND s.step_id OPERATOR(pg_catalog.=) $2), 'default')",
						 2, types,
						 args, NULL, false, 1, SPI_OK_SELECT,
						 "looking at the queue of step %s/%s", run_id, step_id) == 1)
		queue = MemoryContextStrdup(spi.caller_cxt,
									SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1));
	ds_store_spi_end(&spi);
	return queue;
}

void
ds_run_wake_for_queue(const char *queue)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(psprintf(DS_RUN_QUEUE_PAUSED_REASON, queue))};
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	(void) ds_store_execute(&plan,
							"UPDATE durable_steps.runs"
							" SET next_wake_at = pg_catalog.clock_timestamp()"
							" WHERE status OPERATOR(pg_catalog.=) 'waiting'"
							" AND wait_reason OPERATOR(pg_catalog.=) $1",
							1, types, args, NULL, false, 0, SPI_OK_UPDATE,
							"waking the runs of queue %s", queue);
	ds_store_spi_end(&spi);
}

/*
 * Is there any version of run run_id's row in its index, live, dead or being written? Any
 * version counts (SnapshotAny): a concurrent turn's update of the row, which never stays on its
 * page's HOT chain (it changes the status the indexes name), must not hide the row between its
 * index entry and its heap version. Most steps -- a task or a step stored on its own, under a
 * run_id that only groups it -- have none: their outcomes skip the statement that wakes a run.
 */
static bool
run_row_may_exist(const char *run_id)
{
	const StoreRelations *r = ds_store_relations();
	Relation	rel = table_open(r->runs, AccessShareLock);
	Relation	index = index_open(r->runs_pkey, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	ScanKeyData skey;
	IndexScanDesc scan;
	bool		found;

	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, CStringGetTextDatum(run_id));
	scan = ds_index_beginscan(rel, index, SnapshotAny, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return found;
}

void
ds_run_wake_for_step_outcome(const char *run_id, const char *step_id)
{
	static SPIPlanPtr wake_plan = NULL;
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(run_id), CStringGetTextDatum(step_id)};
	StoreSpi	spi;
	bool		woken;

	if (!run_row_may_exist(run_id))
		return;
	ds_store_spi_begin(&spi);
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());

	/*
	 * A running run's row is updated with its own values: that waits for the
	 * turn's transaction, and the row it then recorded is checked again
	 * (waiting for this step: woken).
	 */
	(void) ds_store_execute(&wake_plan,
							"UPDATE durable_steps.runs SET next_wake_at = CASE"
							" WHEN status OPERATOR(pg_catalog.=) 'waiting'"
							" THEN pg_catalog.clock_timestamp() ELSE next_wake_at END"
							" WHERE run_id OPERATOR(pg_catalog.=) $1"
							" AND current_step OPERATOR(pg_catalog.=) $2"
							" AND status OPERATOR(pg_catalog.=) ANY ('{waiting,running}')"
							" RETURNING status OPERATOR(pg_catalog.=) 'waiting'",
							2, types,
							args, NULL, false, 0, SPI_OK_UPDATE_RETURNING,
							"waking run %s", run_id);
	woken = false;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		woken |= DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1,
											&isnull));
	}
	ds_store_spi_end(&spi);
	if (woken)
		ds_worker_wake_at_commit();
}

void
ds_run_wake_parent(const char *run_id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	StoreSpi	spi;
	char	   *parent = NULL;
	char	   *step_id = NULL;

	if (strchr(run_id, '/') == NULL)
		return;
	args[0] = CStringGetTextDatum(run_id);
	ds_store_spi_begin(&spi);
	if (ds_store_execute(&plan,
						 "SELECT parent_run_id, parent_step FROM durable_steps.runs"
						 " WHERE run_id OPERATOR(pg_catalog.=) $1 AND parent_run_id IS NOT NULL",
						 1, types, args, NULL, false, 0, SPI_OK_SELECT,
						 "reading the parent of run %s", run_id) == 1)
	{
		parent = MemoryContextStrdup(spi.caller_cxt,
									 SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1));
		step_id = MemoryContextStrdup(spi.caller_cxt,
									  SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2));
	}
	ds_store_spi_end(&spi);
	if (parent != NULL)
		ds_run_wake_for_step_outcome(parent, step_id);
}

bool
ds_run_child_ended(const char *run_id, const char *step_id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	StoreSpi	spi;
	bool		ended;

	args[0] = CStringGetTextDatum(run_id);
	args[1] = CStringGetTextDatum(step_id);
	ds_store_spi_begin(&spi);
	ended = ds_store_execute(&plan,
							 "SELECT FROM durable_steps.runs"
							 " WHERE run_id OPERATOR(pg_catalog.=) ($1 OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) $2)"
							 " AND parent_run_id OPERATOR(pg_catalog.=) $1 AND parent_step OPERATOR(pg_catalog.=) $2"
							 " AND status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}')",
							 2, types, args, NULL, false, 0, SPI_OK_SELECT,
							 "reading the child run of step %s/%s", run_id, step_id) > 0;
	ds_store_spi_end(&spi);
	return ended;
}
