/*
 * step_lock.h -- the lock that says "this step identity is being executed right now".
 */
#ifndef DS_STEP_LOCK_H
#define DS_STEP_LOCK_H

#include "compat.h"

/*
 * Take the execution lock of (run_id, step_id) until the end of the transaction. With nowait,
 * return false instead of waiting when another transaction holds it.
 */
extern bool step_lock_acquire(const char *run_id, const char *step_id, bool nowait);

/*
 * The worker's form: a session-level lock, never waiting, taken before the claim that marks an
 * attempt started commits and released only after the attempt's outcome commits. While it is
 * held the attempt is in flight; once the process is gone, so is the lock, which is how a lost
 * attempt is recognised.
 */
extern bool step_lock_try_session(const char *run_id, const char *step_id);
extern void step_lock_release_session(const char *run_id, const char *step_id);

#endif							/* DS_STEP_LOCK_H */
