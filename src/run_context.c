/*
 * run_context.c -- the workflow turn running in this backend (README, "Runs").
 *
 * A turn calls the workflow from its start inside a subtransaction of the worker's transaction.
 * When a call in it must wait, the turn suspends: the whole subtransaction rolls back, so the
 * steps that completed in the turn are undone together with their effects (they run again next
 * turn, and nothing of theirs ever committed twice). What must survive that rollback lives here,
 * in backend memory, until the worker writes it back after the rollback:
 *
 *   - why the turn suspended (a workflow that catches the suspension cannot hide it: the turn
 *     counts as suspended whatever the workflow does next, and every later call raises again);
 *   - copies of the step rows and attempt rows that record no effect -- failed attempts, a
 *     sleep's wake-up time, the start of an event wait -- so that attempt history and waits
 *     survive the rollback. Each such step's lock is held for the session meanwhile, so that no
 *     executor claims it between the rollback and the write-back.
 */
#include "compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/fmgroids.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "ds_errcodes.h"
#include "run_context.h"
#include "step_context.h"
#include "step_lock.h"
#include "store.h"

typedef struct KeptStep
{
	char	   *run_id;
	char	   *step_id;
	Datum		row;			/* composite of durable_steps.steps */
	Datum		attempts;		/* array of durable_steps.attempts; 0 = none */
} KeptStep;

#define MAX_KEPT_STEPS 64

static struct
{
	bool		active;
	char	   *run_id;
	Oid			owner;
	TurnSuspension suspension;
	int			n_kept;
	KeptStep	kept[MAX_KEPT_STEPS];
	MemoryContext cxt;
}			turn;

Oid
ds_extension_schema(void)
{
	Oid			ext = get_extension_oid("durable_steps", false);
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			schema = InvalidOid;

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
	turn.n_kept = 0;
	turn.run_id = MemoryContextStrdup(turn.cxt, run_id);
	turn.owner = owner;
	turn.active = true;
}

void
ds_turn_end(TurnSuspension *out)
{
	turn.active = false;
	*out = turn.suspension;
}

/* Raise the suspension the turn has recorded. */
static void
raise_suspension(void) pg_attribute_noreturn();

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

void
ds_turn_suspend(bool blocked, TimestampTz wake_at, const char *reason, const char *step_id,
				const char *event)
{
	Assert(turn.active);
	turn.suspension.suspended = true;
	turn.suspension.blocked = blocked;
	turn.suspension.wake_at = wake_at;
	turn.suspension.reason = MemoryContextStrdup(turn.cxt, reason);
	turn.suspension.step_id = step_id ? MemoryContextStrdup(turn.cxt, step_id) : NULL;
	turn.suspension.event = event ? MemoryContextStrdup(turn.cxt, event) : NULL;
	raise_suspension();
}

/* Plans of the statements below, with the row types they were prepared for. */
static SPIPlanPtr keep_plan = NULL;
static SPIPlanPtr check_plan = NULL;
static SPIPlanPtr delete_plan = NULL;
static SPIPlanPtr insert_step_plan = NULL;
static SPIPlanPtr insert_attempts_plan = NULL;
static Oid	planned_step_type = InvalidOid;
static Oid	planned_attempt_type = InvalidOid;

#define KEY_WHERE " WHERE run_id OPERATOR(pg_catalog.=) $1 AND step_id OPERATOR(pg_catalog.=) $2"

/* A recreated extension has new row types: plan the statements that name them again. */
static void
forget_plans_if_types_changed(Oid step_type, Oid attempt_type)
{
	SPIPlanPtr *plans[] = {&keep_plan, &check_plan, &delete_plan, &insert_step_plan,
	&insert_attempts_plan};

	if (step_type == planned_step_type && attempt_type == planned_attempt_type)
		return;
	for (int i = 0; i < lengthof(plans); i++)
		if (*plans[i] != NULL)
		{
			SPI_freeplan(*plans[i]);
			*plans[i] = NULL;
		}
	planned_step_type = step_type;
	planned_attempt_type = attempt_type;
}

void
ds_turn_keep_step(const char *run_id, const char *step_id)
{
	Oid			key_types[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	StoreSpi	spi;
	KeptStep   *k = NULL;
	MemoryContext oldcxt;
	bool		isnull;
	int			rc;

	Assert(turn.active);
	for (int i = 0; i < turn.n_kept; i++)
		if (strcmp(turn.kept[i].run_id, run_id) == 0 && strcmp(turn.kept[i].step_id, step_id) == 0)
			k = &turn.kept[i];
	if (k == NULL)
	{
		if (turn.n_kept >= MAX_KEPT_STEPS)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("a workflow turn can record at most %d failed or waiting steps",
							MAX_KEPT_STEPS)));
		k = &turn.kept[turn.n_kept++];
		k->run_id = MemoryContextStrdup(turn.cxt, run_id);
		k->step_id = MemoryContextStrdup(turn.cxt, step_id);
		/* held by this transaction already: granted at once, and kept past the rollback */
		(void) ds_step_lock_try_session(run_id, step_id);
	}
	ds_store_spi_begin(&spi);
	forget_plans_if_types_changed(get_rel_type_id(ds_store_relations()->steps),
								  get_rel_type_id(ds_store_relations()->attempts));
	args[0] = CStringGetTextDatum(run_id);
	args[1] = CStringGetTextDatum(step_id);
	rc = SPI_execute_plan(ds_prepare_kept(&keep_plan,
										  "SELECT s, (SELECT pg_catalog.array_agg(a ORDER BY a.attempt)"
										  " FROM durable_steps.attempts a"
										  " WHERE a.run_id OPERATOR(pg_catalog.=) s.run_id"
										  " AND a.step_id OPERATOR(pg_catalog.=) s.step_id)"
										  " FROM durable_steps.steps s"
										  " WHERE s.run_id OPERATOR(pg_catalog.=) $1"
										  " AND s.step_id OPERATOR(pg_catalog.=) $2",
										  2, key_types),
						  args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "step %s/%s to keep was not found", run_id, step_id);
	oldcxt = MemoryContextSwitchTo(turn.cxt);
	k->row = datumCopy(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull),
					   false, -1);
	k->attempts = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	k->attempts = isnull ? (Datum) 0 : datumCopy(k->attempts, false, -1);
	MemoryContextSwitchTo(oldcxt);
	ds_store_spi_end(&spi);
}

/* Integer attribute `name` of a kept row. */
static int
row_int(Datum row, const char *name)
{
	bool		isnull;
	Datum		d = GetAttributeByName(DatumGetHeapTupleHeader(row), name, &isnull);

	return isnull ? 0 : DatumGetInt32(d);
}

/* Text attribute `name` of a kept row. */
static char *
row_text(Datum row, const char *name)
{
	bool		isnull;
	Datum		d = GetAttributeByName(DatumGetHeapTupleHeader(row), name, &isnull);

	return isnull ? "" : TextDatumGetCString(d);
}

int
ds_turn_restore_kept_steps(void)
{
	Oid			key_types[2] = {TEXTOID, TEXTOID};
	StoreSpi	spi;
	int			restored = 0;

	if (turn.n_kept == 0)
		return 0;
	ds_store_spi_begin(&spi);
	forget_plans_if_types_changed(get_rel_type_id(ds_store_relations()->steps),
								  get_rel_type_id(ds_store_relations()->attempts));
	for (int i = 0; i < turn.n_kept; i++)
	{
		KeptStep   *k = &turn.kept[i];
		Datum		args[2] = {CStringGetTextDatum(k->run_id), CStringGetTextDatum(k->step_id)};
		Oid			row_type = planned_step_type;
		Oid			array_type = get_array_type(planned_attempt_type);
		int			rc;

		/*
		 * The step as it stands after the rollback: as before the turn, or absent. Should
		 * another process have run it meanwhile (possible only if the workflow let go of the
		 * session's advisory locks), its newer record stands.
		 */
		rc = SPI_execute_plan(ds_prepare_kept(&check_plan,
											  "SELECT status, attempts FROM durable_steps.steps"
											  KEY_WHERE " FOR UPDATE", 2, key_types),
							  args, NULL, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "reading step %s/%s failed", k->run_id, k->step_id);
		if (SPI_processed == 1)
		{
			bool		isnull;
			char	   *status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
			int			attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
															   SPI_tuptable->tupdesc, 2, &isnull));

			/* kept as it stands: a completed turn, whose workflow caught nothing around it */
			if (attempts == row_int(k->row, "attempts") &&
				strcmp(status, row_text(k->row, "status")) == 0)
				continue;
			if (strcmp(status, "running") == 0 || attempts > row_int(k->row, "attempts"))
				continue;
			/* its attempts go with it (trigger steps_delete_attempts) and come back below */
			rc = SPI_execute_plan(ds_prepare_kept(&delete_plan,
												  "DELETE FROM durable_steps.steps" KEY_WHERE,
												  2, key_types),
								  args, NULL, false, 0);
			if (rc != SPI_OK_DELETE)
				elog(ERROR, "deleting step %s/%s failed", k->run_id, k->step_id);
		}
		rc = SPI_execute_plan(ds_prepare_kept(&insert_step_plan,
											  "INSERT INTO durable_steps.steps SELECT ($1).*",
											  1, &row_type),
							  &k->row, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "restoring step %s/%s failed", k->run_id, k->step_id);
		if (k->attempts != (Datum) 0)
		{
			rc = SPI_execute_plan(ds_prepare_kept(&insert_attempts_plan,
												  "INSERT INTO durable_steps.attempts"
												  " SELECT * FROM pg_catalog.unnest($1)",
												  1, &array_type),
								  &k->attempts, NULL, false, 0);
			if (rc != SPI_OK_INSERT)
				elog(ERROR, "restoring the attempts of step %s/%s failed", k->run_id, k->step_id);
		}
		restored++;
	}
	ds_store_spi_end(&spi);
	return restored;
}

void
ds_turn_release(void)
{
	turn.active = false;
	turn.n_kept = 0;
	if (turn.cxt != NULL)
		MemoryContextReset(turn.cxt);
	memset(&turn.suspension, 0, sizeof(turn.suspension));
	turn.run_id = NULL;
}
