/*
 * direct_write.c -- the row writes of the step hot paths, without SPI.
 *
 * Every attempt writes rows: a fresh step inserts its step and attempt rows, and every later
 * outcome updates the step and adds an attempt. Through SPI each such statement pays for a
 * plan-cache check, an executor start with a projection of every column, and its shutdown:
 * measured at about a sixth of a fresh step's cost and half of the background worker's. The logical replication apply worker writes rows with
 * ExecSimpleRelationInsert / ExecSimpleRelationUpdate on a minimal executor state; so do we.
 * Those check NOT NULL and CHECK constraints, maintain every index (unique checks included, and
 * no new index entries for a HOT update) and fire row triggers, like the statements would.
 */
#include "compat.h"

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
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "direct_write.h"

/*
 * Attribute numbers of the column lists callers pass, resolved once: the lists are static arrays,
 * so their address identifies them. Forgotten on any relcache invalidation (DROP EXTENSION and a
 * new CREATE give the tables new column numbers only through a new relation).
 */
#define ATTNUM_CACHE_SIZE 8
#define ATTNUM_CACHE_MAX_COLUMNS 40

typedef struct AttnumCacheEntry
{
	Oid			relid;
	const char *const *colnames;
	int			ncols;
	AttrNumber	attnums[ATTNUM_CACHE_MAX_COLUMNS];
} AttnumCacheEntry;

static AttnumCacheEntry attnum_cache[ATTNUM_CACHE_SIZE];
static int	attnum_cache_used = 0;
static bool attnum_callback_registered = false;

static void
forget_attnums(Datum arg, Oid relid)
{
	attnum_cache_used = 0;
}

static const AttrNumber *
column_attnums(Relation rel, const char *const *colnames, int ncols)
{
	Oid			relid = RelationGetRelid(rel);
	AttnumCacheEntry *e;

	for (int i = 0; i < attnum_cache_used; i++)
		if (attnum_cache[i].relid == relid && attnum_cache[i].colnames == colnames &&
			attnum_cache[i].ncols == ncols)
			return attnum_cache[i].attnums;

	if (!attnum_callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_attnums, (Datum) 0);
		attnum_callback_registered = true;
	}
	if (ncols > ATTNUM_CACHE_MAX_COLUMNS)
		elog(ERROR, "a direct write names at most %d columns", ATTNUM_CACHE_MAX_COLUMNS);
	if (attnum_cache_used == ATTNUM_CACHE_SIZE)
		attnum_cache_used = 0;	/* more lists than the code has: start over */
	e = &attnum_cache[attnum_cache_used];
	for (int i = 0; i < ncols; i++)
	{
		e->attnums[i] = get_attnum(relid, colnames[i]);
		if (e->attnums[i] == InvalidAttrNumber)
			elog(ERROR, "\"%s\" has no column \"%s\"", RelationGetRelationName(rel), colnames[i]);
	}
	e->relid = relid;
	e->colnames = colnames;
	e->ncols = ncols;
	attnum_cache_used++;
	return e->attnums;
}

/* A minimal executor state with `rel` as its one result relation, indexes open. */
typedef struct DirectWrite
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
} DirectWrite;

static void
direct_write_begin(DirectWrite *w, Oid relid)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	w->rel = table_open(relid, RowExclusiveLock);
	w->estate = CreateExecutorState();
	w->rri = makeNode(ResultRelInfo);
	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = w->rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(w->estate, list_make1(rte));
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	ExecOpenIndices(w->rri, false);
	w->estate->es_output_cid = GetCurrentCommandId(true);
}

static void
direct_write_end(DirectWrite *w)
{
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	/* keep the lock to the end of the transaction, as a statement would */
	table_close(w->rel, NoLock);
	/* later commands of this transaction (the caller's next statement) see the row */
	CommandCounterIncrement();
}

void
direct_insert_row(Oid relid, const char *const *colnames, int ncols, const Datum *values,
				  const bool *nulls)
{
	DirectWrite w;
	TupleDesc	tupdesc;
	TupleTableSlot *slot;
	const AttrNumber *attnums;
	int			live = 0;

	direct_write_begin(&w, relid);
	tupdesc = RelationGetDescr(w.rel);
	for (int i = 0; i < tupdesc->natts; i++)
		if (!TupleDescAttr(tupdesc, i)->attisdropped)
			live++;
	if (live != ncols)
		elog(ERROR, "direct insert into \"%s\" names %d of its %d columns",
			 RelationGetRelationName(w.rel), ncols, live);
	attnums = column_attnums(w.rel, colnames, ncols);

	slot = ExecInitExtraTupleSlot(w.estate, tupdesc, &TTSOpsVirtual);
	ExecClearTuple(slot);
	for (int i = 0; i < tupdesc->natts; i++)
	{
		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
	}
	for (int i = 0; i < ncols; i++)
	{
		slot->tts_values[attnums[i] - 1] = values[i];
		slot->tts_isnull[attnums[i] - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(slot);

	ExecSimpleRelationInsert(w.rri, w.estate, slot);
	direct_write_end(&w);
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
direct_update_row(Oid relid, Oid indexid, int nkeys, const Datum *keys, const RegProcedure *key_eq,
				  ItemPointer tid, const char *const *colnames, int ncols, const Datum *values,
				  const bool *nulls)
{
	DirectWrite w;
	Relation	index;
	TupleDesc	tupdesc;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	ScanKeyData skey[INDEX_MAX_KEYS];
	IndexScanDesc scan;
	const AttrNumber *attnums;
	EPQState	epqstate;
	Snapshot	snapshot = GetLatestSnapshot();
	bool		found;

	Assert(nkeys <= INDEX_MAX_KEYS);
	direct_write_begin(&w, relid);
	tupdesc = RelationGetDescr(w.rel);
	attnums = column_attnums(w.rel, colnames, ncols);
	index = index_open(indexid, AccessShareLock);

	/*
	 * The row as this transaction now sees it. Whoever updates a step's rows holds the step's
	 * identity lock (step_lock.c) for as long, so nobody else can have a newer version; if that
	 * rule were ever broken, the update below fails ("tuple concurrently updated") rather than
	 * write over the other version.
	 */
	for (int i = 0; i < nkeys; i++)
		/* the index's own collation: a btree is searched in the order it was built in */
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[i], key_eq[i], keys[i]);
	oldslot = ExecInitExtraTupleSlot(w.estate, tupdesc, table_slot_callbacks(w.rel));
	/* where the caller last saw the row, if it knows: saves the index descent */
	found = tid != NULL &&
		fetch_by_tid(w.rel, index, tid, nkeys, keys, key_eq, snapshot, oldslot);
	if (!found)
	{
		scan = index_beginscan(w.rel, index, snapshot, nkeys, 0);
		index_rescan(scan, skey, nkeys, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, oldslot);
		index_endscan(scan);
	}
	index_close(index, NoLock);

	if (found)
	{
		/* the new version: the old one's values with the named columns replaced */
		newslot = ExecInitExtraTupleSlot(w.estate, tupdesc, &TTSOpsVirtual);
		ExecClearTuple(newslot);
		slot_getallattrs(oldslot);
		memcpy(newslot->tts_values, oldslot->tts_values, sizeof(Datum) * tupdesc->natts);
		memcpy(newslot->tts_isnull, oldslot->tts_isnull, sizeof(bool) * tupdesc->natts);
		for (int i = 0; i < ncols; i++)
		{
			newslot->tts_values[attnums[i] - 1] = values[i];
			newslot->tts_isnull[attnums[i] - 1] = nulls[i];
		}
		ExecStoreVirtualTuple(newslot);

		EvalPlanQualInit(&epqstate, w.estate, NULL, NIL, -1);
		ExecSimpleRelationUpdate(w.rri, w.estate, &epqstate, oldslot, newslot);
		EvalPlanQualEnd(&epqstate);
		if (tid != NULL)
			*tid = newslot->tts_tid;	/* the new version's */
	}
	direct_write_end(&w);
	return found;
}
