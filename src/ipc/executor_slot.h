/*
 * executor_slot.h -- what an executor says in its slot of the workers' shared memory
 * (ExecutorSlot, ipc/worker_shmem.h), and what the others read there (docs/worker.md):
 *
 *   - the claim it is taking now, and how much it claims at a time (claim sizes);
 *   - whose work it runs and since when: the fair share between roles (executor load);
 *   - the attempts it started in its open transaction, published as it ends: which of a gone
 *     executor's claims never started (unstarted claims);
 *   - the partitions it serves, as it last took them, which the HTTP worker says in its slot too
 *     (fences).
 *
 * Each field has one writer, the process of the slot, and is written without a lock. A claimed
 * attempt calls ds_slot_attempt_starting, a workflow turn ds_slot_turn_starting; an executor
 * that stops running attempts calls ds_slot_idle.
 */
#ifndef DS_EXECUTOR_SLOT_H
#define DS_EXECUTOR_SLOT_H

#include "base/compat.h"
#include "utils/timestamp.h"

/* ---------------------------------------------------------------------------------------------
 * Claim sizes: how much work an executor claims at a time (docs/worker.md).
 * ---------------------------------------------------------------------------------------------
 */

/* queues whose pace an executor remembers; the least recently claimed one is forgotten first */
#define CLAIM_SIZER_QUEUES 16

/* How long one item of a queue took to run, lately (moving average). */
typedef struct QueuePace
{
	char		queue[NAMEDATALEN]; /* the queue's name, cut to fit; "" = a
									 * free entry */
	double		usecs_per_item;
	TimestampTz last_claim;		/* when a claim from it last ended */
} QueuePace;

/* The recent pace of one kind of claim (steps, run turns), queue by queue. */
typedef struct ClaimSizer
{
	QueuePace	queues[CLAIM_SIZER_QUEUES];
} ClaimSizer;

/*
 * The size of a claim whose pace is not known yet. Steps: one, because a step may take a second
 * or an hour, and each one an executor claims waits for that executor while another may be idle.
 * Run turns: a few, because a turn runs until its workflow waits, most often for a step, which
 * the turn leaves to a claim of its own.
 */
#define FIRST_STEP_CLAIM_SIZE 1
#define FIRST_TURN_CLAIM_SIZE 10

/*
 * How many items the next claim from `queue` may take: at most `most` (durable_steps.batch_size),
 * at most this executor's share of the server's lock table (each claimed item holds a lock until
 * its outcome commits), and about CLAIM_BUDGET_MS of work at the queue's recent pace, or `first`
 * when the pace is not known. At least 1.
 */
extern int	ds_claim_size(const ClaimSizer *sizer, const char *queue, int most, int first);

/* A claim of n items of `queue` ran from `started` until now: update the queue's pace. */
extern void ds_claim_size_ran(ClaimSizer *sizer, const char *queue, int n, TimestampTz started);

/* The most locks this executor's claims may hold at once: its share of the lock table. */
extern int	ds_claim_lock_share(void);

/*
 * Executors claiming from the same queue at once (docs/worker.md): the one that
 * holds the queue's claim lock (step_lock.c) takes its first due steps, and says how many
 * (ds_claim_announce); one that comes meanwhile reads past them (ds_claims_in_progress) instead
 * of waiting for its turn, and says how many it takes in its own turn. An announcement lasts
 * until the claim commits (ds_claim_announce_end).
 */
extern void ds_claim_announce(const char *queue, int n);
extern void ds_claim_announce_end(void);

/* Steps other executors of this database are claiming from `queue` now; 0 when none. */
extern int	ds_claims_in_progress(const char *queue);

/* ---------------------------------------------------------------------------------------------
 * The attempts an executor runs: whose they are, and which it started.
 *
 * Executor load -- which roles' work occupies the executors: the fair share between roles
 * (docs/queues.md, "Fair share between roles"). An executor says, in shared memory, whose
 * attempts it runs and since when. Running one role's attempts for DS_BUSY_ATTEMPT_MS (one
 * attempt, or several of one claim) makes an executor busy and that role a busy owner: claims
 * then pass a busy owner's steps by while other roles' steps are due (every other claim, in the
 * database's own executors), and when every executor of a database is busy the launcher starts
 * an extra one (durable_steps.max_extra_workers), which runs only the steps of roles that are
 * not busy and leaves once an executor is free again.
 *
 * Unstarted claims -- which of a gone executor's claims never started (docs/worker.md, "Lost
 * attempts"). An executor commits a batch of claims as started before it runs any of
 * them. When it ends midway -- a body that ignored its cancellation, pg_terminate_backend, an
 * error it could not recover from -- the claims it had not reached are still marked running.
 * Each executor tells shared memory, as it exits, which attempts it had started in the
 * transaction still open (those may have run); whoever then records its lost attempts gives the
 * others their attempt back instead of charging them. When the executor ended itself because the
 * last attempt it started ignored its cancellation, the attempts started before that one in the
 * same transaction are known to have been rolled back for another step's sake: they get their
 * attempt back too. A crash resets shared memory: every claim is then charged, as any attempt
 * whose fate nobody knows.
 * ---------------------------------------------------------------------------------------------
 */

/* Why an executor ended, as far as it knows as it exits. */
typedef enum ExecutorEndCause
{
	EXECUTOR_END_OTHER,			/* a signal, an error it could not recover
								 * from, the end of the server */
	EXECUTOR_END_BODY,			/* the last attempt's body ignored its
								 * cancellation past the grace */
	EXECUTOR_END_SUCCESS_HOOK,	/* its on_success hook did */
	EXECUTOR_END_FAILURE_HOOK	/* its on_failure hook did */
} ExecutorEndCause;

/* What is known of a lost claim of a gone executor. */
typedef enum ClaimFate
{
	CLAIM_FATE_UNKNOWN,			/* not an executor's, or its record is gone:
								 * charge it */
	CLAIM_STARTED,				/* its body may have run: charge it */
	CLAIM_IGNORED_CANCEL,		/* its body ignored its cancellation and ended
								 * the executor */
	CLAIM_SUCCESS_HOOK_IGNORED_CANCEL,	/* its on_success hook ignored its
										 * cancellation */
	CLAIM_FAILURE_HOOK_IGNORED_CANCEL,	/* its on_failure hook did */
	CLAIM_NEVER_STARTED,		/* its executor ended before it: give its
								 * attempt back */
	CLAIM_ROLLED_BACK_BY_ANOTHER	/* it ran in the transaction whose last
									 * claim's body or hook ignored its
									 * cancellation: its outcome and every
									 * write of its body rolled back with it */
} ClaimFate;

/*
 * In an executor: claimed attempt `key` (ds_attempt_cancel_key) of a step of role `owner` starts
 * now, in the open transaction. It counts as started should the executor end
 * (ds_publish_started_claims), and the executor as busy with `owner` since the first of that
 * role's attempts in a row (those of one claim), until ds_slot_idle. A claim is sized to about
 * 100 ms of work (ds_claim_size), so a drain of quick steps never makes an executor busy.
 */
extern void ds_slot_attempt_starting(uint64 key, Oid owner);

/*
 * In an executor: a workflow turn of a run of role `owner` starts now; the executor is busy with
 * that role since the first turn of its transaction, until ds_slot_idle. The step the turn runs
 * counts as started only once its body may run (ds_claim_starting, run_turn.c).
 */
extern void ds_slot_turn_starting(Oid owner);

/* In an executor: attempt `key` (ds_attempt_cancel_key) starts now, in the open transaction. */
extern void ds_claim_starting(uint64 key);

/*
 * In an executor: is there room for one more attempt in the open transaction? (At most
 * DS_STARTED_CLAIMS_MAX: executor.c commits before it starts more.)
 */
extern bool ds_claim_start_room(void);

/*
 * In an executor: the transaction of the started attempts committed (or rolled back); the
 * executor goes on with the same role's attempts.
 */
extern void ds_claims_settled(void);

/*
 * In an executor: the transaction of the started attempts committed (or rolled back), and the
 * attempts or turns in a row are over (a claim's, a transaction of turns): the executor is busy
 * with nobody.
 */
extern void ds_slot_idle(void);

/*
 * In an exiting executor: publish the attempts of the open transaction, for the processes that
 * record this executor's lost claims, and why it ends: `cause` names what of the last one
 * ignored its cancellation, if anything did. Also in an executor that lets go of its claims and
 * goes on (a write refused by a server turned read-only): the record speaks for the claims it
 * took since its last record, or since it started.
 */
extern void ds_publish_started_claims(ExecutorEndCause cause);

/*
 * The fate of attempt `key` claimed at `claimed_at` by process `pid`, which is gone (the
 * claim's lock was free).
 */
extern ClaimFate ds_lost_claim_fate(int pid, TimestampTz claimed_at, uint64 key);

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

/*
 * The worker processes of database `dbid`, as their slots say (written without a lock: a
 * glance): its executors, how many of them run an attempt or a turn now, its HTTP workers.
 */
extern void ds_count_workers(Oid dbid, int *executors, int *executors_busy, int *http_workers);

/* ---------------------------------------------------------------------------------------------
 * Fences: which worker processes have taken the partitions of this server's settings
 * (docs/partitions.md, "Moving a partition").
 *
 * A fence is a reload of durable_steps.partitions, and each process takes a reload at a point of
 * its own: an executor between its claims, the HTTP worker between its passes. Until every worker
 * of the database has, one may still claim a step of the fenced partition, which the export would
 * then hand to another server as it was -- to run there too. So each worker publishes the
 * partitions it serves (ds_partition_settings_key) each time it takes them, and an export waits
 * until all say what the exporting session says.
 * ---------------------------------------------------------------------------------------------
 */

/* In an executor or the HTTP worker: publish the partitions it serves now. */
extern void ds_fence_note_applied(void);

/*
 * The worker processes of database `dbid` whose published partitions are not `key`: writes at
 * most `max` pids to pids[], returns how many there are.
 */
extern int	ds_fence_workers_behind(Oid dbid, uint64 key, int *pids, int max);

#endif							/* DS_EXECUTOR_SLOT_H */
