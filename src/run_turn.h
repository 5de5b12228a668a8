/*
 * run_turn.h -- the worker's side of runs: claiming due turns, running one, recovering lost ones.
 */
#ifndef DS_RUN_TURN_H
#define DS_RUN_TURN_H

#include "compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

typedef struct ClaimedRun
{
	char	   *run_id;
	char	   *workflow;		/* qualified signature */
	Jsonb	   *input;
	Jsonb	   *policy;			/* NULL = none */
	Oid			owner;
	char	   *search_path;
	int			turn;			/* the number of the turn running next (the runs row's turns) */
	int			lost_turns;		/* turns lost in a row before this claim; 0 after a turn */
	MemoryContext cxt;			/* where the claim lives: what the turns cache goes here too */
	/* the statement that calls the workflow, looked up by the claim's first turn */
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
 * In the current transaction (the session user already the run's owner): run one turn of the
 * workflow, as its owner and isolated like a worker attempt, and record how it ended. When the
 * run now waits for an event, *awaited is its name: look again once committed
 * (ds_wake_if_event_emitted), for an emit that committed while the turn ran.
 *
 * Returns true when the run goes on at once and `may_continue` allowed the executor to keep it:
 * the run stays running and claimed, its next turn is counted in this transaction (run->turn is
 * that turn's number), and the caller runs that turn in a later transaction -- after this one
 * committed -- without claiming it again. Returns false when the run is let go: recorded
 * finished, waiting or blocked (due at once, when it can go on), or no longer this claim's.
 */
extern bool ds_run_turn(ClaimedRun *run, bool may_continue, char **awaited);

/* In a new transaction after a turn that waits for `event`: wake the run if it is there. */
extern void ds_wake_if_event_emitted(const char *run_id, const char *event);

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

#endif							/* DS_RUN_TURN_H */
