/*
 * worker_wakeup.h -- shared state of the background workers, and waking them at commit.
 */
#ifndef DS_WORKER_WAKEUP_H
#define DS_WORKER_WAKEUP_H

#include "compat.h"
#include "port/atomics.h"
#include "storage/latch.h"

#define DS_MAX_WORKERS 16

typedef struct WorkerShared
{
	/* latches of the running executors; NULL when a slot is idle */
	Latch	   *executor_latch[DS_MAX_WORKERS];
	/* lets a committing backend wake the executors in turn */
	pg_atomic_uint32 next_executor;
	/* bumped by every DELETE, UPDATE or TRUNCATE of durable_steps.steps by SQL: replay_cache.c */
	pg_atomic_uint64 replay_generation;
	/* process of each running executor, 0 when the slot is idle */
	pg_atomic_uint32 executor_pid[DS_MAX_WORKERS];
	/* ds_cancel_step's request to each executor: the key of the attempt to stop; 0 = none */
	pg_atomic_uint64 cancel_request[DS_MAX_WORKERS];
	/* latch of the HTTP worker (http_worker.c); NULL when it is not running */
	Latch	   *http_latch;
} WorkerShared;

/* The key of attempt `attempt` of step (run_id, step_id) in cancel requests; never 0. */
extern uint64 ds_attempt_cancel_key(const char *run_id, const char *step_id, int attempt);

/*
 * Ask the executor `pid` to stop the attempt `key` it runs. False when no executor of this
 * cluster has that pid.
 */
extern bool ds_request_cancel(int pid, uint64 key);

/* In an executor: has the attempt `key` been asked to stop? (Safe in a signal handler.) */
extern bool ds_cancel_requested(uint64 key);
/* In an executor: forget a request for attempt `key` (it ended). */
extern void ds_cancel_request_clear(uint64 key);

/* The executor's slot, set once when it starts; -1 in other processes. */
extern int	ds_executor_slot;

/* Set up in _PG_init when loaded through shared_preload_libraries. */
extern void ds_worker_shmem_init_module(void);
/* NULL when the library was not preloaded (no worker can exist). */
extern WorkerShared *ds_worker_shared(void);

/*
 * The current transaction made a step due (or due later): wake an executor once it has
 * committed and released its locks, so that the executor sees the step and recomputes when to
 * wake next. Warns once per backend when no worker can exist because the library is not
 * preloaded.
 */
extern void ds_worker_wake_at_commit(void);

/*
 * The same for a step of kind `kind` ("sql" or "http"; NULL is "sql"): HTTP steps are run by
 * the HTTP worker, which is the process to wake.
 */
extern void ds_worker_wake_kind_at_commit(const char *kind);

#endif							/* DS_WORKER_WAKEUP_H */
