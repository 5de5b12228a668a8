/*
 * step_hooks.c -- outcome hooks: on_success and on_failure (docs/steps.md, "Outcome hooks").
 *
 * A hook is its owner's SQL, run in the transaction that records the step's outcome, so that
 * the outcome and what the hook writes (the worker's answer written back, a dead-letter row)
 * commit together or not at all. It runs the way an attempt body runs, in its own
 * subtransaction (subtransaction.h): a failing hook rolls back its own writes and nothing else,
 * and the step, whose outcome is kept, becomes blocked with the hook's error.
 *
 * It runs as the step's owner, never as whoever happens to record the outcome:
 *   - in the worker, with the isolation of a worker attempt (step_isolation.c): the owner as
 *     session and current user in a security-restricted operation, the session reset after it,
 *     and bounded in time like an attempt (the step's timeout or durable_steps.default_timeout,
 *     under durable_steps.max_worker_attempt_time), by a deadline timer of its own
 *     (deadline_timer.h: a hook may run inside a body, under the body's);
 *   - in a caller's session (the attempt ran in ds_run_step, or ds_retry_step runs the hook
 *     again), as a security-restricted operation of the owner, as PostgreSQL runs a table
 *     owner's code in VACUUM: the session user stays the caller's (only a superuser session can
 *     change it), but nothing can be left behind to run later with the caller's privileges (no
 *     WITH HOLD cursor, temporary object, deferred trigger, SET ROLE). The caller's
 *     statement_timeout bounds it.
 * Everywhere it runs under the search_path the step was created with, pg_temp last.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "base/ds_errcodes.h"
#include "base/size_limits.h"
#include "base/sql_text.h"
#include "base/subtransaction.h"
#include "base/worker_attempt_time.h"
#include "steps/caller_guard.h"
#include "steps/deadline_timer.h"
#include "steps/step_context.h"
#include "steps/step_exec.h"
#include "steps/step_hooks.h"
#include "steps/step_isolation.h"

/* A worker hook's deadline timer: it cancels the hook, and past the grace ends the executor. */
static void hook_deadline_passed(void);
static DeadlineTimer hook_deadline_timer = DEADLINE_TIMER_INIT(hook_deadline_passed);

/* The worker hook the timer bounds now (`on_failure`, or not): the one an ended executor names. */
static bool timed_hook_is_on_failure = false;

/* Timeout handler (signal context): cancel the hook, and past the grace period end the executor. */
static void
hook_deadline_passed(void)
{
	ds_deadline_timer_fire(&hook_deadline_timer);
}

/* Cancel the hook at `deadline` and every second after it, ending the executor past it; 0 disarms. */
static void
arm_hook_deadline(TimestampTz deadline)
{
	hook_deadline_timer.end_process_after = deadline;
	if (deadline != 0)
		hook_deadline_timer.fired = false;
	ds_deadline_timer_arm(&hook_deadline_timer, deadline);
}

/* The hook's statement, run inside its subtransaction, as its owner. */
static void
execute_hook_sql(const OutcomeHook *hook)
{
	Oid			argtypes[1] = {JSONBOID};
	Datum		values[1];
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = JsonbPGetDatum(hook->arg);
	rc = SPI_execute_with_args(hook->sql, 1, argtypes, values, NULL, false, 0);
	if (rc < 0)
		elog(ERROR, "%s hook failed: %s", hook->name, SPI_result_code_string(rc));
	SPI_finish();
}

bool
ds_run_outcome_hook(const OutcomeHook *hook, ErrorData **error)
{
	bool		in_worker = DS_AM_BACKGROUND_WORKER;
	volatile TimestampTz deadline = 0;
	volatile bool ok = false;
	CallerGuard guard;
	Oid			save_userid;
	int			save_sec_context;
	const char *search_path;
	Subtransaction sub;

	*error = NULL;
	search_path = hook->search_path == NULL ||
		strspn(hook->search_path, " \t\r\n") == strlen(hook->search_path) ?
		"pg_temp" : psprintf("%s, pg_temp", hook->search_path);

	/*
	 * a hook calling its own step is recursion, as for a body;
	 * ds_attempt_number() answers
	 */
	ds_step_context_push(hook->run_id, hook->step_id, hook->attempt, hook->max_attempts);
	if (in_worker)
	{
		deadline = GetCurrentTimestamp() + ds_worker_attempt_limit_usecs(hook->timeout);
		timed_hook_is_on_failure = strcmp(hook->name, "on_failure") == 0;
		arm_hook_deadline(deadline);
	}
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	/* what the caller's session holds before, when the hook is another role's */
	guard.active = false;
	if (!in_worker)
		ds_caller_guard_begin(&guard, hook->owner);

	ds_subtransaction_begin(&sub);
	PG_TRY();
	{
		int			guc_level = NewGUCNestLevel();

		/*
		 * never as nobody: a dropped owner's hook fails, and the step is
		 * blocked
		 */
		if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(hook->owner)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("the role that created the step no longer exists"),
					 errdetail("Role OID %u was dropped.", hook->owner)));
		if (in_worker)
			ds_isolation_enter(hook->owner, save_sec_context);
		else
			SetUserIdAndSecContext(hook->owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
								   SECURITY_RESTRICTED_OPERATION);
		(void) set_config_option("search_path", search_path, PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);

		execute_hook_sql(hook);

		/*
		 * the worker's session keeps nothing of the hook, nor does another
		 * role's session
		 */
		if (in_worker)
			ds_isolation_reset_session();

		SetUserIdAndSecContext(save_userid, save_sec_context);
		if (!in_worker)
			ds_caller_guard_end(&guard);
		AtEOXact_GUC(false, guc_level);
		ds_subtransaction_commit(&sub);
		ok = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		if (deadline != 0)
			arm_hook_deadline(0);

		/*
		 * rolls back the hook's writes, its SETs, its SPI connection and the
		 * role switch
		 */
		edata = ds_subtransaction_rollback(&sub);
		if (in_worker)
			ds_isolation_reset_after_abort();
		else
			ds_caller_guard_after_abort(&guard);
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && !in_worker)
		{
			/*
			 * the caller's statement was cancelled: not the hook's outcome to
			 * record
			 */
			ds_step_context_pop();
			ReThrowError(edata);
		}
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && hook_deadline_timer.fired)
		{
			edata->sqlerrcode = ERRCODE_DS_STEP_TIMEOUT;
			edata->message = psprintf("timed out after %lld ms",
									  (long long) (ds_worker_attempt_limit_usecs(hook->timeout) / 1000));
			edata->detail = edata->hint = NULL;
		}
		*error = edata;
	}
	PG_END_TRY();

	ds_step_context_pop();
	if (deadline != 0)
	{
		arm_hook_deadline(0);

		/*
		 * a timer that fired just as the hook finished must not cancel what
		 * follows
		 */
		if (hook_deadline_timer.fired)
			QueryCancelPending = false;
		hook_deadline_timer.fired = false;
	}

	/*
	 * a setseed() of the hook must not choose the numbers of the next role's
	 * attempt
	 */
	if (in_worker)
		ds_isolation_reseed_random();
	return ok;
}

/* Add "key": value (a string, or null) to the object being built. */
static void
push_text(DsJsonbBuilder *state, const char *key, const char *value)
{
	JsonbValue	k;
	JsonbValue	v;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	(void) ds_jsonb_push(state, WJB_KEY, &k);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvString;
		v.val.string.val = (char *) value;
		v.val.string.len = strlen(value);
	}
	(void) ds_jsonb_push(state, WJB_VALUE, &v);
}

Jsonb *
ds_outcome_hook_arg(const StepRecord *rec)
{
	DsJsonbBuilder state = {0};
	JsonbValue	k;
	JsonbValue	v;
	JsonbValue *object;

	(void) ds_jsonb_push(&state, WJB_BEGIN_OBJECT, NULL);
	push_text(&state, "run_id", rec->run_id);
	push_text(&state, "step_id", rec->step_id);
	push_text(&state, "status", ds_step_status_name(rec->status));
	k.type = jbvString;
	k.val.string.val = "attempt";
	k.val.string.len = strlen("attempt");
	(void) ds_jsonb_push(&state, WJB_KEY, &k);
	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric(rec->attempts);
	(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	k.val.string.val = "result";
	k.val.string.len = strlen("result");
	(void) ds_jsonb_push(&state, WJB_KEY, &k);
	if (rec->result == NULL)
	{
		v.type = jbvNull;
		(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	else
	{
		/*
		 * the stored value may be compressed: a jsonb container goes in as a
		 * binary value
		 */
		Jsonb	   *result = DatumGetJsonbP(PointerGetDatum(rec->result));

		if (JB_ROOT_IS_SCALAR(result))
		{
			JsonbValue	scalar;

			(void) JsonbExtractScalar(&result->root, &scalar);
			(void) ds_jsonb_push(&state, WJB_VALUE, &scalar);
		}
		else
		{
			v.type = jbvBinary;
			v.val.binary.data = &result->root;
			v.val.binary.len = VARSIZE(result) - VARHDRSZ;
			(void) ds_jsonb_push(&state, WJB_VALUE, &v);
		}
	}
	push_text(&state, "error_class", rec->error_class);
	push_text(&state, "error_code", rec->error_code);
	push_text(&state, "error_message", rec->error_message);
	push_text(&state, "error_detail", rec->error_detail);
	object = ds_jsonb_push(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(object);
}

/* An error text as attempts store them: at most DS_MAX_ERROR_TEXT bytes, cut on a character. */
static char *
capped(const char *text)
{
	int			len;

	if (text == NULL || strlen(text) <= DS_MAX_ERROR_TEXT)
		return text ? pstrdup(text) : NULL;

	len = pg_mbcliplen(text, strlen(text), DS_MAX_ERROR_TEXT - 4);
	return psprintf("%.*s ...", len, text);
}

void
ds_block_step_by_hook(StepRecord *rec, const char *name, const ErrorData *error)
{
	bool		succeeded = rec->status == STEP_SUCCEEDED || rec->result != NULL;

	/*
	 * kept: the result of a success (ds_step_blocked_by_success_hook tells it
	 * apart)
	 */
	rec->status = STEP_BLOCKED;
	rec->error_class = "correctable";
	rec->error_code = pstrdup(unpack_sql_state(error->sqlerrcode));
	rec->error_message = capped(psprintf("%s hook failed: %s", name,
										 error->message ? error->message : "(no message)"));
	rec->error_detail = capped(error->detail);
	rec->remediation = succeeded ?
		psprintf("The step succeeded and its result is kept. Correct what made the %s hook fail, then ds_retry_step() runs the hook again (not the step).", name) :
		psprintf("The step failed at attempt %d, as its row in ds_attempts records. Correct what made the %s hook fail, then ds_retry_step() re-arms the step.", rec->attempts, name);
	rec->next_attempt_at = 0;
	/* waits for a person, so it is not finished and retention keeps it */
	rec->finished_at = 0;
}

/* The hook the step's status runs: its name and SQL; false when there is none. */
static bool
hook_for_status(const StepRecord *rec, const char **name, const char **sql)
{
	if (rec->status == STEP_SUCCEEDED && rec->on_success != NULL)
	{
		*name = "on_success";
		*sql = rec->on_success;
	}
	else if (rec->status == STEP_FAILED && rec->on_failure != NULL)
	{
		*name = "on_failure";
		*sql = rec->on_failure;
	}
	else
		return false;
	return true;
}

void
ds_block_step_by_lost_hook(StepRecord *rec)
{
	const char *name;
	const char *sql;
	ErrorData	error;

	if (!hook_for_status(rec, &name, &sql))
		return;
	memset(&error, 0, sizeof(error));
	error.sqlerrcode = ERRCODE_DS_INVOCATION_LOST;
	error.message = "the process running it ended before it finished";
	error.detail = "It ignored its cancellation past its time limit, or its executor was stopped; it is not run again by itself.";
	ds_block_step_by_hook(rec, name, &error);
}

void
ds_run_step_outcome_hooks(StepRecord *rec)
{
	OutcomeHook hook;
	ErrorData  *error;

	if (!hook_for_status(rec, &hook.name, &hook.sql))
		return;
	hook.run_id = rec->run_id;
	hook.step_id = rec->step_id;
	hook.owner = rec->owner;
	hook.search_path = rec->search_path;
	hook.timeout = rec->timeout;
	hook.attempt = rec->attempts;
	hook.max_attempts = rec->attempt_base + rec->max_attempts;
	hook.arg = ds_outcome_hook_arg(rec);
	if (!ds_run_outcome_hook(&hook, &error))
		ds_block_step_by_hook(rec, hook.name, error);
}

void
ds_check_hook_sql(const char *name, const char *sql)
{
	if (sql == NULL)
		return;
	ds_check_size(DS_LIMIT_SQL, name, strlen(sql));
	ds_check_one_statement(name, sql);
}

ExecutorEndCause
ds_hook_end_cause(void)
{
	if (!hook_deadline_timer.ended_process)
		return EXECUTOR_END_OTHER;
	return timed_hook_is_on_failure ? EXECUTOR_END_FAILURE_HOOK : EXECUTOR_END_SUCCESS_HOOK;
}
