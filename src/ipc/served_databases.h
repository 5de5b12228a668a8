/*
 * served_databases.h -- which databases the background worker serves (docs/worker.md).
 */
#ifndef DS_SERVED_DATABASES_H
#define DS_SERVED_DATABASES_H

#include "base/compat.h"

#include "nodes/pg_list.h"

/* durable_steps.database: '*' or a comma-separated list of database names */
extern char *ds_worker_databases;

/* Define durable_steps.database (when the library is preloaded). */
extern void ds_served_databases_init_module(void);

/* Does the worker serve every database in which the extension is installed ('*')? */
extern bool ds_serves_every_database(void);

/* The listed database names (a fresh List of palloc'd strings); NIL for '*'. */
extern List *ds_listed_databases(void);

/*
 * In a backend whose transaction leaves work for the worker: warn once per session when the
 * worker does not serve this database, with the fix.
 */
extern void ds_warn_if_database_not_served(void);

#endif							/* DS_SERVED_DATABASES_H */
