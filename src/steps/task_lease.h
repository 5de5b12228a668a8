/*
 * task_lease.h -- the attempts of tasks under their leases (task_lease.c, docs/tasks.md):
 * application workers claim them (ds_claim_tasks), keep them (ds_heartbeat) and record their
 * outcomes in their own transactions (ds_complete_task, ds_fail_task) or give them back
 * (ds_release_task); the background worker records the leases that ran out. The lock, the
 * lease's check and the recording of an outcome are shared with task_batch.c.
 */
#ifndef DS_TASK_LEASE_H
#define DS_TASK_LEASE_H

#include "base/compat.h"

#include "base/attempt_outcome.h"
#include "store/step_store.h"

/* What a token names: one attempt of one step, claimed at one time. */
typedef struct TaskToken
{
	char	   *run_id;
	char	   *step_id;
	int			attempt;
	TimestampTz claimed_at;
} TaskToken;

/* A token as ds_claim_tasks returned it, parsed into *t: 22023 when it is malformed. */
extern void ds_task_token_parse(const char *arg, TaskToken *t);

/*
 * Lock and read the task the token names (DS404 for a step the caller may not see, 42501 for
 * one it may see but not act as, 22023 for a step that is not a task); true when the token's
 * attempt holds the step's unexpired lease now.
 */
extern bool ds_lock_task_lease(const TaskToken *t, StepRecord *rec);

/*
 * Record the outcome of the attempt that holds the lease (ds_lock_task_lease answered true), in
 * the caller's transaction: the state rules, the hooks, the attempt's record, the wake-ups.
 */
extern void ds_record_task_outcome(StepRecord *rec, AttemptOutcome *o);

/* ds_record_task_outcome of a success with `result` (NULL: JSON null). */
extern void ds_record_task_success(StepRecord *rec, Jsonb *result);

/*
 * A running task whose lease ran out (its lock and row lock held, read under them): record its
 * attempt as lost (DS007), or timed out (DS004) when its deadline passed first -- retried by the
 * policy, or uncertain for a person when the task says so (on_lost). False when the lease did
 * not run out after all (renewed or ended since it was found).
 */
extern bool ds_record_expired_task_lease(StepRecord *rec, TimestampTz now);

/*
 * ds_cancel_step on a running task (its lock and row lock held): the attempt is recorded
 * cancelled (it does not use the budget), and its token no longer holds the lease; the caller
 * then cancels the step.
 */
extern void ds_cancel_running_task(StepRecord *rec);

#endif							/* DS_TASK_LEASE_H */
