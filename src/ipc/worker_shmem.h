/*
 * worker_shmem.h -- the background workers' shared memory: its whole layout (WorkerShared, the
 * executors' and HTTP workers' slots), and waking the workers at commit.
 */
#ifndef DS_WORKER_SHMEM_H
#define DS_WORKER_SHMEM_H

#include "base/compat.h"
#include "base/step_kind.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

/* executor slots shared by all the databases served */
#define DS_MAX_WORKERS 32
/* HTTP workers, one per served database (http_worker.c) */
#define DS_MAX_HTTP_WORKERS 64
/* databases that may ask the launcher at once to be served */
#define DS_SERVE_REQUESTS 16

/*
 * The databases the launcher could not give a worker process, for lack of a slot of
 * max_worker_processes (or of the executors' slots): what each lacks, so that a call storing work
 * there says so (ds_worker_wake_kind_at_commit). One entry per served database.
 */
#define DS_STARVED_DATABASES 64
#define DS_STARVED_EXECUTOR 0x1 /* no executor runs: nothing deferred, retried
								 * or of a run is taken */
#define DS_STARVED_HTTP 0x2		/* no HTTP worker runs: no HTTP step is sent */

typedef struct StarvedDatabase
{
	pg_atomic_uint32 dboid;		/* InvalidOid: none */
	pg_atomic_uint32 lacks;		/* DS_STARVED_* */
} StarvedDatabase;

/* most attempts one transaction of an executor starts (executor_slot.c) */
#define DS_STARTED_CLAIMS_MAX 256

/*
 * The attempts an executor that ended had started in its last, uncommitted transaction
 * (executor_slot.c): its other claims never started. Written once as it exits, read by
 * whoever records its lost claims; pid is 0 while it is written.
 */
typedef struct EndedExecutor
{
	pg_atomic_uint32 pid;
	TimestampTz started_at;		/* the process's start, and its end: no other
								 * process with */
	TimestampTz ended_at;		/* the pid claimed in between */
	int			end_cause;		/* ExecutorEndCause (executor_slot.h): what of
								 * the last attempt ignored its cancellation,
								 * if anything did */
	int			n_started;
	uint64		started[DS_STARTED_CLAIMS_MAX]; /* ds_attempt_cancel_key of
												 * each */
} EndedExecutor;

/* What an executor slot's last executor found (ExecutorSlot.state). */
typedef enum ExecutorState
{
	EXECUTOR_STARTING = 0,		/* started, has not looked for the extension
								 * yet */
	EXECUTOR_SERVING,			/* found the extension: runs its database's
								 * steps */
	EXECUTOR_NO_EXTENSION		/* every-database mode: found no extension and
								 * exited */
} ExecutorState;

/*
 * One executor slot, shared by all the databases served (launcher.c hands them out): what its
 * running executor says of itself, and what others ask of it. Written without a lock, each field
 * by its one writer (the executor, or a backend asking it to cancel), read by anybody.
 */
typedef struct ExecutorSlot
{
	Latch	   *latch;			/* the running executor's latch; NULL when the
								 * slot is idle */
	pg_atomic_uint32 pid;		/* its process, 0 when the slot is idle */
	pg_atomic_uint32 db;		/* its database, InvalidOid when the slot is
								 * idle */
	pg_atomic_uint32 state;		/* ExecutorState, as its last executor left it */
	/* ds_cancel_step's request: the key of the attempt to stop; 0 = none */
	pg_atomic_uint64 cancel_request;

	/*
	 * The claim it is taking now (executor_slot.c): the key of its database
	 * and queue in the high 32 bits, the number of steps it takes in the low
	 * ones; 0 when it is not claiming
	 */
	pg_atomic_uint64 claiming;

	/*
	 * The owner of the attempt (or workflow turn) it runs now, and since when
	 * (executor_slot.c); InvalidOid and 0 between claims
	 */
	pg_atomic_uint32 attempt_owner;
	pg_atomic_uint64 attempt_since;
	/* the slot's last executor that ended (executor_slot.c) */
	EndedExecutor ended;

	/*
	 * the partitions its executor serves, as it last took them
	 * (executor_slot.c)
	 */
	pg_atomic_uint64 partitions_applied;

	/*
	 * The launcher asks its executor to leave after its pass, so that its
	 * slot of max_worker_processes goes to a database that has no worker
	 * (launcher.c); reset when the slot's next executor is started
	 */
	pg_atomic_uint32 leave_requested;
} ExecutorSlot;

/* The HTTP worker of one served database (http_worker.c). */
typedef struct HttpWorkerSlot
{
	pg_atomic_uint32 db;		/* its database, InvalidOid when the slot is
								 * free */
	Latch	   *latch;
	pg_atomic_uint32 pid;		/* its process */
	/* the partitions it serves, as it last took them (executor_slot.c) */
	pg_atomic_uint64 partitions_applied;
} HttpWorkerSlot;

typedef struct WorkerShared
{
	ExecutorSlot executor[DS_MAX_WORKERS];
	/* lets a committing backend wake the executors in turn */
	pg_atomic_uint32 next_executor;

	/*
	 * bumped by every DELETE, UPDATE or TRUNCATE of durable_steps.steps by
	 * SQL: replay_cache.c
	 */
	pg_atomic_uint64 replay_generation;
	/* the launcher's latch, NULL while no launcher runs */
	Latch	   *launcher_latch;

	/*
	 * databases whose backends committed work while none of their executors
	 * ran; 0 = free
	 */
	pg_atomic_uint32 serve_request[DS_SERVE_REQUESTS];
	HttpWorkerSlot http[DS_MAX_HTTP_WORKERS];

	/*
	 * Bumped whenever an attempt may have been left running with nobody to
	 * finish it: a worker process ended, or could not record an outcome; 1
	 * when the server starts. Executors look for lost attempts when it moves
	 * (ds_lost_attempts_epoch).
	 */
	pg_atomic_uint64 lost_epoch;

	/*
	 * bumped after every commit that kept an HTTP outcome for the executors
	 * to record
	 */
	pg_atomic_uint64 kept_outcomes;

	/*
	 * bumped after every commit that held a step of a limit or let an
	 * admission go: executors then look for steps to admit (steps/limits.c)
	 */
	pg_atomic_uint64 limit_admissions;

	/*
	 * bumped after every commit that settled an item of a map: executors then
	 * look for maps to join (runs/run_map.c)
	 */
	pg_atomic_uint64 map_settles;

	/*
	 * Sessions waiting for a task to be due (ds_wait_for_tasks): bumped and
	 * broadcast after every commit that made a task wait (docs/tasks.md)
	 */
	pg_atomic_uint64 tasks_generation;
	ConditionVariable tasks_cv;

	/* written by the launcher only: entry i is its i-th served database */
	StarvedDatabase starved[DS_STARVED_DATABASES];
} WorkerShared;

/* how long an attempt runs before its executor counts as busy (executor_slot.h) */
#define DS_BUSY_ATTEMPT_MS 1000

/*
 * The owner of the attempt executor slot `slot` has run for DS_BUSY_ATTEMPT_MS or more in
 * database `dbid`; InvalidOid when the slot runs none so long (or serves another database).
 */
static inline Oid
ds_slot_busy_owner(WorkerShared *shared, int slot, Oid dbid, TimestampTz now)
{
	Oid			owner;
	TimestampTz since;

	if (pg_atomic_read_u32(&shared->executor[slot].pid) == 0 ||
		pg_atomic_read_u32(&shared->executor[slot].db) != dbid)
		return InvalidOid;
	owner = pg_atomic_read_u32(&shared->executor[slot].attempt_owner);
	since = (TimestampTz) pg_atomic_read_u64(&shared->executor[slot].attempt_since);
	if (!OidIsValid(owner) || since == 0 ||
		!TimestampDifferenceExceeds(since, now, DS_BUSY_ATTEMPT_MS))
		return InvalidOid;
	return owner;
}

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
 * and wake every executor, which then looks for them (executor.c).
 */
extern void ds_attempts_may_be_lost(void);

/* The epoch of lost attempts: it moves when ds_attempts_may_be_lost() is called. */
extern uint64 ds_lost_attempts_epoch(void);

/* In an executor: has the attempt `key` been asked to stop? (Safe in a signal handler.) */
extern bool ds_cancel_requested(uint64 key);

/* In an executor: forget a request for attempt `key` (it ended). */
extern void ds_cancel_request_clear(uint64 key);

/*
 * In the launcher: what its `i`-th served database, `dbid`, lacks (DS_STARVED_*; 0 when its
 * workers run or it needs none).
 */
extern void ds_note_starved_database(int i, Oid dbid, uint32 lacks);

/* In the launcher: the next database that asked to be served; InvalidOid when none. */
extern Oid	ds_take_serve_request(void);

/* The executor's slot, set once when it starts; -1 in other processes. */
extern int	ds_executor_slot;

/* The slot of WorkerShared.http this process holds (the HTTP worker); -1 in any other process. */
extern int	ds_http_slot;

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
 * In the HTTP worker: the current transaction kept an HTTP outcome for the executors
 * (step_attempt.h): after its commit, move the generation of kept outcomes and wake one.
 */
extern void ds_worker_kept_outcome_at_commit(void);

/* Moves after each such commit; executors look for kept outcomes when it moved (executor.c). */
extern uint64 ds_kept_outcomes_generation(void);

/*
 * The current transaction held a step of a limit, or let an admission go (docs/limits.md):
 * after its commit, move the generation of admissions and wake one executor.
 */
extern void ds_limit_admission_at_commit(void);

/* Moves after each such commit; executors look for steps to admit when it moved (executor.c). */
extern uint64 ds_limit_admissions_generation(void);

/*
 * The current transaction settled an item of a map (docs/runs.md, "Fan-out and join"): after its
 * commit, move the generation of map settles and wake one executor.
 */
extern void ds_map_settled_at_commit(void);

/* Moves after each such commit; executors look for maps to join when it moved (executor.c). */
extern uint64 ds_map_settles_generation(void);

/* The same, without the warnings: the install script's call (CREATE EXTENSION). */
extern void ds_worker_serve_at_commit(void);

/*
 * ds_worker_wake_at_commit for a step of kind `kind`: the HTTP worker for the kinds it sends
 * (step_kind.h), the sessions waiting for tasks (ds_wait_for_tasks) for the kinds application
 * workers run, the executors for the others.
 */
extern void ds_worker_wake_kind_at_commit(StepKind kind);

/* Moves after each commit that made a task wait (0 when the library was not preloaded). */
extern uint64 ds_tasks_generation(void);

/*
 * Sleep until the generation of tasks moves past `seen`, at most `timeout_ms`; true when it
 * moved. Interrupts are served while it sleeps. Without shared memory, sleeps the whole time.
 */
extern bool ds_tasks_wait(uint64 seen, long timeout_ms);

/*
 * In the HTTP worker: take a slot for this database, so that commits wake this process; false
 * when another HTTP worker of this database holds one. The slot is let go at exit.
 */
extern bool ds_http_worker_take_slot(void);

#endif							/* DS_WORKER_SHMEM_H */
