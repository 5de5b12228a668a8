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

static SPIPlanPtr due_tasks_plan = NULL;
static SPIPlanPtr running_in_queue_plan = NULL;
static SPIPlanPtr mark_tasks_plan = NULL;
static SPIPlanPtr expired_plan = NULL;
static SPIPlanPtr next_lease_end_plan = NULL;
static SPIPlanPtr next_task_plan = NULL;

/*
 * The waiting tasks of one name and one owner: a range of steps_task_due_idx (task, owner,
 * priority, next_attempt_at), read in (priority, next_attempt_at) order. `n.task` is the name,
 * `o.owner` the owner; parameter `queues` the queues, or NULL for all. A task of a paused or
 * full queue is not one: a wait must not end for a task no claim may take. Each owner is a range
 * of its own, so one role's backlog is never read by a claim of another role's tasks.
 */
#define WAITING_TASKS_OF_NAME(queues) \
	" FROM durable_steps.steps s" \
	" WHERE s.task OPERATOR(pg_catalog.=) n.task" \
	"  AND s.owner::pg_catalog.oid OPERATOR(pg_catalog.=) o.owner" \
	"  AND s.next_attempt_at IS NOT NULL" \
	"  AND s.task IS NOT NULL AND s.status OPERATOR(pg_catalog.=) ANY ('{pending,retrying}')" \
	"  AND (" queues "::pg_catalog.text[] IS NULL" \
	"       OR s.queue OPERATOR(pg_catalog.=) ANY (" queues "))" \
	"  AND NOT EXISTS (SELECT FROM durable_steps.queues q" \
	"   WHERE q.name OPERATOR(pg_catalog.=) s.queue AND q.concurrency IS NOT NULL" \
	"    AND q.concurrency OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(*)" \
	"     FROM durable_steps.steps r WHERE r.running_queue OPERATOR(pg_catalog.=) s.queue))" \
	"  AND durable_steps.ds_partition_owned(s.run_id)"

/*
 * The names of $1, each once, in the C collation of the task column, with every role whose
 * tasks role `caller` may run (its own, and those whose privileges it has): n(task), o(owner).
 */
#define TASK_NAMES_AND_OWNERS(caller) \
	"(SELECT DISTINCT u.task COLLATE pg_catalog.\"C\" AS task" \
	"  FROM pg_catalog.unnest($1::pg_catalog.text[]) u(task) WHERE u.task IS NOT NULL) n" \
	" CROSS JOIN (SELECT r.oid AS owner FROM pg_catalog.pg_roles r" \
	"  WHERE pg_catalog.pg_has_role(" caller ", r.oid, 'USAGE')) o"

uint64
ds_store_lock_due_tasks(ArrayType *tasks, ArrayType *queues, Oid caller, int limit,
						TimestampTz now)
{
	Oid			types[5] = {TEXTARRAYOID, TEXTARRAYOID, OIDOID, INT4OID, TIMESTAMPTZOID};
	Datum		args[5];
	char		nulls[5] = {' ', queues ? ' ' : 'n', ' ', ' ', ' '};

	args[0] = PointerGetDatum(tasks);
	args[1] = PointerGetDatum(queues);
	args[2] = ObjectIdGetDatum(caller);
	args[3] = Int32GetDatum(limit);
	args[4] = TimestampTzGetDatum(now);
	return ds_store_execute(&due_tasks_plan,

	/*
	 * Fair share between the owners: within a priority, every owner's first
	 * due task comes before any owner's second.
	 */
							"SELECT t.ctid, t.queue FROM " TASK_NAMES_AND_OWNERS("$3")
							" CROSS JOIN LATERAL (SELECT s.ctid, s.queue, s.priority, s.next_attempt_at,"
							"  s.owner" WAITING_TASKS_OF_NAME("$2")
							"  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $5"
							"  ORDER BY s.priority, s.next_attempt_at LIMIT $4"
							"  FOR UPDATE OF s SKIP LOCKED) t"
							" ORDER BY t.priority, pg_catalog.row_number() OVER"
							"  (PARTITION BY t.owner, t.priority ORDER BY t.next_attempt_at),"
							"  t.next_attempt_at LIMIT $4",
							5, types, args, nulls, false, 0, SPI_OK_SELECT, "due task query");
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
static SPIPlanPtr first_task_plan = NULL;

TimestampTz
ds_store_next_task_time(ArrayType *tasks, ArrayType *queues, Oid caller, TimestampTz upto,
						bool earliest)
{
	Oid			types[4] = {TEXTARRAYOID, TEXTARRAYOID, OIDOID, TIMESTAMPTZOID};
	Datum		args[4];
	char		nulls[4] = {' ', queues ? ' ' : 'n', ' ', ' '};

	args[0] = PointerGetDatum(tasks);
	args[1] = PointerGetDatum(queues);
	args[2] = ObjectIdGetDatum(caller);
	args[3] = TimestampTzGetDatum(upto);
	if (!earliest)
		/* the first in index order: one entry read when a task is due */
		return ds_store_query_time(&first_task_plan,
								   "SELECT pg_catalog.min((SELECT s.next_attempt_at"
								   WAITING_TASKS_OF_NAME("$2")
								   "  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $4"
								   "  ORDER BY s.priority, s.next_attempt_at LIMIT 1))"
								   " FROM " TASK_NAMES_AND_OWNERS("$3"),
								   4, types, args, nulls, "first waiting task");
	return ds_store_query_time(&next_task_plan,
							   "SELECT pg_catalog.min((SELECT pg_catalog.min(s.next_attempt_at)"
							   WAITING_TASKS_OF_NAME("$2")
							   "  AND s.next_attempt_at OPERATOR(pg_catalog.<=) $4))"
							   " FROM " TASK_NAMES_AND_OWNERS("$3"),
							   4, types, args, nulls, "next waiting task");
}
