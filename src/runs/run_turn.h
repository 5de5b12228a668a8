/*
 * run_turn.h -- the worker's side of runs: running one turn and recording how it ended.
 */
#ifndef DS_RUN_TURN_H
#define DS_RUN_TURN_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "runs/run_claims.h"



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





#endif							/* DS_RUN_TURN_H */
