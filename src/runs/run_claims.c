/*
 * run_claims.c -- the worker's statements on the runs it takes up (run_claims.h).
 *
 * A claim commits the turn as started (status running, turns counted, claimant recorded) and
 * holds the run's session lock until the turn's outcome commits, as claims of steps do; the
 * turn's transaction also holds the run's row (ds_lock_claimed_run). A run found running whose
 * lock and row are free lost its executor: the crash rolled the turn back (or the executor died
 * between two turns), and the run is due again (ds_recover_lost_turns), its lost step attempt
 * charged to the step the next turn reaches unless the executor is known to have ended first.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/worker_attempt_time.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"
#include "runs/run_claims.h"
#include "steps/run_context.h"
#include "steps/step_attempt.h"
#include "steps/step_exec.h"
#include "ipc/outcome_waits.h"
#include "store/run_store.h"
#include "store/step_lock.h"
#include "store/step_store.h"

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr event_plan = NULL;
static SPIPlanPtr emitted_events_plan = NULL;
static SPIPlanPtr running_plan = NULL;
static SPIPlanPtr lost_plan = NULL;
static SPIPlanPtr next_wake_plan = NULL;

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
										  " AND durable_steps.ds_partition_owned(run_id)"
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
											  " owner::pg_catalog.oid, search_path, turns, lost_turns,"
											  " unrecorded_attempts",
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
			d = SPI_getbinval(t, td, 9, &isnull);
			r->n_unrecorded = isnull ? 0 :
				ds_run_unrecorded_from_array(DatumGetArrayTypeP(d), &r->unrecorded);
			r->unrecorded_changed = false;
			r->cxt = cxt;
			r->statement = NULL;
			r->returns_value = false;
			MemoryContextSwitchTo(old);
		}
	}
	ds_store_spi_end(&spi);
	return n;
}

bool
ds_lock_claimed_run(ClaimedRun *run)
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
		ds_run_status_from_name(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1)) == RUN_RUNNING &&
		DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)) == MyProcPid &&
		!isnull &&
		DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull)) == run->turn;
	if (ours)
		ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
																	SPI_tuptable->tupdesc, 4, &isnull)),
						&run->row_tid);
	ds_store_spi_end(&spi);
	return ours;
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
ds_wake_if_event_emitted(const char *run_id, Oid owner, const char *event)
{
	Oid			types[3] = {TEXTOID, TEXTOID, BOOLOID};
	Datum		args[3] = {CStringGetTextDatum(run_id), CStringGetTextDatum(event), (Datum) 0};
	StoreSpi	spi;

	/*
	 * An emit that has not committed holds the event's lock (ds_emit_event):
	 * its wake-up may have missed the run, whose wait was not committed yet,
	 * and this look cannot see its event. Not waited for (a role's open
	 * transaction would hold the executor): the run looks again later.
	 */
	args[2] = BoolGetDatum(!ds_event_lock(owner, event, false, true));
	ds_store_spi_begin(&spi);
	if (SPI_execute_plan(ds_prepare_kept(&event_plan,
										 "UPDATE durable_steps.runs r"
										 " SET next_wake_at = CASE WHEN $3"
										 "  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
										 "   pg_catalog.current_setting('durable_steps.poll_interval')::pg_catalog.interval"
										 "  ELSE pg_catalog.clock_timestamp() END"
										 " WHERE r.run_id OPERATOR(pg_catalog.=) $1"
										 " AND r.status OPERATOR(pg_catalog.=) 'waiting'"
										 " AND r.wait_event OPERATOR(pg_catalog.=) $2"
										 " AND ($3 OR EXISTS (SELECT FROM durable_steps.events e"
										 "  WHERE e.owner OPERATOR(pg_catalog.=) r.owner"
										 "  AND e.name OPERATOR(pg_catalog.=) $2))",
										 3, types),
						 args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "looking for event %s failed", event);
	ds_store_spi_end(&spi);
}

bool
ds_record_turn_attempt_on_step(const char *run_id, const char *step_id, Oid run_owner,
							   int sqlerrcode, TimestampTz claimed_at)
{
	StepRecord	rec;

	if (step_id == NULL || !ds_step_lock_acquire(run_id, step_id, true) ||
		!ds_store_lock_step(run_id, step_id, &rec))
		return false;
	if (!ds_step_kinds[rec.kind].has_sql_body || rec.owner != run_owner ||
		(rec.status != STEP_RETRYING && rec.status != STEP_PENDING) ||
		(claimed_at != 0 && (rec.next_attempt_at > claimed_at || rec.updated_at > claimed_at)))
		return false;
	ds_record_unrecorded_attempts(&rec, false, 1, &sqlerrcode);
	return true;
}

int
ds_recover_lost_turns(int limit, MemoryContext cxt, char ***run_ids)
{
	Oid			types[1] = {INT4OID};
	Oid			lost_types[5] = {TEXTOID, TEXTOID, TEXTOID, BOOLOID, BOOLOID};
	Datum		args[5];
	StoreSpi	spi;
	int			n = 0;
	int			rc;
	uint64		n_running;
	char	  **ids;
	int		   *lost;
	Jsonb	  **policies;
	int		   *claimed_by;
	int		   *turns;
	TimestampTz *claimed_at;
	char	  **current_step;
	Oid		   *owner;

	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	/* a turn in flight holds its row: SKIP LOCKED passes over it */
	rc = SPI_execute_plan(ds_prepare_kept(&running_plan,
										  "SELECT run_id, lost_turns, policy, claimed_by, updated_at, turns,"
										  " current_step, owner::pg_catalog.oid"
										  " FROM durable_steps.runs"
										  " WHERE status OPERATOR(pg_catalog.=) 'running'"
	/* only the owner records a lost turn (docs/partitions.md) */
										  " AND durable_steps.ds_partition_owned(run_id)"
										  " LIMIT $1 FOR UPDATE SKIP LOCKED", 1, types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "running run query failed: %s", SPI_result_code_string(rc));
	n_running = SPI_processed;
	ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n_running, 1));
	lost = palloc(sizeof(int) * Max(n_running, 1));
	policies = palloc(sizeof(Jsonb *) * Max(n_running, 1));
	claimed_by = palloc(sizeof(int) * Max(n_running, 1));
	turns = palloc(sizeof(int) * Max(n_running, 1));
	claimed_at = palloc(sizeof(TimestampTz) * Max(n_running, 1));
	current_step = palloc(sizeof(char *) * Max(n_running, 1));
	owner = palloc(sizeof(Oid) * Max(n_running, 1));
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
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 4, &isnull);
		claimed_by[i] = isnull ? 0 : DatumGetInt32(d);
		claimed_at[i] = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[i],
														  SPI_tuptable->tupdesc, 5, &isnull));
		turns[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 6,
											   &isnull));
		current_step[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 7);
		owner[i] = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 8,
												  &isnull));
	}
	for (uint64 i = 0; i < n_running; i++)
	{
		RetryPolicy policy;
		bool		give_up;
		bool		step_ran;
		bool		counted;
		ClaimFate	fate;

		/* a free lock on a running run means its executor is gone */
		if (!ds_step_lock_try_session(ids[i], DS_TURN_STEP_ID))
			continue;
		ids[n++] = ids[i];
		ds_policy_resolve(policies[i], NULL, &policy);

		/*
		 * The step attempt the turn may have run rolled back with its record:
		 * the next turn records it on the step it reaches (DS007) -- unless
		 * the executor is known to have ended before the turn began its step
		 * (executor_slot.h), or the turn is known to have rolled back for
		 * another turn's sake, whose code ended the executor: then neither
		 * the run nor its step is charged. After a crash nobody knows: it is
		 * charged, as a plain step's lost claim is.
		 */
		fate = ds_lost_claim_fate(claimed_by[i], claimed_at[i],
								  ds_attempt_cancel_key(ids[i], DS_TURN_STEP_ID, turns[i]));
		counted = fate != CLAIM_ROLLED_BACK_BY_ANOTHER;
		step_ran = counted && fate != CLAIM_NEVER_STARTED;

		/*
		 * a turn that kills its executor every time must not be retried
		 * forever
		 */
		give_up = counted && lost[i] + 1 >= policy.max_attempts;

		/*
		 * known, it is recorded on its step now; a failed run records nothing
		 * more
		 */
		if (step_ran && !give_up &&
			ds_record_turn_attempt_on_step(ids[i], current_step[i], owner[i],
										   ERRCODE_DS_INVOCATION_LOST, claimed_at[i]))
			step_ran = false;
		if (counted)
			ereport(LOG,
					(errmsg("durable_steps: the turn of run %s was lost with its executor; %s",
							ids[i], give_up ? "failing the run" : "running it again")));
		else
			ereport(LOG,
					(errmsg("durable_steps: the turn of run %s rolled back when another run's code ended its executor; it is not counted",
							ids[i])));
		args[0] = CStringGetTextDatum(ids[i]);
		args[1] = CStringGetTextDatum(give_up ? "failed" : "waiting");
		args[2] = CStringGetTextDatum(unpack_sql_state(ERRCODE_DS_INVOCATION_LOST));
		args[3] = BoolGetDatum(step_ran);
		args[4] = BoolGetDatum(counted);
		rc = SPI_execute_plan(ds_prepare_kept(&lost_plan,
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
											  5, lost_types),
							  args, NULL, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "recovering run %s failed", ids[i]);
		if (!give_up)
			ds_worker_wake_at_commit();
		else
			ds_outcome_wake_at_commit(ids[i]);	/* the run failed: its waiters */
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
							   " WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}')"
							   " AND durable_steps.ds_partition_owned(run_id)",
							   "next run wake");
}
