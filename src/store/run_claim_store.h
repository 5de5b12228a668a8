/*
 * run_claim_store.h -- the statements of the worker's claims of runs (run_claim_store.c): the
 * policy -- which runs, when a lost turn is charged -- is runs/run_claims.c's.
 *
 * Each runs inside the caller's SPI connection (ds_store_spi_begin), as the tables' owner, and
 * leaves the rows it read in SPI_tuptable, their columns as each says, until ds_store_spi_end.
 */
#ifndef DS_RUN_CLAIM_STORE_H
#define DS_RUN_CLAIM_STORE_H

#include "base/compat.h"
#include "utils/array.h"
#include "utils/timestamp.h"

/*
 * Up to `limit` pending or waiting runs due now and not before `floor`, in a partition owned
 * here, earliest first, their rows locked (FOR UPDATE SKIP LOCKED): rows (run_id text).
 */
extern uint64 ds_store_lock_due_runs(int limit, TimestampTz floor);

/*
 * The earliest next_wake_at, from `floor` to `upto`, of a pending or waiting run of any
 * partition; DT_NOEND when there is none. A look of ds_due_floor_look.
 */
extern TimestampTz ds_store_first_waiting_run_time(TimestampTz floor, TimestampTz upto);

/*
 * Start a turn of each run of `run_ids` (text[]): running, turn counted, claimed by process
 * `pid`, lease `lease` from now. Rows (run_id, workflow, input, policy, owner oid, search_path,
 * turns, lost_turns, unrecorded_attempts).
 */
extern uint64 ds_store_claim_runs(ArrayType *run_ids, int pid, Interval *lease);

/* Lock run `run_id`'s row (FOR UPDATE): rows (status, claimed_by, turns, ctid), one at most. */
extern uint64 ds_store_lock_run_row(const char *run_id);

/*
 * Up to `limit` running runs in a partition owned here, their rows locked (FOR UPDATE SKIP
 * LOCKED): rows (run_id, lost_turns, policy, claimed_by, updated_at, turns, current_step,
 * owner oid, unrecorded_attempts).
 */
extern uint64 ds_store_lock_running_runs(int limit);

/*
 * Record that the turn of run `run_id` was lost: the run set to `status` ("failed" or
 * "waiting", woken now), its claim cleared, the turn counted in lost_turns when `counted`, the
 * attempt `sqlstate` added to its unrecorded attempts when `step_ran`; a failed run records
 * `sqlstate` as its error.
 */
extern void ds_store_record_lost_turn(const char *run_id, const char *status,
									  const char *sqlstate, bool step_ran, bool counted);

/*
 * The earliest next_wake_at, from `floor` on, of a pending or waiting run owned here; 0 when
 * none.
 */
extern TimestampTz ds_store_next_run_wake_time(TimestampTz floor);

#endif							/* DS_RUN_CLAIM_STORE_H */
