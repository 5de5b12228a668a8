/*
 * run_store.h -- the owner of durable_steps.runs (run_store.c): the statuses of a run, the
 * columns a turn writes and their writer, and the statements on a run's row that the layers
 * below the runs make (waking a run when its step changes).
 */
#ifndef DS_RUN_STORE_H
#define DS_RUN_STORE_H

#include "base/compat.h"
#include "executor/spi.h"
#include "storage/itemptr.h"
#include "utils/array.h"

/* The statuses of a run (docs/runs.md, "Run states"), stored by name. */
typedef enum RunStatus
{
	RUN_PENDING,
	RUN_RUNNING,
	RUN_WAITING,
	RUN_BLOCKED,
	RUN_SUCCEEDED,
	RUN_FAILED,
	RUN_CANCELLED
} RunStatus;

extern const char *ds_run_status_name(RunStatus status);

/* The status named `name` (a stored status column); an unknown name raises an error. */
extern RunStatus ds_run_status_from_name(const char *name);

/* The columns of durable_steps.runs that a turn writes without a statement. */
typedef enum RunColumn
{
	RUN_COL_STATUS,
	RUN_COL_OUTPUT,
	RUN_COL_NEXT_WAKE_AT,
	RUN_COL_WAIT_REASON,
	RUN_COL_CURRENT_STEP,
	RUN_COL_WAIT_EVENT,
	RUN_COL_ERROR_CODE,
	RUN_COL_ERROR_MESSAGE,
	RUN_COL_ERROR_DETAIL,
	RUN_COL_CLAIMED_BY,
	RUN_COL_LEASE_EXPIRES_AT,
	RUN_COL_LOST_TURNS,
	RUN_COL_UPDATED_AT,
	RUN_COL_FINISHED_AT,
	RUN_COL_TURNS,
	RUN_COL_UNRECORDED_ATTEMPTS,
	N_RUN_COLUMNS
} RunColumn;

/* A new row version of a run being written: the columns set so far and their values. */
typedef struct RunWrite
{
	int			n;
	AttrNumber	attnums[N_RUN_COLUMNS];
	Datum		values[N_RUN_COLUMNS];
	bool		nulls[N_RUN_COLUMNS];
} RunWrite;

/* Set column `col` of the write (NULL when isnull). */
extern void ds_run_write_column(RunWrite *w, RunColumn col, Datum value, bool isnull);

/* Set text column `col` of the write from a C string (NULL for SQL NULL). */
extern void ds_run_write_text(RunWrite *w, RunColumn col, const char *text);

/* Set the status of the write. */
extern void ds_run_write_status(RunWrite *w, RunStatus status);

/*
 * Write run `run_id`'s new row version (updated_at set now) over the version at *tid, without a
 * statement (direct_write.c): the caller holds the row's lock, the one that serializes its
 * writers. *tid then names the new version.
 */
extern void ds_run_write_row(const char *run_id, ItemPointer tid, RunWrite *w);

/*
 * One entry of runs.unrecorded_attempts, stored as "SQLSTATE:step_id" or "SQLSTATE": an attempt
 * a lost or interrupted turn may have run, whose record rolled back with the turn.
 */
typedef struct UnrecordedAttempt
{
	int			sqlerrcode;		/* DS007 lost with the executor, 57014
								 * interrupted */

	/*
	 * the step it was an attempt of; NULL: a step the turn was creating,
	 * unknown
	 */
	char	   *step_id;
} UnrecordedAttempt;

/* The entries of an unrecorded_attempts value (text[]), in the current memory context. */
extern int	ds_run_unrecorded_from_array(ArrayType *array, UnrecordedAttempt **entries);

/* Write `n` entries as the run's unrecorded_attempts (NULL when there are none). */
extern void ds_run_write_unrecorded(RunWrite *w, int n, const UnrecordedAttempt *entries);

/*
 * Run one statement on durable_steps.runs with $1 = `run_id` (a text), kept in *slot, as the
 * extension's own statement; returns the rows it touched.
 */
extern uint64 ds_run_statement(SPIPlanPtr *slot, const char *sql, const char *run_id);

/*
 * A step of run `run_id` was re-armed (ds_retry_step): a run that waits for it, or is blocked
 * on it, takes its next turn now.
 */
extern void ds_run_wake_for_step(const char *run_id);

/*
 * Step `step_id` of run `run_id`, whose outcome another process records (an HTTP step the HTTP
 * worker sends, a task an application worker runs), has an outcome the run must see (it
 * succeeded, failed, was cancelled, or waits for a person): a run waiting for it takes its next
 * turn now. A turn of that run in flight is waited for (its row lock), so that a turn that read
 * the step before this outcome committed is woken once it has recorded its wait.
 */
extern void ds_run_wake_for_step_outcome(const char *run_id, const char *step_id);

/*
 * The queue of the run's step `step_id` ('default' for a new one) when it is paused
 * (ds_set_queue(name, 0)), else NULL: a turn then leaves the step's attempt for later.
 */
extern char *ds_run_step_paused_queue(const char *run_id, const char *step_id);

/* The reason a run waits for its step's paused queue `queue`, which ds_set_queue wakes. */
#define DS_RUN_QUEUE_PAUSED_REASON "queue %s is paused"

/* Wake the runs waiting for queue `queue` to be opened again (ds_set_queue), at commit. */
extern void ds_run_wake_for_queue(const char *queue);

/*
 * Run `run_id` finished: when it is a child run (docs/runs.md, "Child runs"), wake its parent if
 * it waits at the step that started it (ds_join_child). Only a run id with a '/' can be a child's:
 * for the others nothing is read.
 */
extern void ds_run_wake_parent(const char *run_id);

/* Has the child run of step `step_id` of run `run_id` ended (latest snapshot)? */
extern bool ds_run_child_ended(const char *run_id, const char *step_id);

#endif							/* DS_RUN_STORE_H */
