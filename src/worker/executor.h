/*
 * worker.h -- the background worker: a launcher and the executors it starts (docs/worker.md).
 */
#ifndef DS_WORKER_H
#define DS_WORKER_H

#include "base/compat.h"
#include "postmaster/bgworker.h"

extern int	ds_max_workers;

extern void ds_launcher_init_module(void);
extern void ds_executor_init_module(void);

extern PGDLLEXPORT void ds_launcher_main(Datum arg);
extern PGDLLEXPORT void ds_executor_main(Datum arg);

#endif							/* DS_WORKER_H */
