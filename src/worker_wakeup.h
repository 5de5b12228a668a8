/*
 * worker_wakeup.h -- shared state of the background workers, and waking them at commit.
 */
#ifndef DS_WORKER_WAKEUP_H
#define DS_WORKER_WAKEUP_H

#include "compat.h"
#include "port/atomics.h"
#include "storage/latch.h"

/* executor slots shared by all the databases served */
#define DS_MAX_WORKERS 32
/* HTTP workers, one per served database (http_worker.c) */
#define DS_MAX_HTTP_WORKERS 64
/* databases that may ask the launcher at once to be served */
#define DS_SERVE_REQUESTS 16

/* What an executor slot's last executor found (executor_state). */
typedef enum ExecutorState
{
	EXECUTOR_STARTING = 0,		/* started, has not looked for the extension yet */
	EXECUTOR_SERVING,			/* found the extension: runs its database's steps */
	EXECUTOR_NO_EXTENSION		/* every-database mode: found no extension and exited */
} ExecutorState;

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
	/* database of each running executor, InvalidOid when the slot is idle */
	pg_atomic_uint32 executor_db[DS_MAX_WORKERS];
	/*
	 * The claim each executor is taking now (claim_size.c): the key of its database and queue in
	 * the high 32 bits, the number of steps it takes in the low ones; 0 when it is not claiming
	 */
	pg_atomic_uint64 claiming[DS_MAX_WORKERS];
	/* ExecutorState of each slot, as its last executor left it */
	pg_atomic_uint32 executor_state[DS_MAX_WORKERS];
	/* the launcher's latch, NULL while no launcher runs */
	Latch	   *launcher_latch;
	/* databases whose backends committed work while none of their executors ran; 0 = free */
	pg_atomic_uint32 serve_request[DS_SERVE_REQUESTS];
	/* database of each running HTTP worker, InvalidOid when the slot is free; and its latch */
	pg_atomic_uint32 http_db[DS_MAX_HTTP_WORKERS];
	Latch	   *http_latch[DS_MAX_HTTP_WORKERS];
	/*
	 * Bumped whenever an attempt may have been left running with nobody to finish it: a worker
	 * process ended, or could not record an outcome; 1 when the server starts. Executors look
	 * for lost attempts when it moves (ds_lost_attempts_epoch).
	 */
	pg_atomic_uint64 lost_epoch;
} WorkerShared;

/* The key of attempt `attempt` of step (run_id, step_id) in cancel requests; never 0. */
extern uint64 ds_attempt_cancel_key(const char *run_id, const char *step_id, int attempt);

/*
 * Ask the executor `pid` to stop the attempt `key` it runs. False when no executor of this
 * cluster has that pid.
 */
extern bool ds_request_cancel(int pid, uint64 key);

/*
 * An attempt may have been left running by a process that cannot finish it (it is ending, or
 * failed to record the outcome and let go of the step's lock): bump the epoch of lost attempts
 * and wake every executor, which then looks for them (worker.c).
 */
extern void ds_attempts_may_be_lost(void);
/* The epoch of lost attempts: it moves when ds_attempts_may_be_lost() is called. */
extern uint64 ds_lost_attempts_epoch(void);

/* In an executor: has the attempt `key` been asked to stop? (Safe in a signal handler.) */
extern bool ds_cancel_requested(uint64 key);
/* In an executor: forget a request for attempt `key` (it ended). */
extern void ds_cancel_request_clear(uint64 key);

/* In the launcher: the next database that asked to be served; InvalidOid when none. */
extern Oid	ds_take_serve_request(void);

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

/* The same, without the warnings: the install script's call (CREATE EXTENSION). */
extern void ds_worker_serve_at_commit(void);

/*
 * ds_worker_wake_at_commit for a step of kind `kind` ("sql" or "http"; NULL is "sql"): HTTP
 * steps are run by the database's HTTP worker, which is the process to wake.
 */
extern void ds_worker_wake_kind_at_commit(const char *kind);

/*
 * In the HTTP worker: take a slot for this database, so that commits wake this process; false
 * when another HTTP worker of this database holds one. The slot is let go at exit.
 */
extern bool ds_http_worker_take_slot(void);

#endif							/* DS_WORKER_WAKEUP_H */
