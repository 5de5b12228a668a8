/*
 * launcher.h -- the background worker's launcher: starts the executors of the databases it
 * serves, their HTTP worker and extra executors (docs/worker.md).
 */
#ifndef DS_LAUNCHER_H
#define DS_LAUNCHER_H

#include "base/compat.h"
#include "postmaster/bgworker.h"

/* durable_steps.max_workers: the executors started for each database served */
extern int	ds_max_workers;

extern void ds_launcher_init_module(void);

extern PGDLLEXPORT void ds_launcher_main(Datum arg);

#endif							/* DS_LAUNCHER_H */
