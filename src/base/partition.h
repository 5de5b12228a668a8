/*
 * partition.h -- the logical partitions of runs this server owns (docs/partitions.md).
 */
#ifndef DS_PARTITION_H
#define DS_PARTITION_H

#include "base/compat.h"

/* The largest durable_steps.partition_count. */
#define DS_MAX_PARTITIONS 1024

extern void ds_partition_init_module(void);

/* durable_steps.partition_count: 0 when this server is not partitioned. */
extern int	ds_partition_count(void);

/*
 * The partition of run_id `run_id` among `count` (a power of two): hashtext(run_id) &
 * (count - 1), as a PL/Proxy router computes it with RUN ON hashtext(run_id).
 */
extern int	ds_partition_of_run(const char *run_id, int count);

/* Does this server own run_id `run_id`? Always when it is not partitioned. */
extern bool ds_partition_owns(const char *run_id);

/* Does this server own partition `p` of the current count? */
extern bool ds_partition_owns_partition(int p);

/*
 * The partitions this process serves, as one number: partition_count and the partitions owned
 * (0 when not partitioned). Two processes with the same settings have the same number; a
 * worker publishes it (ipc/executor_slot.h) so that a partition's export knows every worker
 * has taken its fence.
 */
extern uint64 ds_partition_settings_key(void);

/*
 * Raise DS201 (wrong partition) unless this server owns run_id `run_id`: every call that names
 * a run, before it reads or writes anything of it.
 */
extern void ds_partition_check_run(const char *run_id);

/*
 * The same for an idempotency key (its partition is hashtext(key)'s): every ds_idempotent call,
 * before it reads or writes the key's entry.
 */
extern void ds_partition_check_idempotency_key(const char *key);

#endif							/* DS_PARTITION_H */
