/*
 * executor.h -- an executor of the background worker: claims due steps and runs their attempts
 * (docs/worker.md). The launcher (launcher.h) starts the executors.
 */
#ifndef DS_EXECUTOR_H
#define DS_EXECUTOR_H

#include "base/compat.h"
#include "postmaster/bgworker.h"

extern void ds_executor_init_module(void);

extern PGDLLEXPORT void ds_executor_main(Datum arg);

#endif							/* DS_EXECUTOR_H */
