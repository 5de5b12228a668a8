/*
 * fence_applied.h -- which worker processes have taken the partitions of this server's settings
 * (docs/partitions.md, "Moving a partition").
 *
 * A fence is a reload of durable_steps.partitions, and each process takes a reload at a point of
 * its own: an executor between its claims, the HTTP worker between its passes. Until every worker
 * of the database has, one may still claim a step of the fenced partition, which the export would
 * then hand to another server as it was -- to run there too. So each worker publishes the
 * partitions it serves (ds_partition_settings_key) each time it takes them, and an export waits
 * until all say what the exporting session says.
 */
#ifndef DS_FENCE_APPLIED_H
#define DS_FENCE_APPLIED_H

#include "base/compat.h"

/* In an executor or the HTTP worker: publish the partitions it serves now. */
extern void ds_fence_note_applied(void);

/*
 * The worker processes of database `dbid` whose published partitions are not `key`: writes at
 * most `max` pids to pids[], returns how many there are.
 */
extern int	ds_fence_workers_behind(Oid dbid, uint64 key, int *pids, int max);

#endif							/* DS_FENCE_APPLIED_H */
