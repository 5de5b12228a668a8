/*
 * caller_guard.h -- another role's hook leaves nothing in a caller's session (docs/security.md, "Outcome hooks").
 *
 * When ds_resolve_step or ds_retry_step runs the hook of a step another role owns (a superuser's
 * session included), the hook runs in the caller's session as a security-restricted operation of
 * its owner. PostgreSQL then refuses what could run later with the caller's privileges (WITH
 * HOLD cursors, temporary tables, deferred triggers, SET ROLE); this guard takes care of the
 * rest: it does not run while the caller has a cursor open, which it could FETCH from with the
 * caller's privileges (42501, the call fails); a cursor the hook leaves open, or a temporary
 * object of any kind, fails the hook (its subtransaction rolls them back, 42501); a
 * session-level advisory lock it took is let go when the caller's transaction ends; random() is
 * seeded afresh after it.
 */
#ifndef DS_CALLER_GUARD_H
#define DS_CALLER_GUARD_H

#include "base/compat.h"
#include "nodes/pg_list.h"

/* What a session holds that a hook could leave behind (caller_guard.c reads it). */
typedef struct SessionState
{
	List	   *cursors;		/* names of the open portals */
	int64		temp_objects;	/* objects in the session's temporary schema */
	List	   *advisory;		/* advisory locks held, as text */
} SessionState;

typedef struct CallerGuard
{
	bool		active;			/* the caller is not the owner */
	SessionState before;		/* the session before the hook */
} CallerGuard;

/*
 * Before a hook of `owner` in a caller's session, as the caller: raises (42501) when the
 * session has a cursor open.
 */
extern void ds_caller_guard_begin(CallerGuard *guard, Oid owner);

/* After the hook's SQL, still in its subtransaction, as the caller: raises when it left state. */
extern void ds_caller_guard_end(CallerGuard *guard);

/*
 * After a hook that failed, its subtransaction rolled back: the session advisory locks it took
 * (which a rollback keeps) are let go at the end of the transaction too.
 */
extern void ds_caller_guard_after_abort(CallerGuard *guard);

#endif							/* DS_CALLER_GUARD_H */
