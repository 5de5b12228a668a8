/*
 * http_claims.h -- the HTTP worker's queries: claiming due HTTP steps, the next due time.
 */
#ifndef DS_HTTP_CLAIMS_H
#define DS_HTTP_CLAIMS_H

#include "base/compat.h"
#include "utils/timestamp.h"

#include "http/http_request.h"
#include "worker/step_claims.h"

/*
 * As ds_claim_due_steps (step_claims.h), for steps of kind 'http' only: in the current
 * transaction, claim up to `limit` due HTTP steps, each with its session lock held and its row
 * marked running (attempt counted, this process the claimant, lease set). The caller commits
 * before sending anything, and releases each lock after the outcome commits. The owners of the
 * requests in flight are inflight_owners[0..n_inflight-1]: no role gets more than `per_role`
 * in flight, counting those, so that one role's hanging requests never take every slot.
 */
extern int	ds_claim_due_http_steps(int limit, const Oid *inflight_owners, int n_inflight,
									int per_role, MemoryContext cxt, ClaimedStep **claims);

/* The earliest next_attempt_at of a pending or retrying HTTP step; 0 when there is none. */
extern TimestampTz ds_next_http_due_time(void);

#endif							/* DS_HTTP_CLAIMS_H */
