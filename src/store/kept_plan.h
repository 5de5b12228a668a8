/*
 * kept_plan.h -- the extension's statements as kept plans (kept_plan.c): prepared once per
 * backend, and run through the one point that first checks the extension is installed
 * (ds_store_relations()).
 */
#ifndef DS_KEPT_PLAN_H
#define DS_KEPT_PLAN_H

#include "base/compat.h"
#include "executor/spi.h"

/* The saved plan in *slot, prepared (and kept for the backend's life) on first use. */
extern SPIPlanPtr ds_prepare_kept(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes);

/* `expected` of ds_store_execute for a statement whose every success is right */
#define DS_SPI_OK_ANY 0

/*
 * Run the kept statement in *slot (prepared from `sql` on first use: `sql` is not read once it
 * is, and may then be NULL) with args[0..nargs-1] and `nulls` as SPI_execute_plan takes them,
 * inside the caller's SPI connection. It first checks that the extension is installed
 * (ds_store_relations()). Unless the statement answers `expected` (or, for DS_SPI_OK_ANY, any
 * success), raises "<what> failed: <SPI result>", `what` formatted from what_fmt. Returns
 * SPI_processed; the rows, if any, are in SPI_tuptable.
 */
extern uint64 ds_store_execute(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes,
							   Datum *args, const char *nulls, bool read_only, long count,
							   int expected, const char *what_fmt,...) pg_attribute_printf(10, 11);

#endif							/* DS_KEPT_PLAN_H */
