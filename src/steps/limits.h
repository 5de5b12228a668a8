/*
 * limits.h -- rate limits and concurrency per key (docs/limits.md): the SQL functions that set
 * them, the check of a step that names one, the executors' admission of held steps, and the
 * pause of a key after a receiver's 429.
 */
#ifndef DS_LIMITS_H
#define DS_LIMITS_H

#include "base/compat.h"
#include "utils/timestamp.h"

#include "store/step_store.h"

/* The names of maps' own limits (runs/run_map.c): no step may name one in its policy. */
#define DS_MAP_LIMIT_PREFIX "ds_map:"

/*
 * A new step names limit `name` in its policy: the limit must exist (42704), and a step that
 * runs in its caller's transaction cannot wait for an admission (0A000, `synchronous`).
 */
extern void ds_limit_check_step(const char *name, bool synchronous);

/*
 * The executors' admission (executor.c), in the caller's transaction: make due the held steps
 * whose keys have a token and a free slot, each role's oldest first, the roles taking turns.
 * Returns how many it admitted; *next is when to look again (0: only when a commit asks, see
 * ds_limit_admission_at_commit).
 */
extern int	ds_admit_limited_steps(TimestampTz now, TimestampTz *next);

/*
 * The receiver of HTTP step `rec`, of a limit, answered 429 with a wait of `wait_usecs` (or
 * -1: none given): pause the step's key until then and hold the step again, its attempt given
 * back uncounted (docs/limits.md, "When the receiver says 429"). The caller writes `rec`.
 */
extern void ds_limit_pause_for_429(StepRecord *rec, int64 wait_usecs, TimestampTz now);

#endif							/* DS_LIMITS_H */
