/*
 * http_outcomes.h -- the HTTP worker's attempts, and the outcome each one records
 * (http_outcomes.c): a finished transfer, or a request refused before it was sent, turned into
 * the step's recorded attempt.
 */
#ifndef DS_HTTP_OUTCOMES_H
#define DS_HTTP_OUTCOMES_H

#include "base/compat.h"
#include "lib/ilist.h"
#include "utils/timestamp.h"

#include "base/attempt_outcome.h"
#include "http/http_request.h"
#include "http/http_transfer.h"
#include "store/step_store.h"

/* A claim batch's memory (http_worker.c): freed when its last attempt has been recorded. */
typedef struct ClaimBatch ClaimBatch;

/* One claimed attempt of an HTTP step, from its claim to its recorded outcome. */
typedef struct HttpAttempt
{
	dlist_node	node;			/* in the HTTP worker's attempts in flight, or
								 * finished */
	ClaimBatch *batch;			/* whose memory holds it */
	StepRecord	step;			/* the step as claimed */
	TimestampTz claimed_at;
	HttpRequest request;		/* the step's stored request, read at the
								 * claim */

	/*
	 * a second send after an uncertain first one is safe: an idempotency
	 * header, or an idempotent method
	 */
	bool		repeat_safe;
	char	   *idempotency_key;	/* for the step's idempotency header;
									 * NULL: none */
	bool		check_addresses;	/* no proxy: its connections are checked */
	bool		by_name;		/* its host was allowed by name: only denied
								 * addresses apply */

	/*
	 * a request refused before sending (stored request invalid, host no
	 * longer allowed, libcurl could not set it up): nothing was sent, and
	 * `refusal` is its outcome
	 */
	bool		refused;
	AttemptOutcome refusal;
	HttpTransfer transfer;		/* the request in libcurl's hands */
} HttpAttempt;

/* Refuse the attempt's request, which is not sent: its outcome is this. */
extern void ds_http_attempt_refuse(HttpAttempt *attempt, AttemptClass cls, int sqlerrcode,
								   char *message, char *detail, char *hint);

/*
 * Record a finished attempt's outcome in the current transaction, in a subtransaction of its
 * own, so that one step's failure to record loses no other's: applied to the step and written,
 * or, when it has a hook to run, kept on the step for an executor. False, with a WARNING, when it
 * could not be recorded: its step stays running, and once its lock is let go the executors'
 * recovery counts the attempt lost. A write refused because the server turned read-only
 * (25006) is re-thrown instead: the HTTP worker keeps the attempt, unchanged, to record later.
 */
extern bool ds_record_http_attempt(HttpAttempt *attempt);

#endif							/* DS_HTTP_OUTCOMES_H */
