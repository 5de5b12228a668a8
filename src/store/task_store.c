/*
 * task_store.c -- the statements of tasks (task_store.h).
 *
 * Most run in the sessions of application workers, as the tables' owner, under the caller's
 * search_path: every name is qualified, every operator too (OPERATOR(pg_catalog.=)), or a role
 * could put an operator of its own first on its path and have it run as the owner. The caller's
 * role is passed as an argument wherever it decides which rows are the caller's.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "store/step_claim_store.h"
#include "store/step_store.h"
#include "store/task_store.h"

static SPIPlanPtr running_in_queue_plan = NULL;
static SPIPlanPtr mark_tasks_plan = NULL;
static SPIPlanPtr expired_plan = NULL;
static SPIPlanPtr next_lease_end_plan = NULL;

/*
 * The waiting tasks of one group g(task, owner): a range of steps_task_due_idx (task, owner,
 * priority, next_attempt_at). `queues` is a parameter, the queues or NULL for all. A task of a
 * paused or full queue is not one: a wait must not end for a task no claim may take. Each owner
 * is a range of its own, so one role's backlog is never read by a claim of another role's tasks.
 */
#define WAITING_TASKS_OF_GROUP(queues, range) \
	" FROM durable_steps.steps s" \
	" WHERE s.task OPERATOR(pg_catalog.=) g.task" \
	"  AND s.owner::pg_catalog.oid OPERATOR(pg_catalog.=) g.owner" \
	"  AND s.next_attempt_at IS NOT NULL" \
	"  AND s.task IS NOT NULL AND s.status OPERATOR(pg_catalog.=) ANY ('{pending,retrying}')" \
	range \
	"  AND (" queues "::pg_catalog.text[] IS NULL" \
	"       OR s.queue OPERATOR(pg_catalog.=) ANY (" queues "))" \
	"  AND NOT EXISTS (SELECT FROM durable_steps.queues q" \
	"   WHERE q.name OPERATOR(pg_catalog.=) s.queue AND q.concurrency IS NOT NULL" \
	"    AND q.concurrency OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(*)" \
	"     FROM durable_steps.steps r WHERE r.running_queue OPERATOR(pg_catalog.=) s.queue))" \
	"  AND durable_steps.ds_partition_owned(s.run_id)"

/*
 * The groups a read covers, g(task, owner[, priority, floor]), of owners whose
 * privileges role $3 has (its own and those it is a member of with USAGE):
 *  - with floors (ipc/due_floors.h), one per (task, owner, priority) from parameters $5..$8
 *    (arrays of task names, owners, priorities and floors), each read from its floor: the claims
 *    never walk the entries that finished tasks leave while an old snapshot holds the horizon;
 *  - without, one per name of $1 and owner, every priority, each read from its start.
 */
#define TASK_GROUPS_WITH_FLOORS \
	"(SELECT u.task COLLATE pg_catalog.\"C\" AS task, u.owner, u.priority, u.floor FROM ROWS FROM (pg_catalog.unnest($5::pg_catalog.text[])," \
	"  pg_catalog.unnest($6::pg_catalog.oid[]), pg_catalog.unnest($7::pg_catalog.int4[])," \
	"  pg_catalog.unnest($8::pg_catalog.timestamptz[])) u(task, owner, priority, floor)" \
	"  WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) u.owner" \
	"   AND pg_catalog.pg_has_role($3, r.oid, 'USAGE'))) g"
#define TASK_GROUPS_FROM_START \
	"(SELECT n.task, o.owner" \
	"  FROM (SELECT DISTINCT u.task COLLATE pg_catalog.\"C\" AS task" \
	"   FROM pg_catalog.unnest($1::pg_catalog.text[]) u(task) WHERE u.task IS NOT NULL) n" \
	"  CROSS JOIN (SELECT r.oid AS owner FROM pg_catalog.pg_roles r" \
	"   WHERE pg_catalog.pg_has_role($3, r.oid, 'USAGE')) o) g"

/* What a group's range is: a priority from its floor, or the whole (task, owner) range. */
#define FLOOR_RANGE \
	"  AND s.priority OPERATOR(pg_catalog.=) g.priority" \
	"  AND s.next_attempt_at OPERATOR(pg_catalog.>=) g.floor"
#define WHOLE_RANGE ""

/* Parameters $5..$8 for TASK_GROUPS_WITH_FLOORS from `groups` (n of them). */
static void
group_args(const DueTaskGroup *groups, int n, Oid *types, Datum *args, char *nulls)
{
	Datum	   *names = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *owners = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *priorities = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *floors = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		names[i] = CStringGetTextDatum(groups[i].task);
		owners[i] = ObjectIdGetDatum(groups[i].owner);
		priorities[i] = Int32GetDatum(groups[i].priority);
		floors[i] = TimestampTzGetDatum(groups[i].floor);
	}
	types[0] = TEXTARRAYOID;
	types[1] = OIDARRAYOID;
	types[2] = INT4ARRAYOID;
	types[3] = TIMESTAMPTZARRAYOID;
	args[0] = PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(owners, n, OIDOID, sizeof(Oid), true,
											  TYPALIGN_INT));
	args[2] = PointerGetDatum(construct_array(priorities, n, INT4OID, sizeof(int32), true,
											  TYPALIGN_INT));
	args[3] = PointerGetDatum(construct_array(floors, n, TIMESTAMPTZOID, sizeof(TimestampTz),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	memset(nulls, ' ', 4);
}

/*
 * Fair share between the owners: within a priority, every owner's first due task comes before
 * any owner's second.
 */
#define LOCK_DUE_TASKS(groups, range) \
	"SELECT t.ctid, t.queue FROM " groups \
	" CROSS JOIN LATERAL (SELECT s.ctid, s.queue, s.priority, s.next_attempt_at," \
	"  s.owner" WAITING_TASKS_OF_GROUP("$2", range) \
	"  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $4" \
	"  ORDER BY s.priority, s.next_attempt_at LIMIT $9" \
	"  FOR UPDATE OF s SKIP LOCKED) t" \
	" ORDER BY t.priority, pg_catalog.row_number() OVER" \
	"  (PARTITION BY t.owner, t.priority ORDER BY t.next_attempt_at)," \
	"  t.next_attempt_at LIMIT $9"

static SPIPlanPtr due_tasks_plan = NULL;
static SPIPlanPtr due_tasks_from_start_plan = NULL;

uint64
ds_store_lock_due_tasks(ArrayType *tasks, ArrayType *queues, Oid caller, int limit,
						TimestampTz now, const DueTaskGroup *groups, int n_groups)
{
	Oid			types[9] = {TEXTARRAYOID, TEXTARRAYOID, OIDOID, TIMESTAMPTZOID,
	TEXTARRAYOID, OIDARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT4OID};
	Datum		args[9];
	char		nulls[9] = {' ', queues ? ' ' : 'n', ' ', ' ', 'n', 'n', 'n', 'n', ' '};

	args[0] = PointerGetDatum(tasks);
	args[1] = PointerGetDatum(queues);
	args[2] = ObjectIdGetDatum(caller);
	args[3] = TimestampTzGetDatum(now);
	args[8] = Int32GetDatum(limit);
	if (n_groups < 0)
		return ds_store_execute(&due_tasks_from_start_plan,
								LOCK_DUE_TASKS(TASK_GROUPS_FROM_START, WHOLE_RANGE),
								9, types, args, nulls, false, 0, SPI_OK_SELECT, "due task query");
	group_args(groups, n_groups, &types[4], &args[4], &nulls[4]);
	return ds_store_execute(&due_tasks_plan, LOCK_DUE_TASKS(TASK_GROUPS_WITH_FLOORS, FLOOR_RANGE),
							9, types, args, nulls, false, 0, SPI_OK_SELECT, "due task query");
}

static SPIPlanPtr waiting_groups_plan = NULL;

uint64
ds_store_waiting_task_groups(void)
{
	/*
	 * a walk of steps_task_due_idx: its waiting tasks, of any partition or
	 * queue
	 */
	return ds_store_execute(&waiting_groups_plan,
							"SELECT DISTINCT task, owner::pg_catalog.oid, priority FROM durable_steps.steps"
							" WHERE next_attempt_at IS NOT NULL AND task IS NOT NULL"
							" AND status OPERATOR(pg_catalog.=) ANY ('{pending,retrying}')",
							0, NULL, NULL, NULL, false, 0, SPI_OK_SELECT, "waiting task groups");
}

static SPIPlanPtr first_waiting_tasks_plan = NULL;

void
ds_store_first_waiting_tasks(const DueTaskGroup *groups, const TimestampTz *bounds, int n,
							 TimestampTz *first)
{
	Oid			types[5];
	Datum		args[5];
	char		nulls[5];
	Datum	   *upto = palloc(sizeof(Datum) * Max(n, 1));
	uint64		rows;

	for (int i = 0; i < n; i++)
	{
		upto[i] = TimestampTzGetDatum(bounds[i]);
		first[i] = DT_NOEND;
	}
	group_args(groups, n, types, args, nulls);
	types[4] = TIMESTAMPTZARRAYOID;
	args[4] = PointerGetDatum(construct_array(upto, n, TIMESTAMPTZOID, sizeof(TimestampTz),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	nulls[4] = ' ';

	/*
	 * every waiting task of the group, of any queue or partition: no floor
	 * passes one; none past its bound, which no floor passes either
	 */
	rows = ds_store_execute(&first_waiting_tasks_plan,
							"SELECT u.i, (SELECT pg_catalog.min(s.next_attempt_at)"
							"  FROM durable_steps.steps s"
							"  WHERE s.task OPERATOR(pg_catalog.=) u.task COLLATE pg_catalog.\"C\""
							"   AND s.owner::pg_catalog.oid OPERATOR(pg_catalog.=) u.owner"
							"   AND s.priority OPERATOR(pg_catalog.=) u.priority"
							"   AND s.next_attempt_at IS NOT NULL AND s.task IS NOT NULL"
							"   AND s.next_attempt_at OPERATOR(pg_catalog.>=) u.floor"
							"   AND s.next_attempt_at OPERATOR(pg_catalog.<=) u.upto"
							"   AND s.status OPERATOR(pg_catalog.=) ANY ('{pending,retrying}'))"
							" FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]),"
							"  pg_catalog.unnest($2::pg_catalog.oid[]), pg_catalog.unnest($3::pg_catalog.int4[]),"
							"  pg_catalog.unnest($4::pg_catalog.timestamptz[]),"
							"  pg_catalog.unnest($5::pg_catalog.timestamptz[]))"
							"  WITH ORDINALITY u(task, owner, priority, floor, upto, i)",
							5, types, args, nulls, false, 0, SPI_OK_SELECT, "first waiting tasks");
	for (uint64 r = 0; r < rows; r++)
	{
		bool		isnull;
		int64		i = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1,
													&isnull));
		Datum		t = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2, &isnull);

		if (!isnull && i >= 1 && i <= n)
			first[i - 1] = DatumGetTimestampTz(t);
	}
}

static SPIPlanPtr queue_limit_plan = NULL;

int64
ds_store_task_queue_room(const char *queue)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;
	int32		concurrency;
	int64		running;

	args[0] = CStringGetTextDatum(queue);
	if (ds_store_execute(&queue_limit_plan,
						 "SELECT concurrency FROM durable_steps.queues WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
						 1, types, args, NULL, false, 0, SPI_OK_SELECT, "queue limit query") == 0)
		return -1;
	concurrency = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											  &isnull));
	if (isnull)
		return -1;
	(void) ds_store_execute(&running_in_queue_plan,
							"SELECT pg_catalog.count(*) FROM durable_steps.steps"
							" WHERE running_queue OPERATOR(pg_catalog.=) $1",
							1, types, args, NULL, false, 0, SPI_OK_SELECT, "running step count");
	running = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
										  &isnull));
	return Max(concurrency - running, 0);
}

uint64
ds_store_mark_tasks_running(ArrayType *tids, TimestampTz now, int pid, const char *worker,
							Interval *lease)
{
	Oid			types[5] = {TIDARRAYOID, TIMESTAMPTZOID, INT4OID, TEXTOID, INTERVALOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', worker ? ' ' : 'n', ' '};

	args[0] = PointerGetDatum(tids);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int32GetDatum(pid);
	args[3] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
	args[4] = IntervalPGetDatum(lease);
	ds_due_floor_note_task_left_waiting();
	return ds_store_claim_by_tid(&mark_tasks_plan,

	/*
	 * running_queue holds the queue whatever its limit: the leases are read
	 * through steps_limited_running_idx, which then holds every one
	 */
								 "UPDATE durable_steps.steps s SET status = 'running',"
								 "  attempts = s.attempts OPERATOR(pg_catalog.+) 1, updated_at = $2,"
								 "  lease_expires_at = $2 OPERATOR(pg_catalog.+) CASE WHEN s.timeout IS NULL THEN $5"
								 "   ELSE least($5, s.timeout) END,"
								 "  claimed_by = $3, running_queue = s.queue, worker = $4"
								 " WHERE s.ctid OPERATOR(pg_catalog.=) ANY ($1) AND s.next_attempt_at IS NOT NULL"
								 "  AND s.task IS NOT NULL"
								 "  AND s.status OPERATOR(pg_catalog.=) ANY ('{pending,retrying}')"
								 " RETURNING s.run_id, s.step_id, s.task, s.input, s.attempts,"
								 "  s.attempt_base OPERATOR(pg_catalog.+) s.max_attempts, s.lease_expires_at,"
								 "  $2 OPERATOR(pg_catalog.+) s.timeout, s.priority, s.next_attempt_at",
								 5, types, args, nulls, "claiming tasks");
}

uint64
ds_store_expired_task_leases(TimestampTz now, int limit)
{
	Oid			types[2] = {TIMESTAMPTZOID, INT4OID};
	Datum		args[2];

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	return ds_store_execute(&expired_plan,
							"SELECT run_id, step_id FROM durable_steps.steps"
							" WHERE running_queue IS NOT NULL AND task IS NOT NULL"
							" AND status OPERATOR(pg_catalog.=) 'running' AND lease_expires_at OPERATOR(pg_catalog.<=) $1"
							" AND durable_steps.ds_partition_owned(run_id)"
							" LIMIT $2",
							2, types, args, NULL, false, 0, SPI_OK_SELECT,
							"expired task lease query");
}

TimestampTz
ds_store_next_task_lease_end(void)
{
	return ds_store_query_time(&next_lease_end_plan,
							   "SELECT pg_catalog.min(lease_expires_at) FROM durable_steps.steps"
							   " WHERE running_queue IS NOT NULL AND task IS NOT NULL"
							   " AND status OPERATOR(pg_catalog.=) 'running'"
							   " AND durable_steps.ds_partition_owned(run_id)",
							   0, NULL, NULL, NULL, "next task lease end");
}

/* The statements of ds_store_next_task_time: the first waiting task in index order; the earliest. */
#define FIRST_TASK_TIME(groups, range) \
	"SELECT pg_catalog.min((SELECT s.next_attempt_at" WAITING_TASKS_OF_GROUP("$2", range) \
	"  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $4" \
	"  ORDER BY s.priority, s.next_attempt_at LIMIT 1)) FROM " groups
#define EARLIEST_TASK_TIME(groups, range) \
	"SELECT pg_catalog.min((SELECT pg_catalog.min(s.next_attempt_at)" WAITING_TASKS_OF_GROUP("$2", range) \
	"  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $4)) FROM " groups

static SPIPlanPtr task_time_plans[2][2];

TimestampTz
ds_store_next_task_time(ArrayType *tasks, ArrayType *queues, Oid caller, TimestampTz upto,
						bool earliest, const DueTaskGroup *groups, int n_groups)
{
	static const char *const sql[2][2] = {
		{FIRST_TASK_TIME(TASK_GROUPS_FROM_START, WHOLE_RANGE), FIRST_TASK_TIME(TASK_GROUPS_WITH_FLOORS, FLOOR_RANGE)},
		{EARLIEST_TASK_TIME(TASK_GROUPS_FROM_START, WHOLE_RANGE), EARLIEST_TASK_TIME(TASK_GROUPS_WITH_FLOORS, FLOOR_RANGE)},
	};
	Oid			types[8] = {TEXTARRAYOID, TEXTARRAYOID, OIDOID, TIMESTAMPTZOID,
	TEXTARRAYOID, OIDARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID};
	Datum		args[8];
	char		nulls[8] = {' ', queues ? ' ' : 'n', ' ', ' ', 'n', 'n', 'n', 'n'};
	int			with_floors = n_groups >= 0;

	args[0] = PointerGetDatum(tasks);
	args[1] = PointerGetDatum(queues);
	args[2] = ObjectIdGetDatum(caller);
	args[3] = TimestampTzGetDatum(upto);
	if (with_floors)
		group_args(groups, n_groups, &types[4], &args[4], &nulls[4]);

	/*
	 * without `earliest`, the first in index order: one entry read when a
	 * task is due
	 */
	return ds_store_query_time(&task_time_plans[earliest][with_floors], sql[earliest][with_floors],
							   8, types, args, nulls,
							   earliest ? "next waiting task" : "first waiting task");
}
