/*
 * outcome_waits.c -- sessions that wait for a run or a step to stop, and the commits that wake
 * them (outcome_waits.h).
 *
 * The wake-up is PostgreSQL's own condition variable: a waiter prepares to sleep on the variable
 * of its run before it reads the state, so that a commit between the read and the sleep still
 * wakes it; the broadcast is sent from the transaction callback of a commit, which runs once the
 * commit is visible to new snapshots. A transaction marks the variables to wake in a bitmap; a
 * transaction that rolls back wakes nobody.
 *
 * A wait that is the whole of its statement lets go of the backend's xmin while it sleeps
 * (ds_outcome_wait_may_release_xmin below says when): the statement's snapshot is then read with
 * no more, and every check after a wake-up takes a snapshot of its own, which publishes the xmin
 * again until the next sleep.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "common/hashfn.h"
#include "executor/execdesc.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/plannodes.h"
#include "pgstat.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "tcop/pquery.h"
#include "utils/lsyscache.h"
#include "utils/portal.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "ipc/outcome_waits.h"

/* Condition variables; a power of two, so that a hash picks one with a mask. */
#define DS_WAIT_PARTITIONS 256

typedef struct OutcomeWaits
{
	ConditionVariable cv[DS_WAIT_PARTITIONS];
} OutcomeWaits;

static OutcomeWaits *waits = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* the partitions this transaction wakes when it commits */
static uint64 wake_pending[DS_WAIT_PARTITIONS / 64];
static bool any_wake_pending = false;
static bool callback_registered = false;

static void
waits_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(OutcomeWaits)));
}

static void
waits_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	waits = ShmemInitStruct("durable_steps outcome waits", sizeof(OutcomeWaits), &found);
	if (!found)
		for (int i = 0; i < DS_WAIT_PARTITIONS; i++)
			ConditionVariableInit(&waits->cv[i]);
	LWLockRelease(AddinShmemInitLock);
}

void
ds_outcome_waits_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = waits_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = waits_shmem_startup;
}

bool
ds_outcome_waits_available(void)
{
	return waits != NULL;
}

void
ds_outcome_waits_require(void)
{
	if (waits == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("waiting needs durable_steps in shared_preload_libraries"),
				 errhint("Add durable_steps to shared_preload_libraries and restart the server.")));
}

static int
partition_of(const char *run_id)
{
	return (int) (hash_bytes((const unsigned char *) run_id, (int) strlen(run_id)) &
				  (DS_WAIT_PARTITIONS - 1));
}

/* Transaction callback: a commit wakes the marked partitions; any end forgets them. */
static void
wake_at_end_of_xact(XactEvent event, void *arg)
{
	bool		commit = event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT;

	if (!any_wake_pending ||
		(!commit && event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT))
		return;
	if (commit && waits != NULL)
		for (int i = 0; i < DS_WAIT_PARTITIONS; i++)
			if (wake_pending[i / 64] & (UINT64CONST(1) << (i % 64)))
				ConditionVariableBroadcast(&waits->cv[i]);
	memset(wake_pending, 0, sizeof(wake_pending));
	any_wake_pending = false;
}

void
ds_outcome_wake_at_commit(const char *run_id)
{
	int			p;

	if (waits == NULL)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(wake_at_end_of_xact, NULL);
		callback_registered = true;
	}
	p = partition_of(run_id);
	wake_pending[p / 64] |= UINT64CONST(1) << (p % 64);
	any_wake_pending = true;
}

/* ---- letting go of the xmin horizon while asleep ---- */

/* What the plan of the statement may evaluate besides the wait. */
typedef struct WholeStatement
{
	Oid			fn_oid;			/* the waiting function */
	Node	   *call;			/* the call being evaluated (fn_expr) */
	bool		found;			/* the plan holds that call */
} WholeStatement;

static bool
not_immutable(Oid func_id, void *context)
{
	return func_volatile(func_id) != PROVOLATILE_IMMUTABLE;
}

/*
 * Might evaluating `node` read the database with the statement's snapshot once the wait is over?
 * A sub-select might, a function that is not immutable might (a stable one reads with the
 * snapshot of its caller), a domain's check might. Calls of the waiting function itself read
 * with snapshots of their own; their arguments are held to the same rule.
 */
static bool
may_read(Node *node, void *context)
{
	WholeStatement *ws = context;

	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr) && ((FuncExpr *) node)->funcid == ws->fn_oid)
	{
		if (node == ws->call)
			ws->found = true;
		return expression_tree_walker(node, may_read, context);
	}
	if (IsA(node, SubLink) || IsA(node, SubPlan) || IsA(node, AlternativeSubPlan) ||
		IsA(node, CoerceToDomain) ||
		(IsA(node, Param) && ((Param *) node)->paramkind != PARAM_EXTERN))
		return true;
	if (check_functions_in_node(node, not_immutable, NULL))
		return true;
	return expression_tree_walker(node, may_read, context);
}

/*
 * Is the plan the wait and nothing else: `SELECT <targets> FROM f(...)` (a function scan of the
 * call alone) or `SELECT <targets>` (a result without a scan), whose targets and arguments read
 * nothing (may_read)? Such a plan reads no table, so after the call returns the statement only
 * hands its row to the client.
 */
static bool
plan_is_the_wait(PlannedStmt *stmt, WholeStatement *ws)
{
	Plan	   *plan = stmt->planTree;

	if (stmt->commandType != CMD_SELECT || stmt->hasModifyingCTE || stmt->rowMarks != NIL ||
		stmt->subplans != NIL || stmt->utilityStmt != NULL || plan == NULL ||
		plan->lefttree != NULL || plan->righttree != NULL || plan->initPlan != NIL ||
		plan->qual != NIL)
		return false;
	if (IsA(plan, FunctionScan))
	{
		FunctionScan *scan = (FunctionScan *) plan;
		RangeTblFunction *rtfunc;

		if (list_length(scan->functions) != 1 || scan->funcordinality)
			return false;
		rtfunc = linitial_node(RangeTblFunction, scan->functions);
		if (rtfunc->funcexpr != ws->call || may_read(rtfunc->funcexpr, ws))
			return false;
	}
	else if (!IsA(plan, Result) || ((Result *) plan)->resconstantqual != NULL)
		return false;
	return !may_read((Node *) plan->targetlist, ws) && ws->found;
}

/*
 * Letting go of the xmin is safe only when no snapshot that it protects is read with again: then
 * VACUUM may remove what those snapshots saw without anyone noticing. The snapshots that exist
 * while a function runs are the statement's (registered by the executor for the whole of the
 * statement), those of statements or functions around it, of open cursors, the transaction's own
 * under REPEATABLE READ and SERIALIZABLE (every later statement reads with it), exported ones,
 * and the catalog's (taken again on demand). So the wait lets go only when:
 *
 * - the transaction is READ COMMITTED: each later statement takes a snapshot of its own;
 * - the portal being run is a plain SELECT whose plan is the wait and nothing else
 *   (plan_is_the_wait): after the call, the statement reads no table, and its row holds no
 *   pointer into one (a composite result is flattened);
 * - the statement's snapshot is the portal's alone, registered by its query and its executor
 *   (two registrations), active once, at the top of a stack of active snapshots that holds nothing
 *   else: no statement or function around the call, no trigger;
 * - no other snapshot is registered (the catalog's dropped first): an open cursor, or a portal
 *   of the extended protocol left suspended, holds one of its own.
 *
 * Anything else waits holding its snapshot, as any long statement does.
 */
bool
ds_outcome_wait_may_release_xmin(FunctionCallInfo fcinfo)
{
	WholeStatement ws;
	QueryDesc  *qd;
	Snapshot	snap;
	bool		alone;

	if (IsolationUsesXactSnapshot() || fcinfo->flinfo == NULL ||
		fcinfo->flinfo->fn_expr == NULL || ActivePortal == NULL ||
		ActivePortal->strategy != PORTAL_ONE_SELECT || ActivePortal->status != PORTAL_ACTIVE ||
		ActivePortal->queryDesc == NULL)
		return false;
	qd = ActivePortal->queryDesc;
	ws.fn_oid = fcinfo->flinfo->fn_oid;
	ws.call = fcinfo->flinfo->fn_expr;
	ws.found = false;
	if (qd->plannedstmt == NULL || !plan_is_the_wait(qd->plannedstmt, &ws))
		return false;
	snap = qd->snapshot;
	if (snap == NULL || !ActiveSnapshotSet() || GetActiveSnapshot() != snap ||
		snap->regd_count != 2 || snap->active_count != 1)
		return false;
	InvalidateCatalogSnapshot();
	if (!ThereAreNoPriorRegisteredSnapshots())
		return false;
	/* nothing under the statement's snapshot on the active stack? */
	PopActiveSnapshot();
	alone = !ActiveSnapshotSet();
	PushActiveSnapshot(snap);
	return alone;
}

bool
ds_outcome_wait(const char *run_id, int64 timeout_ms, bool release_xmin,
				bool (*done) (void *arg), void *arg)
{
	ConditionVariable *cv;
	TimestampTz deadline = GetCurrentTimestamp() + timeout_ms * 1000;
	bool		finished;

	if (waits == NULL)
		return done(arg);
	cv = &waits->cv[partition_of(run_id)];
	ConditionVariablePrepareToSleep(cv);
	for (;;)
	{
		TimestampTz remaining_us;

		/*
		 * reads with a snapshot of its own, which publishes an xmin again
		 * when the sleep had none
		 */
		finished = done(arg);
		if (finished)
			break;
		remaining_us = deadline - GetCurrentTimestamp();
		if (remaining_us <= 0)
			break;
		if (release_xmin)
		{
			/*
			 * As SnapshotResetXmin does when no snapshot is left: the ones
			 * left are never read with again (see above), and the catalog's
			 * is taken anew when needed.
			 */
			InvalidateCatalogSnapshot();
			MyProc->xmin = TransactionXmin = InvalidTransactionId;
		}

		/*
		 * rounded up: a wait never answers before the time it was given has
		 * passed
		 */
		(void) ConditionVariableTimedSleep(cv, (long) ((remaining_us + 999) / 1000),
										   PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return finished;
}
