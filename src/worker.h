/*
 * worker.h -- the background worker: a launcher and the executors it starts (README, "The
 * background worker").
 */
#ifndef DS_WORKER_H
#define DS_WORKER_H

#include "compat.h"
#include "postmaster/bgworker.h"

extern int	ds_max_workers;

extern void ds_launcher_init_module(void);
extern void ds_executor_init_module(void);

/*
 * A transaction on the extension's tables, share-locking the extension against DROP EXTENSION;
 * false, with no transaction open, when the extension is not installed. End it with
 * ds_worker_commit().
 */
extern bool ds_worker_begin_work(const char *activity);

/*
 * Does the server refuse writes (default_transaction_read_only, as a failover manager sets it
 * while it hands a primary over)? The workers then write nothing and look again later, instead
 * of failing on their first write and being restarted every second. Logs each change once.
 */
extern bool ds_worker_writes_refused(void);
extern void ds_worker_commit(void);

/* The HTTP worker of database `dbname` (http_worker.c), registered by the launcher. */
extern void ds_http_worker_init_module(void);
extern BackgroundWorkerHandle *ds_http_worker_register(Oid dbid, const char *dbname);
extern PGDLLEXPORT void ds_http_worker_main(Datum arg);

extern PGDLLEXPORT void ds_launcher_main(Datum arg);
extern PGDLLEXPORT void ds_executor_main(Datum arg);

#endif							/* DS_WORKER_H */
