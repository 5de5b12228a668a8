/*
 * step_claims.h -- the worker's queries: claiming due steps, finding lost attempts, next due time.
 */
#ifndef DS_STEP_CLAIMS_H
#define DS_STEP_CLAIMS_H

#include "base/compat.h"
#include "ipc/executor_slot.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

#include "store/step_store.h"

typedef struct ClaimedStep
{
	char	   *run_id;
	char	   *step_id;
	int			attempt;		/* the attempt number the claim committed as
								 * started */
	bool		alone;			/* its last attempt was lost: it runs alone,
								 * after the others */
	StepRecord	rec;			/* the step as claimed (claims only; not lost
								 * attempts) */
} ClaimedStep;

/* The queue a claim served. */
typedef struct ClaimedQueue
{
	char		name[NAMEDATALEN];	/* "" when nothing was claimed */
	bool		limited;		/* it has a concurrency limit */
} ClaimedQueue;

/*
 * In the current transaction (READ COMMITTED), claim up to `limit` due steps of one queue: the
 * first queue after `after_queue` (in name order, wrapping around) that has due steps and room
 * under its concurrency limit (docs/queues.md), as many as ds_claim_size() allows for that
 * queue. Take each step's session lock (skipping steps in flight elsewhere), mark them running, count
 * their attempts and record this process as the claimant. A limited queue never has more steps
 * running than its concurrency: its row in durable_steps.queues is locked while its running
 * steps are counted and the claim is made. Claims come sorted by priority, then owner, then due
 * time; they are all one owner's (docs/queues.md, "Fair share between roles"), and none is a step of an
 * owner in passed_owners[0..n_passed_owners-1]. The caller commits, runs each attempt, and releases each step's session lock after the
 * attempt's outcome commits. Each claim carries the whole step as it was claimed: while its
 * session lock is held nobody else changes a running step, so the attempt needs no second read.
 * *served names the queue served; *skipped counts due steps passed over because someone else
 * held them.
 */
extern int	ds_claim_due_steps(const ClaimSizer *sizer, int limit, const char *after_queue,
							   const Oid *passed_owners, int n_passed_owners,
							   ClaimedQueue *served, MemoryContext cxt, ClaimedStep **claims,
							   int *skipped);

/*
 * Mark the steps at row places tids[0..n-1] (Datums pointing at ItemPointerData; the caller
 * holds their step locks) running: attempt counted, claim time, this process as claimant,
 * lease, and, when they come from a queue with a concurrency limit (`limited`), counted against
 * it. A row that is no longer there, waiting and due is left alone (the executors read the rows
 * without row locks). The attempt is durable as started once the transaction commits.
 * Returns how many were claimed, and the claims, allocated in cxt and sorted by `order`, in
 * *claims.
 */
extern int	ds_mark_steps_running(Datum *tids, int n, bool limited, MemoryContext cxt,
								  ClaimedStep **claims, int (*order) (const void *, const void *));

/*
 * In the current transaction, find steps left running by an executor that is gone (their
 * session lock is free), and record the attempts of at most `limit` of them as lost (DS007,
 * retryable by the policy): call again while it returns `limit`. Returns the steps recovered;
 * their session locks are held: release them after commit. It reads every waiting and running
 * step: run it when a worker process has ended (ds_lost_attempts_epoch), not on every pass.
 */
extern int	ds_recover_lost_attempts(int limit, MemoryContext cxt, ClaimedStep **recovered);

/*
 * In the current transaction: up to `limit` HTTP steps whose outcome the HTTP worker kept for an
 * executor to record with their hook (ds_record_kept_outcome), oldest first. Returns how many,
 * their identities allocated in cxt.
 */
extern int	ds_find_kept_outcomes(int limit, MemoryContext cxt, char ***run_ids, char ***step_ids);

/*
 * In the current transaction: up to `limit` running tasks whose lease ran out by `now`
 * (docs/tasks.md). Returns how many, their identities allocated in cxt.
 */
extern int	ds_find_expired_task_leases(TimestampTz now, int limit, MemoryContext cxt,
										char ***run_ids, char ***step_ids);

/*
 * The earliest next_attempt_at of a pending or retrying step of a queue with room under its
 * limit; 0 when there is none. (A full queue gets room when one of its attempts ends, and the
 * executor that ran it looks again at once.)
 */
extern TimestampTz ds_next_due_time(void);

#endif							/* DS_STEP_CLAIMS_H */
