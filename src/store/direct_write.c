/*
 * direct_write.c -- the row writes of the step hot paths, without SPI.
 *
 * Every attempt writes rows: a fresh step inserts its step and attempt rows, and every later
 * outcome updates the step and adds an attempt. Through SPI each such statement pays for a
 * plan-cache check, an executor start with a projection of every column, and its shutdown:
 * measured at about a sixth of a fresh step's cost and half of the background worker's. The
 * logical replication apply worker writes rows with ExecSimpleRelationInsert /
 * ExecSimpleRelationUpdate on a minimal executor state; so do we.
 * Those check NOT NULL and CHECK constraints and maintain every index (unique checks included,
 * and no new index entries for a HOT update), like the statements would. Unlike statements they
 * fire no statement triggers, and AFTER ROW triggers would need a query level around them that
 * is not set up here: the extension's tables have no row triggers (a writer refuses a table
 * that has one), and their statement triggers are for SQL written by others
 * (steps_forget_replays, see replay_cache.c; the deletion of a deleted step's attempts, see the
 * install script). The direct writes never delete.
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "parser/parse_relation.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "store/citus_commit.h"
#include "store/direct_write.h"

/*
 * A minimal executor state with `rel` as its one result relation, indexes open, and the slots
 * the writes use (made on first use).
 */
typedef struct DirectWrite
{
	Oid			relid;
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *row_slot;	/* the row found (table slot) */
	TupleTableSlot *new_slot;	/* the row written (virtual) */
	bool		kept;			/* belongs to the open batch: reused, closed
								 * by the batch */
} DirectWrite;

/*
 * A batch: while one is open, the writes made at its transaction level share one kept writer
 * per relation instead of each setting one up and tearing it down (the executor state, the
 * relation and index opens are a third of an update's cost). The background worker opens one
 * per shared transaction. Writes from a subtransaction (a nested step) set up their own as
 * usual: a kept writer belongs to the batch's resource owner, which a subtransaction's abort
 * does not release.
 */
#define MAX_KEPT_WRITERS 4

static struct
{
	bool		open;
	int			nest_level;
	ResourceOwner owner;
	MemoryContext cxt;
	int			n;
	DirectWrite writers[MAX_KEPT_WRITERS];
}			batch;

static bool batch_callback_registered = false;

/* Open `relid` as the one result relation of a new minimal executor state. */
static void
writer_open(DirectWrite *w, Oid relid)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	w->relid = relid;
	w->rel = table_open(relid, RowExclusiveLock);

	/*
	 * a direct write fires no row trigger: refuse a table that has one rather
	 * than skip it
	 */
	if (w->rel->trigdesc != NULL &&
		(w->rel->trigdesc->trig_insert_before_row || w->rel->trigdesc->trig_insert_after_row ||
		 w->rel->trigdesc->trig_insert_instead_row ||
		 w->rel->trigdesc->trig_update_before_row || w->rel->trigdesc->trig_update_after_row ||
		 w->rel->trigdesc->trig_update_instead_row))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("durable_steps.%s has a row trigger", RelationGetRelationName(w->rel)),
				 errdetail("The extension writes its tables' rows directly, and would not fire it."),
				 errhint("Drop the trigger: the extension's tables take no row triggers.")));
	w->estate = CreateExecutorState();
	w->rri = makeNode(ResultRelInfo);
	w->row_slot = NULL;
	w->new_slot = NULL;
	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = w->rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ds_exec_init_range_table(w->estate, rte);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	ExecOpenIndices(w->rri, false);
}

/* Close a writer's indexes, executor state and relation. */
static void
writer_close(DirectWrite *w)
{
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	/* keep the lock to the end of the transaction, as a statement would */
	table_close(w->rel, NoLock);
}

/* A transaction that ends with a batch open releases it with its resources. */
static void
batch_xact_callback(XactEvent event, void *arg)
{
	if (!batch.open)
		return;
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PARALLEL_PRE_COMMIT)
		ds_direct_write_batch_end();
	else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
	{
		batch.open = false;
		batch.n = 0;
	}
}

void
ds_direct_write_batch_begin(void)
{
	if (!batch_callback_registered)
	{
		RegisterXactCallback(batch_xact_callback, NULL);
		batch_callback_registered = true;
	}
	if (batch.open)
		elog(ERROR, "a direct write batch is already open");
	batch.open = true;
	batch.nest_level = GetCurrentTransactionNestLevel();
	batch.owner = CurrentResourceOwner;
	batch.cxt = CurTransactionContext;
	batch.n = 0;
}

void
ds_direct_write_batch_end(void)
{
	ResourceOwner save_owner = CurrentResourceOwner;

	if (!batch.open)
		return;
	CurrentResourceOwner = batch.owner;
	for (int i = 0; i < batch.n; i++)
		writer_close(&batch.writers[i]);
	CurrentResourceOwner = save_owner;
	batch.open = false;
	batch.n = 0;
}

/* The writer for `relid`: the open batch's kept one, or `local` set up for one write. */
static DirectWrite *
direct_write_begin(DirectWrite *local, Oid relid)
{
	DirectWrite *w = local;

	if (batch.open && GetCurrentTransactionNestLevel() == batch.nest_level &&
		CurrentResourceOwner == batch.owner)
	{
		for (int i = 0; i < batch.n; i++)
			if (batch.writers[i].relid == relid)
				w = &batch.writers[i];
		if (w == local && batch.n < MAX_KEPT_WRITERS)
		{
			MemoryContext old = MemoryContextSwitchTo(batch.cxt);

			w = &batch.writers[batch.n++];
			writer_open(w, relid);
			w->kept = true;
			MemoryContextSwitchTo(old);
		}
	}
	if (w == local)
	{
		writer_open(w, relid);
		w->kept = false;
	}
	/* each write is a command of its own, seen by the next (direct_write_end) */
	w->estate->es_output_cid = GetCurrentCommandId(true);
	return w;
}

/* End one write: a writer that is not kept by the batch is closed. */
static void
direct_write_end(DirectWrite *w)
{
	if (w->kept)
	{
		ResetPerTupleExprContext(w->estate);
		if (w->row_slot)
			ExecClearTuple(w->row_slot);
		if (w->new_slot)
			ExecClearTuple(w->new_slot);
	}
	else
		writer_close(w);

	/*
	 * later commands of this transaction (the caller's next statement) see
	 * the row
	 */
	CommandCounterIncrement();
}

/* The virtual slot a writer builds new rows in, made on first use. */
static TupleTableSlot *
writer_new_slot(DirectWrite *w)
{
	if (w->new_slot == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(w->estate->es_query_cxt);

		w->new_slot = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel),
											 &TTSOpsVirtual);
		MemoryContextSwitchTo(old);
	}
	ExecClearTuple(w->new_slot);
	return w->new_slot;
}

/* The table slot a writer reads existing rows into, made on first use. */
static TupleTableSlot *
writer_row_slot(DirectWrite *w)
{
	if (w->row_slot == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(w->estate->es_query_cxt);

		w->row_slot = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel),
											 table_slot_callbacks(w->rel));
		MemoryContextSwitchTo(old);
	}
	ExecClearTuple(w->row_slot);
	return w->row_slot;
}

void
ds_direct_insert_row(Oid relid, const AttrNumber *attnums, int ncols, const Datum *values,
					 const bool *nulls)
{
	DirectWrite local;
	DirectWrite *w = direct_write_begin(&local, relid);
	TupleDesc	tupdesc = RelationGetDescr(w->rel);
	TupleTableSlot *slot;
	int			live = 0;

	/* the record and the effects of its step on other nodes commit together */
	ds_citus_use_two_phase_commit();

	for (int i = 0; i < tupdesc->natts; i++)
		if (!TupleDescAttr(tupdesc, i)->attisdropped)
			live++;
	if (live != ncols)
		elog(ERROR, "direct insert into \"%s\" names %d of its %d columns",
			 RelationGetRelationName(w->rel), ncols, live);

	slot = writer_new_slot(w);
	for (int i = 0; i < tupdesc->natts; i++)
	{
		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
	}
	for (int i = 0; i < ncols; i++)
	{
		Assert(attnums[i] >= 1 && attnums[i] <= tupdesc->natts);
		slot->tts_values[attnums[i] - 1] = values[i];
		slot->tts_isnull[attnums[i] - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(slot);

	ExecSimpleRelationInsert(w->rri, w->estate, slot);
	direct_write_end(w);
}

/*
 * Is the row at *tid, as `snapshot` sees it, the one with these keys? Then it is the row's
 * current version: a unique key has one visible version.
 */
static bool
fetch_by_tid(Relation rel, Relation index, ItemPointer tid, int nkeys, const Datum *keys,
			 const RegProcedure *key_eq, Snapshot snapshot, TupleTableSlot *slot)
{
	if (!ItemPointerIsValid(tid) ||
		!table_tuple_fetch_row_version(rel, tid, snapshot, slot))
		return false;
	for (int i = 0; i < nkeys; i++)
	{
		AttrNumber	att = index->rd_index->indkey.values[i];
		bool		isnull;
		Datum		d = slot_getattr(slot, att, &isnull);

		if (isnull ||
			!DatumGetBool(OidFunctionCall2Coll(key_eq[i], index->rd_indcollation[i], d, keys[i])))
			return false;
	}
	return true;
}

bool
ds_direct_update_row(Oid relid, Oid indexid, int nkeys, const Datum *keys, const RegProcedure *key_eq,
					 ItemPointer tid, const AttrNumber *attnums, int ncols, const Datum *values,
					 const bool *nulls)
{
	DirectWrite local;
	DirectWrite *w;
	Relation	index;
	TupleDesc	tupdesc;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	ScanKeyData skey[INDEX_MAX_KEYS];
	IndexScanDesc scan;
	EPQState	epqstate;

	/*
	 * registered while it is used: GetLatestSnapshot()'s alone is neither
	 * registered nor active
	 */
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	bool		found;

	Assert(nkeys <= INDEX_MAX_KEYS);
	ds_citus_use_two_phase_commit();
	w = direct_write_begin(&local, relid);
	tupdesc = RelationGetDescr(w->rel);
	index = index_open(indexid, AccessShareLock);

	/*
	 * The row as this transaction now sees it. Whoever updates a step's rows
	 * holds the step's identity lock (step_lock.c) for as long, so nobody
	 * else can have a newer version; if that rule were ever broken, the
	 * update below fails ("tuple concurrently updated") rather than write
	 * over the other version.
	 */
	for (int i = 0; i < nkeys; i++)

		/*
		 * the index's own collation: a btree is searched in the order it was
		 * built in
		 */
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[i], key_eq[i], keys[i]);
	oldslot = writer_row_slot(w);
	/* where the caller last saw the row, if it knows: saves the index descent */
	found = tid != NULL &&
		fetch_by_tid(w->rel, index, tid, nkeys, keys, key_eq, snapshot, oldslot);
	if (!found)
	{
		scan = ds_index_beginscan(w->rel, index, snapshot, nkeys, 0);
		index_rescan(scan, skey, nkeys, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, oldslot);
		index_endscan(scan);
	}
	index_close(index, NoLock);

	if (found)
	{
		/*
		 * the new version: the old one's values with the named columns
		 * replaced
		 */
		newslot = writer_new_slot(w);
		slot_getallattrs(oldslot);
		memcpy(newslot->tts_values, oldslot->tts_values, sizeof(Datum) * tupdesc->natts);
		memcpy(newslot->tts_isnull, oldslot->tts_isnull, sizeof(bool) * tupdesc->natts);
		for (int i = 0; i < ncols; i++)
		{
			Assert(attnums[i] >= 1 && attnums[i] <= tupdesc->natts);
			newslot->tts_values[attnums[i] - 1] = values[i];
			newslot->tts_isnull[attnums[i] - 1] = nulls[i];
		}
		ExecStoreVirtualTuple(newslot);

		ds_eval_plan_qual_init(&epqstate, w->estate);
		ExecSimpleRelationUpdate(w->rri, w->estate, &epqstate, oldslot, newslot);
		EvalPlanQualEnd(&epqstate);
		if (tid != NULL)
			*tid = newslot->tts_tid;	/* the new version's */
	}
	UnregisterSnapshot(snapshot);
	direct_write_end(w);
	return found;
}
