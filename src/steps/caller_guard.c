/*
 * caller_guard.c -- another role's hook leaves nothing in a caller's session (caller_guard.h).
 *
 * What the session holds is read through PostgreSQL's own views (pg_cursors, pg_locks, the
 * catalogs of the temporary schema), before and after the hook. A session-level advisory lock
 * cannot be told from a transaction-level one while the transaction runs; a lock the hook took
 * that is still held once the transaction's locks are released is a session-level one, and is
 * let go then (a resource-release callback after the locks).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "steps/caller_guard.h"
#include "steps/step_isolation.h"

/* the open portals, the objects of the temporary schema, the advisory locks held */
#define STATE_QUERY \
	"SELECT (SELECT pg_catalog.array_agg(name) FROM pg_catalog.pg_cursors)," \
	" (SELECT pg_catalog.sum(n) FROM (" \
	"  SELECT pg_catalog.count(*) n FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_type WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_operator WHERE oprnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_opclass WHERE opcnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_opfamily WHERE opfnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_collation WHERE collnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_conversion WHERE connamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_statistic_ext WHERE stxnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_config WHERE cfgnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_dict WHERE dictnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_parser WHERE prsnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	"  UNION ALL SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_template WHERE tmplnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()" \
	" ) c)::pg_catalog.int8," \
	" (SELECT pg_catalog.array_agg(pg_catalog.concat_ws(' ', classid, objid, objsubid, mode))" \
	"   FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted" \
	"    AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())"

/* advisory locks a hook took, to let go of if still held when the transaction's locks are */
typedef struct HookLock
{
	LOCKTAG		tag;
	LOCKMODE	mode;
} HookLock;

static HookLock *hook_locks = NULL;
static int	n_hook_locks = 0;
static int	max_hook_locks = 0;
static bool callback_registered = false;

/*
 * The elements of a text[] value of column `col` of the one row read, as a List of strings in
 * `cxt` (SPI's memory goes with SPI_finish).
 */
static List *
text_array(int col, MemoryContext cxt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, &isnull);
	Datum	   *elems;
	int			n;
	List	   *out = NIL;
	MemoryContext old;

	if (isnull)
		return NIL;
	deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &n);
	old = MemoryContextSwitchTo(cxt);
	for (int i = 0; i < n; i++)
		out = lappend(out, TextDatumGetCString(elems[i]));
	MemoryContextSwitchTo(old);
	return out;
}

/* Is `s` one of the strings of `list`? */
static bool
has_string(List *list, const char *s)
{
	ListCell   *lc;

	foreach(lc, list)
		if (strcmp((const char *) lfirst(lc), s) == 0)
		return true;
	return false;
}

static void
read_state(SessionState *state)
{
	bool		isnull;
	MemoryContext cxt = CurrentMemoryContext;

	/*
	 * nothing of the hook's search_path (nor the caller's) takes part in the
	 * query
	 */
	int			guc_level = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * not read-only: the query must see what the hook's statements did (a new
	 * command id)
	 */
	if (SPI_execute(STATE_QUERY, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reading the session's state failed");
	state->cursors = text_array(1, cxt);
	state->temp_objects = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, 2, &isnull));
	state->advisory = text_array(3, cxt);
	SPI_finish();
	AtEOXact_GUC(true, guc_level);
}

void
ds_caller_guard_begin(CallerGuard *guard, Oid owner)
{
	ListCell   *lc;

	memset(guard, 0, sizeof(*guard));

	/*
	 * a superuser's session too: the owner's code must leave nothing there
	 * either
	 */
	guard->active = GetUserId() != owner;
	if (!guard->active)
		return;
	read_state(&guard->before);

	/*
	 * The hook could FETCH from the caller's cursors, whose queries read what
	 * the caller may (not the portal running this call, which no statement
	 * can fetch from)
	 */
	foreach(lc, guard->before.cursors)
	{
		const char *name = (const char *) lfirst(lc);

		if (ActivePortal == NULL || strcmp(name, ActivePortal->name) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("cannot run another role's hook while cursor \"%s\" is open", name),
					 errdetail("The hook could fetch from it with the privileges of this session's role."),
					 errhint("Close the session's cursors (CLOSE ALL) first.")));
	}
}

/* Resource release callback: the session-level advisory locks the hooks left are let go. */
static void
release_hook_locks(ResourceReleasePhase phase, bool isCommit, bool isTopLevel, void *arg)
{
	if (phase != RESOURCE_RELEASE_AFTER_LOCKS || !isTopLevel)
		return;
	for (int i = 0; i < n_hook_locks; i++)

		/*
		 * transaction-level ones are gone by now: one still held was taken
		 * for the session
		 */
		while (ds_lock_held_by_me(&hook_locks[i].tag, hook_locks[i].mode) &&
			   LockRelease(&hook_locks[i].tag, hook_locks[i].mode, true))
			;
	n_hook_locks = 0;
}

/* Remember advisory lock `text` ("classid objid objsubid mode", as pg_locks shows it). */
static void
remember_hook_lock(const char *text)
{
	unsigned int classid;
	unsigned int objid;
	int			objsubid;
	char		mode[32];
	HookLock   *l;

	if (sscanf(text, "%u %u %d %31s", &classid, &objid, &objsubid, mode) != 4)
		return;
	if (n_hook_locks == max_hook_locks)
	{
		max_hook_locks = Max(8, max_hook_locks * 2);
		hook_locks = hook_locks == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(HookLock) * max_hook_locks) :
			repalloc(hook_locks, sizeof(HookLock) * max_hook_locks);
	}
	l = &hook_locks[n_hook_locks++];

	/*
	 * pg_locks shows an advisory key as (classid, objid, objsubid): the
	 * fields of the tag
	 */
	SET_LOCKTAG_ADVISORY(l->tag, MyDatabaseId, classid, objid, objsubid);
	l->mode = strcmp(mode, "ShareLock") == 0 ? ShareLock : ExclusiveLock;
	if (!callback_registered)
	{
		RegisterResourceReleaseCallback(release_hook_locks, NULL);
		callback_registered = true;
	}
}

/* Remember the advisory locks held now that were not before the hook. */
static void
remember_new_locks(const CallerGuard *guard, const SessionState *now)
{
	ListCell   *lc;

	foreach(lc, now->advisory)
		if (!has_string(guard->before.advisory, (const char *) lfirst(lc)))
		remember_hook_lock((char *) lfirst(lc));
}

/* A name of `now` that was not in `before`; NULL when there is none. */
static const char *
new_name(List *before, List *now)
{
	ListCell   *lc;

	foreach(lc, now)
		if (!has_string(before, (const char *) lfirst(lc)))
		return (const char *) lfirst(lc);
	return NULL;
}

void
ds_caller_guard_end(CallerGuard *guard)
{
	SessionState now;
	const char *name;

	if (!guard->active)
		return;
	read_state(&now);

	/*
	 * first: a hook that fails below still took them, and its rollback does
	 * not let them go
	 */
	remember_new_locks(guard, &now);
	/* a setseed() of the hook must not choose the caller's numbers */
	ds_isolation_reseed_random();
	if ((name = new_name(guard->before.cursors, now.cursors)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("a hook run in another role's session may not leave cursor \"%s\" open", name),
				 errdetail("Its queries would run later with the privileges of the session's role.")));
	if (now.temp_objects > guard->before.temp_objects)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("a hook run in another role's session may not create temporary objects"),
				 errdetail("They would be found later by the session's own statements.")));
}

void
ds_caller_guard_after_abort(CallerGuard *guard)
{
	SessionState now;

	if (!guard->active)
		return;
	read_state(&now);
	remember_new_locks(guard, &now);
	ds_isolation_reseed_random();
}
