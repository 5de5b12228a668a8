/*
 * direct_insert.h -- inserting one row without planning or starting a query.
 */
#ifndef DS_DIRECT_INSERT_H
#define DS_DIRECT_INSERT_H

#include "compat.h"

/*
 * Insert one row into `relid`: column colnames[i] gets values[i] (NULL where nulls[i]). Every
 * column of the table must be named: no defaults are applied. Unique indexes are checked,
 * partial index predicates evaluated, and the row is made visible to the transaction's later
 * commands. No privileges are checked: for the extension's own tables only.
 */
extern void direct_insert_row(Oid relid, const char *const *colnames, int ncols,
							  const Datum *values, const bool *nulls);

#endif							/* DS_DIRECT_INSERT_H */
