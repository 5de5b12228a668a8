/*
 * step_claims.c -- the worker's view of durable_steps.steps.
 *
 * The worker runs as a superuser with search_path pinned to pg_catalog (see worker.c); the
 * statements here still name the extension's schema explicitly.
 */
#include "compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "ds_errcodes.h"
#include "policy.h"
#include "replay_cache.h"
#include "step_attempt.h"
#include "step_claims.h"
#include "step_exec.h"
#include "step_lock.h"
#include "store.h"

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr mark_running_plan = NULL;
static SPIPlanPtr running_plan = NULL;
static SPIPlanPtr next_due_plan = NULL;

int
ds_claim_due_steps(int limit, MemoryContext cxt, ClaimedStep **claims, int *skipped)
{
	Oid			due_types[1] = {INT4OID};
	Oid			mark_types[5] = {TIDARRAYOID, TIMESTAMPTZOID, INT4OID, INTERVALOID, INTERVALOID};
	Datum		args[5];
	char	  **run_ids;
	char	  **step_ids;
	Datum	   *tids;
	int			n_locked = 0;
	int			n_claimed = 0;
	uint64		n_due;
	int			rc;
	StoreSpi	spi;
	bool		isnull;

	*skipped = 0;
	*claims = NULL;
	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	rc = SPI_execute_plan(ds_prepare_kept(&due_plan,
									"SELECT run_id, step_id, ctid FROM durable_steps.steps "
									"WHERE status IN ('pending', 'retrying') AND kind = 'sql' "
									"AND next_attempt_at <= clock_timestamp() "
									"ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED",
									1, due_types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "due step query failed: %s", SPI_result_code_string(rc));
	n_due = SPI_processed;
	if (n_due == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	run_ids = palloc(sizeof(char *) * n_due);
	step_ids = palloc(sizeof(char *) * n_due);
	tids = palloc(sizeof(Datum) * n_due);
	for (uint64 i = 0; i < n_due; i++)
	{
		char	   *run_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		char	   *step_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);

		/* a synchronous caller (or another executor) may be running it right now */
		if (ds_step_lock_try_session(run_id, step_id))
		{
			run_ids[n_locked] = run_id;
			step_ids[n_locked] = step_id;
			tids[n_locked] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3,
										 &isnull);
			n_locked++;
		}
		else
			(*skipped)++;
	}
	if (n_locked > 0)
	{
		/* the rows are locked: their places are where they stay until we update them */
		args[0] = PointerGetDatum(construct_array(tids, n_locked, TIDOID,
												  sizeof(ItemPointerData), false,
												  TYPALIGN_SHORT));
		args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
		args[2] = Int32GetDatum(MyProcPid);
		/* no worker attempt runs longer than the ceiling, whatever its own timeout */
		args[3] = IntervalPGetDatum(ds_usecs_to_interval(ds_max_worker_attempt_usecs()));
		/* and a step without a timeout of its own has durable_steps.default_timeout */
		args[4] = IntervalPGetDatum(ds_usecs_to_interval(ds_worker_attempt_limit_usecs(0)));
		/* claims never touch a succeeded row: no backend need forget its replays */
		ds_replay_cache_internal_update(true);
		if (mark_running_plan == NULL)
			(void) ds_prepare_kept(&mark_running_plan,
								   psprintf("WITH claimed AS ("
										   " UPDATE durable_steps.steps s SET status = 'running',"
										   "  attempts = s.attempts + 1, updated_at = $2,"
										   "  lease_expires_at = $2 + least(coalesce(s.timeout, $5), $4),"
										   "  claimed_by = $3"
										   " WHERE s.ctid = ANY ($1) AND s.status IN ('pending', 'retrying')"
										   " RETURNING s.*, s.ctid AS row_tid) "
										   "SELECT %s, row_tid FROM claimed"
										   " ORDER BY owner::pg_catalog.oid, next_attempt_at",
										   ds_step_column_list()),
								   5, mark_types);
		rc = SPI_execute_plan(mark_running_plan, args, NULL, false, 0);
		ds_replay_cache_internal_update(false);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "claiming steps failed: %s", SPI_result_code_string(rc));
		n_claimed = (int) SPI_processed;
		*claims = MemoryContextAlloc(cxt, sizeof(ClaimedStep) * Max(n_claimed, 1));
		for (int i = 0; i < n_claimed; i++)
		{
			HeapTuple	t = SPI_tuptable->vals[i];
			TupleDesc	td = SPI_tuptable->tupdesc;
			ClaimedStep *claim = &(*claims)[i];

			ds_store_record_from_tuple(t, td, 0, cxt, &claim->rec);
			claim->run_id = claim->rec.run_id;
			claim->step_id = claim->rec.step_id;
			claim->attempt = claim->rec.attempts;
		}
		if (n_claimed < n_locked)
		{
			/* never expected (the rows are locked), but a lock must not outlive its claim */
			for (int i = 0; i < n_locked; i++)
				ds_step_lock_release_session(run_ids[i], step_ids[i]);
			for (int i = 0; i < n_claimed; i++)
				(void) ds_step_lock_try_session((*claims)[i].run_id, (*claims)[i].step_id);
		}
	}
	ds_store_spi_end(&spi);
	return n_claimed;
}

int
ds_recover_lost_attempts(int limit, MemoryContext cxt, ClaimedStep **recovered)
{
	Oid			types[1] = {INT4OID};
	Datum		args[1];
	int			n = 0;
	int			rc;
	uint64		n_running;
	StoreSpi	spi;
	char	  **run_ids;
	char	  **step_ids;

	*recovered = NULL;
	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	rc = SPI_execute_plan(ds_prepare_kept(&running_plan,
									"SELECT run_id, step_id FROM durable_steps.steps "
									"WHERE status = 'running' ORDER BY lease_expires_at "
									"LIMIT $1 FOR UPDATE SKIP LOCKED", 1, types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "running step query failed: %s", SPI_result_code_string(rc));
	n_running = SPI_processed;
	/* copied out of SPI's memory, which SPI_finish() releases */
	run_ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n_running, 1));
	step_ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n_running, 1));
	for (uint64 i = 0; i < n_running; i++)
	{
		run_ids[i] = MemoryContextStrdup(cxt, SPI_getvalue(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc, 1));
		step_ids[i] = MemoryContextStrdup(cxt, SPI_getvalue(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc, 2));
	}
	ds_store_spi_end(&spi);

	*recovered = MemoryContextAlloc(cxt, sizeof(ClaimedStep) * Max(n_running, 1));
	for (uint64 i = 0; i < n_running; i++)
	{
		StepRecord	rec;

		/* a free lock on a running step means its executor is gone: that is the lease ending */
		if (!ds_step_lock_try_session(run_ids[i], step_ids[i]))
			continue;
		(*recovered)[n].run_id = MemoryContextStrdup(cxt, run_ids[i]);
		(*recovered)[n].step_id = MemoryContextStrdup(cxt, step_ids[i]);
		n++;
		if (!ds_store_lock_step(run_ids[i], step_ids[i], &rec) ||
			rec.status != STEP_RUNNING)
			continue;
		(*recovered)[n - 1].attempt = rec.attempts;
		ereport(LOG,
				(errmsg("durable_steps: attempt %d of step %s/%s was lost; recording it as failed",
						rec.attempts, rec.run_id, rec.step_id)));
		ds_record_lost_attempt(&rec);
	}
	return n;
}

TimestampTz
ds_next_due_time(void)
{
	TimestampTz next = 0;
	bool		isnull;
	int			rc;
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_plan(ds_prepare_kept(&next_due_plan,
									"SELECT min(next_attempt_at) FROM durable_steps.steps "
									"WHERE status IN ('pending', 'retrying') AND kind = 'sql'", 0, NULL),
						  NULL, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "next due query failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			next = DatumGetTimestampTz(d);
	}
	ds_store_spi_end(&spi);
	return next;
}
