/*
 * unstarted_claims.h -- which of a gone executor's claims never started (docs/worker.md, "Security model").
 *
 * An executor commits a batch of claims as started before it runs any of them. When it ends
 * midway -- a body that ignored its cancellation, pg_terminate_backend, an error it could not
 * recover from -- the claims it had not reached are still marked running. Each executor tells
 * shared memory, as it exits, which attempts it had started in the transaction still open (those
 * may have run); whoever then records its lost attempts gives the others their attempt back
 * instead of charging them. When the executor ended itself because the last attempt it started
 * ignored its cancellation, the attempts started before that one in the same transaction are
 * known to have been rolled back for another step's sake: they get their attempt back too. A crash resets shared memory: every claim is then charged, as any
 * attempt whose fate nobody knows.
 */
#ifndef DS_UNSTARTED_CLAIMS_H
#define DS_UNSTARTED_CLAIMS_H

#include "base/compat.h"
#include "utils/timestamp.h"

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

/* In an executor: attempt `key` (ds_attempt_cancel_key) starts now, in the open transaction. */
extern void ds_claim_starting(uint64 key);

/*
 * In an executor: is there room for one more attempt in the open transaction? (At most
 * DS_STARTED_CLAIMS_MAX: executor.c commits before it starts more.)
 */
extern bool ds_claim_start_room(void);

/* In an executor: the transaction of the started attempts committed (or rolled back). */
extern void ds_claims_settled(void);

/*
 * In an exiting executor: publish the attempts of the open transaction, for the processes that
 * record this executor's lost claims, and why it ends: `cause` names what of the last one
 * ignored its cancellation, if anything did.
 */
extern void ds_publish_started_claims(ExecutorEndCause cause);

/*
 * The fate of attempt `key` claimed at `claimed_at` by process `pid`, which is gone (the
 * claim's lock was free).
 */
extern ClaimFate ds_lost_claim_fate(int pid, TimestampTz claimed_at, uint64 key);

#endif							/* DS_UNSTARTED_CLAIMS_H */
