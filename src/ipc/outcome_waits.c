/*
 * outcome_waits.c -- sessions that wait for a run or a step to stop, and the commits that wake
 * them (outcome_waits.h).
 *
 * The wake-up is PostgreSQL's own condition variable: a waiter prepares to sleep on the variable
 * of its run before it reads the state, so that a commit between the read and the sleep still
 * wakes it; the broadcast is sent from the transaction callback of a commit, which runs once the
 * commit is visible to new snapshots. A transaction marks the variables to wake in a bitmap; a
 * transaction that rolls back wakes nobody.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "ipc/outcome_waits.h"

/* Condition variables; a power of two, so that a hash picks one with a mask. */
#define DS_WAIT_PARTITIONS 256

typedef struct OutcomeWaits
{
	ConditionVariable cv[DS_WAIT_PARTITIONS];
} OutcomeWaits;

static OutcomeWaits *waits = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* the partitions this transaction wakes when it commits */
static uint64 wake_pending[DS_WAIT_PARTITIONS / 64];
static bool any_wake_pending = false;
static bool callback_registered = false;

static void
waits_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(OutcomeWaits)));
}

static void
waits_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	waits = ShmemInitStruct("durable_steps outcome waits", sizeof(OutcomeWaits), &found);
	if (!found)
		for (int i = 0; i < DS_WAIT_PARTITIONS; i++)
			ConditionVariableInit(&waits->cv[i]);
	LWLockRelease(AddinShmemInitLock);
}

void
ds_outcome_waits_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = waits_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = waits_shmem_startup;
}

bool
ds_outcome_waits_available(void)
{
	return waits != NULL;
}

static int
partition_of(const char *run_id)
{
	return (int) (hash_bytes((const unsigned char *) run_id, (int) strlen(run_id)) &
				  (DS_WAIT_PARTITIONS - 1));
}

/* Transaction callback: a commit wakes the marked partitions; any end forgets them. */
static void
wake_at_end_of_xact(XactEvent event, void *arg)
{
	bool		commit = event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT;

	if (!any_wake_pending ||
		(!commit && event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT))
		return;
	if (commit && waits != NULL)
		for (int i = 0; i < DS_WAIT_PARTITIONS; i++)
			if (wake_pending[i / 64] & (UINT64CONST(1) << (i % 64)))
				ConditionVariableBroadcast(&waits->cv[i]);
	memset(wake_pending, 0, sizeof(wake_pending));
	any_wake_pending = false;
}

void
ds_outcome_wake_at_commit(const char *run_id)
{
	int			p;

	if (waits == NULL)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(wake_at_end_of_xact, NULL);
		callback_registered = true;
	}
	p = partition_of(run_id);
	wake_pending[p / 64] |= UINT64CONST(1) << (p % 64);
	any_wake_pending = true;
}

bool
ds_outcome_wait(const char *run_id, int64 timeout_ms, bool (*done) (void *arg), void *arg)
{
	ConditionVariable *cv;
	TimestampTz deadline = GetCurrentTimestamp() + timeout_ms * 1000;
	bool		finished;

	if (waits == NULL)
		return done(arg);
	cv = &waits->cv[partition_of(run_id)];
	ConditionVariablePrepareToSleep(cv);
	for (;;)
	{
		TimestampTz remaining_us;

		finished = done(arg);
		if (finished)
			break;
		remaining_us = deadline - GetCurrentTimestamp();
		if (remaining_us <= 0)
			break;

		/*
		 * rounded up: a wait never answers before the time it was given has
		 * passed
		 */
		(void) ConditionVariableTimedSleep(cv, (long) ((remaining_us + 999) / 1000),
										   PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return finished;
}
