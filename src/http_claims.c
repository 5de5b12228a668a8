/*
 * http_claims.c -- the HTTP worker's view of durable_steps.steps.
 *
 * The same two phases as the SQL executors' claims (step_claims.c): lock due rows, skipping
 * rows others hold; take each step's session lock, skipping steps someone is acting on; then
 * mark those running in one statement. SQL executors never claim kind 'http', and this never
 * claims anything else. HTTP steps are not served by queue: all of them sit in the queue
 * DS_HTTP_QUEUE at priority 0, one range of steps_due_idx read up to its first step not yet due,
 * and durable_steps.http_max_inflight bounds them.
 */
#include "compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "http_claims.h"
#include "policy.h"
#include "replay_cache.h"
#include "step_exec.h"
#include "step_lock.h"
#include "store.h"

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr mark_running_plan = NULL;
static SPIPlanPtr next_due_plan = NULL;

int
ds_claim_due_http_steps(int limit, MemoryContext cxt, ClaimedStep **claims)
{
	Oid			due_types[2] = {INT4OID, TIMESTAMPTZOID};
	Oid			mark_types[5] = {TIDARRAYOID, TIMESTAMPTZOID, INT4OID, INTERVALOID, INTERVALOID};
	Datum		args[5];
	Datum	   *tids;
	int			n_locked = 0;
	int			n_claimed;
	uint64		n_due;
	int			rc;
	StoreSpi	spi;
	bool		isnull;

	*claims = NULL;
	ds_store_spi_begin(&spi);
	args[0] = Int32GetDatum(limit);
	/* a parameter, not clock_timestamp(): the bound of the index range, not a filter */
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	rc = SPI_execute_plan(ds_prepare_kept(&due_plan,
										  "SELECT run_id, step_id, ctid FROM durable_steps.steps"
										  " WHERE queue = '" DS_HTTP_QUEUE "' AND priority = 0"
										  " AND status IN ('pending', 'retrying')"
										  " AND next_attempt_at <= $2 AND kind = 'http'"
										  " ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED",
										  2, due_types),
						  args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "due HTTP step query failed: %s", SPI_result_code_string(rc));
	n_due = SPI_processed;
	if (n_due == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	tids = palloc(sizeof(Datum) * n_due);
	for (uint64 i = 0; i < n_due; i++)
	{
		char	   *run_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		char	   *step_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);

		/* ds_retry_step or ds_cancel_step may be acting on it right now */
		if (ds_step_lock_try_session(run_id, step_id))
			tids[n_locked++] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3,
											 &isnull);
	}
	if (n_locked == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	args[0] = PointerGetDatum(construct_array(tids, n_locked, TIDOID, sizeof(ItemPointerData),
											  false, TYPALIGN_SHORT));
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[2] = Int32GetDatum(MyProcPid);
	args[3] = IntervalPGetDatum(ds_usecs_to_interval(ds_max_worker_attempt_usecs()));
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
										"SELECT %s, row_tid FROM claimed ORDER BY next_attempt_at",
										ds_step_column_list()),
							   5, mark_types);
	rc = SPI_execute_plan(mark_running_plan, args, NULL, false, 0);
	ds_replay_cache_internal_update(false);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "claiming HTTP steps failed: %s", SPI_result_code_string(rc));
	n_claimed = (int) SPI_processed;
	/* the rows are locked by this transaction: every locked one is claimed */
	if (n_claimed != n_locked)
		elog(ERROR, "claimed %d of %d locked HTTP steps", n_claimed, n_locked);
	*claims = MemoryContextAlloc(cxt, sizeof(ClaimedStep) * n_claimed);
	for (int i = 0; i < n_claimed; i++)
	{
		ClaimedStep *claim = &(*claims)[i];

		ds_store_record_from_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 0, cxt,
								   &claim->rec);
		claim->run_id = claim->rec.run_id;
		claim->step_id = claim->rec.step_id;
		claim->attempt = claim->rec.attempts;
	}
	ds_store_spi_end(&spi);
	return n_claimed;
}

TimestampTz
ds_next_http_due_time(void)
{
	TimestampTz next = 0;
	bool		isnull;
	int			rc;
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_plan(ds_prepare_kept(&next_due_plan,
										  "SELECT min(next_attempt_at) FROM durable_steps.steps"
										  " WHERE queue = '" DS_HTTP_QUEUE "' AND priority = 0"
										  " AND status IN ('pending', 'retrying') AND kind = 'http'",
										  0, NULL),
						  NULL, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "next due HTTP step query failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			next = DatumGetTimestampTz(d);
	}
	ds_store_spi_end(&spi);
	return next;
}
