/*
 * step_call.c -- what every kind of step call shares (step_call.h): checked arguments, the
 * fingerprint of a definition, the answer of a stored step, who may see and run it, its lock
 * (docs/steps.md, "How a step behaves"). ds_run_step (run_step.c) and ds_http_step (http_step.c) are
 * built on it, so that every kind answers replays, conflicts and other roles' calls the same way.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "steps/limits.h"
#include "base/size_limits.h"
#include "base/step_kind.h"
#include "catalog/namespace.h"
#include "steps/run_context.h"
#include "steps/step_call.h"
#include "steps/step_context.h"
#include "store/run_control_store.h"
#include "store/schedule_store.h"
#include "store/step_lock.h"
#include "base/partition.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"

/* Longest run_id or step_id, in characters. */
#define DS_MAX_IDENTITY_CHARS 255

/* Argument `argno`, a run_id or step_id: not NULL, not empty, at most 255 characters. */
char *
ds_step_identity_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text	   *t;
	char	   *s;
	int			chars;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	t = PG_GETARG_TEXT_PP(argno);
	s = text_to_cstring(t);
	if (s[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));

	/*
	 * characters never outnumber bytes: count them only when the bytes could
	 * be too many
	 */
	chars = VARSIZE_ANY_EXHDR(t) > DS_MAX_IDENTITY_CHARS ? pg_mbstrlen(s) : 0;
	if (chars > DS_MAX_IDENTITY_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", name),
				 errdetail("It has %d characters; the limit is %d.", chars,
						   DS_MAX_IDENTITY_CHARS)));
	return s;
}

/* (step_call.h) */
char *
ds_run_id_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *run_id = ds_step_identity_arg(fcinfo, argno, "run_id");

	ds_partition_check_run(run_id);
	return run_id;
}

/*
 * (step_call.h) A slot's run id begins `schedule:` and then the job name as ds_key writes a part
 * (`:` and `\` escaped with `\`), then `:`. Another role that could make a step or a run under a
 * schedule's next slot keys would make every firing of it skip them, or hold them with an open
 * transaction: so those keys are reserved, and checked before anything is locked.
 */
void
ds_check_slot_run_id(const char *run_id)
{
	StringInfoData job;
	const char *p;
	Oid			owner;
	bool		in_use;
	StoreSpi	spi;

	if (strncmp(run_id, "schedule:", 9) != 0)
		return;
	initStringInfo(&job);
	for (p = run_id + 9; *p != '\0' && *p != ':'; p++)
	{
		if (*p == '\\' && p[1] != '\0')
			p++;
		appendStringInfoChar(&job, *p);
	}
	if (*p != ':' || job.len == 0)
		return;					/* not a slot's key: no slot follows a job
								 * name */

	/*
	 * Only a new run id is reserved: one with a run or a step under it
	 * already (a firing's run going on after its schedule was dropped, a step
	 * of that run's own turn, a replay) is judged by the rules of runs and
	 * steps that every call has.
	 */
	ds_store_spi_begin(&spi);
	in_use = ds_store_run_id_in_use(run_id);
	owner = in_use ? InvalidOid : ds_store_schedule_owner(job.data);
	ds_store_spi_end(&spi);
	if (in_use)
		return;
	if (!OidIsValid(owner) || !has_privs_of_role(GetUserId(), owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run id \"%s\" is reserved for the slots of schedule \"%s\"", run_id,
						job.data),
				 errdetail("Run ids of the form ds_key('schedule', job_name, slot) are made by the schedule's firings, as its owner."),
				 errhint("Choose a run id of another form.")));
}

/*
 * The step's definition: its SQL, its input and its outcome hooks (policy and timeout are not
 * part of it), as 128 bits of two independently seeded hashes. It tells definitions apart,
 * which needs no cryptographic strength (a caller can only ever match steps of roles it acts
 * for), and every call computes it, replays included. A step without hooks hashes as it did
 * before hooks existed.
 */
char *
ds_step_fingerprint(const char *sql, Jsonb *input, const char *on_success, const char *on_failure)
{
	size_t		sql_len = strlen(sql) + 1;	/* the NUL separates SQL from
											 * input */
	uint64		a = hash_bytes_extended((const unsigned char *) sql, (int) sql_len,
										UINT64CONST(0x6473716c66700001));
	uint64		b = hash_bytes_extended((const unsigned char *) sql, (int) sql_len,
										UINT64CONST(0x9e3779b97f4a7c15));

	if (input != NULL)
	{
		char	   *text = JsonbToCString(NULL, &input->root, VARSIZE(input));
		int			len = (int) strlen(text);

		a = hash_bytes_extended((const unsigned char *) text, len, a);
		b = hash_bytes_extended((const unsigned char *) text, len, b ^ UINT64CONST(0xc2b2ae3d27d4eb4f));
	}
	if (on_success != NULL || on_failure != NULL)
	{
		/*
		 * a tag byte tells a missing hook from an empty one and the two hooks
		 * apart
		 */
		StringInfoData hooks;

		initStringInfo(&hooks);
		appendStringInfoChar(&hooks, on_success ? 'S' : 's');
		if (on_success)
			appendBinaryStringInfo(&hooks, on_success, strlen(on_success) + 1);
		appendStringInfoChar(&hooks, on_failure ? 'F' : 'f');
		if (on_failure)
			appendBinaryStringInfo(&hooks, on_failure, strlen(on_failure) + 1);
		a = hash_bytes_extended((const unsigned char *) hooks.data, hooks.len,
								a ^ UINT64CONST(0x686f6f6b73000001));
		b = hash_bytes_extended((const unsigned char *) hooks.data, hooks.len,
								b ^ UINT64CONST(0x686f6f6b73000002));
	}
	return psprintf("%016" DS_UINT64_HEX "%016" DS_UINT64_HEX, a, b);
}

/* The ds_step_result of the step as `rec` holds it. */
Datum
ds_step_result_datum(FunctionCallInfo fcinfo, const StepRecord *rec, bool replayed)
{
	TupleDesc	tupdesc;
	Datum		values[13];
	bool		nulls[13];

	/*
	 * looked up once per call site: the type of ds_step_result does not
	 * change under us
	 */
	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;
	if (tupdesc == NULL)
	{
		MemoryContext oldcxt;

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "ds_step_result must be a composite type");
		oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		MemoryContextSwitchTo(oldcxt);
		fcinfo->flinfo->fn_extra = tupdesc;
	}
	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(rec->run_id);
	values[1] = CStringGetTextDatum(rec->step_id);
	values[2] = CStringGetTextDatum(ds_step_status_name(rec->status));
	values[3] = PointerGetDatum(rec->result);
	nulls[3] = rec->result == NULL;
	values[4] = Int32GetDatum(rec->attempts);
	values[5] = Int32GetDatum(rec->attempt_base + rec->max_attempts);
	values[6] = TimestampTzGetDatum(rec->next_attempt_at);
	nulls[6] = rec->next_attempt_at == 0;
#define TEXT_OR_NULL(i, s) \
	do { nulls[i] = (s) == NULL; values[i] = (s) ? CStringGetTextDatum(s) : (Datum) 0; } while (0)
	TEXT_OR_NULL(7, rec->error_class);
	TEXT_OR_NULL(8, rec->error_code);
	TEXT_OR_NULL(9, rec->error_message);
	TEXT_OR_NULL(10, rec->error_detail);
	TEXT_OR_NULL(11, rec->remediation);
#undef TEXT_OR_NULL
	values[12] = BoolGetDatum(replayed);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * A step is answered only to the role that created it (docs/security.md): not to an
 * admin, not to a superuser. Its stored result is what its owner's SQL did under its owner's
 * search_path and privileges; handed to another role "as if it were its own", it would answer a
 * question that role never asked. The identity is one namespace for every role (one identity,
 * one idempotency key, whoever calls), so another role learns only that it is taken.
 */
void
ds_step_check_owner_id(Oid owner, const char *run_id, const char *step_id)
{
	if (owner != GetUserId())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("step %s/%s belongs to another role", run_id, step_id),
				 errhint("Only the role that created a step can run or replay it; choose another run_id or step_id.")));
}

/* ds_step_check_owner_id for the step in `rec`. */
void
ds_step_check_owner(const StepRecord *rec)
{
	ds_step_check_owner_id(rec->owner, rec->run_id, rec->step_id);
}

bool
ds_expect_row_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *expect;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return false;
	expect = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (strcmp(expect, "row") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expect must be 'row' or null")));
	return true;
}

char *
ds_sql_step_fingerprint(const char *sql, bool expect_row, Jsonb *input, const char *on_success,
						const char *on_failure)
{
	/*
	 * a prefix no stored SQL has (a statement does not begin so): a step
	 * stored without it hashes as it did before steps could expect a row
	 */
	return ds_step_fingerprint(expect_row ? psprintf("expect row\n%s", sql) : sql, input,
							   on_success, on_failure);
}

/*
 * The hint of a conflict with stored step `rec`: a step that stopped without succeeding takes a
 * corrected definition through its re-arm (docs/steps.md, "Stuck work: find, cancel, re-arm"); any other needs a
 * new step id.
 */
static char *
conflict_hint(const StepRecord *rec)
{
	const char *fix;

	/*
	 * an uncertain HTTP step's request is never replaced: it may have been
	 * received
	 */
	if ((rec->status != STEP_FAILED && rec->status != STEP_BLOCKED &&
		 rec->status != STEP_UNCERTAIN) ||
		(rec->kind == STEP_KIND_HTTP && rec->status == STEP_UNCERTAIN))
		return pstrdup("Use a new step_id for a different step.");
	fix = rec->kind == STEP_KIND_HTTP ? "request => ..." :
		rec->kind == STEP_KIND_TASK ? "input => ..." : "sql => ..., input => ...";
	return psprintf("To run this %s step with a corrected definition, re-arm it: ds_retry_step(%s, %s, %s).",
					ds_step_status_name(rec->status), quote_literal_cstr(rec->run_id),
					quote_literal_cstr(rec->step_id), fix);
}

/*
 * The rows of the table in docs/steps.md, "How a step behaves", that do not run the body. Returns true
 * when the stored state is the answer; raises on a conflict; false means there is an attempt to
 * run now.
 */
bool
ds_step_answer_from_store(const StepRecord *rec, const char *fingerprint)
{
	ds_step_check_owner(rec);
	if (strcmp(rec->fingerprint, fingerprint) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("step %s/%s already exists with a different definition",
						rec->run_id, rec->step_id),
				 errdetail("The stored step (status %s) was created with other SQL, input or hooks.",
						   ds_step_status_name(rec->status)),
				 errhint("%s", conflict_hint(rec))));
	if (ds_step_status_is_settled(rec->status))
		return true;
	if ((rec->status == STEP_RETRYING || rec->status == STEP_PENDING) &&
		rec->next_attempt_at > GetCurrentTimestamp())
		return true;
	return false;
}

/* Argument `argno`, a step timeout, in microseconds: 0 for NULL, else in (0, 24 hours]. */
int64
ds_step_timeout_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		return 0;
	usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs <= 0 || usecs > DS_MAX_DELAY_USECS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be more than 0 and at most 24 hours")));
	return usecs;
}

/*
 * Take the step's lock (waiting for, or with nowait refusing, a transaction that has it in
 * flight) and read the row again under it, locked; false when there is no step yet.
 */
bool
ds_step_lock_and_read(const char *run_id, const char *step_id, bool nowait, StepRecord *rec)
{
	bool		found;

	/*
	 * from here on the call may write: refuse where writing is not allowed,
	 * before anything
	 */
	PreventCommandIfReadOnly("ds_run_step()");
	PreventCommandIfParallelMode("ds_run_step()");
	if (!ds_step_lock_acquire(run_id, step_id, nowait))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("step %s/%s is in progress in another transaction", run_id,
						step_id),
				 errhint("Retry after a moment, or call without nowait to wait for it.")));

	/*
	 * Under the lock, the latest snapshot sees whatever the previous holder
	 * committed. Most often there is nothing: a new step, inserted without
	 * reading the row again.
	 */
	found = ds_probe_step(run_id, step_id, GetLatestSnapshot(), rec, NULL);
	if (found && IsolationUsesXactSnapshot() &&
		!ds_probe_step(run_id, step_id, GetTransactionSnapshot(), rec, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent creation of step %s/%s",
						run_id, step_id),
				 errhint("Retry the transaction.")));
	return found && ds_store_lock_step(run_id, step_id, rec);
}

/*
 * A new step under the run_id of a run belongs to that run: it takes the run's policy, the run's
 * workflow replays it as its own step, ds_cancel_run cancels it (run_id names the business fact,
 * so the application may add steps of the same order to its run). So only the run's own turn (its
 * workflow, and the step work the executor does for it: the innermost step context is the turn's)
 * and roles with the privileges of the run's owner may create one. Anybody else could otherwise
 * squat a step id the owner's workflow will reach, which then fails the run with "belongs to
 * another role" (docs/security.md).
 *
 * ds_start_run holds the run_id's lock exclusively until it commits, and refuses a run_id with
 * another role's steps; a new step takes it shared and only then looks for the run, in the latest
 * snapshot. So a run and a step created at the same time meet as they would one after the other,
 * whichever comes first: the second waits for the first to commit, then sees it.
 */
Jsonb *
ds_new_step_run_policy(const char *run_id, bool nowait)
{
	const StepContext *ctx = ds_step_context_innermost();
	Oid			run_owner;
	Jsonb	   *policy;

	/*
	 * in the turn, a SECURITY DEFINER function of the workflow makes steps of
	 * its definer
	 */
	if (ctx != NULL && strcmp(ctx->run_id, run_id) == 0 &&
		strcmp(ctx->step_id, DS_TURN_STEP_ID) == 0)
		return ds_probe_run_policy(run_id, GetActiveSnapshot(), &run_owner);
	if (!ds_run_id_lock(run_id, false, nowait))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("run %s is being started in another transaction", run_id),
				 errhint("Retry after a moment, or call without nowait to wait for it.")));
	policy = ds_probe_run_policy(run_id, GetLatestSnapshot(), &run_owner);
	if (OidIsValid(run_owner) && run_owner != GetUserId() &&
		!has_privs_of_role(GetUserId(), run_owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("run %s belongs to another role", run_id),
				 errdetail("Only the run's workflow and roles with the privileges of its owner can add steps to it."),
				 errhint("Choose another run_id.")));
	return policy;
}

/*
 * How long past its lease (its timeout) an HTTP request in flight is waited for by a call that
 * stops it: the time the HTTP worker takes to record an outcome.
 */
#define HTTP_RECORD_GRACE_MS 1000

/*
 * Take the lock of step (run_id, step_id), waiting for a transaction that has it in flight, and
 * read it locked. A step the caller may not see answers as one that does not exist, at once:
 * neither the answer nor a wait for its lock tells anything about it. With `stop_running`, a
 * step's HTTP request in flight is waited for until its timeout (then DS409).
 */
void
ds_step_lock_visible(const char *run_id, const char *step_id, bool stop_running, StepRecord *rec)
{
	if (!ds_probe_step(run_id, step_id, GetLatestSnapshot(), rec, NULL) ||
		!ds_store_may_access(rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("step %s/%s does not exist", run_id, step_id)));

	/*
	 * an attempt a worker runs is asked to stop, so that its lock comes free
	 * soon
	 */
	if (stop_running && rec->status == STEP_RUNNING && rec->claimed_by != 0 &&
		rec->claimed_by != MyProcPid)
		(void) ds_request_cancel(rec->claimed_by,
								 ds_attempt_cancel_key(run_id, step_id, rec->attempts));

	/*
	 * A request in flight cannot be called back: the HTTP worker holds the
	 * step until the request ends, which its timeout bounds (its lease). A
	 * worker that does not record it by then (stopped, or starved) is not
	 * waited for without end.
	 */
	if (stop_running && rec->status == STEP_RUNNING && rec->lease_expires_at != 0 &&
		ds_step_kinds[rec->kind].sent_by_http_worker)
	{
		TimestampTz until = TimestampTzPlusMilliseconds(rec->lease_expires_at,
														HTTP_RECORD_GRACE_MS);

		if (!ds_step_lock_acquire_until(run_id, step_id, until))
			ereport(ERROR,
					(errcode(ERRCODE_DS_IN_PROGRESS),
					 errmsg("step %s/%s is in progress: its HTTP request is in flight", run_id, step_id),
					 errdetail("The HTTP worker has not recorded the request's outcome within its timeout."),
					 errhint("Retry after a moment.")));
	}
	else if (!ds_step_lock_acquire(run_id, step_id, false))
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("step %s/%s is in progress in this process", run_id, step_id)));
	if (!ds_lock_step_row(run_id, step_id, rec) || !ds_store_may_access(rec->owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("step %s/%s does not exist", run_id, step_id)));
}

void
ds_http_step_check_role(void)
{
	Oid			http_role = get_role_oid("durable_steps_http", true);

	if (!OidIsValid(http_role) || !has_privs_of_role(GetUserId(), http_role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to create HTTP steps"),
				 errdetail("Only roles with the privileges of durable_steps_http can create HTTP steps."),
				 errhint("GRANT durable_steps_http TO the role that calls ds_http_step().")));
}

void
ds_http_step_check_request(Jsonb *request, HttpRequest *req)
{
	if (request != NULL)
		ds_check_size(DS_LIMIT_REQUEST, "request", VARSIZE_ANY(request));
	ds_http_parse_request(request, req);
	if (ds_http_host_allowed(req->host, req->port) == HOST_REFUSED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("host \"%s\" is not allowed for HTTP steps", req->host),
				 errdetail("durable_steps.http_allowed_hosts does not list it on port %d.", req->port),
				 errhint("A superuser can add it to durable_steps.http_allowed_hosts.")));
}

void
ds_http_step_check_idempotency_header(const HttpRequest *req, const char *name)
{
	if (name == NULL)
		return;
	for (int i = 0; i < req->n_headers; i++)
		if (pg_strcasecmp(req->header_names[i], name) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the request's headers already set the idempotency header \"%s\"", name),
					 errhint("Pass idempotency_header => NULL to send a key of your own.")));
}

bool
ds_outbox_step_stored(FunctionCallInfo fcinfo, const char *run_id, const char *step_id,
					  bool nowait, const char *fingerprint, Datum *answer)
{
	StepRecord	rec;

	if (!ds_probe_step(run_id, step_id,
					   ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot(),
					   &rec, NULL) &&
		!ds_step_lock_and_read(run_id, step_id, nowait, &rec))
		return false;

	/*
	 * stored: its state is the answer (an owner's replay, or 42501, or a
	 * DS422 conflict)
	 */
	(void) ds_step_answer_from_store(&rec, fingerprint);
	*answer = ds_step_result_datum(fcinfo, &rec, true);
	return true;
}

void
ds_outbox_step_init(StepRecord *rec, const char *run_id, const char *step_id, StepKind kind,
					Jsonb *policy, bool nowait, char *fingerprint, TimestampTz run_at)
{
	TimestampTz now = GetCurrentTimestamp();
	Jsonb	   *run_policy = ds_new_step_run_policy(run_id, nowait);
	RetryPolicy resolved;

	ds_policy_resolve(run_policy, policy, &resolved);
	memset(rec, 0, sizeof(*rec));
	rec->backoff = resolved;
	rec->run_id = pstrdup(run_id);
	rec->step_id = pstrdup(step_id);
	rec->kind = kind;
	rec->fingerprint = fingerprint;
	rec->max_attempts = resolved.max_attempts;
	rec->on_timeout = "retry";
	rec->owner = GetUserId();
	rec->search_path = namespace_search_path;
	rec->status = STEP_PENDING;
	rec->next_attempt_at = run_at != 0 ? run_at : now;
	rec->created_at = now;
	rec->updated_at = now;
	if (resolved.limit_name != NULL)
	{
		ds_limit_check_step(resolved.limit_name, false);
		rec->limit_name = resolved.limit_name;
		rec->limit_key = resolved.limit_key;
	}
}

bool
ds_map_item_stored(const char *run_id, const char *step_id, const char *fingerprint)
{
	StepRecord	rec;

	if (!ds_probe_step(run_id, step_id, GetLatestSnapshot(), &rec, NULL))
		return false;
	(void) ds_step_answer_from_store(&rec, fingerprint);
	return true;
}

void
ds_map_item_insert(StepRecord *rec, const char *map_step, const char *limit_name)
{
	rec->map_step = (char *) map_step;
	if (limit_name != NULL)
	{
		rec->limit_name = (char *) limit_name;
		rec->limit_key = "";
	}
	ds_store_insert_step(rec);
}
