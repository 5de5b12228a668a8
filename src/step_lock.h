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

#endif							/* DS_STEP_LOCK_H */
