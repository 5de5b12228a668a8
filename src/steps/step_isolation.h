/*
 * step_isolation.h -- running another role's step body inside the worker's superuser session.
 */
#ifndef DS_STEP_ISOLATION_H
#define DS_STEP_ISOLATION_H

#include "base/compat.h"

/* Once per executor, in a transaction: make the session user restorable. */
extern void ds_isolation_init_session(void);

/*
 * Around a group of `owner`'s attempts in one worker transaction: the session user is the owner
 * until ds_isolation_end_owner(level), which also seeds random() afresh. Call end before commit.
 */
extern int	ds_isolation_begin_owner(Oid owner);
extern void ds_isolation_end_owner(int level);

/*
 * Become `owner` (session and current user) in a security-restricted operation, with every
 * deferrable constraint immediate. Call inside the attempt's subtransaction and GUC nest level.
 */
extern void ds_isolation_enter(Oid owner, int save_sec_context);

/* After a body that succeeded, still inside its subtransaction: drop what it left in the session. */
extern void ds_isolation_reset_session(void);

/* Seed random() afresh (after an owner's code ran outside an owner group: outcome hooks). */
extern void ds_isolation_reseed_random(void);

/* After a body that failed and was rolled back: drop what the rollback did not. */
extern void ds_isolation_reset_after_abort(void);

#endif							/* DS_STEP_ISOLATION_H */
