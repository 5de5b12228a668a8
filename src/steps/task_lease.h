/*
 * task_lease.h -- the attempts of tasks under their leases (task_lease.c, docs/tasks.md):
 * application workers claim them (ds_claim_tasks), keep them (ds_heartbeat) and record their
 * outcomes in their own transactions (ds_complete_task, ds_fail_task) or give them back
 * (ds_release_task); the background worker records the leases that ran out.
 */
#ifndef DS_TASK_LEASE_H
#define DS_TASK_LEASE_H

#include "base/compat.h"

#include "store/step_store.h"

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
