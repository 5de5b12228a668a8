/*
 * retention.h -- purging finished steps, their attempts and finished runs.
 */
#ifndef DS_RETENTION_H
#define DS_RETENTION_H

#include "base/compat.h"

extern void ds_retention_init_module(void);

/* Is a purge due (at most one pass a minute)? */
extern bool ds_retention_purge_due(void);

/*
 * Delete one batch of what finished more than durable_steps.retention ago, in the current
 * transaction. Returns the number of steps and runs deleted; a full batch means call again.
 */
extern int	ds_retention_purge_batch(void);
extern void ds_retention_purge_done(void);

/* Make the next purge due now (after a configuration reload). */
extern void ds_retention_purge_done_reset(void);

#define RETENTION_BATCH 1000

#endif							/* DS_RETENTION_H */
