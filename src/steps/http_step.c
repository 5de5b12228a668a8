/*
 * http_step.c -- ds_http_step and ds_resolve_step (docs/http.md).
 *
 * An HTTP step is a transactional outbox entry: the call checks the request, claims the step's
 * identity and stores the step with the caller's transaction; nothing is sent by the caller. Once
 * the transaction commits, the HTTP worker (http_worker.c) sends it. A caller that rolls back
 * leaves nothing to send. A second call with the same identity is answered from the store, as
 * ds_run_step answers (step_call.h): the request is the step's definition.
 */
#include "base/compat.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "http/http_request.h"
#include "base/policy.h"
#include "store/run_store.h"
#include "steps/step_attempt.h"
#include "steps/step_call.h"
#include "steps/step_hooks.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "steps/http_step.h"
#include "ipc/worker_shmem.h"
#include "base/size_limits.h"

PG_FUNCTION_INFO_V1(ds_http_step);
PG_FUNCTION_INFO_V1(ds_resolve_step);

/* The idempotency_header argument: NULL or '' for none, else a header name not in the request. */
static char *
idempotency_header_arg(FunctionCallInfo fcinfo, int argno, const HttpRequest *req)
{
	char	   *name;

	if (PG_ARGISNULL(argno))
		return NULL;
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (name[0] == '\0')
		return NULL;
	for (const char *p = name; *p; p++)
		if (!ds_http_is_token_char(*p))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency_header must be a header name (letters, digits and !#$%%&'*+-.^_`|~)")));
	ds_http_step_check_idempotency_header(req, name);
	return name;
}

/*
 * ds_http_step(run_id, step_id, request, policy, idempotency_header, on_success, timeout,
 *              nowait, run_at, notify, on_failure, retry_on_status, fail_on_status) -> ds_step_result
 */
Datum
ds_http_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	Jsonb	   *request;
	Jsonb	   *policy;
	HttpRequest req;
	RetryPolicy parsed;
	char	   *idempotency_header;
	int64		timeout;
	bool		nowait;
	TimestampTz run_at;
	char	   *notify;
	char	   *on_success;
	char	   *on_failure;
	char	   *fingerprint;
	StepRecord	rec;
	Datum		answer;

	ds_http_step_check_role();
	ds_check_slot_run_id(run_id);
	request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	/* the step's own status lists are part of its request (docs/http.md) */
	request = ds_http_request_with_status_lists(request,
												PG_ARGISNULL(11) ? NULL : PG_GETARG_ARRAYTYPE_P(11),
												PG_ARGISNULL(12) ? NULL : PG_GETARG_ARRAYTYPE_P(12));
	ds_http_step_check_request(request, &req);
	policy = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	ds_policy_parse(policy, &parsed);
	idempotency_header = idempotency_header_arg(fcinfo, 4, &req);
	on_success = PG_ARGISNULL(5) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(5));
	ds_check_hook_sql("on_success", on_success);
	timeout = ds_step_timeout_arg(fcinfo, 6);
	if (PG_ARGISNULL(7))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("nowait must not be null")));
	nowait = PG_GETARG_BOOL(7);
	run_at = PG_ARGISNULL(8) ? 0 : PG_GETARG_TIMESTAMPTZ(8);
	if (!PG_ARGISNULL(8) && TIMESTAMP_NOT_FINITE(run_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("run_at must be a finite time")));
	notify = PG_ARGISNULL(9) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(9));
	on_failure = PG_ARGISNULL(10) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(10));
	ds_check_hook_sql("on_failure", on_failure);
	if (notify != NULL && (notify[0] == '\0' || strlen(notify) >= NAMEDATALEN))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("notify must be a channel name of 1 to %d bytes", NAMEDATALEN - 1)));

	/* the request (and its hooks) is the step's definition */
	fingerprint = ds_step_fingerprint(DS_HTTP_FINGERPRINT_SQL, request, on_success, on_failure);
	if (ds_outbox_step_stored(fcinfo, run_id, step_id, nowait, fingerprint, &answer))
		PG_RETURN_DATUM(answer);
	ds_outbox_step_init(&rec, run_id, step_id, STEP_KIND_HTTP, policy, nowait, fingerprint, run_at);
	rec.request = request;
	rec.idempotency_header = idempotency_header;
	rec.timeout = timeout;
	rec.notify = notify;
	rec.on_success = on_success;
	rec.on_failure = on_failure;
	rec.queue = DS_HTTP_QUEUE;
	rec.priority = 0;
	ds_store_insert_step(&rec);
	ds_worker_wake_kind_at_commit(STEP_KIND_HTTP);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/*
 * ds_resolve_step(run_id, step_id, status, result) -> ds_step_result: an operator's finding
 * about an uncertain step, recorded as an attempt of its own (executor 'operator').
 */
Datum
ds_resolve_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	char	   *status;
	bool		succeeded;
	Jsonb	   *result = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P_COPY(3);
	StepRecord	rec;
	AttemptOutcome outcome;
	const char *who = GetUserNameFromId(GetUserId(), false);

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("status must not be null")));
	status = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(status, "succeeded") != 0 && strcmp(status, "failed") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status must be 'succeeded' or 'failed'")));
	succeeded = strcmp(status, "succeeded") == 0;
	if (succeeded && result == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("result must not be null when status is 'succeeded'"),
				 errhint("Record what the receiver says happened, for example {\"status\": 200, \"body\": ...}.")));
	PreventCommandIfReadOnly("ds_resolve_step()");
	PreventCommandIfParallelMode("ds_resolve_step()");
	ds_step_lock_visible(run_id, step_id, false, &rec);

	/*
	 * The rule of a re-arm (run_step.c): the finding feeds the owner's hooks,
	 * which run with the owner's rights, so an admin without them may not
	 * resolve a superuser's step.
	 */
	if (!has_privs_of_role(GetUserId(), rec.owner) && superuser_arg(rec.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("step %s/%s belongs to a superuser", run_id, step_id),
				 errdetail("Only superusers can resolve a superuser's step.")));
	if (rec.status != STEP_UNCERTAIN)
		ereport(ERROR,
				(errcode(ERRCODE_DS_INVALID_STEP_STATE),
				 errmsg("step %s/%s is %s and cannot be resolved", run_id, step_id,
						ds_step_status_name(rec.status)),
				 errdetail("Only uncertain steps can be resolved.")));
	memset(&outcome, 0, sizeof(outcome));
	outcome.started_at = outcome.finished_at = GetCurrentTimestamp();
	if (succeeded)
	{
		outcome.cls = ATTEMPT_COMPLETED;
		outcome.result = result;
		outcome.message = psprintf("resolved as succeeded by role %s", who);
	}
	else
	{
		outcome.cls = ATTEMPT_PERMANENT;
		outcome.sqlerrcode = ERRCODE_DS_RESOLVED_FAILED;
		outcome.message = psprintf("resolved as failed by role %s", who);
	}
	if (!succeeded && result != NULL)

		/*
		 * what the operator found, kept with the failure (a result is a
		 * success's alone)
		 */
		outcome.detail = psprintf("Found: %s", JsonbToCString(NULL, &result->root, VARSIZE(result)));
	ds_apply_attempt_outcome(&rec, rec.attempts + 1, &outcome);
	rec.claimed_by = 0;
	ds_store_update_step_insert_operator_attempt(&rec, rec.attempts, &outcome);
	/* a run blocked on this step goes on: it replays the finding (ds_http) */
	ds_run_wake_for_step(run_id);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

void
ds_store_map_http_item(const char *run_id, const char *step_id, Jsonb *request, Jsonb *policy,
					   int64 timeout, const char *map_step, const char *limit_name)
{
	HttpRequest req;
	char	   *fingerprint;
	StepRecord	rec;

	/* every check of a new HTTP step's request, as the role storing it */
	ds_http_step_check_request(request, &req);
	ds_http_step_check_idempotency_header(&req, DS_MAP_HTTP_IDEMPOTENCY_HEADER);
	fingerprint = ds_step_fingerprint(DS_HTTP_FINGERPRINT_SQL, request, NULL, NULL);
	if (ds_map_item_stored(run_id, step_id, fingerprint))
		return;
	ds_outbox_step_init(&rec, run_id, step_id, STEP_KIND_HTTP, policy, false, fingerprint, 0);
	rec.request = request;
	rec.idempotency_header = DS_MAP_HTTP_IDEMPOTENCY_HEADER;
	rec.timeout = timeout > 0 ? timeout : DS_MAP_HTTP_TIMEOUT_USECS;
	rec.queue = DS_HTTP_QUEUE;
	ds_map_item_insert(&rec, map_step, limit_name);
	ds_worker_wake_kind_at_commit(STEP_KIND_HTTP);
}
