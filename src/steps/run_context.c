/*
 * run_context.c -- the workflow turn running in this backend (docs/runs.md).
 *
 * A turn calls the workflow from its start inside a subtransaction of the worker's transaction.
 * Completed steps replay; the first call that has work to do (an attempt to run, a wait to
 * record) or must wait ends the turn: the whole subtransaction rolls back (the workflow's own
 * writes with it), and the executor then does that one piece of work in the turn's transaction,
 * where it commits on its own -- a step's effect together with its record. What the rollback must
 * not take lives here, in backend memory: why the turn ended and the work it left. A workflow
 * that catches the suspension cannot hide it: the turn counts as suspended whatever the workflow
 * does next, and every later call raises again.
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "storage/proc.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "base/ds_errcodes.h"
#include "steps/run_context.h"
#include "steps/step_context.h"

static struct
{
	bool		active;
	char	   *run_id;
	Oid			owner;
	TurnSuspension suspension;
	MemoryContext cxt;
	List	   *visited;		/* the run's steps this turn's calls found
								 * recorded (ds_turn_visit) */
}			turn;

/* What the executor handed to the ds_run_step of the step its turn runs now. */
static struct
{
	const char *run_id;
	const char *step_id;
	int			n;
	const UnrecordedAttempt *entries;
}			unrecorded;

/* The extension's schema as this transaction found it: turns and their calls ask for it often. */
static Oid	schema_cached = InvalidOid;
static LocalTransactionId schema_cached_lxid = InvalidLocalTransactionId;

Oid
ds_extension_schema(void)
{
	Oid			ext;
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			schema = InvalidOid;

	if (OidIsValid(schema_cached) && schema_cached_lxid == DS_MY_LXID &&
		schema_cached_lxid != InvalidLocalTransactionId)
		return schema_cached;
	ext = get_extension_oid("durable_steps", false);
	rel = table_open(ExtensionRelationId, AccessShareLock);

	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		schema = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!OidIsValid(schema))
		elog(ERROR, "extension durable_steps has no schema");
	schema_cached = schema;
	schema_cached_lxid = DS_MY_LXID;
	return schema;
}

void
ds_turn_begin(const char *run_id, Oid owner)
{
	if (turn.cxt == NULL)
		turn.cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps turn",
										 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(turn.cxt);
	memset(&turn.suspension, 0, sizeof(turn.suspension));
	turn.run_id = MemoryContextStrdup(turn.cxt, run_id);
	turn.owner = owner;
	turn.visited = NIL;
	turn.active = true;
}

void
ds_turn_visit(const char *step_id)
{
	ListCell   *lc;
	MemoryContext old;

	if (!turn.active)
		return;
	foreach(lc, turn.visited)
	{
		if (strcmp((const char *) lfirst(lc), step_id) == 0)
			return;
	}
	old = MemoryContextSwitchTo(turn.cxt);
	turn.visited = lappend(turn.visited, pstrdup(step_id));
	MemoryContextSwitchTo(old);
}

int
ds_turn_visited(void)
{
	return list_length(turn.visited);
}

void
ds_turn_end(TurnSuspension *out)
{
	turn.active = false;
	*out = turn.suspension;
}

/* Raise the suspension the turn has recorded. */
pg_noreturn static void raise_suspension(void);

static void
raise_suspension(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_DS_RUN_SUSPENDED),
			 errmsg("run %s suspends: %s", turn.run_id,
					turn.suspension.reason ? turn.suspension.reason : "waiting"),
			 errdetail("The run's turn ends here and is rolled back; the worker resumes it when it is due."),
			 errhint("Do not catch this error in a workflow; if you do, the turn ends suspended all the same.")));
}

const char *
ds_turn_require(const char *function, Oid *owner)
{
	const StepContext *ctx = ds_step_context_innermost();

	if (!turn.active)
		ereport(ERROR,
				(errcode(ERRCODE_DS_NO_RUN_CONTEXT),
				 errmsg("%s() can only be called by a run's workflow", function),
				 errhint("Start the workflow with ds_start_run(); the background worker runs it.")));
	if (ctx == NULL || strcmp(ctx->run_id, turn.run_id) != 0 ||
		strcmp(ctx->step_id, DS_TURN_STEP_ID) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_NO_RUN_CONTEXT),
				 errmsg("%s() can only be called by a run's workflow, not from a step's body",
						function)));
	if (turn.suspension.suspended)
		raise_suspension();
	if (owner)
		*owner = turn.owner;
	return turn.run_id;
}

/* Copy into the turn's memory. */
static char *turn_strdup(const char *s);

void
ds_turn_suspend(bool blocked, TimestampTz wake_at, const char *reason, const char *step_id,
				const char *event)
{
	Assert(turn.active);
	turn.suspension.suspended = true;
	turn.suspension.blocked = blocked;
	turn.suspension.wake_at = wake_at;
	turn.suspension.reason = turn_strdup(reason);
	turn.suspension.step_id = turn_strdup(step_id);
	turn.suspension.event = turn_strdup(event);
	raise_suspension();
}

/* Copy into the turn's memory. */
static char *
turn_strdup(const char *s)
{
	return s ? MemoryContextStrdup(turn.cxt, s) : NULL;
}

void
ds_turn_suspend_for_work(const TurnSuspension *work)
{
	Assert(turn.active);
	turn.suspension = *work;
	turn.suspension.suspended = true;
	turn.suspension.reason = turn_strdup(work->reason);
	turn.suspension.step_id = turn_strdup(work->step_id);
	turn.suspension.event = turn_strdup(work->event);
	turn.suspension.step_call = turn_strdup(work->step_call);
	turn.suspension.payload = turn_strdup(work->payload);
	turn.suspension.search_path = turn_strdup(work->search_path);
	raise_suspension();
}

void
ds_turn_release(void)
{
	turn.active = false;
	if (turn.cxt != NULL)
		MemoryContextReset(turn.cxt);
	memset(&turn.suspension, 0, sizeof(turn.suspension));
	turn.run_id = NULL;
	turn.visited = NIL;
	unrecorded.n = 0;
}

void
ds_turn_hand_unrecorded_attempts(const char *run_id, const char *step_id, int n,
								 const UnrecordedAttempt *entries)
{
	unrecorded.run_id = run_id;
	unrecorded.step_id = step_id;
	unrecorded.n = n;
	unrecorded.entries = entries;
}

int
ds_turn_take_unrecorded_attempts(const char *run_id, const char *step_id,
								 const UnrecordedAttempt **entries)
{
	int			n = unrecorded.n;

	if (n == 0 || strcmp(run_id, unrecorded.run_id) != 0 ||
		strcmp(step_id, unrecorded.step_id) != 0)
		return 0;
	*entries = unrecorded.entries;
	unrecorded.n = 0;
	return n;
}

char *
ds_jsonb_field_text(Jsonb *j, const char *key, char *absent)
{
	LOCAL_FCINFO(call, 2);
	Datum		d;

	if (j == NULL)
		return absent;
	InitFunctionCallInfoData(*call, NULL, 2, InvalidOid, NULL, NULL);
	call->args[0].value = PointerGetDatum(j);
	call->args[0].isnull = false;
	call->args[1].value = CStringGetTextDatum(key);
	call->args[1].isnull = false;
	d = jsonb_object_field_text(call);
	return call->isnull ? absent : TextDatumGetCString(d);
}
