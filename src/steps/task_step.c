/*
 * task_step.c -- ds_task_step (docs/tasks.md).
 *
 * A task is a step whose body is application code. The call stores it with the caller's
 * transaction -- an outbox entry, as an HTTP step is -- and runs nothing: once the transaction
 * commits, an application worker claims it by its name (task_lease.c). A second call with the
 * same identity is answered from the store (step_call.h): the task's name, input and hooks are
 * its definition.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/size_limits.h"
#include "ipc/worker_shmem.h"
#include "store/step_store.h"
#include "steps/queues.h"
#include "steps/step_call.h"
#include "steps/step_hooks.h"
#include "steps/task_args.h"
#include "steps/task_step.h"

PG_FUNCTION_INFO_V1(ds_task_step);

/*
 * ds_task_step(run_id, step_id, task, input, policy, queue, priority, run_at, timeout, notify,
 *              on_success, on_failure, on_lost, nowait) -> ds_step_result
 */
Datum
ds_task_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	char	   *task = ds_task_name_arg(fcinfo, 2);
	Jsonb	   *input = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P_COPY(3);
	Jsonb	   *policy = PG_ARGISNULL(4) ? NULL : PG_GETARG_JSONB_P(4);
	char	   *queue = ds_queue_name_arg(fcinfo, 5, "queue");
	int32		priority = ds_priority_arg(fcinfo, 6);
	TimestampTz run_at = PG_ARGISNULL(7) ? 0 : PG_GETARG_TIMESTAMPTZ(7);
	int64		timeout = ds_step_timeout_arg(fcinfo, 8);
	char	   *notify = PG_ARGISNULL(9) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(9));
	char	   *on_success = PG_ARGISNULL(10) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(10));
	char	   *on_failure = PG_ARGISNULL(11) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(11));
	char	   *on_lost;
	bool		nowait;
	bool		expect_row;
	RetryPolicy parsed;
	char	   *fingerprint;
	StepRecord	rec;
	Datum		answer;

	ds_check_slot_run_id(run_id);
	if (input != NULL)
		ds_check_size(DS_LIMIT_INPUT, "input", VARSIZE_ANY(input));
	ds_policy_parse(policy, &parsed);
	if (!PG_ARGISNULL(7) && TIMESTAMP_NOT_FINITE(run_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("run_at must be a finite time")));
	if (notify != NULL && (notify[0] == '\0' || strlen(notify) >= NAMEDATALEN))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("notify must be a channel name of 1 to %d bytes", NAMEDATALEN - 1)));
	ds_check_hook_sql("on_success", on_success);
	ds_check_hook_sql("on_failure", on_failure);
	if (PG_ARGISNULL(12))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("on_lost must not be null")));
	on_lost = text_to_cstring(PG_GETARG_TEXT_PP(12));
	if (strcmp(on_lost, "retry") != 0 && strcmp(on_lost, "uncertain") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("on_lost must be 'retry' or 'uncertain'")));
	if (PG_ARGISNULL(13))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("nowait must not be null")));
	nowait = PG_GETARG_BOOL(13);

	expect_row = ds_expect_row_arg(fcinfo, 14);
	fingerprint = ds_task_fingerprint(task, expect_row, input, on_success, on_failure);
	if (ds_outbox_step_stored(fcinfo, run_id, step_id, nowait, fingerprint, &answer))
		PG_RETURN_DATUM(answer);
	ds_outbox_step_init(&rec, run_id, step_id, STEP_KIND_TASK, policy, nowait, fingerprint, run_at);
	rec.task = task;
	rec.expect_row = expect_row;
	rec.input = input;
	rec.timeout = timeout;
	/* NULL for the default: the column costs a retried task nothing */
	rec.on_lost = strcmp(on_lost, "uncertain") == 0 ? on_lost : NULL;
	rec.notify = notify;
	rec.on_success = on_success;
	rec.on_failure = on_failure;
	rec.queue = queue;
	rec.priority = priority;
	ds_store_insert_step(&rec);

	/*
	 * the sessions waiting for tasks (ds_wait_for_tasks) look again once this
	 * commits
	 */
	ds_worker_wake_kind_at_commit(STEP_KIND_TASK);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

void
ds_store_map_task_item(const char *run_id, const char *step_id, const char *task, Jsonb *input,
					   Jsonb *policy, int64 timeout, const char *map_step, const char *limit_name)
{
	char	   *fingerprint = ds_task_fingerprint(task, false, input, NULL, NULL);
	StepRecord	rec;

	if (ds_map_item_stored(run_id, step_id, fingerprint))
		return;
	ds_outbox_step_init(&rec, run_id, step_id, STEP_KIND_TASK, policy, false, fingerprint, 0);
	rec.task = (char *) task;
	rec.input = input;
	rec.timeout = timeout;
	rec.queue = "default";
	ds_map_item_insert(&rec, map_step, limit_name);
	ds_worker_wake_kind_at_commit(STEP_KIND_TASK);
}
