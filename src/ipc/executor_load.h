/*
 * executor_load.h -- which roles' work occupies the executors: the fair share between roles
 * (docs/queues.md, "Fair share between roles").
 *
 * An executor says, in shared memory, whose attempts it runs and since when. Running one role's
 * attempts for DS_BUSY_ATTEMPT_MS (one attempt, or several of one claim) makes an executor busy and
 * that role a busy owner: claims then pass a busy owner's steps by while other roles' steps are
 * due (every other claim, in the database's own executors), and when every executor of a
 * database is busy the launcher starts an extra one (durable_steps.max_extra_workers), which
 * runs only the steps of roles that are not busy and leaves once an executor is free again.
 */
#ifndef DS_EXECUTOR_LOAD_H
#define DS_EXECUTOR_LOAD_H

#include "base/compat.h"

/*
 * In an executor: an attempt or a turn of role `owner` begins now; the executor has been busy
 * with that role since the first of its attempts in a row (those of one claim, or of one
 * transaction of turns), until ds_attempt_ended. A claim is sized to about 100 ms of work
 * (claim_size.c), so a drain of quick steps never makes an executor busy.
 */
extern void ds_attempt_began(Oid owner);

/* In an executor: the attempts in a row are over (a claim's, a transaction of turns). */
extern void ds_attempt_ended(void);

/*
 * The busy owners of database `dbid`: the owners of attempts running for DS_BUSY_ATTEMPT_MS or
 * more in its executors but the one in `except_slot` (-1: none). Writes at most DS_MAX_WORKERS
 * distinct OIDs to out[]; returns how many.
 */
extern int	ds_busy_owners(Oid dbid, int except_slot, Oid *out);

/*
 * Is every executor of database `dbid` but the one in `except_slot` busy (and at least one
 * running)?
 */
extern bool ds_executors_all_busy(Oid dbid, int except_slot);

#endif							/* DS_EXECUTOR_LOAD_H */
