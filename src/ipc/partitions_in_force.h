/*
 * partitions_in_force.h -- the partitions this server owns as its latest reload says, kept in
 * shared memory (partitions_in_force.c, docs/partitions.md).
 */
#ifndef DS_PARTITIONS_IN_FORCE_H
#define DS_PARTITIONS_IN_FORCE_H

#include "base/compat.h"

/* From _PG_init: the shared record, and its check registered with base/partition.c. */
extern void ds_partitions_in_force_init_module(void);

/*
 * Publish this process's partitions, stamped with when it last loaded the configuration file,
 * unless a process has published a later load. Each worker process calls it as it takes a
 * reload; every other process when it next checks a partition.
 */
extern void ds_partitions_in_force_publish(void);

#endif							/* DS_PARTITIONS_IN_FORCE_H */
