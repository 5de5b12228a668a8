/*
 * step_claim_store.h -- the statements of the claims of steps (step_claim_store.c): the SQL
 * executors' (worker/step_claims.c) and the HTTP worker's (worker/http_claims.c). The policy --
 * which queue, how many, for whom -- is the callers'; these read and mark the rows.
 *
 * Each runs inside the caller's SPI connection (ds_store_spi_begin), as the tables' owner, and
 * leaves the rows it read in SPI_tuptable, their columns as each says, until ds_store_spi_end.
 */
#ifndef DS_STEP_CLAIM_STORE_H
#define DS_STEP_CLAIM_STORE_H

#include "base/compat.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "ipc/due_floors.h"

/*
 * Every (queue, priority) group with waiting steps (pending, retrying; of any kind but tasks, and
 * partition), found by walking steps_due_idx from group to group from their start: rows (queue
 * text, priority int4) in (queue, priority) order, the queue in byte order (C collation).
 */
extern uint64 ds_store_waiting_groups(void);

/*
 * The earliest next_attempt_at, from `floor` to `upto`, of a waiting step of group (queue,
 * priority), of any kind but tasks, any owner or partition; DT_NOEND when there is none. A look of
 * ds_due_floor_look.
 */
extern TimestampTz ds_store_first_waiting_time(const char *queue, int32 priority,
											   TimestampTz floor, TimestampTz upto);

/* Is a transaction of this database prepared (PREPARE TRANSACTION) and not yet ended? */
extern bool ds_store_prepared_transactions(void);

/*
 * Of the `n` groups (in (queue, priority) order, each read from its floor), those with due SQL
 * steps whose runs' partition this server owns, in that order: rows (queue text, concurrency
 * int4 or NULL when the queue has no row, priority int4). `now` bounds the due times.
 */
extern uint64 ds_store_due_queues(TimestampTz now, const DueGroup *groups, int n);

/*
 * Lock queue `queue`'s row (FOR UPDATE SKIP LOCKED). False when another transaction holds it or
 * it is gone; else its concurrency in *concurrency, or *unlimited when it is NULL.
 */
extern bool ds_store_lock_queue_row(const char *queue, int *concurrency, bool *unlimited);

/* The steps counted against queue `queue` (running_queue): rows (owner oid, count int8). */
extern uint64 ds_store_running_by_owner(const char *queue);

/*
 * Up to `limit` SQL steps of `queue` at `priority` due at `now` and not before `floor`, earliest
 * due first, passing
 * the first `offset` and the rows at passed_tids (tid[]), without row locks: rows (run_id text,
 * step_id text, ctid tid, owner oid). With passed_owners (oid[]), a limited queue's share: the
 * rows of those owners are passed too, over a window of the first `window` rows of the range.
 */
extern uint64 ds_store_read_due_steps(const char *queue, int32 priority, TimestampTz floor,
									  int limit, TimestampTz now, ArrayType *passed_tids,
									  int offset);
extern uint64 ds_store_read_due_steps_share(const char *queue, int32 priority,
											TimestampTz floor, int limit, TimestampTz now,
											ArrayType *passed_tids, int offset, int window,
											ArrayType *passed_owners);

/*
 * Mark the rows at `tids` (tid[]) that are still waiting and due at `now` running, claimed by
 * process `pid`: attempt counted, lease from `now` for the step's timeout or `default_timeout`,
 * at most `ceiling`; counted against their queue when `limited`. Rows: every step column (of
 * ds_step_column_list()) and the ctid, for ds_store_record_from_tuple(..., 0, ...).
 */
/*
 * Run `sql`, an UPDATE ... WHERE ctid = ANY (...) RETURNING of a claim, kept in *slot (prepared
 * on first use) with its rows found by their ctid (a TID scan), never through an index of waiting
 * steps: the rows it returned are in SPI_tuptable. `what` names it in its error.
 */
extern uint64 ds_store_claim_by_tid(SPIPlanPtr *slot, const char *sql, int nargs, Oid *types,
									Datum *args, const char *nulls, const char *what);

extern uint64 ds_store_mark_steps_running(ArrayType *tids, TimestampTz now, int pid,
										  Interval *ceiling, Interval *default_timeout,
										  bool limited);

/*
 * Every running step whose outcome was not kept for an executor, in a partition owned here:
 * rows (run_id text, step_id text).
 */
extern uint64 ds_store_read_running_steps(void);

/* Up to `limit` running steps with a kept outcome, oldest first: rows (run_id, step_id). */
extern uint64 ds_store_read_kept_outcomes(int limit);

/*
 * The earliest next_attempt_at of a due-or-waiting SQL step of the `n` groups, each read from its
 * floor, in a queue with room under its limit (a partition owned here); 0 when there is none.
 */
extern TimestampTz ds_store_next_due_step_time(const DueGroup *groups, int n);

/*
 * Up to `limit` HTTP steps due at `now` and not before `floor`, earliest due first, of owners not in `capped` (oid[]),
 * in a partition owned here, their rows locked (FOR UPDATE SKIP LOCKED): rows (run_id text,
 * step_id text, ctid tid, owner oid).
 */
extern uint64 ds_store_lock_due_http_steps(int limit, TimestampTz now, ArrayType *capped,
										   TimestampTz floor);

/*
 * The earliest next_attempt_at, from `floor` on, of a due-or-waiting HTTP step owned here; 0
 * when none.
 */
extern TimestampTz ds_store_next_due_http_time(TimestampTz floor);

#endif							/* DS_STEP_CLAIM_STORE_H */
