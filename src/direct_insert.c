/*
 * direct_insert.c -- the row inserts of a fresh step, without SPI.
 *
 * A new step writes two rows (the step and its first attempt). Through SPI each insert pays for
 * a plan-cache check, an executor start with a projection of every column, and its shutdown --
 * measured at about a sixth of a fresh step's whole cost. The logical replication apply worker
 * inserts rows with ExecSimpleRelationInsert on a minimal executor state; so do we. It checks
 * NOT NULL and CHECK constraints, maintains every index (unique checks included) and fires row
 * triggers, like an INSERT statement.
 */
#include "compat.h"

#include "access/table.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "direct_insert.h"

void
direct_insert_row(Oid relid, const char *const *colnames, int ncols, const Datum *values,
				  const bool *nulls)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	TupleDesc	tupdesc = RelationGetDescr(rel);
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	RangeTblEntry *rte = makeNode(RangeTblEntry);
	TupleTableSlot *slot;
	int			live = 0;

	for (int i = 0; i < tupdesc->natts; i++)
		if (!TupleDescAttr(tupdesc, i)->attisdropped)
			live++;
	if (live != ncols)
		elog(ERROR, "direct insert into \"%s\" names %d of its %d columns",
			 RelationGetRelationName(rel), ncols, live);

	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(estate, list_make1(rte));
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);
	estate->es_output_cid = GetCurrentCommandId(true);

	slot = ExecInitExtraTupleSlot(estate, tupdesc, &TTSOpsVirtual);
	ExecClearTuple(slot);
	for (int i = 0; i < tupdesc->natts; i++)
	{
		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
	}
	for (int i = 0; i < ncols; i++)
	{
		AttrNumber	att = get_attnum(relid, colnames[i]);

		if (att == InvalidAttrNumber)
			elog(ERROR, "\"%s\" has no column \"%s\"", RelationGetRelationName(rel), colnames[i]);
		slot->tts_values[att - 1] = values[i];
		slot->tts_isnull[att - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(slot);

	ExecSimpleRelationInsert(rri, estate, slot);

	ExecCloseIndices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	table_close(rel, NoLock);
	/* later commands of this transaction (the caller's next statement) see the row */
	CommandCounterIncrement();
}
