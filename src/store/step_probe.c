/*
 * step_probe.c -- a step's state read straight through durable_steps.steps_pkey.
 *
 * Replays are the hot path of ds_run_step: a completed step answers every later call. Going
 * through SPI for that answer costs a plan-cache check, an executor start and a copy of every
 * column; an index probe that deforms the one heap tuple and copies only the answer's columns
 * costs a fraction of it. Locked reads stay on SPI (step_store.c), where FOR UPDATE comes for
 * free; writes go through direct_write.c.
 *
 * No permission checks apply here: the functions that call these act for the caller on rows
 * they then check ownership of (ds_store_may_access), exactly as the SPI path does as the owner.
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "executor/tuptable.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "store/store_relations.h"
#include "store/step_probe.h"
#include "store/step_store.h"

/* The columns an answer reads (the definition columns are left NULL). */
static const StepColumn answer_columns[] = {
	STEP_COL_KIND, STEP_COL_STATUS, STEP_COL_FINGERPRINT, STEP_COL_OWNER, STEP_COL_RESULT,
	STEP_COL_ATTEMPTS, STEP_COL_ATTEMPT_BASE, STEP_COL_MAX_ATTEMPTS, STEP_COL_NEXT_ATTEMPT_AT,
	STEP_COL_ERROR_CLASS, STEP_COL_ERROR_CODE, STEP_COL_ERROR_MESSAGE, STEP_COL_ERROR_DETAIL,
	STEP_COL_REMEDIATION, STEP_COL_CLAIMED_BY, STEP_COL_LEASE_EXPIRES_AT
};

/*
 * Find the row whose primary key equals `keys`, as `snapshot` sees it; on success the slot
 * holds it with every attribute deformed. The caller drops the slot and closes the relations.
 */
static bool
probe_primary_key(Relation rel, Relation index, const char *const *keys, int nkeys,
				  Snapshot snapshot, TupleTableSlot *slot)
{
	ScanKeyData skey[2];
	IndexScanDesc scan;
	bool		found;

	Assert(nkeys <= 2);
	for (int i = 0; i < nkeys; i++)

		/*
		 * the index's own collation: a btree is searched in the order it was
		 * built in
		 */
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[i], F_TEXTEQ,
							   CStringGetTextDatum(keys[i]));

	/*
	 * A scan's snapshot must be registered (or active) while it is used:
	 * callers pass GetLatestSnapshot()'s, which is neither (assertion-enabled
	 * builds check it).
	 */
	snapshot = RegisterSnapshot(snapshot);
	scan = ds_index_beginscan(rel, index, snapshot, nkeys, 0);
	index_rescan(scan, skey, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
		slot_getallattrs(slot);
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * Was the row version in the slot committed by another transaction, with nobody deleting it
 * (as far as its header tells now)?
 */
static bool
row_is_settled(TupleTableSlot *slot)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	HeapTupleHeader h = tuple->t_data;
	bool		settled;

	settled = !TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(h)) &&
		((h->t_infomask & HEAP_XMAX_INVALID) != 0 ||
		 HEAP_XMAX_IS_LOCKED_ONLY(h->t_infomask) ||
		 !TransactionIdIsValid(HeapTupleHeaderGetRawXmax(h)));
	if (should_free)
		heap_freetuple(tuple);
	return settled;
}

bool
ds_probe_step(const char *run_id, const char *step_id, Snapshot snapshot, StepRecord *out,
			  bool *settled)
{
	const StoreRelations *r = ds_store_relations();
	const char *keys[2] = {run_id, step_id};
	Relation	rel = table_open(r->steps, AccessShareLock);
	Relation	index = index_open(r->steps_pkey, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		found = probe_primary_key(rel, index, keys, 2, snapshot, slot);

	if (settled != NULL)
		*settled = false;
	if (found)
	{
		memset(out, 0, sizeof(*out));
		out->run_id = pstrdup(run_id);
		out->step_id = pstrdup(step_id);
		for (int i = 0; i < lengthof(answer_columns); i++)
		{
			int			att = r->step_attnums[answer_columns[i]] - 1;

			ds_step_set_field(out, answer_columns[i], slot->tts_values[att],
							  slot->tts_isnull[att], CurrentMemoryContext);
		}
		if (settled != NULL)
			*settled = row_is_settled(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
	/* keep the locks to the end of the transaction, as a query would */
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return found;
}

/*
 * A locked read without a statement: the row as the latest snapshot sees it, locked FOR UPDATE
 * in place with table_tuple_lock, which follows a newer committed version itself. Its callers hold
 * the step's identity lock, so a newer version is rare (an operator's own UPDATE); what the
 * table's lock cannot settle here (a version this transaction wrote, a row deleted under us)
 * goes to the statement, whose FOR UPDATE answers every case.
 */
bool
ds_lock_step_row(const char *run_id, const char *step_id, StepRecord *out)
{
	const StoreRelations *r = ds_store_relations();
	const char *keys[2] = {run_id, step_id};
	Relation	rel;
	Relation	index;
	TupleTableSlot *slot;
	TM_Result	locked = TM_Invisible;
	TM_FailureData tmfd;

	/*
	 * Under a snapshot taken for the whole transaction a newer version is a
	 * serialization failure, and SERIALIZABLE wants its predicate lock: the
	 * statement's FOR UPDATE does both
	 */
	if (IsolationUsesXactSnapshot())
		return ds_store_lock_step(run_id, step_id, out);

	/*
	 * the earlier writes of this transaction are seen, as a statement sees
	 * them
	 */
	CommandCounterIncrement();
	rel = table_open(r->steps, RowShareLock);
	index = index_open(r->steps_pkey, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	if (probe_primary_key(rel, index, keys, 2, GetLatestSnapshot(), slot))
	{
		ItemPointerData tid = slot->tts_tid;
		Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());

		locked = table_tuple_lock(rel, &tid, snapshot, slot, GetCurrentCommandId(true),
								  LockTupleExclusive, LockWaitBlock,
								  TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		UnregisterSnapshot(snapshot);
		if (locked == TM_Ok)
		{
			slot_getallattrs(slot);
			memset(out, 0, sizeof(*out));
			for (int i = 0; i < N_STEP_COLUMNS; i++)
			{
				int			att = r->step_attnums[i] - 1;

				ds_step_set_field(out, (StepColumn) i, slot->tts_values[att],
								  slot->tts_isnull[att], CurrentMemoryContext);
			}
			out->tid = slot->tts_tid;
		}
	}
	else
		locked = TM_Deleted;
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	if (locked == TM_Ok)
		return true;
	if (locked == TM_Deleted)
		return false;
	return ds_store_lock_step(run_id, step_id, out);
}

Jsonb *
ds_probe_run_policy(const char *run_id, Snapshot snapshot, Oid *owner)
{
	const StoreRelations *r = ds_store_relations();
	const char *keys[1] = {run_id};
	Relation	rel = table_open(r->runs, AccessShareLock);
	Relation	index = index_open(r->runs_pkey, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	Jsonb	   *policy = NULL;

	*owner = InvalidOid;
	if (probe_primary_key(rel, index, keys, 1, snapshot, slot))
	{
		*owner = DatumGetObjectId(slot->tts_values[r->runs_owner_attnum - 1]);
		if (!slot->tts_isnull[r->runs_policy_attnum - 1])
			policy = (Jsonb *) PG_DETOAST_DATUM_COPY(slot->tts_values[r->runs_policy_attnum - 1]);
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return policy;
}
