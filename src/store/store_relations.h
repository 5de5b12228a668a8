/*
 * store_relations.h -- the root of the storage layer: the extension's tables, looked up once per
 * backend (store_relations.c). The modules above it: step_store.h (steps and attempts through
 * SPI), step_probe.h (replays through the primary key), direct_write.h (the hot paths' rows).
 */
#ifndef DS_STORE_RELATIONS_H
#define DS_STORE_RELATIONS_H

#include "base/compat.h"

#include "access/attnum.h"

/*
 * Most columns a table's layout may have. The layouts are step_store.h's (StepColumn,
 * AttemptColumn): it registers their column names (ds_store_register_columns), so that this
 * root of the storage layer includes nothing above it.
 */
#define DS_STORE_MAX_COLUMNS 64

/* The tables whose layouts are registered. */
typedef enum StoreTable
{
	STORE_TABLE_STEPS,
	STORE_TABLE_ATTEMPTS
} StoreTable;

/* The extension's tables, looked up once per backend and forgotten on any relcache change. */
typedef struct StoreRelations
{
	Oid			steps;
	Oid			steps_pkey;
	Oid			runs;
	Oid			runs_pkey;
	Oid			attempts;
	Oid			owner;			/* owner of durable_steps.steps: the internal
								 * statements' role */
	/* attribute numbers of the columns, in StepColumn and AttemptColumn order */
	AttrNumber	step_attnums[DS_STORE_MAX_COLUMNS];
	AttrNumber	attempt_attnums[DS_STORE_MAX_COLUMNS];
	AttrNumber	runs_policy_attnum;
	AttrNumber	runs_owner_attnum;
} StoreRelations;

/*
 * The version of the extension this library is (durable_steps.control's default_version): the
 * Makefile passes it, so that the library and the scripts it is installed with never disagree.
 */
#ifndef DS_EXTENSION_VERSION
#error "DS_EXTENSION_VERSION comes from the Makefile (durable_steps.control's default_version)"
#endif

/*
 * Raises "extension is not installed" when the tables are missing, and DS426 when the
 * extension installed in this database is of another version than this library (before
 * ALTER EXTENSION durable_steps UPDATE: docs/operations.md, "Upgrades").
 */
extern const StoreRelations *ds_store_relations(void);

/*
 * Are the extension's tables here? (No error when they are not; DS426 when they are of another
 * version than this library.)
 */
extern bool ds_store_installed(void);

/*
 * The extension installed in this database, and its version (*version, palloc'd): InvalidOid
 * and NULL when it is not installed. One catalog probe; in a transaction.
 */
extern Oid	ds_store_extension(char **version);

/* The version of the extension installed in this database, or NULL: ds_store_extension's. */
extern char *ds_store_installed_version(void);

/*
 * What a user does when the installed version differs from this library's: the hint of DS426
 * and of the worker's log line.
 */
extern const char *ds_store_version_hint(const char *installed);

/* From _PG_init: registers the storage layer's one relcache callback. */
extern void ds_store_init_module(void);

/*
 * From _PG_init, before any lookup: the names of `table`'s columns in layout order, names[0..n-1]
 * (n at most DS_STORE_MAX_COLUMNS; the array must live as long as the process). Each must exist
 * in the installed table.
 */
extern void ds_store_register_columns(StoreTable table, const char *const *names, int n);

#endif							/* DS_STORE_RELATIONS_H */
