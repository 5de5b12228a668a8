/*
 * citus_commit.h -- two-phase commit asked of Citus by a transaction that writes the extension's
 * records (citus_commit.c, docs/citus.md).
 */
#ifndef DS_CITUS_COMMIT_H
#define DS_CITUS_COMMIT_H

#include "base/compat.h"

/*
 * Ask Citus, when it is loaded, to commit this transaction's writes on other nodes in two
 * phases. Cheap after the first call in a backend; nothing at all without Citus.
 */
extern void ds_citus_use_two_phase_commit(void);

/* durable_steps.citus_two_phase_commit, from _PG_init */
extern void ds_citus_commit_init_module(void);

#endif							/* DS_CITUS_COMMIT_H */
