/*
 * step_claim_store.c -- the statements of the claims of steps (step_claim_store.h).
 *
 * The worker runs as a superuser with search_path pinned to pg_catalog (see worker.c); the
 * statements here still name the extension's schema explicitly. Executors claim and count SQL
 * steps only (kind 'sql'): HTTP steps are the HTTP worker's.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "http/http_request.h"
#include "ipc/due_floors.h"
#include "utils/array.h"
#include "store/replay_cache.h"
#include "store/step_claim_store.h"
#include "store/step_store.h"

static SPIPlanPtr queues_plan = NULL;
static SPIPlanPtr queue_lock_plan = NULL;
static SPIPlanPtr running_count_plan = NULL;
static SPIPlanPtr groups_plan = NULL;
static SPIPlanPtr first_waiting_plan = NULL;
static SPIPlanPtr prepared_plan = NULL;
static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr due_share_plan = NULL;
static SPIPlanPtr mark_running_plan = NULL;
static SPIPlanPtr running_plan = NULL;
static SPIPlanPtr next_due_plan = NULL;
static SPIPlanPtr kept_outcomes_plan = NULL;
static SPIPlanPtr http_due_plan = NULL;
static SPIPlanPtr next_http_due_plan = NULL;

/*
 * The (queue, priority) groups of waiting steps, walked through steps_due_idx one group at a
 * time: each row of the recursion is one index descent to the next group, however many steps a
 * group holds. PostgreSQL 15 has no skip scan; this is the "loose index scan" written out.
 */
#define WAITING_GROUPS \
	"WITH RECURSIVE g(queue, priority) AS (" \
	" (SELECT queue, priority FROM durable_steps.steps" \
	"   WHERE next_attempt_at IS NOT NULL AND task IS NULL AND status IN ('pending', 'retrying')" \
	"   ORDER BY queue, priority LIMIT 1)" \
	" UNION ALL" \
	" SELECT n.queue, n.priority FROM g CROSS JOIN LATERAL" \
	"  (SELECT s.queue, s.priority FROM durable_steps.steps s" \
	"    WHERE s.next_attempt_at IS NOT NULL AND s.task IS NULL AND s.status IN ('pending', 'retrying')" \
	"      AND (s.queue, s.priority) > (g.queue, g.priority)" \
	"    ORDER BY s.queue, s.priority LIMIT 1) n) "

/*
 * The groups as a relation g(queue, priority, floor, i), from arrays $N, $N+1 and $N+2, in their
 * order (i); queue in the C collation of the steps' column.
 */
#define GROUPS_FROM(a, b, c) \
	"(SELECT u.queue COLLATE \"C\" AS queue, u.priority, u.floor, u.i FROM ROWS FROM (" \
	"pg_catalog.unnest(" a "::pg_catalog.text[]), pg_catalog.unnest(" b "::pg_catalog.int4[])," \
	" pg_catalog.unnest(" c "::pg_catalog.timestamptz[]))" \
	" WITH ORDINALITY u(queue, priority, floor, i)) g"

/* The arrays of GROUPS_FROM, in args[0..2]. */
static void
group_arrays(const DueGroup *groups, int n, Datum *args)
{
	Datum	   *queues = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *priorities = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *floors = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		queues[i] = CStringGetTextDatum(groups[i].queue);
		priorities[i] = Int32GetDatum(groups[i].priority);
		floors[i] = TimestampTzGetDatum(groups[i].floor);
	}
	args[0] = PointerGetDatum(construct_array(queues, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(priorities, n, INT4OID, sizeof(int32), true,
											  TYPALIGN_INT));
	args[2] = PointerGetDatum(construct_array(floors, n, TIMESTAMPTZOID, sizeof(TimestampTz),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

uint64
ds_store_waiting_groups(void)
{
	return ds_store_execute(&groups_plan,
							WAITING_GROUPS "SELECT queue, priority FROM g ORDER BY queue, priority",
							0, NULL, NULL, NULL, false, 0, SPI_OK_SELECT, "waiting group query");
}

TimestampTz
ds_store_first_waiting_time(const char *queue, int32 priority, TimestampTz floor,
							TimestampTz upto)
{
	Oid			types[4] = {TEXTOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[4];
	TimestampTz first;

	args[0] = CStringGetTextDatum(queue);
	args[1] = Int32GetDatum(priority);
	args[2] = TimestampTzGetDatum(floor);
	args[3] = TimestampTzGetDatum(upto);

	/*
	 * every waiting step of the group, whoever's, of any kind but tasks (in
	 * steps_task_due_idx) and partition: no floor passes one; none past
	 * `upto`, which no floor passes either (steps scheduled far ahead are
	 * never read)
	 */
	first = ds_store_query_time(&first_waiting_plan,
								"SELECT pg_catalog.min(next_attempt_at) FROM durable_steps.steps"
								" WHERE queue = $1 AND priority = $2"
								" AND next_attempt_at IS NOT NULL AND task IS NULL AND next_attempt_at >= $3"
								" AND next_attempt_at <= $4 AND status IN ('pending', 'retrying')",
								4, types, args, NULL, "first waiting step");
	return first != 0 ? first : DT_NOEND;
}

bool
ds_store_prepared_transactions(void)
{
	return ds_store_execute(&prepared_plan,
							"SELECT FROM pg_catalog.pg_prepared_xacts"
							" WHERE database = pg_catalog.current_database() LIMIT 1",
							0, NULL, NULL, NULL, false, 0, SPI_OK_SELECT,
							"prepared transaction query") > 0;
}

uint64
ds_store_due_queues(TimestampTz now, const DueGroup *groups, int n)
{
	Oid			types[4] = {TIMESTAMPTZOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID};
	Datum		args[4];

	args[0] = TimestampTzGetDatum(now);
	group_arrays(groups, n, args + 1);
	return ds_store_execute(&queues_plan,

	/*
	 * a lateral read of one step per group: each is an index range from the
	 * group's floor, never a scan of every entry due by now (which a
	 * semi-join would plan)
	 */
							"SELECT g.queue, q.concurrency, g.priority FROM "
							GROUPS_FROM("$2", "$3", "$4")
							" CROSS JOIN LATERAL (SELECT FROM durable_steps.steps s"
							"  WHERE s.queue = g.queue AND s.priority = g.priority"
							"   AND s.next_attempt_at IS NOT NULL AND s.task IS NULL AND s.status IN ('pending', 'retrying')"
							"   AND s.next_attempt_at >= g.floor AND s.next_attempt_at <= $1"
							"   AND s.kind = 'sql' AND durable_steps.ds_partition_owned(s.run_id)"
							"  ORDER BY s.next_attempt_at LIMIT 1) d"
							" LEFT JOIN durable_steps.queues q ON q.name = g.queue"
							" ORDER BY g.i",
							4, types, args, NULL, false, 0, SPI_OK_SELECT, "due queue query");
}

bool
ds_store_lock_queue_row(const char *queue, int *concurrency, bool *unlimited)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	Datum		d;

	*concurrency = 0;
	args[0] = CStringGetTextDatum(queue);
	if (ds_store_execute(&queue_lock_plan,
						 "SELECT concurrency FROM durable_steps.queues"
						 " WHERE name = $1 FOR UPDATE SKIP LOCKED", 1, types,
						 args, NULL, false, 0, SPI_OK_SELECT, "queue lock") != 1)
		return false;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, unlimited);
	if (!*unlimited)
		*concurrency = DatumGetInt32(d);
	return true;
}

uint64
ds_store_running_by_owner(const char *queue)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];

	args[0] = CStringGetTextDatum(queue);
	return ds_store_execute(&running_count_plan,
							"SELECT owner::pg_catalog.oid, pg_catalog.count(*)"
							" FROM durable_steps.steps"
							" WHERE running_queue = $1 GROUP BY 1", 1, types,
							args, NULL, false, 0, SPI_OK_SELECT, "running step count");
}

uint64
ds_store_read_due_steps(const char *queue, int32 priority, TimestampTz floor, int limit,
						TimestampTz now, ArrayType *passed_tids, int offset)
{
	Oid			due_types[7] = {TEXTOID, INT4OID, INT4OID, TIMESTAMPTZOID, TIDARRAYOID, INT4OID,
	TIMESTAMPTZOID};
	Datum		args[7];

	args[0] = CStringGetTextDatum(queue);
	args[1] = Int32GetDatum(priority);
	args[2] = Int32GetDatum(limit);
	args[3] = TimestampTzGetDatum(now);
	args[4] = PointerGetDatum(passed_tids);
	args[5] = Int32GetDatum(offset);
	args[6] = TimestampTzGetDatum(floor);
	return ds_store_execute(&due_plan,
							"SELECT run_id, step_id, ctid, owner::pg_catalog.oid"
							" FROM durable_steps.steps"
							" WHERE queue = $1 AND priority = $2"
							" AND next_attempt_at IS NOT NULL AND task IS NULL AND status IN ('pending', 'retrying')"
							" AND next_attempt_at >= $7 AND next_attempt_at <= $4 AND kind = 'sql'"
							" AND durable_steps.ds_partition_owned(run_id)"
							" AND ctid <> ALL ($5)"
							" ORDER BY next_attempt_at LIMIT $3 OFFSET $6",
							7, due_types, args, NULL, false, 0, SPI_OK_SELECT,
							"due step query");
}

uint64
ds_store_read_due_steps_share(const char *queue, int32 priority, TimestampTz floor, int limit,
							  TimestampTz now, ArrayType *passed_tids, int offset, int window,
							  ArrayType *passed_owners)
{
	Oid			due_types[9] = {TEXTOID, INT4OID, INT4OID, TIMESTAMPTZOID, TIDARRAYOID, INT4OID,
	INT4OID, OIDARRAYOID, TIMESTAMPTZOID};
	Datum		args[9];

	args[0] = CStringGetTextDatum(queue);
	args[1] = Int32GetDatum(priority);
	args[2] = Int32GetDatum(limit);
	args[3] = TimestampTzGetDatum(now);
	args[4] = PointerGetDatum(passed_tids);
	args[5] = Int32GetDatum(offset);
	args[6] = Int32GetDatum(window);
	args[7] = PointerGetDatum(passed_owners);
	args[8] = TimestampTzGetDatum(floor);

	/*
	 * A limited queue's share: the passed owners' rows may be many before
	 * another owner's, so they are passed in the statement, over a window of
	 * the range read in index order (the inner LIMIT keeps the planner's
	 * estimate, and so the ordered index scan, of ds_store_read_due_steps's
	 * statement).
	 */
	return ds_store_execute(&due_share_plan,
							"SELECT run_id, step_id, ctid, owner FROM"
							" (SELECT run_id, step_id, ctid, owner::pg_catalog.oid AS owner,"
							"   next_attempt_at FROM durable_steps.steps"
							"  WHERE queue = $1 AND priority = $2"
							"  AND next_attempt_at IS NOT NULL AND task IS NULL AND status IN ('pending', 'retrying')"
							"  AND next_attempt_at >= $9 AND next_attempt_at <= $4 AND kind = 'sql'"
							"  AND durable_steps.ds_partition_owned(run_id)"
							"  AND ctid <> ALL ($5)"
							"  ORDER BY next_attempt_at LIMIT $7) w"
							" WHERE owner <> ALL ($8)"
							" ORDER BY next_attempt_at LIMIT $3 OFFSET $6",
							9, due_types, args, NULL, false, 0, SPI_OK_SELECT,
							"due step query");
}

uint64
ds_store_claim_by_tid(SPIPlanPtr *slot, const char *sql, int nargs, Oid *types, Datum *args,
					  const char *nulls, const char *what)
{
	uint64		n;
	int			guc_level;

	/* claims never touch a succeeded row: no backend need forget its replays */
	ds_replay_cache_internal_update(true);

	/*
	 * The rows are found by their ctid (a TID scan), never through
	 * steps_due_idx or steps_task_due_idx: the generic plan would otherwise
	 * read the index from its start up to `now`, every finished step an old
	 * snapshot keeps there (docs/internals.md, "Claims under a held
	 * horizon"). The plan is made under these settings, once, and kept.
	 */
	guc_level = NewGUCNestLevel();
	(void) set_config_option("enable_indexscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_bitmapscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	n = ds_store_execute(slot, *slot ? NULL : sql, nargs, types, args, nulls, false, 0,
						 SPI_OK_UPDATE_RETURNING, "%s", what);
	AtEOXact_GUC(true, guc_level);
	ds_replay_cache_internal_update(false);
	return n;
}

uint64
ds_store_mark_steps_running(ArrayType *tids, TimestampTz now, int pid, Interval *ceiling,
							Interval *default_timeout, bool limited)
{
	Oid			types[6] = {TIDARRAYOID, TIMESTAMPTZOID, INT4OID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		args[6];

	args[0] = PointerGetDatum(tids);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int32GetDatum(pid);
	args[3] = IntervalPGetDatum(ceiling);
	args[4] = IntervalPGetDatum(default_timeout);
	args[5] = BoolGetDatum(limited);
	return ds_store_claim_by_tid(&mark_running_plan,
								 mark_running_plan ? NULL :

	/*
	 * No column of an index changes (next_attempt_at stays; see
	 * steps_due_idx), but running_queue for a limited queue: a HOT update,
	 * which writes no index entry and stays on its page.
	 */
								 psprintf("UPDATE durable_steps.steps s SET status = 'running',"
										  "  attempts = s.attempts + 1, updated_at = $2,"
										  "  lease_expires_at = $2 + least(coalesce(s.timeout, $5), $4),"
										  "  claimed_by = $3,"
										  "  running_queue = CASE WHEN $6 THEN s.queue END"
										  " WHERE s.ctid = ANY ($1) AND s.next_attempt_at IS NOT NULL AND s.task IS NULL"
										  "  AND s.status IN ('pending', 'retrying')"

	/*
	 * read without a row lock: a row changed since then (a re-arm with a
	 * later run_at) is checked again here
	 */
										  "  AND s.next_attempt_at <= $2"
										  " RETURNING %s, s.ctid",
										  ds_step_column_list()),
								 6, types, args, NULL, "claiming steps");
}

uint64
ds_store_read_running_steps(void)
{
	/*
	 * No row lock: the step lock tells which are lost, and ds_store_lock_step
	 * locks the row of each before it is recorded.
	 */
	return ds_store_execute(&running_plan,
							"SELECT run_id, step_id FROM durable_steps.steps"
							" WHERE next_attempt_at IS NOT NULL AND task IS NULL AND status = 'running'"
	/* an outcome kept for an executor is not lost (worker.c) */
							" AND kept_outcome IS NULL"

	/*
	 * only the owner records a lost attempt: a fenced partition's are its
	 * next owner's, after the move (docs/partitions.md)
	 */
							" AND durable_steps.ds_partition_owned(run_id)",
							0, NULL, NULL, NULL, false, 0, SPI_OK_SELECT,
							"running step query");
}

uint64
ds_store_read_kept_outcomes(int limit)
{
	Oid			types[1] = {INT4OID};
	Datum		args[1];

	args[0] = Int32GetDatum(limit);
	return ds_store_execute(&kept_outcomes_plan,
							"SELECT run_id, step_id FROM durable_steps.steps"
							" WHERE kept_outcome IS NOT NULL AND status = 'running'"
							" ORDER BY updated_at LIMIT $1", 1, types,
							args, NULL, false, 0, SPI_OK_SELECT, "kept outcome query");
}

TimestampTz
ds_store_next_due_step_time(const DueGroup *groups, int n)
{
	Oid			types[3] = {TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID};
	Datum		args[3];

	group_arrays(groups, n, args);
	return ds_store_query_time(&next_due_plan,
							   "SELECT pg_catalog.min((SELECT s.next_attempt_at"
							   "  FROM durable_steps.steps s"
							   "  WHERE s.queue = g.queue AND s.priority = g.priority"
							   "   AND s.next_attempt_at IS NOT NULL AND s.task IS NULL AND s.status IN ('pending', 'retrying')"
							   "   AND s.next_attempt_at >= g.floor"
							   "   AND s.kind = 'sql' AND durable_steps.ds_partition_owned(s.run_id)"
							   "  ORDER BY s.next_attempt_at LIMIT 1))"
							   " FROM " GROUPS_FROM("$1", "$2", "$3")
							   " LEFT JOIN durable_steps.queues q ON q.name = g.queue"
	/* a full or paused queue has nothing for an idle executor */
							   " WHERE q.concurrency IS NULL OR q.concurrency >"
							   "  (SELECT pg_catalog.count(*) FROM durable_steps.steps r"
							   "    WHERE r.running_queue = g.queue)",
							   3, types, args, NULL, "next due step");
}

uint64
ds_store_lock_due_http_steps(int limit, TimestampTz now, ArrayType *capped, TimestampTz floor)
{
	Oid			due_types[4] = {INT4OID, TIMESTAMPTZOID, OIDARRAYOID, TIMESTAMPTZOID};
	Datum		args[4];

	args[0] = Int32GetDatum(limit);

	/*
	 * a parameter, not clock_timestamp(): the bound of the index range, not a
	 * filter
	 */
	args[1] = TimestampTzGetDatum(now);
	args[2] = PointerGetDatum(capped);
	args[3] = TimestampTzGetDatum(floor);
	return ds_store_execute(&http_due_plan,
							"SELECT run_id, step_id, ctid, owner::pg_catalog.oid FROM durable_steps.steps"
							" WHERE queue = '" DS_HTTP_QUEUE "' AND priority = 0"
							" AND next_attempt_at IS NOT NULL AND task IS NULL AND status IN ('pending', 'retrying')"
							" AND next_attempt_at >= $4 AND next_attempt_at <= $2 AND kind = 'http'"
							" AND owner::pg_catalog.oid OPERATOR(pg_catalog.<>) ALL ($3)"
							" AND durable_steps.ds_partition_owned(run_id)"
							" ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED",
							4, due_types, args, NULL, false, 0, SPI_OK_SELECT,
							"due HTTP step query");
}

TimestampTz
ds_store_next_due_http_time(TimestampTz floor)
{
	Oid			types[1] = {TIMESTAMPTZOID};
	Datum		args[1];

	args[0] = TimestampTzGetDatum(floor);
	return ds_store_query_time(&next_http_due_plan,
							   "SELECT min(next_attempt_at) FROM durable_steps.steps"
							   " WHERE queue = '" DS_HTTP_QUEUE "' AND priority = 0"
							   " AND next_attempt_at IS NOT NULL AND task IS NULL AND status IN ('pending', 'retrying')"
							   " AND next_attempt_at >= $1"
							   " AND kind = 'http' AND durable_steps.ds_partition_owned(run_id)",
							   1, types, args, NULL, "next due HTTP step");
}
