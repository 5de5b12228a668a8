/*
 * store.h -- the storage layer: the extension's tables and every module that reads or writes
 * them. Include this one header to use any of them.
 *
 *   store_relations.c  the tables, looked up once per backend; the one relcache callback
 *   step_store.c       steps and attempts through SPI: locked reads, the column lists
 *   step_probe.c       replays read straight through the primary key
 *   direct_write.c     the hot paths' row inserts and updates, without SPI
 */
#ifndef DS_STORE_H
#define DS_STORE_H

#include "compat.h"

#include "step_store.h"

/* The extension's tables, looked up once per backend and forgotten on any relcache change. */
typedef struct StoreRelations
{
	Oid			steps;
	Oid			steps_pkey;
	Oid			runs;
	Oid			runs_pkey;
	Oid			attempts;
	Oid			owner;			/* owner of durable_steps.steps: the internal statements' role */
	/* attribute numbers of the columns, in StepColumn and AttemptColumn order */
	AttrNumber	step_attnums[N_STEP_COLUMNS];
	AttrNumber	attempt_attnums[N_ATTEMPT_COLUMNS];
	AttrNumber	runs_policy_attnum;
	AttrNumber	runs_owner_attnum;
} StoreRelations;

/* Raises "extension is not installed" when the tables are missing. */
extern const StoreRelations *ds_store_relations(void);

/* Are the extension's tables here? (No error when they are not.) */
extern bool ds_store_installed(void);

/* From _PG_init: registers the storage layer's one relcache callback. */
extern void ds_store_init_module(void);

#include "direct_write.h"
#include "step_probe.h"

#endif							/* DS_STORE_H */
