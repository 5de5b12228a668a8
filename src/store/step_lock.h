/*
 * step_lock.h -- the lock that says "this step identity is being executed right now".
 */
#ifndef DS_STEP_LOCK_H
#define DS_STEP_LOCK_H

#include "base/compat.h"
#include "utils/timestamp.h"

/*
 * Take the execution lock of (run_id, step_id) until the end of the transaction. With nowait,
 * return false instead of waiting when another transaction holds it.
 */
extern bool ds_step_lock_acquire(const char *run_id, const char *step_id, bool nowait);

/*
 * Like ds_step_lock_acquire, waiting at most until `until`: false when the lock is still held
 * then (or is held by this process).
 */
extern bool ds_step_lock_acquire_until(const char *run_id, const char *step_id, TimestampTz until);

/*
 * Does nobody hold the execution lock of (run_id, step_id)? Tried without waiting and let go of at
 * once: no attempt of the identity is in flight now (a worker's claim holds it to its outcome).
 */
extern bool ds_step_lock_is_free(const char *run_id, const char *step_id);

/*
 * The worker's form: a session-level lock, never waiting, taken before the claim that marks an
 * attempt started commits and released only after the attempt's outcome commits. While it is
 * held the attempt is in flight; once the process is gone, so is the lock, which is how a lost
 * attempt is recognised.
 */
extern bool ds_step_lock_try_session(const char *run_id, const char *step_id);
extern void ds_step_lock_release_session(const char *run_id, const char *step_id);

/*
 * Also hold an identity this process holds for its session until the end of the transaction.
 * While pinned, letting go of the session lock does not let go of the identity.
 */
extern void ds_step_lock_pin(const char *run_id, const char *step_id);

/*
 * Let go of every session-level advisory lock of this process: the claims' (pin those that must
 * stay, and take them again with ds_step_lock_try_session, which cannot fail while pinned) and any
 * a step body took with pg_advisory_lock() -- which must not outlive its attempt.
 */
extern void ds_step_lock_release_all_session(void);

/*
 * Lock run_id `run_id` to the end of the transaction: exclusive to store a run, shared to store a
 * new step outside a run's workflow (docs/runs.md: a run's steps are its workflow's). With
 * nowait, false instead of waiting for another transaction that holds it.
 */
extern bool ds_run_id_lock(const char *run_id, bool exclusive, bool nowait);

/*
 * Lock event `name` of role `owner` to the end of the transaction: exclusive while an emit records
 * it and wakes its waiting runs, shared while an executor looks once more for the event a run's
 * turn has just started waiting for (docs/runs.md, "Events"). Whichever comes second sees the
 * other's commit. With nowait, false instead of waiting for another transaction that holds it.
 */
extern bool ds_event_lock(Oid owner, const char *name, bool exclusive, bool nowait);

/*
 * Try to take the claim lock of queue `queue` to the end of the transaction, without waiting:
 * executors take turns to read a queue's due steps (step_claims.c).
 */
extern bool ds_queue_claim_lock_try(const char *queue);

/* Let go of it before the end of the transaction: nothing was claimed from the queue. */
extern void ds_queue_claim_lock_release(const char *queue);

#endif							/* DS_STEP_LOCK_H */
