/*
 * direct_write.h -- inserting and updating one row without planning or starting a query.
 *
 * For the extension's own tables only: no privileges are checked. Both keep the table locked to
 * the end of the transaction and make the row visible to the transaction's later commands.
 */
#ifndef DS_DIRECT_WRITE_H
#define DS_DIRECT_WRITE_H

#include "base/compat.h"
#include "access/attnum.h"
#include "storage/itemptr.h"

/*
 * Insert one row into `relid`: the column numbered attnums[i] gets values[i] (NULL where
 * nulls[i]). Every column of the table must be given: no defaults are applied. Unique indexes
 * are checked and partial index predicates evaluated.
 */
extern void ds_direct_insert_row(Oid relid, const AttrNumber *attnums, int ncols,
								 const Datum *values, const bool *nulls);

/*
 * Update the row of `relid` whose key in unique index `indexid` is keys[0..nkeys-1] (compared
 * with the equality functions key_eq[]): column attnums[i] gets values[i] (NULL where nulls[i]),
 * the other columns keep their values. Returns false, changing nothing, when no such row is
 * visible. The caller must hold the lock that serializes writers of that row.
 * `tid`, when not NULL, is where the caller last saw the row (an invalid pointer when it does
 * not know): tried before the index, and set to the new version's place.
 */
extern bool ds_direct_update_row(Oid relid, Oid indexid, int nkeys, const Datum *keys,
								 const RegProcedure *key_eq, ItemPointer tid,
								 const AttrNumber *attnums, int ncols, const Datum *values,
								 const bool *nulls);

/*
 * Between these, the writes made at the current transaction level reuse one executor state per
 * relation. For a run of many writes in one transaction (the worker's shared transactions).
 * The batch ends by itself when its transaction commits or aborts.
 */
extern void ds_direct_write_batch_begin(void);
extern void ds_direct_write_batch_end(void);

#endif							/* DS_DIRECT_WRITE_H */
