/*
 * task_lease.c -- the attempts of tasks under their leases (task_lease.h, docs/tasks.md).
 *
 * An application worker claims due tasks with ds_claim_tasks, in a statement of its own: the
 * claim commits each attempt as started (counted, its lease running) before any handler runs, as
 * an executor's claim does. Each claimed attempt carries a token: the step, the attempt's number
 * and the claim's time. Every later call with the token -- ds_heartbeat, ds_complete_task,
 * ds_fail_task, ds_release_task -- reads the step under its lock and acts only while that very
 * attempt still holds an unexpired lease: a worker that paused, lost its connection or came back
 * after its lease ran out is refused (DS410), and an outcome refused aborts the transaction that
 * tried it, the handler's own writes with it. A lease that runs out is the background worker's
 * to record (ds_record_expired_task_lease, from executor.c): the attempt lost, retried by the
 * policy, or uncertain for a person when the task says a repeat is not safe.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "base/ds_errcodes.h"
#include "base/key.h"
#include "base/policy.h"
#include "ipc/worker_shmem.h"
#include "store/run_store.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "store/task_store.h"
#include "steps/step_attempt.h"
#include "steps/step_call.h"
#include "steps/step_exec.h"
#include "steps/task_lease.h"
#include "steps/task_args.h"
#include "steps/task_floors.h"

PG_FUNCTION_INFO_V1(ds_claim_tasks);
PG_FUNCTION_INFO_V1(ds_heartbeat);
PG_FUNCTION_INFO_V1(ds_complete_task);
PG_FUNCTION_INFO_V1(ds_fail_task);
PG_FUNCTION_INFO_V1(ds_release_task);
PG_FUNCTION_INFO_V1(ds_claim_task);

/* The most tasks one claim takes, and the longest lease and the default one. */
#define MAX_CLAIM 1000
#define DEFAULT_LEASE_USECS (30 * USECS_PER_SEC)
/* The longest code a handler gives its failure, and a worker's name. */
#define MAX_ERROR_CODE 64
#define MAX_WORKER_NAME 200

/*
 * The token of an attempt: "attempt.claim-time.run_id-length.run_id step_id", the run_id's
 * length telling where the step_id begins. Opaque to workers; no secret (a role may act on its
 * own tasks anyway): it tells one attempt's lease from another's.
 */
static char *
token_text(const char *run_id, const char *step_id, int attempt, TimestampTz claimed_at)
{
	return psprintf("%d.%lld.%zu.%s%s", attempt, (long long) claimed_at, strlen(run_id), run_id,
					step_id);
}

/* Argument `argno`, a token, parsed: 22004 when NULL, 22023 when malformed. */
static void
token_arg(FunctionCallInfo fcinfo, int argno, TaskToken *t)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	ds_task_token_parse(text_to_cstring(PG_GETARG_TEXT_PP(argno)), t);
}

void
ds_task_token_parse(const char *arg, TaskToken *t)
{
	const char *p;
	char	   *end;
	long		attempt;
	long long	claimed_at;
	unsigned long run_len;

	/* its identities are cut by byte counts: only whole characters are valid */
	if (!pg_verifymbstr(arg, strlen(arg), true))
		goto malformed;
	p = arg;
	errno = 0;
	attempt = strtol(p, &end, 10);
	if (end == p || *end != '.' || errno != 0 || attempt <= 0 || attempt > PG_INT32_MAX)
		goto malformed;
	p = end + 1;
	claimed_at = strtoll(p, &end, 10);
	if (end == p || *end != '.' || errno != 0 || claimed_at <= 0)
		goto malformed;
	p = end + 1;
	run_len = strtoul(p, &end, 10);
	if (end == p || *end != '.' || errno != 0 || run_len == 0 || run_len > 255 ||
		strlen(end + 1) <= run_len || strlen(end + 1) - run_len > 255)
		goto malformed;
	p = end + 1;
	t->run_id = pnstrdup(p, run_len);
	t->step_id = pstrdup(p + run_len);
	t->attempt = (int) attempt;
	t->claimed_at = (TimestampTz) claimed_at;
	return;

malformed:
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("malformed task token"),
			 errhint("Pass the token ds_claim_tasks() returned, unchanged.")));
}

/* Does the operator's pause (durable_steps.paused) hold every claim now? */
static bool
claims_paused(void)
{
	const char *paused = GetConfigOption("durable_steps.paused", true, false);

	return paused != NULL && strcmp(paused, "on") == 0;
}

/* A microsecond count as an Interval. */
static Interval *
usecs_interval(int64 usecs)
{
	Interval   *i = palloc0(sizeof(Interval));

	i->time = usecs;
	return i;
}

/*
 * Lock and read the task the token names: DS404 for a step the caller may not see; 42501 for
 * one it may see (durable_steps_admin) but not act as; 22023 for a step that is not a task.
 */
static void
lock_task(const TaskToken *t, StepRecord *rec)
{
	PreventCommandIfReadOnly("a task's lease");
	PreventCommandIfParallelMode("a task's lease");
	ds_step_lock_visible(t->run_id, t->step_id, false, rec);
	if (!has_privs_of_role(GetUserId(), rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only the task's owner may act on its attempts"),
				 errdetail("Task %s/%s belongs to role %s.", t->run_id, t->step_id,
						   GetUserNameFromId(rec->owner, true) ? GetUserNameFromId(rec->owner, true) : "(dropped)")));
	if (rec->kind != STEP_KIND_TASK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step %s/%s is not a task", t->run_id, t->step_id)));
}

/* Does the token's attempt hold the step's lease at `now`? */
static bool
lease_held(const StepRecord *rec, const TaskToken *t, TimestampTz now)
{
	return rec->status == STEP_RUNNING && rec->attempts == t->attempt &&
		rec->updated_at == t->claimed_at && rec->lease_expires_at > now;
}

/* DS410: the token's attempt no longer holds the lease, and why. */
static void
refuse_lost_lease(const StepRecord *rec, const TaskToken *t)
{
	char	   *why;

	if (rec->status == STEP_CANCELLED)
		why = pstrdup("The step was cancelled.");
	else if (rec->status == STEP_RUNNING && rec->attempts == t->attempt &&
			 rec->updated_at == t->claimed_at)
		why = pstrdup("Its lease ran out before this call.");
	else if (rec->status == STEP_RUNNING)
		why = psprintf("Attempt %d holds the step's lease now.", rec->attempts);
	else if ((rec->status == STEP_RETRYING || rec->status == STEP_PENDING) &&
			 rec->attempts >= t->attempt && rec->error_code != NULL)
		why = psprintf("Attempt %d was recorded as failed (%s: %s); the step is %s.", t->attempt,
					   rec->error_code, rec->error_message ? rec->error_message : "",
					   ds_step_status_name(rec->status));
	else if (rec->status == STEP_RETRYING || rec->status == STEP_PENDING)
		why = pstrdup("The attempt was given back; the step waits for its next claim.");
	else
		why = psprintf("The step is %s.", ds_step_status_name(rec->status));
	ereport(ERROR,
			(errcode(ERRCODE_DS_LEASE_LOST),
			 errmsg("attempt %d of task %s/%s no longer holds its lease", t->attempt, t->run_id,
					t->step_id),
			 errdetail("%s", why),
			 errhint("Nothing of this transaction is kept: the attempt's outcome is the one already recorded, or the next attempt's.")));
}

/*
 * Record the outcome of the attempt that holds the lease, in the caller's transaction: the
 * state rules, the hooks (run as the owner, whose privileges the caller has), the attempt's
 * record; its claim is the attempt's start. A run waiting for the task is woken when the run
 * must see the outcome.
 */
void
ds_record_task_outcome(StepRecord *rec, AttemptOutcome *o)
{
	TimestampTz claimed_at = rec->updated_at;

	o->started_at = claimed_at;
	o->finished_at = GetCurrentTimestamp();
	ds_apply_attempt_outcome(rec, rec->attempts, o);
	ds_store_finish_claimed_attempt(rec, rec->attempts, claimed_at, o);

	/*
	 * the attempt no longer counts against its queue's limit: a session
	 * waiting for a task of a full queue looks again
	 */
	ds_worker_wake_kind_at_commit(STEP_KIND_TASK);

	/*
	 * a run waiting for the task (ds_task) goes on, but not for a retry: that
	 * is the workers'
	 */
	if (rec->status != STEP_RETRYING && rec->status != STEP_PENDING)
		ds_run_wake_for_step_outcome(rec->run_id, rec->step_id);
}

bool
ds_lock_task_lease(const TaskToken *t, StepRecord *rec)
{
	lock_task(t, rec);
	return lease_held(rec, t, GetCurrentTimestamp());
}

void
ds_record_task_success(StepRecord *rec, Jsonb *result)
{
	AttemptOutcome o;
	JsonbValue	scalar;

	memset(&o, 0, sizeof(o));

	/*
	 * a task stored with expect => 'row' whose handler answered nothing:
	 * correctable, as a SQL step that found no row (docs/tasks.md)
	 */
	if (rec->expect_row &&
		(result == NULL ||
		 (JsonbExtractScalar(&result->root, &scalar) && scalar.type == jbvNull)))
	{
		o.cls = ATTEMPT_CORRECTABLE;
		o.sqlerrcode = ERRCODE_DS_NO_ROW;
		o.message = pstrdup("task returned no result");
		o.detail = pstrdup("The task expects a result (expect => 'row'): its handler completed it with none.");
		o.hint = pstrdup("Correct the task's input or the data it depends on, then re-arm it with ds_retry_step().");
		ds_record_task_outcome(rec, &o);
		return;
	}
	o.cls = ATTEMPT_COMPLETED;

	/*
	 * a step's result is never SQL NULL once it succeeded: JSON null stands
	 * for none
	 */
	o.result = result != NULL ? result :
		DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("null")));
	ds_record_task_outcome(rec, &o);
}

/*
 * The room left under each queue's limit for this claim, looked up once per queue (its row
 * locked first, so that claims of the queue count in turn) and counted down as the claim takes
 * tasks of it: -1 without a limit.
 */
typedef struct QueueRoom
{
	char	   *queue;
	int64		room;			/* -1: no limit */
} QueueRoom;

static int64 *
queue_room(QueueRoom *rooms, int *n_rooms, const char *queue)
{
	for (int i = 0; i < *n_rooms; i++)
		if (strcmp(rooms[i].queue, queue) == 0)
			return &rooms[i].room;
	rooms[*n_rooms].queue = pstrdup(queue);
	rooms[*n_rooms].room = ds_store_task_queue_room(queue);
	return &rooms[(*n_rooms)++].room;
}

/*
 * ds_claim_tasks(tasks, max, lease, worker, queues) -> setof (run_id, step_id, task, input,
 * attempt, max_attempts, idempotency_key, attempt_key, token, lease_expires_at, deadline)
 */
Datum
ds_claim_tasks(PG_FUNCTION_ARGS)
{
	ArrayType  *tasks = ds_task_names_arg(fcinfo, 0, "tasks", false);
	int32		max;
	int64		lease = ds_task_interval_arg(fcinfo, 2, "lease", DEFAULT_LEASE_USECS);
	char	   *worker = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	ArrayType  *queues = ds_task_names_arg(fcinfo, 4, "queues", true);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			caller;
	StoreSpi	spi;
	TimestampTz now;
	uint64		n;
	Datum	   *tids;
	QueueRoom  *rooms;
	int			n_rooms = 0;
	int			n_tids = 0;
	DueTaskGroup *groups = NULL;
	int			n_groups;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max must not be null")));
	max = PG_GETARG_INT32(1);
	if (max < 1 || max > MAX_CLAIM)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max must be 1 to %d", MAX_CLAIM)));
	if (worker != NULL && (worker[0] == '\0' || strlen(worker) > MAX_WORKER_NAME))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("worker must be 1 to %d bytes", MAX_WORKER_NAME)));

	/*
	 * The claim is the attempt's start, committed before its handler runs: a
	 * claim inside a transaction block would count nothing until that
	 * commits, and a handler could run an attempt that a rollback then
	 * forgets.
	 */

	/*
	 * Under a snapshot taken for the whole transaction, a claim would lock
	 * rows updated since (a serialization failure) and count the running
	 * steps of a queue as they were before it waited for the queue's row.
	 */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("ds_claim_tasks() must run at the READ COMMITTED isolation level"),
				 errhint("Claim in a session whose default_transaction_isolation is read committed.")));
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("ds_claim_tasks() must be called outside a transaction block"),
				 errdetail("A claim is the start of its attempts: it must commit before their handlers run."),
				 errhint("Run it as a statement of its own, in autocommit mode.")));
	PreventCommandIfReadOnly("ds_claim_tasks()");
	PreventCommandIfParallelMode("ds_claim_tasks()");
	InitMaterializedSRF(fcinfo, 0);

	/* the operator's pause holds every claim, the application workers' too */
	if (claims_paused())
		PG_RETURN_NULL();

	now = GetCurrentTimestamp();

	/*
	 * the caller's role decides whose tasks it may run: read before the
	 * switch to the owner
	 */
	caller = GetUserId();
	n_groups = ds_task_groups_to_read(tasks, caller, &groups);
	ds_store_spi_begin(&spi);
	n = ds_store_lock_due_tasks(tasks, queues, caller, max, now, groups, n_groups);
	tids = palloc(sizeof(Datum) * Max(n, 1));
	rooms = palloc(sizeof(QueueRoom) * Max(n, 1));
	{
		/* the rows, copied out before the next statement replaces them */
		SPITupleTable *tt = SPI_tuptable;
		ItemPointerData *ctids = palloc(sizeof(ItemPointerData) * Max(n, 1));
		char	  **row_queues = palloc(sizeof(char *) * Max(n, 1));

		for (uint64 i = 0; i < n; i++)
		{
			bool		isnull;

			ctids[i] = *(ItemPointer) DatumGetPointer(SPI_getbinval(tt->vals[i], tt->tupdesc, 1, &isnull));
			row_queues[i] = SPI_getvalue(tt->vals[i], tt->tupdesc, 2);
		}
		for (uint64 i = 0; i < n; i++)
		{
			int64	   *room = queue_room(rooms, &n_rooms, row_queues[i]);

			/* a full or paused queue keeps its tasks waiting */
			if (*room == 0)
				continue;
			if (*room > 0)
				(*room)--;
			tids[n_tids++] = PointerGetDatum(&ctids[i]);
		}
	}
	if (n_tids > 0)
	{
		ArrayType  *tid_array = construct_array(tids, n_tids, TIDOID, sizeof(ItemPointerData),
												false, TYPALIGN_SHORT);
		uint64		claimed = ds_store_mark_tasks_running(tid_array, now, MyProcPid, worker,
														  usecs_interval(lease));
		SPITupleTable *tt = SPI_tuptable;

		for (uint64 i = 0; i < claimed; i++)
		{
			Datum		values[11];
			bool		nulls[11];
			bool		isnull;
			char	   *run_id = SPI_getvalue(tt->vals[i], tt->tupdesc, 1);
			char	   *step_id = SPI_getvalue(tt->vals[i], tt->tupdesc, 2);
			int			attempt = DatumGetInt32(SPI_getbinval(tt->vals[i], tt->tupdesc, 5, &isnull));
			StringInfoData key;

			memset(nulls, false, sizeof(nulls));
			initStringInfo(&key);
			ds_append_step_key(&key, run_id, step_id);
			values[0] = CStringGetTextDatum(run_id);
			values[1] = CStringGetTextDatum(step_id);
			values[2] = SPI_getbinval(tt->vals[i], tt->tupdesc, 3, &isnull);
			values[3] = SPI_getbinval(tt->vals[i], tt->tupdesc, 4, &nulls[3]);
			values[4] = Int32GetDatum(attempt);
			values[5] = SPI_getbinval(tt->vals[i], tt->tupdesc, 6, &isnull);
			values[6] = CStringGetTextDatum(key.data);
			values[7] = CStringGetTextDatum(psprintf("%s:%d", key.data, attempt));
			values[8] = CStringGetTextDatum(token_text(run_id, step_id, attempt, now));
			values[9] = SPI_getbinval(tt->vals[i], tt->tupdesc, 7, &isnull);
			values[10] = SPI_getbinval(tt->vals[i], tt->tupdesc, 8, &nulls[10]);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	ds_store_spi_end(&spi);
	PG_RETURN_NULL();
}

/* ds_heartbeat(token, extend) -> (held boolean, cancelled boolean, lease_expires_at timestamptz) */
Datum
ds_heartbeat(PG_FUNCTION_ARGS)
{
	TaskToken	t;
	int64		extend;
	StepRecord	rec;
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, true};
	TimestampTz now;

	token_arg(fcinfo, 0, &t);
	extend = ds_task_interval_arg(fcinfo, 1, "extend", DEFAULT_LEASE_USECS);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "ds_heartbeat must return a row");
	lock_task(&t, &rec);
	now = GetCurrentTimestamp();
	values[0] = BoolGetDatum(false);
	values[1] = BoolGetDatum(rec.status == STEP_CANCELLED);
	if (lease_held(&rec, &t, now))
	{
		TimestampTz until = now + extend;

		/* never past the attempt's deadline: the lease then runs out with it */
		if (rec.timeout != 0 && until > t.claimed_at + rec.timeout)
			until = t.claimed_at + rec.timeout;
		if (until > rec.lease_expires_at)
		{
			rec.lease_expires_at = until;
			ds_store_update_step(&rec);
		}
		values[0] = BoolGetDatum(true);
		values[2] = TimestampTzGetDatum(rec.lease_expires_at);
		nulls[2] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* ds_complete_task(token, result) -> ds_step_result */
Datum
ds_complete_task(PG_FUNCTION_ARGS)
{
	TaskToken	t;
	Jsonb	   *result = PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P_COPY(1);
	StepRecord	rec;

	token_arg(fcinfo, 0, &t);
	if (result != NULL && VARSIZE(result) > (Size) ds_max_result_size())
		ereport(ERROR,
				(errcode(ERRCODE_DS_RESULT_TOO_LARGE),
				 errmsg("task result is too large"),
				 errdetail("The result has %u bytes; durable_steps.max_result_size is %d bytes.",
						   (unsigned) VARSIZE(result), ds_max_result_size())));
	if (!ds_lock_task_lease(&t, &rec))
		refuse_lost_lease(&rec, &t);
	ds_record_task_success(&rec, result);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/* A text argument cut to DS_MAX_ERROR_TEXT bytes; NULL stays NULL. */
static char *
error_text_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *s;

	if (PG_ARGISNULL(argno))
		return NULL;
	s = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (strlen(s) > DS_MAX_ERROR_TEXT)
		s[pg_mbcliplen(s, strlen(s), DS_MAX_ERROR_TEXT)] = '\0';
	return s;
}

/*
 * ds_fail_task(token, error_code, message, detail, class, retry_after, remediation)
 * -> ds_step_result
 */
Datum
ds_fail_task(PG_FUNCTION_ARGS)
{
	TaskToken	t;
	char	   *code;
	char	   *message;
	char	   *cls;
	int64		retry_after;
	char	   *remediation;
	StepRecord	rec;
	AttemptOutcome o;

	token_arg(fcinfo, 0, &t);
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null",
						PG_ARGISNULL(1) ? "error_code" : PG_ARGISNULL(2) ? "message" : "class")));
	code = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (code[0] == '\0' || strlen(code) > MAX_ERROR_CODE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("error_code must be 1 to %d bytes", MAX_ERROR_CODE)));
	message = error_text_arg(fcinfo, 2);
	cls = text_to_cstring(PG_GETARG_TEXT_PP(4));
	memset(&o, 0, sizeof(o));
	if (strcmp(cls, "retryable") == 0)
	{
		o.cls = ATTEMPT_RETRYABLE;
		o.sqlerrcode = ERRCODE_DS_RETRY_AFTER;
	}
	else if (strcmp(cls, "correctable") == 0)
	{
		o.cls = ATTEMPT_CORRECTABLE;
		o.sqlerrcode = ERRCODE_DS_BLOCKED;
	}
	else if (strcmp(cls, "permanent") == 0)
	{
		o.cls = ATTEMPT_PERMANENT;
		o.sqlerrcode = ERRCODE_DS_NON_RETRIABLE;
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("class must be 'retryable', 'correctable' or 'permanent'")));
	/* as ds_retry_after() takes it: 0 (at once) to 24 hours */
	retry_after = -1;
	if (!PG_ARGISNULL(5))
	{
		retry_after = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(5));
		if (retry_after < 0 || retry_after > DS_MAX_DELAY_USECS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("retry_after must be 0 to 24 hours")));
	}
	if (retry_after >= 0 && o.cls != ATTEMPT_RETRYABLE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry_after is for retryable failures only")));
	remediation = error_text_arg(fcinfo, 6);
	if (remediation != NULL && o.cls != ATTEMPT_CORRECTABLE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("remediation is for correctable failures only")));
	if (!ds_lock_task_lease(&t, &rec))
		refuse_lost_lease(&rec, &t);
	o.error_code = code;
	o.message = message;
	o.detail = error_text_arg(fcinfo, 3);
	o.hint = remediation;
	o.has_retry_after = retry_after >= 0;
	o.retry_after = Max(retry_after, 0);
	ds_record_task_outcome(&rec, &o);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, false));
}

/* ds_release_task(token) -> boolean: a claim whose handler never started, given back */
Datum
ds_release_task(PG_FUNCTION_ARGS)
{
	TaskToken	t;
	StepRecord	rec;

	token_arg(fcinfo, 0, &t);
	if (!ds_lock_task_lease(&t, &rec))
		PG_RETURN_BOOL(false);

	/*
	 * The attempt is not counted: nothing of it ran. Its number is issued
	 * again, under a later claim's time, so this token stays refused.
	 */
	rec.attempts--;
	rec.status = rec.attempts > rec.attempt_base ? STEP_RETRYING : STEP_PENDING;
	rec.lease_expires_at = 0;
	rec.claimed_by = 0;
	rec.running_queue = NULL;
	rec.worker = NULL;
	rec.updated_at = GetCurrentTimestamp();
	ds_store_update_step(&rec);
	ds_worker_wake_kind_at_commit(STEP_KIND_TASK);
	PG_RETURN_BOOL(true);
}

/* A column of ds_claim_task's row. */
enum
{
	CT_STATUS, CT_RESULT, CT_ATTEMPT, CT_MAX_ATTEMPTS, CT_IDEMPOTENCY_KEY, CT_ATTEMPT_KEY,
	CT_TOKEN, CT_LEASE_EXPIRES_AT, CT_DEADLINE, CT_NEXT_ATTEMPT_AT, CT_ERROR_CODE,
	CT_ERROR_MESSAGE, N_CT
};

/*
 * ds_claim_task(holder, step_id, lease, worker) -> (status, result, attempt, max_attempts,
 * idempotency_key, attempt_key, token, lease_expires_at, deadline, next_attempt_at, error_code,
 * error_message)
 *
 * The attempt of one named task of a run, claimed by the holder of another task of the same run
 * (docs/app-workflows.md): an application workflow's segment claims the attempts of its own
 * steps, which no worker claims by name. `holder` is the segment's token and must hold its
 * lease (DS410 otherwise), so that a worker that paused or came back after its lease ran out
 * starts no step. A step that waits and is due is claimed exactly as ds_claim_tasks claims it
 * (counted, its lease running, committed by this statement); a running one whose lease ran out
 * is first recorded lost, as the background worker records it. Any other state is answered as
 * it is, with no token: succeeded (its result), failed or cancelled (its error), a retry not yet
 * due (next_attempt_at), running under another attempt's lease (lease_expires_at), blocked or
 * uncertain.
 */
Datum
ds_claim_task(PG_FUNCTION_ARGS)
{
	TaskToken	holder;
	TaskToken	step;
	char	   *step_id;
	int64		lease = ds_task_interval_arg(fcinfo, 2, "lease", DEFAULT_LEASE_USECS);
	char	   *worker = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	StepRecord	hrec;
	StepRecord	rec;
	TupleDesc	desc;
	Datum		values[N_CT];
	bool		nulls[N_CT];
	TimestampTz now;

	token_arg(fcinfo, 0, &holder);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("step_id must not be null")));
	step_id = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (step_id[0] == '\0' || strlen(step_id) > 255)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step_id must be 1 to 255 bytes")));
	if (strcmp(step_id, holder.step_id) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a task cannot claim itself"),
				 errdetail("Step %s/%s is the holder's own step.", holder.run_id, step_id)));
	if (worker != NULL && (worker[0] == '\0' || strlen(worker) > MAX_WORKER_NAME))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("worker must be 1 to %d bytes", MAX_WORKER_NAME)));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "ds_claim_task must return a row");

	/*
	 * the same rules as ds_claim_tasks: the claim commits before the attempt
	 * runs
	 */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("ds_claim_task() must run at the READ COMMITTED isolation level")));
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("ds_claim_task() must be called outside a transaction block"),
				 errdetail("A claim is the start of its attempt: it must commit before the attempt runs."),
				 errhint("Run it as a statement of its own, in autocommit mode.")));

	/*
	 * Both steps' locks in the order of their identities, as
	 * ds_complete_tasks and ds_cancel_run take a run's: two callers never
	 * wait for each other in a circle.
	 */
	step.run_id = holder.run_id;
	step.step_id = step_id;
	step.attempt = 0;
	step.claimed_at = 0;
	if (strcmp(holder.step_id, step_id) < 0)
	{
		lock_task(&holder, &hrec);
		lock_task(&step, &rec);
	}
	else
	{
		lock_task(&step, &rec);
		lock_task(&holder, &hrec);
	}
	now = GetCurrentTimestamp();
	if (!lease_held(&hrec, &holder, now))
		refuse_lost_lease(&hrec, &holder);

	/*
	 * only a segment of an application workflow claims by name, and only its
	 * own steps: a task that workers claim by name is theirs
	 */
	if (hrec.task == NULL || strncmp(hrec.task, "ds.workflow:", 12) != 0 ||
		rec.task == NULL || strncmp(rec.task, "ds.step:", 8) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ds_claim_task claims a step of an application workflow for its segment"),
				 errdetail("The holder is task %s and the step task %s; they must be ds.workflow:<name> and ds.step:<name>.",
						   hrec.task ? hrec.task : "(none)", rec.task ? rec.task : "(none)")));

	/* a lease that ran out is recorded now rather than waited for */
	if (ds_record_expired_task_lease(&rec, now) &&
		!ds_lock_step_row(holder.run_id, step_id, &rec))
		elog(ERROR, "step %s/%s vanished under its lock", holder.run_id, step_id);

	memset(nulls, true, sizeof(nulls));

	/*
	 * A waiting step that is due is claimed, unless the operator's pause or a
	 * full or paused queue holds it, as they hold ds_claim_tasks. The claim
	 * answers the attempt's number and lease: the row is not read again.
	 */
	if ((rec.status == STEP_PENDING || rec.status == STEP_RETRYING) &&
		rec.next_attempt_at != 0 && rec.next_attempt_at <= now && !claims_paused())
	{
		StoreSpi	spi;
		Datum		tid = PointerGetDatum(&rec.tid);
		bool		claimed = false;

		ds_store_spi_begin(&spi);
		if (ds_store_task_queue_room(rec.queue) != 0)
		{
			bool		isnull;

			if (ds_store_mark_tasks_running(construct_array(&tid, 1, TIDOID, sizeof(ItemPointerData),
															false, TYPALIGN_SHORT),
											now, MyProcPid, worker, usecs_interval(lease)) != 1)
				elog(ERROR, "task %s/%s was not claimed", holder.run_id, step_id);
			rec.attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
													   5, &isnull));
			rec.lease_expires_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
																	 SPI_tuptable->tupdesc, 7, &isnull));
			rec.status = STEP_RUNNING;
			claimed = true;
		}
		ds_store_spi_end(&spi);
		if (claimed)
		{
			StringInfoData key;

			initStringInfo(&key);
			ds_append_step_key(&key, holder.run_id, step_id);
			values[CT_IDEMPOTENCY_KEY] = CStringGetTextDatum(key.data);
			values[CT_ATTEMPT_KEY] = CStringGetTextDatum(psprintf("%s:%d", key.data, rec.attempts));
			values[CT_TOKEN] = CStringGetTextDatum(token_text(holder.run_id, step_id, rec.attempts, now));
			if (rec.timeout != 0)
				values[CT_DEADLINE] = TimestampTzGetDatum(now + rec.timeout);
			nulls[CT_IDEMPOTENCY_KEY] = nulls[CT_ATTEMPT_KEY] = nulls[CT_TOKEN] = false;
			nulls[CT_DEADLINE] = rec.timeout == 0;
		}
	}
	values[CT_STATUS] = CStringGetTextDatum(ds_step_status_name(rec.status));
	nulls[CT_STATUS] = false;
	if (rec.status == STEP_SUCCEEDED && rec.result != NULL)
	{
		values[CT_RESULT] = JsonbPGetDatum(rec.result);
		nulls[CT_RESULT] = false;
	}
	values[CT_ATTEMPT] = Int32GetDatum(rec.attempts);
	values[CT_MAX_ATTEMPTS] = Int32GetDatum(rec.attempt_base + rec.max_attempts);
	nulls[CT_ATTEMPT] = nulls[CT_MAX_ATTEMPTS] = false;
	if (rec.status == STEP_RUNNING && rec.lease_expires_at != 0)
	{
		values[CT_LEASE_EXPIRES_AT] = TimestampTzGetDatum(rec.lease_expires_at);
		nulls[CT_LEASE_EXPIRES_AT] = false;
	}
	if ((rec.status == STEP_PENDING || rec.status == STEP_RETRYING) && rec.next_attempt_at != 0)
	{
		values[CT_NEXT_ATTEMPT_AT] = TimestampTzGetDatum(rec.next_attempt_at);
		nulls[CT_NEXT_ATTEMPT_AT] = false;
	}
	if (rec.status != STEP_SUCCEEDED && rec.status != STEP_RUNNING && rec.error_code != NULL)
	{
		values[CT_ERROR_CODE] = CStringGetTextDatum(rec.error_code);
		values[CT_ERROR_MESSAGE] = CStringGetTextDatum(rec.error_message ? rec.error_message : "");
		nulls[CT_ERROR_CODE] = nulls[CT_ERROR_MESSAGE] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

bool
ds_record_expired_task_lease(StepRecord *rec, TimestampTz now)
{
	AttemptOutcome o;
	bool		past_deadline;

	if (rec->kind != STEP_KIND_TASK || rec->status != STEP_RUNNING ||
		rec->lease_expires_at == 0 || rec->lease_expires_at > now)
		return false;
	past_deadline = rec->timeout != 0 && now >= rec->updated_at + rec->timeout;
	memset(&o, 0, sizeof(o));
	o.cls = rec->on_lost != NULL ? ATTEMPT_UNCERTAIN : ATTEMPT_RETRYABLE;
	o.sqlerrcode = past_deadline ? ERRCODE_DS_STEP_TIMEOUT : ERRCODE_DS_INVOCATION_LOST;
	o.message = pstrdup(past_deadline ? "step_timeout" : "invocation_lost");
	o.detail = past_deadline ?
		psprintf("Attempt %d passed its deadline without an outcome; its lease ended with it.",
				 rec->attempts) :
		psprintf("The lease of attempt %d ran out at %s without a heartbeat or an outcome%s.",
				 rec->attempts, timestamptz_to_str(rec->lease_expires_at),
				 rec->worker ? psprintf(" from worker %s", rec->worker) : "");
	ereport(LOG,
			(errmsg("durable_steps: the lease of attempt %d of task %s/%s ran out; recording it as %s",
					rec->attempts, rec->run_id, rec->step_id,
					past_deadline ? "timed out" : "lost")));
	if (o.cls == ATTEMPT_UNCERTAIN)
		o.hint = pstrdup("The task's handler may have taken effect before its lease ran out. Find out, then settle the step with ds_resolve_step() or run it again with ds_retry_step().");
	ds_record_task_outcome(rec, &o);
	return true;
}

void
ds_cancel_running_task(StepRecord *rec)
{
	AttemptOutcome o;

	Assert(rec->kind == STEP_KIND_TASK && rec->status == STEP_RUNNING);
	memset(&o, 0, sizeof(o));
	o.cls = ATTEMPT_CANCELLED;
	o.sqlerrcode = ERRCODE_QUERY_CANCELED;
	o.message = pstrdup("canceling statement due to user request");
	o.detail = psprintf("ds_cancel_step() cancelled the task while attempt %d ran; its worker's next heartbeat says so.",
						rec->attempts);
	ds_record_task_outcome(rec, &o);
}
