/*
 * outcome_waits.h -- sessions that wait for a run or a step to stop (docs/steps.md, "Waiting for
 * a step"), and the commits that wake them.
 *
 * Waiters sleep on one of a fixed set of condition variables in shared memory, chosen by a hash
 * of the run_id (a step's waiters by its run's): a transaction that stops a step or writes a run
 * broadcasts that variable once it has committed, and each waiter woken reads its step or run
 * again. Two run_ids that share a variable only cost a waiter a read.
 */
#ifndef DS_OUTCOME_WAITS_H
#define DS_OUTCOME_WAITS_H

#include "base/compat.h"

#include "fmgr.h"

/* From _PG_init: reserve the condition variables (only when preloaded). */
extern void ds_outcome_waits_init_module(void);

/* Are there condition variables to wait on (the library was preloaded)? */
extern bool ds_outcome_waits_available(void);

/* Raise 55000 unless there are: a call that must wait cannot without the library preloaded. */
extern void ds_outcome_waits_require(void);

/* When the current transaction commits, wake the sessions waiting on run `run_id` or its steps. */
extern void ds_outcome_wake_at_commit(const char *run_id);

/*
 * May the wait of the SQL function called through `fcinfo` let go of the backend's xmin while it
 * sleeps? True only when nothing will read again with a snapshot older than the wait: the call
 * is the whole of a top-level `SELECT ... FROM f(...)` or `SELECT f(...)` over constants and
 * parameters, in READ COMMITTED, with no other snapshot or open cursor in the transaction
 * (docs/steps.md, "Waiting for a step"). A false answer costs only the horizon.
 */
extern bool ds_outcome_wait_may_release_xmin(FunctionCallInfo fcinfo);

/*
 * Wait until done(arg) is true or `timeout_ms` passed; done is called first, and again after
 * each wake-up of run `run_id`. Returns done's last answer. A cancel ends the wait with an error.
 * With `release_xmin` (ds_outcome_wait_may_release_xmin said so), the backend publishes no xmin
 * while it sleeps, so that VACUUM's horizon moves on; each done() reads with a snapshot of its
 * own, taken after the sleep.
 */
extern bool ds_outcome_wait(const char *run_id, int64 timeout_ms, bool release_xmin,
							bool (*done) (void *arg), void *arg);

#endif							/* DS_OUTCOME_WAITS_H */
