/*
 * http_outcomes.c -- the outcome of an HTTP step's attempt, recorded (http_outcomes.h).
 *
 * A finished transfer, or a request refused before it was sent, becomes the step's recorded
 * attempt: classified (http_response.c), applied to the step by its state rules
 * (step_attempt.c) and written, each in a subtransaction of its own, in the transaction the
 * HTTP worker's loop opened for a batch of outcomes (http_worker.c). No user code runs here,
 * among other roles' requests in flight: an outcome with a hook to run is kept on the step for
 * an executor, which records it with the hook (executor.c). Sending and the loop are
 * http_worker.c's; libcurl is http_transfer.c's.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "mb/pg_wchar.h"
#include "utils/elog.h"
#include "utils/jsonb.h"

#include "base/ds_errcodes.h"
#include "base/subtransaction.h"
#include "http/http_response.h"
#include "steps/limits.h"
#include "steps/step_attempt.h"
#include "steps/step_exec.h"
#include "store/run_store.h"
#include "worker/http_outcomes.h"

/* The outcome of a request refused before it was sent. */
static void
set_refusal(AttemptOutcome *outcome, AttemptClass cls, int sqlerrcode, char *message,
			char *detail, char *hint)
{
	outcome->cls = cls;
	outcome->sqlerrcode = sqlerrcode;
	outcome->message = message;
	outcome->detail = detail;
	outcome->hint = hint;
}

void
ds_http_attempt_refuse(HttpAttempt *attempt, AttemptClass cls, int sqlerrcode, char *message,
					   char *detail, char *hint)
{
	attempt->refused = true;
	set_refusal(&attempt->refusal, cls, sqlerrcode, message, detail, hint);
}

/* The outcome of a finished attempt; *kept: a response to keep on a step that did not succeed. */
static void
attempt_outcome(const HttpAttempt *attempt, AttemptOutcome *outcome, Jsonb **kept)
{
	const HttpTransfer *transfer = &attempt->transfer;

	*kept = NULL;
	if (attempt->refused)
		*outcome = attempt->refusal;
	else if (ds_http_transfer_refused_at_address(transfer))
	{
		memset(outcome, 0, sizeof(*outcome));
		set_refusal(outcome, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
					psprintf("host \"%s\" resolved to %s, an address HTTP steps may not reach",
							 attempt->request.host, transfer->refused_address),
					pstrdup("durable_steps.http_denied_addresses or the address entries of durable_steps.http_allowed_hosts refused the connection; nothing was sent."),
					pstrdup("A superuser can change those settings; then re-arm the step with ds_retry_step()."));
	}
	else
	{
		memset(outcome, 0, sizeof(*outcome));
		ds_http_classify(&transfer->resp, attempt->request.expect_json,
						 &attempt->request.status_rules, attempt->repeat_safe,
						 ds_http_max_response_size(), outcome, kept);
	}
	outcome->started_at = transfer->started_at;
	outcome->finished_at = transfer->finished_at;
}

/*
 * The detail of an attempt that got a response but did not succeed: the response itself, as
 * JSON text cut to DS_MAX_ERROR_TEXT bytes. (A step's result is its success's alone.)
 */
static char *
response_detail(const char *detail, Jsonb *response)
{
	char	   *text = JsonbToCString(NULL, &response->root, VARSIZE(response));
	char	   *full = psprintf("%s%sResponse: %s", detail ? detail : "", detail ? " " : "", text);
	int			len = strlen(full);

	if (len <= DS_MAX_ERROR_TEXT)
		return full;
	len = pg_mbcliplen(full, len, DS_MAX_ERROR_TEXT - 4);
	return psprintf("%.*s ...", len, full);
}

bool
ds_record_http_attempt(HttpAttempt *attempt)
{
	Subtransaction sub;
	volatile bool recorded = true;

	/*
	 * the state rules change the step they apply to: the attempt keeps the
	 * step as claimed, to be recorded again should this transaction roll back
	 */
	StepRecord	claimed = attempt->step;

	ds_subtransaction_begin(&sub);
	PG_TRY();
	{
		AttemptOutcome outcome;
		Jsonb	   *kept;
		StepRecord *step = &claimed;

		attempt_outcome(attempt, &outcome, &kept);
		if (kept != NULL)
			outcome.detail = response_detail(outcome.detail, kept);

		/*
		 * No user code runs here, among other roles' requests in flight: an
		 * outcome with a hook to run is kept for an executor, which records
		 * it with the hook (executor.c).
		 */
		if (step->limit_name != NULL && outcome.cls == ATTEMPT_RETRYABLE &&
			!attempt->refused && attempt->transfer.resp.status == 429)
		{
			/*
			 * the receiver's limit, not the step's failure: its key waits,
			 * the step's attempt is given back (docs/limits.md)
			 */
			TimestampTz now = GetCurrentTimestamp();

			ds_limit_pause_for_429(step, ds_http_rate_limit_wait_usecs(&attempt->transfer.resp, now),
								   now);
			ds_store_update_step(step);
		}
		else if (ds_outcome_runs_hook(step, step->attempts, &outcome))
			ds_keep_outcome_for_executor(step, attempt->claimed_at, &outcome);
		else
		{
			ds_apply_attempt_outcome(step, step->attempts, &outcome);
			ds_store_finish_claimed_attempt(step, step->attempts, attempt->claimed_at, &outcome);

			/*
			 * a run waiting for the step (ds_http) goes on, but not for a
			 * retry: that is ours
			 */
			if (step->status != STEP_RETRYING && step->status != STEP_PENDING)
				ds_run_wake_for_step_outcome(step->run_id, step->step_id);
		}
		ds_subtransaction_commit(&sub);
	}
	PG_CATCH();
	{
		ErrorData  *edata = ds_subtransaction_rollback(&sub);

		/*
		 * A server turned read-only refuses every write of the transaction:
		 * that is no step's failure, and the HTTP worker keeps the outcome
		 * until it can record it (ds_worker_caught_read_only, http_worker.c).
		 */
		if (edata->sqlerrcode == ERRCODE_READ_ONLY_SQL_TRANSACTION &&
			(DefaultXactReadOnly || RecoveryInProgress()))
			ReThrowError(edata);

		/*
		 * the step stays running: once its lock is let go, recovery counts
		 * the attempt lost
		 */
		ereport(WARNING,
				(errmsg("durable_steps: could not record attempt %d of HTTP step %s/%s: %s",
						attempt->step.attempts, attempt->step.run_id, attempt->step.step_id,
						edata->message)));
		recorded = false;
	}
	PG_END_TRY();
	return recorded;
}
