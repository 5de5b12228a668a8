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
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/worker_attempt_time.h"
#include "ipc/due_floors.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"
#include "runs/run_claims.h"
#include "steps/run_context.h"
#include "steps/step_attempt.h"
#include "steps/step_exec.h"
#include "ipc/outcome_waits.h"
#include "store/event_store.h"
#include "store/run_claim_store.h"
#include "store/run_store.h"
#include "store/step_lock.h"
#include "store/step_store.h"

/* The transaction that last claimed runs: the first claim of a transaction looks first. */
static LocalTransactionId claimed_lxid = InvalidLocalTransactionId;

/*
 * Move the runs' floor up to the first waiting run (ipc/due_floors.h) -- only before this
 * transaction claims any: a claim it then rolled back would put its runs back below -- and
 * return it: the claim's read starts there.
 */
static TimestampTz
raise_runs_floor(void)
{
	DueFloorLook look;

	if (claimed_lxid != DS_MY_LXID && ds_due_floor_look(DS_RUNS_GROUP, 0, &look))
		ds_due_floor_raise(&look, ds_store_first_waiting_run_time(look.floor, look.bound));
	claimed_lxid = DS_MY_LXID;
	return ds_due_floor(DS_RUNS_GROUP, 0);
}

int
ds_claim_due_runs(int limit, MemoryContext cxt, ClaimedRun **runs)
{
	Datum	   *ids;
	int			n_locked = 0;
	int			n = 0;
	StoreSpi	spi;

	*runs = NULL;
	ds_store_spi_begin(&spi);
	if (ds_store_lock_due_runs(limit, raise_runs_floor()) == 0)
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
		n = (int) ds_store_claim_runs(construct_array(ids, n_locked, TEXTOID, -1, false,
													  TYPALIGN_INT),
									  MyProcPid,
									  ds_usecs_to_interval(ds_worker_attempt_limit_usecs(0)));
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
	StoreSpi	spi;
	bool		ours;
	bool		isnull;

	ds_store_spi_begin(&spi);
	ours = ds_store_lock_run_row(run->run_id) == 1 &&
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
	ds_store_wake_runs_with_emitted_events();
}

void
ds_wake_if_event_emitted(const char *run_id, Oid owner, const char *event)
{
	bool		emit_in_flight;

	/*
	 * An emit that has not committed holds the event's lock (ds_emit_event):
	 * its wake-up may have missed the run, whose wait was not committed yet,
	 * and this look cannot see its event. Not waited for (a role's open
	 * transaction would hold the executor): the run looks again later.
	 */
	emit_in_flight = !ds_event_lock(owner, event, false, true);
	ds_store_wake_if_event_emitted(run_id, event, emit_in_flight);
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

bool
ds_turn_only_records(const char *run_id, const char *step_id, Oid run_owner, int n,
					 const UnrecordedAttempt *entries)
{
	bool		unnamed = false;
	StepRecord	rec;

	for (int i = 0; i < n; i++)
	{
		if (entries[i].step_id == NULL)
			unnamed = true;
		else if (step_id != NULL && strcmp(entries[i].step_id, step_id) == 0)
			return true;
	}
	if (!unnamed)
		return false;

	/*
	 * One that names no step is recorded at the first step the turn creates,
	 * whose body it then does not run: a turn holding one runs a body only at
	 * a step that exists and is due. `step_id` is the run's current step as
	 * the last turn that committed left it (a lost turn writes none): the
	 * lost turn either went on from it to a new step, where it only recorded,
	 * or ran it, which it could only if it is the owner's SQL step and waits
	 * to run. Charging the turn otherwise would record its loss a second
	 * time, as an attempt the step never made.
	 */
	if (step_id == NULL || !ds_store_lock_step(run_id, step_id, &rec))
		return true;
	return !(ds_step_kinds[rec.kind].has_sql_body && rec.owner == run_owner &&
			 (rec.status == STEP_RETRYING || rec.status == STEP_PENDING));
}

int
ds_recover_lost_turns(int limit, MemoryContext cxt, char ***run_ids)
{
	StoreSpi	spi;
	int			n = 0;
	uint64		n_running;
	char	  **ids;
	int		   *lost;
	Jsonb	  **policies;
	int		   *claimed_by;
	int		   *turns;
	TimestampTz *claimed_at;
	char	  **current_step;
	Oid		   *owner;
	int		   *n_unrecorded;
	UnrecordedAttempt **unrecorded;

	ds_store_spi_begin(&spi);
	n_running = ds_store_lock_running_runs(limit);
	ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n_running, 1));
	lost = palloc(sizeof(int) * Max(n_running, 1));
	policies = palloc(sizeof(Jsonb *) * Max(n_running, 1));
	claimed_by = palloc(sizeof(int) * Max(n_running, 1));
	turns = palloc(sizeof(int) * Max(n_running, 1));
	claimed_at = palloc(sizeof(TimestampTz) * Max(n_running, 1));
	current_step = palloc(sizeof(char *) * Max(n_running, 1));
	owner = palloc(sizeof(Oid) * Max(n_running, 1));
	n_unrecorded = palloc0(sizeof(int) * Max(n_running, 1));
	unrecorded = palloc0(sizeof(UnrecordedAttempt *) * Max(n_running, 1));
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
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 9, &isnull);
		if (!isnull)
			n_unrecorded[i] = ds_run_unrecorded_from_array(DatumGetArrayTypeP(d), &unrecorded[i]);
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
		step_ran = counted && fate != CLAIM_NEVER_STARTED &&
			!ds_turn_only_records(ids[i], current_step[i], owner[i], n_unrecorded[i],
								  unrecorded[i]);

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
		ds_store_record_lost_turn(ids[i], give_up ? "failed" : "waiting",
								  unpack_sql_state(ERRCODE_DS_INVOCATION_LOST), step_ran, counted);
		if (!give_up)
			ds_worker_wake_at_commit();
		else
		{
			ds_outcome_wake_at_commit(ids[i]);	/* the run failed: its waiters */
			ds_run_wake_parent(ids[i]); /* and its parent's join */
		}
	}
	ds_store_spi_end(&spi);
	*run_ids = ids;
	return n;
}

TimestampTz
ds_next_run_wake_time(void)
{
	return ds_store_next_run_wake_time(ds_due_floor(DS_RUNS_GROUP, 0));
}
