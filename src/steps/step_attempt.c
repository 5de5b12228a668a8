/*
 * step_attempt.c -- one attempt of a stored step, from execution to its recorded outcome.
 *
 * Shared by the synchronous caller (ds_run_step) and the background worker, so that a step
 * moves between states by one set of rules wherever it runs:
 *
 *   completed                        -> succeeded (result stored)
 *   retryable, attempts left         -> retrying  (next_attempt_at = backoff or retry-after)
 *   retryable, no attempts left      -> failed    (error_class 'exhausted')
 *   correctable                      -> blocked   (remediation stored)
 *   permanent                        -> failed    (error_class 'permanent')
 *   uncertain (HTTP steps only)      -> uncertain (a person settles it: ds_resolve_step)
 *   cancelled (a worker attempt that -> retrying  (the cancelling call, waiting for the step's
 *     ds_cancel_step/_run stopped)                 lock, then cancels it in its transaction)
 *
 * Then, before the outcome is written: the step's outcome hook (step_hooks.c) for a success or
 * a failure for good, which may make the step blocked; in the worker, a log line for a step
 * that failed or is blocked; the step's NOTIFY if it stopped.
 */
#include "base/compat.h"

#include "commands/async.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "store/outcome_json.h"
#include "http/http_request.h"
#include "base/policy.h"
#include "store/run_store.h"
#include "steps/step_attempt.h"
#include "steps/step_hooks.h"
#include "ipc/outcome_waits.h"
#include "ipc/executor_slot.h"
#include "ipc/worker_shmem.h"
#include "steps/step_exec.h"

/* durable_steps.log_outcomes_level */
static int	log_outcomes_level = LOG;

static const struct config_enum_entry log_level_options[] = {
	{"debug5", DEBUG5, false},
	{"debug4", DEBUG4, false},
	{"debug3", DEBUG3, false},
	{"debug2", DEBUG2, false},
	{"debug1", DEBUG1, false},
	{"debug", DEBUG2, true},
	{"info", INFO, false},
	{"notice", NOTICE, false},
	{"warning", WARNING, false},
	{"log", LOG, false},
	{NULL, 0, false}
};

void
ds_step_attempt_init_module(void)
{
	DefineCustomEnumVariable("durable_steps.log_outcomes_level",
							 "Message level at which the worker logs failed and blocked steps.",
							 "Each line names the step, its attempt, status and SQLSTATE, never its input or result.",
							 &log_outcomes_level,
							 LOG,
							 log_level_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
}

#define DEFAULT_REMEDIATION \
	"Correct the step's input or the data it depends on, then re-arm it with ds_retry_step()."

void
ds_overrides_from_record(const StepRecord *rec, ClassOverrides *out)
{
	memset(out, 0, sizeof(*out));
	ds_parse_sqlstate_list(rec->retry_on ? DatumGetArrayTypeP(PointerGetDatum(rec->retry_on)) : NULL,
						   "retry_on", &out->n_retry, &out->retry_on,
						   &out->retry_is_class);
	ds_parse_sqlstate_list(rec->fail_on ? DatumGetArrayTypeP(PointerGetDatum(rec->fail_on)) : NULL,
						   "fail_on", &out->n_fail, &out->fail_on,
						   &out->fail_is_class);
	out->timeout_fails = rec->on_timeout != NULL && strcmp(rec->on_timeout, "fail") == 0;
}

/* Clear the error fields of the step record. */
static void
clear_error(StepRecord *rec)
{
	rec->error_class = NULL;
	rec->error_code = NULL;
	rec->error_message = NULL;
	rec->error_detail = NULL;
	rec->remediation = NULL;
}

void
ds_notify_step_stopped(const StepRecord *rec)
{
	StringInfoData payload;

	/* ds_wait_step and ds_wait_run of its run wake when this commits */
	ds_outcome_wake_at_commit(rec->run_id);
	if (rec->notify == NULL)
		return;
	initStringInfo(&payload);
	appendStringInfoString(&payload, "{\"run_id\": ");
	escape_json(&payload, rec->run_id);
	appendStringInfoString(&payload, ", \"step_id\": ");
	escape_json(&payload, rec->step_id);
	appendStringInfo(&payload, ", \"status\": \"%s\", \"attempt\": %d}",
					 ds_step_status_name(rec->status), rec->attempts);
	/* sent when the transaction that records the state commits, and only then */
	Async_Notify(rec->notify, payload.data);
}

/*
 * A worker's outcome that needs a person, or ends the step for good without success, goes to
 * the server log (docs/worker.md, "Logging"): identity, attempt, status and SQLSTATE, never the input,
 * the result or the error's text (which may quote the input).
 */
static void
log_worker_outcome(const StepRecord *rec)
{
	if (!DS_AM_BACKGROUND_WORKER ||
		(rec->status != STEP_FAILED && rec->status != STEP_BLOCKED))
		return;
	ereport(log_outcomes_level,
			(errmsg("durable_steps: step %s/%s attempt %d is %s (%s), SQLSTATE %s",
					rec->run_id, rec->step_id, rec->attempts, ds_step_status_name(rec->status),
					rec->error_class ? rec->error_class : "-",
					rec->error_code ? rec->error_code : "-"),
			 errhidestmt(true)));
}

/* Apply the outcome, run the step's outcome hook, and NOTIFY its channel if it stopped. */
static void apply_outcome(StepRecord *rec, int attempt, const AttemptOutcome *outcome);

/*
 * ds_apply_attempt_outcome, with the hook run (`hook_lost` false) or, when the process that ran
 * it ended before it finished, the step blocked by it as by a failed hook.
 */
static void
apply_outcome_and_hook(StepRecord *rec, int attempt, const AttemptOutcome *outcome, bool hook_lost)
{
	apply_outcome(rec, attempt, outcome);

	/*
	 * in the transaction that records the outcome, before it is written: it
	 * may block the step
	 */
	if (hook_lost)
		ds_block_step_by_lost_hook(rec);
	else
		ds_run_step_outcome_hooks(rec);
	log_worker_outcome(rec);
	if (rec->status == STEP_SUCCEEDED || rec->status == STEP_FAILED ||
		rec->status == STEP_BLOCKED || rec->status == STEP_CANCELLED ||
		rec->status == STEP_UNCERTAIN)
		ds_notify_step_stopped(rec);
}

void
ds_apply_attempt_outcome(StepRecord *rec, int attempt, const AttemptOutcome *outcome)
{
	apply_outcome_and_hook(rec, attempt, outcome, false);
}

bool
ds_outcome_runs_hook(const StepRecord *rec, int attempt, const AttemptOutcome *outcome)
{
	StepRecord	after = *rec;

	apply_outcome(&after, attempt, outcome);
	return (after.status == STEP_SUCCEEDED && after.on_success != NULL) ||
		(after.status == STEP_FAILED && after.on_failure != NULL);
}

void
ds_keep_outcome_for_executor(StepRecord *rec, TimestampTz claimed_at, const AttemptOutcome *outcome)
{
	KeptOutcome kept;

	kept.outcome = *outcome;
	kept.claimed_at = claimed_at;
	kept.pid = rec->claimed_by;
	rec->kept_outcome = ds_outcome_to_jsonb(&kept);

	/*
	 * no process runs its hook yet: the executor that takes it says so first
	 * (executor.c)
	 */
	rec->claimed_by = 0;
	ds_store_update_step(rec);
	ds_worker_kept_outcome_at_commit();
}

void
ds_record_kept_outcome(StepRecord *rec, bool hook_lost)
{
	KeptOutcome kept;

	Assert(rec->status == STEP_RUNNING && rec->kept_outcome != NULL);
	ds_outcome_from_jsonb(rec->kept_outcome, &kept);
	rec->kept_outcome = NULL;
	/* the attempt's record names the process that sent its request */
	rec->claimed_by = kept.pid;
	apply_outcome_and_hook(rec, rec->attempts, &kept.outcome, hook_lost);
	ds_store_finish_claimed_attempt(rec, rec->attempts, kept.claimed_at, &kept.outcome);
	/* a run waiting for the HTTP step (ds_http) goes on, but not for a retry */
	if (ds_step_kinds[rec->kind].sent_by_http_worker &&
		rec->status != STEP_RETRYING && rec->status != STEP_PENDING)
		ds_run_wake_for_step_outcome(rec->run_id, rec->step_id);
}

void
ds_cancel_waiting_step(StepRecord *rec)
{
	TimestampTz now = GetCurrentTimestamp();

	/* only a step that waits is cancelled: a finished or running one never is */
	Assert(rec->status == STEP_PENDING || rec->status == STEP_RETRYING ||
		   rec->status == STEP_BLOCKED || rec->status == STEP_UNCERTAIN);
	rec->status = STEP_CANCELLED;
	rec->next_attempt_at = 0;
	rec->lease_expires_at = 0;
	rec->claimed_by = 0;
	rec->updated_at = now;
	rec->finished_at = now;
	ds_store_update_step(rec);
	ds_notify_step_stopped(rec);
}

/*
 * How long a step whose worker attempt was stopped by a cancel request waits before an executor
 * may claim it again, should the cancelling call roll back.
 */
#define CANCELLED_ATTEMPT_RESUME_USECS (1 * USECS_PER_SEC)

/* The state rules of the file header. */
static void
apply_outcome(StepRecord *rec, int attempt, const AttemptOutcome *outcome)
{
	int			last_allowed = rec->attempt_base + rec->max_attempts;

	/*
	 * attempt numbers only grow: the worker counted its attempt at the claim,
	 * a caller's is next
	 */
	Assert(attempt > 0 && attempt >= rec->attempts);
	rec->attempts = attempt;
	rec->updated_at = outcome->finished_at;
	rec->lease_expires_at = 0;
	clear_error(rec);
	if (outcome->cls == ATTEMPT_COMPLETED)
	{
		rec->status = STEP_SUCCEEDED;
		rec->result = outcome->result;
		rec->next_attempt_at = 0;
		rec->finished_at = outcome->finished_at;
		return;
	}

	rec->result = NULL;
	rec->error_code = pstrdup(outcome->error_code ? outcome->error_code :
							  unpack_sql_state(outcome->sqlerrcode));
	rec->error_message = outcome->message;
	rec->error_detail = outcome->detail;
	rec->next_attempt_at = 0;
	rec->finished_at = outcome->finished_at;
	switch (outcome->cls)
	{
		case ATTEMPT_RETRYABLE:
			if (attempt < last_allowed)
			{
				int64		delay;

				if (outcome->has_retry_after)
					delay = outcome->retry_after;
				else
					delay = ds_policy_backoff_delay(&rec->backoff, attempt - rec->attempt_base);
				rec->status = STEP_RETRYING;
				rec->error_class = "retryable";
				rec->next_attempt_at = outcome->finished_at + delay;
				rec->finished_at = 0;
				ds_worker_wake_kind_at_commit(rec->kind);
			}
			else
			{
				rec->status = STEP_FAILED;
				rec->error_class = "exhausted";
			}
			break;
		case ATTEMPT_CORRECTABLE:

			/*
			 * waits for a person, so it is not finished and retention keeps
			 * it
			 */
			rec->status = STEP_BLOCKED;
			rec->error_class = "correctable";
			rec->remediation = outcome->hint ? outcome->hint : DEFAULT_REMEDIATION;
			rec->finished_at = 0;
			break;
		case ATTEMPT_CANCELLED:

			/*
			 * ds_cancel_step() or ds_cancel_run() stopped this worker
			 * attempt, and waits for the step's lock to cancel the step in
			 * its own transaction: a call that rolls back leaves the step
			 * going on, as it found it. Meanwhile the step waits, out of the
			 * executors' reach for a little while (the call is already
			 * waiting for its lock), and the stopped attempt does not use the
			 * step's attempt budget.
			 */
			rec->status = STEP_RETRYING;
			rec->error_class = "cancelled";
			rec->attempt_base++;
			rec->next_attempt_at = outcome->finished_at + CANCELLED_ATTEMPT_RESUME_USECS;
			rec->finished_at = 0;
			ds_worker_wake_kind_at_commit(rec->kind);
			break;
		case ATTEMPT_UNCERTAIN:

			/*
			 * never retried by itself: a person finds out what happened
			 * (docs/http.md)
			 */
			rec->status = STEP_UNCERTAIN;
			rec->error_class = "uncertain";
			rec->remediation = outcome->hint ? outcome->hint :
				"The request may have taken effect. Check with its receiver, then settle the step with ds_resolve_step() or send it again with ds_retry_step().";
			rec->finished_at = 0;
			break;
		default:
			rec->status = STEP_FAILED;
			rec->error_class = "permanent";
			break;
	}

	/*
	 * what the claims and retention rely on: only a retrying step is due,
	 * only a failed one done
	 */
	Assert((rec->status == STEP_RETRYING) == (rec->next_attempt_at != 0));
	Assert((rec->status == STEP_FAILED) == (rec->finished_at != 0));
}

void
ds_run_next_attempt(StepRecord *rec, bool is_new, bool by_worker)
{
	StepBody	body;
	ClassOverrides overrides;
	AttemptOutcome outcome;

	/*
	 * the worker committed its attempt as started (and counted it) before
	 * running it
	 */
	int			attempt = by_worker ? rec->attempts : rec->attempts + 1;

	/*
	 * a worker's claim wrote the step row last: its updated_at is the claim's
	 * time
	 */
	TimestampTz claimed_at = rec->updated_at;

	ds_overrides_from_record(rec, &overrides);
	body.run_id = rec->run_id;
	body.step_id = rec->step_id;
	body.sql = rec->sql;
	body.input = rec->input;
	body.expect_row = rec->expect_row;
	body.timeout = rec->timeout;
	body.isolate_as = by_worker ? rec->owner : InvalidOid;
	body.cancel_key = by_worker ? ds_attempt_cancel_key(rec->run_id, rec->step_id, attempt) : 0;

	/*
	 * In the worker, pg_temp goes last: a temporary table made by one role's
	 * step must not shadow the tables of the next step, which may belong to
	 * another role, in the same session.
	 */
	body.search_path = !by_worker ? NULL :
		strspn(rec->search_path, " \t\r\n") == strlen(rec->search_path) ? "pg_temp" :
		psprintf("%s, pg_temp", rec->search_path);
	body.overrides = &overrides;

	ds_execute_step_attempt(&body, attempt, rec->attempt_base + rec->max_attempts, &outcome);
	ds_apply_attempt_outcome(rec, attempt, &outcome);

	if (is_new)
	{
		Assert(!by_worker);
		ds_store_insert_step_with_attempt(rec, attempt, &outcome);
		return;
	}
	if (by_worker)
		ds_store_finish_claimed_attempt(rec, attempt, claimed_at, &outcome);
	else
		ds_store_update_step_insert_attempt(rec, attempt, &outcome);
}

/*
 * ds_fail_started_attempt with the class given, or classified by the SQLSTATE (`cls` < 0); with
 * `hook_lost`, a hook the outcome would run is not run: the step is blocked by it instead.
 */
static void
fail_started_attempt(StepRecord *rec, int cls, int sqlerrcode, const char *message,
					 const char *detail, bool hook_lost)
{
	AttemptOutcome outcome;
	ClassOverrides overrides;
	TimestampTz claimed_at = rec->updated_at;	/* as in ds_run_next_attempt */

	ds_overrides_from_record(rec, &overrides);
	memset(&outcome, 0, sizeof(outcome));
	outcome.cls = cls >= 0 ? (AttemptClass) cls : ds_classify_sqlstate(sqlerrcode, &overrides);
	outcome.sqlerrcode = sqlerrcode;
	outcome.message = pstrdup(message);
	outcome.detail = detail ? pstrdup(detail) : NULL;
	outcome.started_at = outcome.finished_at = GetCurrentTimestamp();
	apply_outcome_and_hook(rec, rec->attempts, &outcome, hook_lost);
	ds_store_finish_claimed_attempt(rec, rec->attempts, claimed_at, &outcome);
}

void
ds_fail_started_attempt(StepRecord *rec, int sqlerrcode, const char *message, const char *detail)
{
	fail_started_attempt(rec, -1, sqlerrcode, message, detail, false);
}

void
ds_record_unrecorded_attempts(StepRecord *rec, bool is_new, int n, const int *codes)
{
	ClassOverrides overrides;

	ds_overrides_from_record(rec, &overrides);
	for (int i = 0; i < n; i++)
	{
		AttemptOutcome outcome;
		int			attempt = rec->attempts + 1;
		bool		lost = codes[i] == ERRCODE_DS_INVOCATION_LOST;

		ereport(LOG,
				(errmsg("durable_steps: attempt %d of step %s/%s was %s with its turn; recording it as failed",
						attempt, rec->run_id, rec->step_id, lost ? "lost" : "interrupted")));
		memset(&outcome, 0, sizeof(outcome));
		outcome.cls = ds_classify_sqlstate(codes[i], &overrides);
		outcome.sqlerrcode = codes[i];
		outcome.message = lost ? "invocation_lost" : "canceling statement due to user request";
		outcome.detail = psprintf(lost ?
								  "The turn running attempt %d of the step ended with its executor before recording its outcome." :
								  "The turn running attempt %d of the step was cancelled before recording its outcome.",
								  attempt);
		outcome.started_at = outcome.finished_at = GetCurrentTimestamp();
		ds_apply_attempt_outcome(rec, attempt, &outcome);
		if (is_new)
			ds_store_insert_step_with_attempt(rec, attempt, &outcome);
		else
			ds_store_update_step_insert_attempt(rec, attempt, &outcome);
		is_new = false;
		if (rec->status != STEP_RETRYING)
			break;
	}
}

/*
 * A claim its executor never started, or whose attempt rolled back with the transaction another
 * claim's body or hook ended: the claim is undone -- the attempt not counted, the step waiting
 * as before, due when it was -- and no attempt is recorded, for nothing of it is left.
 */
static void
give_back_attempt(StepRecord *rec, bool started)
{
	if (started)
		ereport(LOG,
				(errmsg("durable_steps: attempt %d of step %s/%s rolled back when another step's code ended its executor; it is not counted",
						rec->attempts, rec->run_id, rec->step_id)));
	else
		ereport(LOG,
				(errmsg("durable_steps: attempt %d of step %s/%s never started before its executor ended; it is not counted",
						rec->attempts, rec->run_id, rec->step_id)));
	rec->attempts--;
	rec->status = rec->attempts > rec->attempt_base ? STEP_RETRYING : STEP_PENDING;
	rec->lease_expires_at = 0;
	rec->claimed_by = 0;
	rec->running_queue = NULL;
	rec->updated_at = GetCurrentTimestamp();
	ds_store_update_step(rec);
	ds_worker_wake_at_commit();
}

void
ds_record_lost_attempt(StepRecord *rec)
{
	ClaimFate	fate = ds_lost_claim_fate(rec->claimed_by, rec->updated_at,
										  ds_attempt_cancel_key(rec->run_id, rec->step_id,
																rec->attempts));
	char	   *detail;
	bool		hook_lost;

	/*
	 * Its request was answered, and the outcome is kept for an executor,
	 * which records it with the step's hook: not lost, and not for this
	 * session to record (the hook would run here).
	 */
	if (rec->kept_outcome != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("step %s/%s is in progress: the worker is recording its HTTP response",
						rec->run_id, rec->step_id),
				 errhint("Retry after a moment.")));
	if (fate == CLAIM_NEVER_STARTED)
	{
		give_back_attempt(rec, false);
		return;
	}

	/*
	 * Another step's code ended the executor while this attempt's outcome
	 * waited for the commit of their shared transaction: every write of the
	 * attempt went with it, so the step is charged nothing (the other step
	 * runs alone from now on). An attempt that acts outside the database may
	 * have acted: it stays charged.
	 */
	if (fate == CLAIM_ROLLED_BACK_BY_ANOTHER && !ds_step_kinds[rec->kind].acts_outside)
	{
		give_back_attempt(rec, true);
		return;
	}
	ereport(LOG,
			(errmsg("durable_steps: attempt %d of step %s/%s was lost; recording it as failed",
					rec->attempts, rec->run_id, rec->step_id)));

	/*
	 * The on_failure hook the attempt's outcome ran ignored its cancellation
	 * until the executor ended: running it again here, when the loss exhausts
	 * the step, would end this process the same way, and the next, for ever.
	 * It blocks the step instead (DS007), as a lost hook of an HTTP step does
	 * (docs/steps.md, "Outcome hooks"). A lost on_success hook is not one a
	 * loss runs: the loss is retried, or runs on_failure, which has not
	 * failed anyone yet.
	 */
	hook_lost = fate == CLAIM_FAILURE_HOOK_IGNORED_CANCEL;
	if (fate == CLAIM_IGNORED_CANCEL)
		detail = psprintf("Attempt %d ignored its cancellation past its time limit; its process was ended.",
						  rec->attempts);
	else if (fate == CLAIM_SUCCESS_HOOK_IGNORED_CANCEL || fate == CLAIM_FAILURE_HOOK_IGNORED_CANCEL)
		detail = psprintf("The %s hook of attempt %d ignored its cancellation past its time limit; its process was ended.",
						  fate == CLAIM_SUCCESS_HOOK_IGNORED_CANCEL ? "on_success" : "on_failure",
						  rec->attempts);
	else
		detail = psprintf("The process running attempt %d ended before recording its outcome.",
						  rec->attempts);

	/*
	 * An HTTP request in flight may have reached its receiver: sent again, it
	 * must carry the idempotency key or be idempotent by its method;
	 * otherwise a person must find out.
	 */
	if (ds_step_kinds[rec->kind].acts_outside &&
		!ds_http_repeat_is_safe(rec->idempotency_header,
								rec->request ? DatumGetJsonbP(PointerGetDatum(rec->request)) : NULL))
		fail_started_attempt(rec, ATTEMPT_UNCERTAIN, ERRCODE_DS_INVOCATION_LOST, "invocation_lost",
							 detail, hook_lost);
	else
		fail_started_attempt(rec, -1, ERRCODE_DS_INVOCATION_LOST, "invocation_lost", detail,
							 hook_lost);

	/*
	 * a run waiting for the HTTP step (ds_http) must see it uncertain or
	 * failed
	 */
	if (ds_step_kinds[rec->kind].sent_by_http_worker &&
		rec->status != STEP_RETRYING && rec->status != STEP_PENDING)
		ds_run_wake_for_step_outcome(rec->run_id, rec->step_id);
}
