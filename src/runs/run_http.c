/*
 * run_http.c -- ds_http: an HTTP step of the current run, called by its workflow (docs/runs.md
 * and "HTTP steps").
 *
 * As for ds_step (workflow_calls.c), a turn only replays: an HTTP step that succeeded returns its
 * response, one that failed for good raises the step-failed error (DS102), one that waits for a
 * person (blocked, uncertain) blocks the run, one the HTTP worker has not finished yet suspends
 * the run with no wake-up time. A step that does not exist yet ends the turn; the executor then
 * creates it by calling ds_http_step as the workflow's role, isolated like a worker attempt
 * (run_turn.c), so that every check of ds_http_step applies (durable_steps_http membership,
 * allowed hosts, the request, the idempotency header) and the step commits with the run's wait.
 *
 * The HTTP worker sends it once that commits; when it records an outcome the run must see (not
 * a retry, which it handles itself), it wakes the run (ds_run_wake_for_step_outcome); so do
 * ds_retry_step and ds_resolve_step for a step a person settles.
 */
#include "base/compat.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "http/http_request.h"
#include "base/policy.h"
#include "steps/run_context.h"
#include "runs/workflow_calls.h"
#include "steps/step_call.h"
#include "store/step_probe.h"
#include "store/step_store.h"

PG_FUNCTION_INFO_V1(ds_http);

/*
 * ds_http_step's arguments for the executor, as the text of a jsonb object: a key is left out
 * for SQL NULL (the idempotency header is always there: JSON null for none).
 */
static char *
encode_http_call(const char *run_id, const char *step_id, Jsonb *request, Jsonb *policy,
				 const char *idempotency_header, Interval *timeout)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"run_id\": ");
	escape_json(&buf, run_id);
	appendStringInfoString(&buf, ", \"step_id\": ");
	escape_json(&buf, step_id);
	appendStringInfo(&buf, ", \"request\": %s", JsonbToCString(NULL, &request->root, 0));
	if (policy != NULL)
		appendStringInfo(&buf, ", \"policy\": %s", JsonbToCString(NULL, &policy->root, 0));
	appendStringInfoString(&buf, ", \"idempotency_header\": ");
	if (idempotency_header != NULL)
		escape_json(&buf, idempotency_header);
	else
		appendStringInfoString(&buf, "null");
	if (timeout != NULL)
	{
		appendStringInfoString(&buf, ", \"timeout\": ");
		escape_json(&buf, DatumGetCString(DirectFunctionCall1(interval_out,
															  IntervalPGetDatum(timeout))));
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * ds_http(step_id, request, policy, idempotency_header, timeout) -> jsonb: the response of the
 * run's HTTP step `step_id` ({"status": ..., "headers": ..., "body": ...}).
 */
Datum
ds_http(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_http", NULL);
	char	   *step_id = ds_step_identity_arg(fcinfo, 0, "step_id");
	Jsonb	   *request = PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1);
	Jsonb	   *policy = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	char	   *idempotency_header = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	Interval   *timeout = PG_ARGISNULL(4) ? NULL : PG_GETARG_INTERVAL_P(4);
	HttpRequest req;
	RetryPolicy parsed;
	StepRecord	rec;
	TurnSuspension work;

	/* a malformed call is the workflow's error, raised where it can catch it */
	ds_http_parse_request(request, &req);
	ds_policy_parse(policy, &parsed);
	(void) ds_step_timeout_arg(fcinfo, 4);

	if (ds_probe_step(run_id, step_id, GetLatestSnapshot(), &rec, NULL))
	{
		ds_turn_visit(step_id);

		/*
		 * another role's step is 42501; another definition (or a SQL step) is
		 * DS422
		 */
		(void) ds_step_answer_from_store(&rec,
										 ds_step_fingerprint(DS_HTTP_FINGERPRINT_SQL, request,
															 NULL, NULL));
		switch (rec.status)
		{
			case STEP_SUCCEEDED:
				if (rec.result == NULL)
					PG_RETURN_NULL();
				PG_RETURN_JSONB_P(rec.result);
			case STEP_FAILED:
			case STEP_CANCELLED:
				ds_turn_throw_step_failed(run_id, step_id, rec.status,
										  rec.error_class, rec.error_code, rec.error_message);
			case STEP_BLOCKED:
				ds_turn_suspend(true, 0,
								psprintf("HTTP step %s is blocked: %s", step_id,
										 rec.remediation ? rec.remediation :
										 "correct what it depends on, then ds_retry_step()"),
								step_id, NULL);
			case STEP_UNCERTAIN:
				ds_turn_suspend(true, 0,
								psprintf("HTTP step %s is uncertain: %s", step_id,
										 rec.remediation ? rec.remediation :
										 "find out whether the receiver acted, then ds_resolve_step() or ds_retry_step()"),
								step_id, NULL);
			default:

				/*
				 * pending, retrying, running: the HTTP worker's; it wakes the
				 * run
				 */
				ds_turn_suspend(false, 0,
								psprintf("http: step %s waits for the HTTP worker", step_id),
								step_id, NULL);
		}
	}

	/*
	 * new: the executor creates it after the turn, and the run waits for its
	 * outcome
	 */
	memset(&work, 0, sizeof(work));
	work.work = TURN_WORK_HTTP;
	work.step_id = step_id;
	work.reason = psprintf("http: step %s waits for the HTTP worker", step_id);
	work.step_call = encode_http_call(run_id, step_id, request, policy, idempotency_header,
									  timeout);
	work.owner = GetUserId();
	work.search_path = namespace_search_path;
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}
