/*
 * http_claims.h -- the HTTP worker's queries: claiming due HTTP steps, the next due time.
 */
#ifndef DS_HTTP_CLAIMS_H
#define DS_HTTP_CLAIMS_H

#include "compat.h"
#include "utils/timestamp.h"

#include "step_claims.h"

/* The queue of every HTTP step, at priority 0 (README, "HTTP steps"). */
#define DS_HTTP_QUEUE "default"

/*
 * As ds_claim_due_steps (step_claims.h), for steps of kind 'http' only: in the current
 * transaction, claim up to `limit` due HTTP steps, each with its session lock held and its row
 * marked running (attempt counted, this process the claimant, lease set). The caller commits
 * before sending anything, and releases each lock after the outcome commits.
 */
extern int	ds_claim_due_http_steps(int limit, MemoryContext cxt, ClaimedStep **claims);

/* The earliest next_attempt_at of a pending or retrying HTTP step; 0 when there is none. */
extern TimestampTz ds_next_http_due_time(void);

#endif							/* DS_HTTP_CLAIMS_H */
