/*
 * step_isolation.c -- running another role's step body inside the worker's superuser session.
 *
 * An executor is one long-lived session connected as the bootstrap superuser, and it runs the
 * bodies of every role's steps. Switching the current user is not enough for that (docs/security.md): code can be left behind to run later -- at the worker's commit, in the next
 * role's attempt, or whenever the worker's own statements run -- with the worker's privileges,
 * and session state (temporary objects, prepared statements, cursors, sequence values) would pass
 * from one role's attempt to the next. So a worker attempt runs the way PostgreSQL runs table
 * owners' code in VACUUM and REFRESH MATERIALIZED VIEW, and a little more:
 *
 *   - the session user becomes the step's owner (session_user, is_superuser and everything keyed
 *     on them answer for the owner, not for the worker), and the current user too, inside a
 *     security-restricted operation: no WITH HOLD cursor, temporary table, LISTEN, PREPARE,
 *     DISCARD, SET ROLE or SET SESSION AUTHORIZATION, and no deferred trigger that would fire
 *     at commit;
 *   - deferrable constraints are checked at the end of each statement (SET CONSTRAINTS ALL
 *     IMMEDIATE), so that nothing of the body is left queued for the shared commit;
 *   - the restricted operation refuses temporary tables, but not the temporary schema itself
 *     nor functions, operators, types and the other objects that can be made in pg_temp: after
 *     the body (and after a hook) everything in the session's temporary schema is dropped, as
 *     DISCARD TEMP would, so no temporary object of any kind outlives the attempt to be called
 *     by a later one, which may be another role's;
 *   - after the body, still as its owner, its cursors and portals are closed and the sequence
 *     values it saw forgotten, as DISCARD ALL would; its session-level advisory locks go with
 *     the shared transaction (executor.c, step_lock.c);
 *   - the worker's shared transactions hold one owner's attempts each: the session user is set
 *     for the whole group (two GUC changes per attempt were a seventh of a drained step's CPU),
 *     and at its end random() is seeded afresh, so that a setseed() of one role never chooses
 *     another's numbers.
 *
 * Every setting, the session user included, is undone by the attempt's GUC nest level.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/guc.h"
#include "utils/portal.h"

#include "steps/step_isolation.h"

void
ds_isolation_init_session(void)
{
	/*
	 * A background worker's session_authorization is the boot value NULL, and
	 * popping a GUC back to NULL does nothing. Give it the real value, so
	 * that the end of every attempt puts the session user back to the
	 * worker's own.
	 */
	SetConfigOption("session_authorization", GetUserNameFromId(GetSessionUserId(), false),
					PGC_SUSET, PGC_S_OVERRIDE);
}

/* Seed random() afresh: a seed set by one role's setseed() must not choose the next one's. */
void
ds_isolation_reseed_random(void)
{
	uint32		seed;

	if (!pg_strong_random(&seed, sizeof(seed)))
		seed = (uint32) GetCurrentTimestamp();
	(void) DirectFunctionCall1(setseed, Float8GetDatum((double) seed / PG_UINT32_MAX * 2.0 - 1.0));
}

/* Make `owner` the session user, in the current GUC nest level. */
static void
become_session_user(Oid owner)
{
	(void) set_config_option("session_authorization", GetUserNameFromId(owner, false),
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

int
ds_isolation_begin_owner(Oid owner)
{
	int			level = NewGUCNestLevel();

	/* a dropped owner's steps fail closed without running: nobody to become */
	if (GetUserNameFromId(owner, true) != NULL)
		become_session_user(owner);
	return level;
}

void
ds_isolation_end_owner(int level)
{
	AtEOXact_GUC(true, level);
	ds_isolation_reseed_random();
}

void
ds_isolation_enter(Oid owner, int save_sec_context)
{
	ConstraintsSetStmt *all_immediate = makeNode(ConstraintsSetStmt);

	/*
	 * normally the owner's group made it so already; otherwise, for this
	 * attempt only
	 */
	if (GetSessionUserId() != owner)
		become_session_user(owner);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	all_immediate->constraints = NIL;
	all_immediate->deferred = false;
	AfterTriggerSetState(all_immediate);
}

void
ds_isolation_reset_session(void)
{
	Oid			temp_namespace;
	Oid			temp_toast_namespace;

	/* the worker itself keeps no portal, sequence value or temporary object */
	PortalHashTableDeleteAll();
	ResetSequenceCaches();

	/*
	 * a session that never made its temporary schema (the usual case) pays
	 * nothing here
	 */
	GetTempNamespaceState(&temp_namespace, &temp_toast_namespace);
	if (OidIsValid(temp_namespace))
		ResetTempTableNamespace();
}

void
ds_isolation_reset_after_abort(void)
{
	/* the abort closed the body's portals; not these */
	ResetSequenceCaches();
}
