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
 * Must the workers wait, claiming, running and recording nothing, and look again later? While
 * durable_steps.paused is on (a restored copy, README "Backups"), or while the server refuses
 * writes (default_transaction_read_only, as a failover manager sets it while it hands a primary
 * over; rather than fail on the first write and be restarted every second). Logs each change
 * once.
 */
extern bool ds_worker_must_wait(void);
extern void ds_worker_commit(void);

/* The HTTP worker of database `dbname` (http_worker.c), registered by the launcher. */
extern void ds_http_worker_init_module(void);
extern BackgroundWorkerHandle *ds_http_worker_register(Oid dbid, const char *dbname);
extern PGDLLEXPORT void ds_http_worker_main(Datum arg);

extern PGDLLEXPORT void ds_launcher_main(Datum arg);
extern PGDLLEXPORT void ds_executor_main(Datum arg);

#endif							/* DS_WORKER_H */
