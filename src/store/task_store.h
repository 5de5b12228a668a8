/*
 * task_store.h -- the statements of tasks (task_store.c): their claims by name, their leases, and
 * the looks of the sessions that wait for them (docs/tasks.md). Tasks wait in an index of their
 * own, steps_task_due_idx (task, owner, priority, next_attempt_at); a running task's queue is in
 * running_queue whatever the queue's limit, so steps_limited_running_idx holds every lease.
 *
 * Each runs inside the caller's SPI connection (ds_store_spi_begin), as the tables' owner, and
 * leaves the rows it read in SPI_tuptable, their columns as each says, until ds_store_spi_end.
 */
#ifndef DS_TASK_STORE_H
#define DS_TASK_STORE_H

#include "base/compat.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "ipc/due_floors.h"

/*
 * The due tasks named in `tasks` (and of `queues` unless it is NULL) that role `caller` has the
 * privileges of, whose runs' partition this server owns, locked (FOR UPDATE SKIP LOCKED): at most
 * `limit`, by priority, then in turn between their owners (every owner's first before any
 * owner's second), then due time. Rows (ctid tid, queue text). The groups[0..n_groups-1] are
 * read from their floors (steps/task_floors.h); with n_groups -1, every (name, owner) from its
 * start.
 */
extern uint64 ds_store_lock_due_tasks(ArrayType *tasks, ArrayType *queues, Oid caller, int limit,
									  TimestampTz now, const DueTaskGroup *groups, int n_groups);

/*
 * The task groups with waiting tasks: rows (task text, owner oid, priority int4), of any queue
 * or partition.
 */
extern uint64 ds_store_waiting_task_groups(void);

/*
 * first[i]: the first waiting task of groups[i] (of any queue or partition) from its floor and
 * no later than bounds[i]; DT_NOEND when none is.
 */
extern void ds_store_first_waiting_tasks(const DueTaskGroup *groups, const TimestampTz *bounds,
										 int n, TimestampTz *first);

/*
 * The room left under queue `queue`'s limit: its concurrency less the steps running against it
 * (running_queue), at least 0; -1 when it has no limit. Its row is locked first (FOR UPDATE), so
 * that the claims of one queue count in turn.
 */
extern int64 ds_store_task_queue_room(const char *queue);

/*
 * Mark the locked tasks at `tids` running for attempt attempts + 1, claimed at `now` by backend
 * `pid` and worker `worker` (may be NULL), their lease `lease` long and never past their
 * deadline. Rows (run_id, step_id, task, input, attempt, max_attempts, lease_expires_at,
 * deadline): the deadline NULL without a timeout.
 */
extern uint64 ds_store_mark_tasks_running(ArrayType *tids, TimestampTz now, int pid,
										  const char *worker, Interval *lease);

/*
 * Running tasks whose lease ran out by `now`, of runs whose partition this server owns: at most
 * `limit` rows (run_id, step_id).
 */
extern uint64 ds_store_expired_task_leases(TimestampTz now, int limit);

/* The earliest end of a running task's lease; 0 when no task runs. */
extern TimestampTz ds_store_next_task_lease_end(void);

/*
 * When a task named in `tasks` (and of `queues` unless it is NULL) that role `caller` has the
 * privileges of waits for, if it is `upto` or earlier; 0 when none is. With `earliest`, the
 * earliest such time (reading every one up to `upto`); without it, the first found in index
 * order (reading one when one is due). In the latest snapshot. The groups as for
 * ds_store_lock_due_tasks.
 */
extern TimestampTz ds_store_next_task_time(ArrayType *tasks, ArrayType *queues, Oid caller,
										   TimestampTz upto, bool earliest,
										   const DueTaskGroup *groups, int n_groups);

#endif							/* DS_TASK_STORE_H */
