/*
 * run_task.c -- ds_task: a task of the current run, called by its workflow (docs/runs.md and
 * docs/tasks.md, "In SQL workflows").
 *
 * Exactly as ds_http (run_http.c), a turn only replays: a task that succeeded returns its
 * result, one that failed for good (failed, cancelled) raises the step-failed error (DS102), one
 * that waits for a person (blocked, uncertain) blocks the run, one no worker has finished yet
 * suspends the run with no wake-up time. A task that does not exist yet ends the turn; the
 * executor then creates it by calling ds_task_step as the workflow's role, isolated like a worker
 * attempt (run_turn.c), so that every check of ds_task_step applies and the task commits with
 * the run's wait, as the workflow's role's: only that role's workers may claim it.
 *
 * An application worker claims it once that commits; when it records an outcome the run must
 * see (not a retry, which the workers handle themselves), the record wakes the run
 * (task_lease.c, ds_run_wake_for_step_outcome); so do ds_retry_step and ds_resolve_step for a
 * task a person settles, and ds_cancel_step.
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

#include "base/policy.h"
#include "base/size_limits.h"
#include "steps/queues.h"
#include "steps/run_context.h"
#include "runs/workflow_calls.h"
#include "steps/step_call.h"
#include "steps/task_args.h"
#include "store/step_probe.h"
#include "store/step_store.h"

PG_FUNCTION_INFO_V1(ds_task);

/*
 * ds_task_step's arguments for the executor, as the text of a jsonb object: a key is left out
 * for SQL NULL, so that a JSON null input stays one.
 */
static char *
encode_task_call(const char *run_id, const char *step_id, const char *task, Jsonb *input,
				 Jsonb *policy, const char *queue, int32 priority, Interval *timeout,
				 const char *on_lost)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"run_id\": ");
	escape_json(&buf, run_id);
	appendStringInfoString(&buf, ", \"step_id\": ");
	escape_json(&buf, step_id);
	appendStringInfoString(&buf, ", \"task\": ");
	escape_json(&buf, task);
	if (input != NULL)
		appendStringInfo(&buf, ", \"input\": %s", JsonbToCString(NULL, &input->root, 0));
	if (policy != NULL)
		appendStringInfo(&buf, ", \"policy\": %s", JsonbToCString(NULL, &policy->root, 0));
	appendStringInfoString(&buf, ", \"queue\": ");
	escape_json(&buf, queue);
	appendStringInfo(&buf, ", \"priority\": %d", priority);
	if (timeout != NULL)
	{
		appendStringInfoString(&buf, ", \"timeout\": ");
		escape_json(&buf, DatumGetCString(DirectFunctionCall1(interval_out,
															  IntervalPGetDatum(timeout))));
	}
	appendStringInfoString(&buf, ", \"on_lost\": ");
	escape_json(&buf, on_lost);
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/* Argument `argno`, on_lost: 'retry' or 'uncertain', as ds_task_step checks it. */
static char *
on_lost_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *on_lost;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("on_lost must not be null")));
	on_lost = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (strcmp(on_lost, "retry") != 0 && strcmp(on_lost, "uncertain") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("on_lost must be 'retry' or 'uncertain'")));
	return on_lost;
}

/*
 * ds_task(step_id, task, input, policy, queue, priority, timeout, on_lost) -> jsonb: the result
 * of the run's task `step_id`, which a worker of `task` completed.
 */
Datum
ds_task(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_task", NULL);
	char	   *step_id = ds_step_identity_arg(fcinfo, 0, "step_id");
	char	   *task = ds_task_name_arg(fcinfo, 1);
	Jsonb	   *input = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	Jsonb	   *policy = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	char	   *queue;
	int32		priority;
	Interval   *timeout = PG_ARGISNULL(6) ? NULL : PG_GETARG_INTERVAL_P(6);
	char	   *on_lost;
	RetryPolicy parsed;
	StepRecord	rec;
	TurnSuspension work;
	char	   *waits;

	/*
	 * a malformed call is the workflow's error, raised where it can catch it,
	 * in ds_task_step's order
	 */
	if (input != NULL)
		ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(input));
	ds_policy_parse(policy, &parsed);
	queue = ds_queue_name_arg(fcinfo, 4, "queue");
	priority = ds_priority_arg(fcinfo, 5);
	(void) ds_step_timeout_arg(fcinfo, 6);
	on_lost = on_lost_arg(fcinfo, 7);
	waits = psprintf("task: step %s waits for a worker of task %s", step_id, task);

	if (ds_probe_step(run_id, step_id, GetLatestSnapshot(), &rec, NULL))
	{
		/*
		 * A task re-armed by ds_retry_step runs as it was armed, corrected
		 * input included: the workflow passes what it passed before, which
		 * must not be a conflict (as for ds_step).
		 */
		bool		rearmed = rec.kind == STEP_KIND_TASK && rec.attempt_base > 0;

		ds_turn_visit(step_id);

		/*
		 * another role's step is 42501; another definition (or another kind
		 * of step) is DS422
		 */
		(void) ds_step_answer_from_store(&rec,
										 rearmed ? rec.fingerprint :
										 ds_task_fingerprint(task, false, input, NULL, NULL));
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
								psprintf("task step %s is blocked: %s", step_id,
										 rec.remediation ? rec.remediation :
										 "correct its input, then ds_retry_step()"),
								step_id, NULL);
			case STEP_UNCERTAIN:
				ds_turn_suspend(true, 0,
								psprintf("task step %s is uncertain: %s", step_id,
										 rec.remediation ? rec.remediation :
										 "find out whether its handler acted, then ds_resolve_step() or ds_retry_step()"),
								step_id, NULL);
			default:

				/*
				 * pending, retrying, running: the workers'; the outcome the
				 * run must see wakes it
				 */
				ds_turn_suspend(false, 0, waits, step_id, NULL);
		}
	}

	/*
	 * new: the executor creates it after the turn, and the run waits for its
	 * outcome
	 */
	memset(&work, 0, sizeof(work));
	work.work = TURN_WORK_TASK;
	work.step_id = step_id;
	work.reason = waits;
	work.step_call = encode_task_call(run_id, step_id, task, input, policy, queue, priority,
									  timeout, on_lost);
	work.owner = GetUserId();
	work.search_path = namespace_search_path;
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}
