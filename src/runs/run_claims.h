/*
 * run_claims.h -- the worker's statements on the runs it takes up (run_claims.c): claiming due
 * runs, locking a claimed run's row for its turn, recovering turns whose executor is gone, and
 * waking runs for events.
 */
#ifndef DS_RUN_CLAIMS_H
#define DS_RUN_CLAIMS_H

#include "base/compat.h"
#include "storage/itemptr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "store/run_store.h"

typedef struct ClaimedRun
{
	char	   *run_id;
	char	   *workflow;		/* qualified signature */
	Jsonb	   *input;
	Jsonb	   *policy;			/* NULL = none */
	Oid			owner;
	char	   *search_path;
	int			turn;			/* the number of the turn running next (the
								 * runs row's turns) */
	ItemPointerData row_tid;	/* the run's row version: found by
								 * ds_lock_claimed_run, moved by each write */
	int			lost_turns;		/* turns lost in a row before this claim; 0
								 * after a turn */

	/*
	 * the runs row's unrecorded_attempts, and whether a turn changed them
	 * (written with the turn's outcome)
	 */
	int			n_unrecorded;
	UnrecordedAttempt *unrecorded;
	bool		unrecorded_changed;
	MemoryContext cxt;			/* where the claim lives: what the turns cache
								 * goes here too */

	/*
	 * the statement that calls the workflow, looked up by the claim's first
	 * turn
	 */
	char	   *statement;
	bool		returns_value;
} ClaimedRun;

/*
 * In the current transaction, claim up to `limit` due runs: lock their rows (skipping rows others
 * hold), take each run's session lock, mark them running with this process as claimant (each
 * claim counts one turn). The caller commits, then runs turns (ds_run_turn), never two of one run
 * in one transaction, and releases the run's session lock after the turn that lets it go has
 * committed.
 */
extern int	ds_claim_due_runs(int limit, MemoryContext cxt, ClaimedRun **runs);

/*
 * Record on step `step_id` of run `run_id` an attempt a turn of the run ran and lost (its
 * SQLSTATE `sqlerrcode`: DS007 lost with the executor, 57014 interrupted) -- at once, before any
 * executor could take the step up as a plain step with the lost attempt's number -- when the step
 * exists, is the run owner's and waits for its next attempt; with `claimed_at` (not 0), the time
 * the lost turn was claimed, only when the step was due then and nobody touched it since (the
 * turn went first to it). Returns whether it was recorded; else the run keeps the attempt for the
 * step its next turn reaches (runs.unrecorded_attempts).
 */
extern bool ds_record_turn_attempt_on_step(const char *run_id, const char *step_id,
										   Oid run_owner, int sqlerrcode, TimestampTz claimed_at);

/*
 * Does a lost turn of run `run_id`, whose last committed turn left it at step `step_id` (NULL:
 * none yet), only record attempts earlier turns lost (`n` `entries`, the run's
 * unrecorded_attempts), without running a step's body? Its ds_run_step does when one of them
 * names the step, or names none and the turn reaches a step that does not exist yet (run_step.c):
 * unless the turn could have run `step_id` itself, the owner's SQL step waiting to run. Such a
 * turn, lost or interrupted, ran nothing more: the step is charged the attempts it was
 * recording, and no other.
 */
extern bool ds_turn_only_records(const char *run_id, const char *step_id, Oid run_owner, int n,
								 const UnrecordedAttempt *entries);

/*
 * Is the run still this claim's (not cancelled meanwhile)? In the current transaction, locks its
 * row for the turn and sets run->row_tid.
 */
extern bool ds_lock_claimed_run(ClaimedRun *run);

/*
 * In a new transaction after a turn that waits for `event` of `owner`: wake the run if it is
 * there. While an emit of that event has not committed, the run is woken after
 * durable_steps.poll_interval to look again (its turn replays to the wait), never waited for.
 */
extern void ds_wake_if_event_emitted(const char *run_id, Oid owner, const char *event);

/*
 * Wake every run that waits for an event already emitted: the look an executor takes after a
 * turn's commit (ds_wake_if_event_emitted) is lost with the executor if it ends between the two.
 * Run when a worker process has ended (ds_lost_attempts_epoch).
 */
extern void ds_wake_runs_with_emitted_events(void);

/*
 * In the current transaction, find runs left running by an executor that is gone and make them
 * due again (or failed, past the run's max_attempts lost turns in a row). Returns the runs
 * found; their session locks are held: release them after commit.
 */
extern int	ds_recover_lost_turns(int limit, MemoryContext cxt, char ***run_ids);

/* The earliest next_wake_at of a pending or waiting run; 0 when there is none. */
extern TimestampTz ds_next_run_wake_time(void);

#endif							/* DS_RUN_CLAIMS_H */
