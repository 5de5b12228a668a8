/*
 * retention.c -- finished steps and runs, and old events, are purged after durable_steps.retention;
 * idempotency keys when they expire, or when their owner no longer exists.
 *
 * Each batch is its own short transaction that deletes at most RETENTION_BATCH rows chosen with
 * SKIP LOCKED, so a purge never holds long locks and never waits for a step someone is using.
 * Only finished work is purged: blocked and uncertain steps wait for a person and stay.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/policy.h"
#include "store/retention.h"
#include "store/step_store.h"

/* seconds; 0 keeps everything */
static int	retention_seconds = 7 * 24 * 3600;
static TimestampTz last_purge = 0;
static SPIPlanPtr purge_steps_plan = NULL;
static SPIPlanPtr purge_runs_plan = NULL;
static SPIPlanPtr purge_events_plan = NULL;
static SPIPlanPtr purge_keys_plan = NULL;
static SPIPlanPtr purge_orphan_keys_plan = NULL;

void
ds_retention_init_module(void)
{
	DefineCustomIntVariable("durable_steps.retention",
							"How long finished steps, their attempts and finished runs are kept.",
							"0 keeps them forever.",
							&retention_seconds,
							7 * 24 * 3600,
							0,
							INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

bool
ds_retention_purge_due(void)
{
	/* expired idempotency keys are purged whatever the retention */
	return TimestampDifferenceExceeds(last_purge, GetCurrentTimestamp(), 60 * 1000);
}

void
ds_retention_purge_done(void)
{
	last_purge = GetCurrentTimestamp();
}

void
ds_retention_purge_done_reset(void)
{
	last_purge = 0;
}

/* Run one purge statement (it returns the count it deleted) with $1 = cutoff, $2 = batch. */
static int
purge(SPIPlanPtr *slot, const char *sql, Datum *args)
{
	Oid			types[2] = {TIMESTAMPTZOID, INT4OID};
	bool		isnull;

	(void) ds_store_execute(slot, sql, 2, types, args, NULL, false, 0, SPI_OK_SELECT, "purge");
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

int
ds_retention_purge_batch(void)
{
	Datum		args[2];
	int			deleted;
	StoreSpi	spi;

	args[0] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[1] = Int32GetDatum(RETENTION_BATCH);
	ds_store_spi_begin(&spi);

	/*
	 * Idempotency keys past their expiry, and never one held within its lease
	 * (docs/idempotent-requests.md): the index on expires_at finds them.
	 */
	deleted = purge(&purge_keys_plan,
					"WITH gone AS ("
					" DELETE FROM durable_steps.idempotency_keys WHERE ctid IN ("
					"  SELECT ctid FROM durable_steps.idempotency_keys"
					"  WHERE expires_at < $1"
					"  AND (state OPERATOR(pg_catalog.=) 'done' OR lease_expires_at < $1)"
					"  LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) "
					"SELECT count(*)::int4 FROM gone", args);

	/*
	 * Idempotency keys whose owner no longer exists. DROP ROLE deletes a
	 * role's keys only in the database it runs in (role_guard.c); a role
	 * dropped while connected to another database leaves its keys here, and a
	 * role created later with the same OID must never be answered them
	 * (docs/idempotent-requests.md). The owners are read off the primary key,
	 * which leads with the owner, one index probe per distinct owner, so the
	 * sweep costs little however many keys there are.
	 */
	deleted += purge(&purge_orphan_keys_plan,
					 "WITH RECURSIVE owners(o) AS ("
					 " (SELECT owner::pg_catalog.oid FROM durable_steps.idempotency_keys"
					 "  ORDER BY owner::pg_catalog.oid LIMIT 1)"
					 " UNION ALL"
					 " SELECT (SELECT k.owner::pg_catalog.oid FROM durable_steps.idempotency_keys k"
					 "  WHERE k.owner::pg_catalog.oid OPERATOR(pg_catalog.>) owners.o"
					 "  ORDER BY k.owner::pg_catalog.oid LIMIT 1)"
					 " FROM owners WHERE owners.o IS NOT NULL),"
					 " orphans(o) AS ("
					 "  SELECT o FROM owners WHERE o IS NOT NULL AND NOT EXISTS ("
					 "   SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) o)),"
					 " gone AS ("
					 " DELETE FROM durable_steps.idempotency_keys WHERE ctid IN ("
					 "  SELECT k.ctid FROM orphans, LATERAL ("
					 "   SELECT ctid FROM durable_steps.idempotency_keys"
					 "   WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) orphans.o"
	/* in the primary key's order, so that the index finds them */
					 "   ORDER BY scope, key LIMIT $2 FOR UPDATE SKIP LOCKED) k"
					 "  LIMIT $2) RETURNING 1) "
					 "SELECT count(*)::int4 FROM gone", args);
	if (retention_seconds == 0)
	{
		ds_store_spi_end(&spi);
		return deleted;
	}
	args[0] = TimestampTzGetDatum(GetCurrentTimestamp() - (int64) retention_seconds * USECS_PER_SEC);

	/*
	 * the steps' attempts go with them: the trigger steps_delete_attempts
	 * deletes those
	 */
	deleted += purge(&purge_steps_plan,
					 "WITH gone AS ("
					 " DELETE FROM durable_steps.steps WHERE ctid IN ("
					 "  SELECT ctid FROM durable_steps.steps"
	/* created before it finished: the BRIN index on created_at finds them */
					 "  WHERE finished_at < $1 AND created_at < $1"
					 "  AND status IN ('succeeded', 'failed', 'cancelled')"
	/* a run that has not finished replays its steps: they stay with it */
					 "  AND NOT EXISTS (SELECT FROM durable_steps.runs r"
					 "   WHERE r.run_id OPERATOR(pg_catalog.=) steps.run_id AND r.finished_at IS NULL)"
					 "  LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) "
					 "SELECT count(*)::int4 FROM gone", args);
	deleted += purge(&purge_runs_plan,
					 "WITH gone AS ("
					 " DELETE FROM durable_steps.runs WHERE ctid IN ("
					 "  SELECT ctid FROM durable_steps.runs c"
					 "  WHERE finished_at < $1 AND status IN ('succeeded', 'failed', 'cancelled')"

	/*
	 * a child run stays while its parent has not finished: the parent replays
	 * it
	 */
					 "  AND (c.parent_run_id IS NULL OR NOT EXISTS (SELECT FROM durable_steps.runs p"
					 "   WHERE p.run_id OPERATOR(pg_catalog.=) c.parent_run_id AND p.finished_at IS NULL))"
					 "  LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING run_id), "
	/* a run's maps go with it */
					 " maps_gone AS (DELETE FROM durable_steps.maps m USING gone"
					 "  WHERE m.run_id OPERATOR(pg_catalog.=) gone.run_id) "
					 "SELECT count(*)::int4 FROM gone", args);

	/*
	 * An event is kept as long as a finished step: long enough for the runs
	 * that were to wait for it to start, and never while a run waits for it.
	 */
	deleted += purge(&purge_events_plan,
					 "WITH gone AS ("
					 " DELETE FROM durable_steps.events WHERE ctid IN ("
					 "  SELECT ctid FROM durable_steps.events e"
					 "  WHERE emitted_at < $1"
					 "  AND NOT EXISTS (SELECT FROM durable_steps.runs r"
					 "   WHERE r.status OPERATOR(pg_catalog.=) 'waiting'"
					 "   AND r.wait_event OPERATOR(pg_catalog.=) e.name"
					 "   AND r.owner OPERATOR(pg_catalog.=) e.owner)"
					 "  LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) "
					 "SELECT count(*)::int4 FROM gone", args);
	ds_store_spi_end(&spi);
	return deleted;
}
