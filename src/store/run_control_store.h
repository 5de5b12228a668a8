/*
 * run_control_store.h -- the statements on runs and a run's steps of the runs' SQL functions
 * (run_control_store.c): starting a run (ds_start_run), reading, cancelling and resuming one
 * (runs/runs.c), waiting for one (runs/waits.c), what a turn counts and cancels
 * (runs/workflow_calls.c, runs/run_turn.c). Who may do what is the callers' to decide.
 *
 * Those that say so run inside the caller's SPI connection (ds_store_spi_begin), as the tables'
 * owner, and leave the rows they read in SPI_tuptable, their columns as each says, until
 * ds_store_spi_end.
 */
#ifndef DS_RUN_CONTROL_STORE_H
#define DS_RUN_CONTROL_STORE_H

#include "base/compat.h"
#include "utils/jsonb.h"

/*
 * Insert run `run_id` (pending, due now) unless one has that id (ON CONFLICT DO NOTHING, which
 * waits for a concurrent insert of it): true when this one was inserted. `run_key` and `policy`
 * may be NULL. In the caller's SPI connection.
 */
extern bool ds_store_insert_run(const char *run_id, const char *workflow, Jsonb *input,
								const char *run_key, Jsonb *policy, Oid owner,
								const char *search_path);

/*
 * Has run `run_id` a step of a role `role` lacks the privileges of? Read in the latest snapshot.
 * In the caller's SPI connection.
 */
extern bool ds_store_run_has_foreign_steps(const char *run_id, Oid role);

/*
 * Run `run_id`'s definition: rows (workflow, input, owner oid, status, run_key), one at most. In
 * the caller's SPI connection.
 */
extern uint64 ds_store_read_run_definition(const char *run_id);

/* Does a run, or any step, exist under `run_id` (in this transaction's snapshot)? */
extern bool ds_store_run_id_in_use(const char *run_id);

/*
 * Run `run_id`, its row locked (FOR UPDATE) when `lock`: rows (status, owner oid, claimed_by,
 * turns), one at most. In the caller's SPI connection.
 */
extern uint64 ds_store_read_run(const char *run_id, bool lock);

/*
 * The steps of run `run_id` not finished (pending, retrying, running, blocked, uncertain) of
 * roles the run's owner has the privileges of, in step_id order: rows (step_id, running bool,
 * claimed_by, attempts). In the caller's SPI connection.
 */
extern uint64 ds_store_read_unfinished_run_steps(const char *run_id);

/*
 * Run `run_id` as the latest snapshot sees it: rows (status, output, error_code, error_message,
 * owner oid), one at most. In the caller's SPI connection.
 */
extern uint64 ds_store_read_run_latest(const char *run_id);

/*
 * Link run `child` to the step `step_id` of run `parent` that started it, unless it has a parent
 * already: true when it is (now) that step's child.
 */
extern bool ds_store_link_child_run(const char *child, const char *parent, const char *step_id);

/*
 * The children of run `parent` that have not finished: rows (run_id, owner oid), in run_id order. In the
 * caller's SPI connection.
 */
extern uint64 ds_store_unfinished_children(const char *parent);

/* How many steps run `run_id` has recorded, of every kind (its own SPI connection). */
extern int64 ds_store_count_run_steps(const char *run_id);

/* Run `run_id` cancelled by ds_cancel_run (its own SPI connection). */
extern void ds_store_cancel_run(const char *run_id);

/* Run `run_id` resumed by ds_resume_run: waiting, due now, its errors cleared. */
extern void ds_store_resume_run(const char *run_id);

/*
 * The steps of cancelled run `run_id` that have not finished and are not running, of roles the
 * run's owner has the privileges of, cancelled (its own SPI connection).
 */
extern void ds_store_cancel_run_steps(const char *run_id);

#endif							/* DS_RUN_CONTROL_STORE_H */
