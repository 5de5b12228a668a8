/*
 * http_worker.h -- the HTTP worker: one process per served database that sends its HTTP steps
 * (http_worker.c), registered by the launcher.
 */
#ifndef DS_HTTP_WORKER_H
#define DS_HTTP_WORKER_H

#include "base/compat.h"
#include "postmaster/bgworker.h"

/*
 * The HTTP worker of database `dbname` (http_worker.c), registered by the launcher; NULL when no
 * slot of max_worker_processes is free (the launcher says so).
 */
extern void ds_http_worker_init_module(void);
extern BackgroundWorkerHandle *ds_http_worker_register(Oid dbid, const char *dbname);
extern PGDLLEXPORT void ds_http_worker_main(Datum arg);

#endif							/* DS_HTTP_WORKER_H */
