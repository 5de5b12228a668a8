/*
 * run_map.c -- ds_map: fan-out and join in a SQL workflow (docs/runs.md, "Fan-out and join").
 *
 * ds_map(step_id, sql, inputs, concurrency, ...) runs one SQL step per element of the array
 * `inputs` -- the run's step "<step_id>/<n>", n from 1, whose body `sql` gets its element as $1
 * -- and returns their results in order. As for ds_http (run_http.c), a turn only replays: a map
 * whose items have all succeeded returns their results; one with items still to settle suspends
 * the run with no wake-up time; one with an item that waits for a person blocks it; one with an
 * item that failed for good raises that item's DS102 (or, with outcomes => true, returns every
 * item's outcome). A new map ends the turn: the executor stores it after the turn
 * (ds_start_map, as the workflow's role, like a worker attempt) with the run's wait.
 *
 * The items are deferred steps of the run like any other: claimed in batches by every
 * executor, retried by their own policy, re-armed one by one. A concurrency is an internal
 * limit of the map ("ds_map:<hash>", concurrency N: steps/limits.c admits the items). An item
 * that settles bumps a generation after its commit (step_store.c); the executors then close the
 * open maps none of whose items is left to settle and wake their runs (ds_join_settled_maps),
 * in a transaction after those commits, so the last item's commit is always seen.
 */
#include "base/compat.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/size_limits.h"
#include "base/sql_text.h"
#include "runs/run_map.h"
#include "runs/workflow_calls.h"
#include "steps/http_step.h"
#include "steps/limits.h"
#include "steps/run_context.h"
#include "steps/run_step.h"
#include "steps/step_call.h"
#include "steps/task_args.h"
#include "steps/task_step.h"
#include "store/limit_store.h"
#include "store/map_store.h"
#include "store/run_store.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"

PG_FUNCTION_INFO_V1(ds_map);
PG_FUNCTION_INFO_V1(ds_start_map);

/* The most items one map may have. */
#define DS_MAX_MAP_ITEMS 100000


/* A map's checked arguments. */
typedef struct MapCall
{
	char	   *sql;			/* NULL for a map of tasks */
	char	   *task;			/* the items' task name; NULL for SQL items */
	bool		http;			/* the items are HTTP steps, the inputs their
								 * requests */
	Jsonb	   *inputs;
	int			items;
	int32		concurrency;	/* 0: none */
	Jsonb	   *policy;
	int64		timeout;
	char	   *fingerprint;
} MapCall;

/*
 * Arguments sql, inputs, concurrency, policy, timeout from `argno` on, and the task name at
 * `task_argno`: a map's items are SQL steps of `sql`, or tasks of `task` (sql NULL).
 */
static void
parse_map_call(FunctionCallInfo fcinfo, int argno, int task_argno, MapCall *call)
{
	RetryPolicy parsed;

	memset(call, 0, sizeof(*call));
	if (PG_ARGISNULL(task_argno + 1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("http must not be null")));
	call->http = PG_GETARG_BOOL(task_argno + 1);
	if (call->http)
	{
		if (!PG_ARGISNULL(argno) || !PG_ARGISNULL(task_argno))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a map of HTTP steps has no sql and no task: its inputs are the requests")));
		ds_http_step_check_role();
	}
	else if (!PG_ARGISNULL(task_argno))
	{
		call->task = ds_task_name_arg(fcinfo, task_argno);
		if (!PG_ARGISNULL(argno))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a map of tasks has no sql"),
					 errhint("Pass sql => NULL with task, or sql without task.")));
	}
	else
	{
		if (PG_ARGISNULL(argno))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("sql must not be null"),
					 errhint("A map of tasks names its task instead.")));
		call->sql = text_to_cstring(PG_GETARG_TEXT_PP(argno));
		ds_check_one_statement("sql", call->sql);
	}
	if (PG_ARGISNULL(argno + 1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("inputs must not be null")));
	call->inputs = PG_GETARG_JSONB_P(argno + 1);
	if (!JB_ROOT_IS_ARRAY(call->inputs) || JB_ROOT_IS_SCALAR(call->inputs))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("inputs must be a JSON array, one element per item")));
	call->items = JB_ROOT_COUNT(call->inputs);
	if (call->items > DS_MAX_MAP_ITEMS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a map may have at most %d items, not %d", DS_MAX_MAP_ITEMS, call->items)));
	if (!PG_ARGISNULL(argno + 2))
	{
		call->concurrency = PG_GETARG_INT32(argno + 2);
		if (call->concurrency < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("concurrency must be at least 1, or NULL for no limit")));
	}
	call->policy = PG_ARGISNULL(argno + 3) ? NULL : PG_GETARG_JSONB_P(argno + 3);
	ds_policy_parse(call->policy, &parsed);
	if (parsed.limit_name != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid retry policy field \"limit\": a map's items are admitted by its concurrency"),
				 errhint("Give the map a concurrency.")));
	call->timeout = ds_step_timeout_arg(fcinfo, argno + 4);
	/* what the items are made of: the SQL, or the task's name, and the inputs */
	call->fingerprint = ds_step_fingerprint(call->sql ? call->sql :
											call->http ? "http:" : psprintf("task:%s", call->task),
											call->inputs, NULL, NULL);
}

/* The name of map (run_id, step_id)'s internal limit. */
static char *
map_limit_name(const char *run_id, const char *step_id)
{
	/*
	 * the run id's length first: run "a/b" and step "c" is not run "a" and
	 * step "b/c"
	 */
	return psprintf(DS_MAP_LIMIT_PREFIX "%s",
					ds_step_fingerprint(psprintf("%zu:%s/%s", strlen(run_id), run_id, step_id),
										NULL, NULL, NULL));
}

/* ds_start_map's arguments for the executor, as the text of a jsonb object. */
static char *
map_call_json(const char *run_id, const char *step_id, const MapCall *call)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"run_id\": ");
	escape_json(&buf, run_id);
	appendStringInfoString(&buf, ", \"step_id\": ");
	escape_json(&buf, step_id);
	if (call->sql != NULL)
	{
		appendStringInfoString(&buf, ", \"sql\": ");
		escape_json(&buf, call->sql);
	}
	else if (call->http)
		appendStringInfoString(&buf, ", \"http\": true");
	else
	{
		appendStringInfoString(&buf, ", \"task\": ");
		escape_json(&buf, call->task);
	}
	appendStringInfo(&buf, ", \"inputs\": %s", JsonbToCString(NULL, &call->inputs->root, 0));
	if (call->concurrency > 0)
		appendStringInfo(&buf, ", \"concurrency\": %d", call->concurrency);
	if (call->policy != NULL)
		appendStringInfo(&buf, ", \"policy\": %s", JsonbToCString(NULL, &call->policy->root, 0));
	if (call->timeout > 0)
		appendStringInfo(&buf, ", \"timeout\": \"%lld microseconds\"", (long long) call->timeout);
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * The stored map is `caller`'s (or one whose privileges it has) and was made of the same SQL
 * and inputs, or an error.
 */
static void
check_stored_map(const char *run_id, const char *step_id, const MapRow *row,
				 const char *fingerprint, Oid caller)
{
	if (!has_privs_of_role(caller, row->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for map %s/%s", run_id, step_id)));
	if (strcmp(row->fingerprint, fingerprint) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("map %s/%s exists with another definition", run_id, step_id),
				 errdetail("The map was made with other SQL or inputs."),
				 errhint("Use another step id for another map, or ds_patched() to change a workflow whose runs are in flight.")));
}

/*
 * ds_map(step_id, sql, inputs, concurrency, policy, timeout, outcomes, task) -> jsonb: the results of
 * the map's items in the order of `inputs`; with outcomes, each item's {status, result,
 * error_code, error_message}.
 */
Datum
ds_map(PG_FUNCTION_ARGS)
{
	const char *run_id = ds_turn_require("ds_map", NULL);
	char	   *step_id = ds_step_identity_arg(fcinfo, 0, "step_id");
	MapCall		call;
	bool		outcomes;
	MapRow		row;
	StoreSpi	spi;
	bool		found;
	TurnSuspension work;

	parse_map_call(fcinfo, 1, 7, &call);
	if (PG_ARGISNULL(6))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outcomes must not be null")));
	outcomes = PG_GETARG_BOOL(6);
	/* nothing to fan out: nothing to wait for, and nothing to record */
	if (call.items == 0)
		PG_RETURN_JSONB_P(DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("[]"))));

	ds_store_spi_begin(&spi);
	found = ds_store_map_read(run_id, step_id, spi.caller_cxt, &row);
	ds_store_spi_end(&spi);
	if (found)
	{
		int64		stored;
		int64		open;
		char	   *needs_person;
		char	   *failed;
		Jsonb	   *results;

		ds_turn_visit(step_id);
		check_stored_map(run_id, step_id, &row, call.fingerprint, GetUserId());
		ds_store_spi_begin(&spi);
		ds_store_map_items(run_id, step_id, outcomes, spi.caller_cxt, &stored, &open,
						   &needs_person, &failed, &results);
		ds_store_spi_end(&spi);
		if (stored < row.items)
			ereport(ERROR,
					(errcode(ERRCODE_DS_INVALID_STEP_STATE),
					 errmsg("map %s/%s has %lld of its %d items", run_id, step_id,
							(long long) stored, row.items),
					 errdetail("A step of the run took the id of one of its items (\"%s/<n>\"), or items were deleted.",
							   step_id)));
		if (open > 0)
		{
			/*
			 * items to settle (again, after a re-arm): the executor opens the
			 * map once more after the turn (ds_start_map), so that the look
			 * after the last item's commit finds it
			 */
			memset(&work, 0, sizeof(work));
			work.work = TURN_WORK_MAP;
			work.step_id = step_id;
			work.reason = psprintf("map %s: %lld of %d items to settle", step_id,
								   (long long) open, row.items);
			work.step_call = map_call_json(run_id, step_id, &call);
			work.owner = GetUserId();
			work.search_path = namespace_search_path;
			ds_turn_suspend_for_work(&work);
		}
		if (needs_person != NULL)
			ds_turn_suspend(false, GetCurrentTimestamp() + DS_JOIN_RECHECK_USECS,
							psprintf("map %s: item %s waits for a person (blocked or uncertain): settle it with ds_retry_step() or ds_resolve_step()",
									 step_id, needs_person),
							step_id, NULL);
		if (failed != NULL && !outcomes)
		{
			StepRecord	item;

			if (!ds_probe_step(run_id, failed, GetLatestSnapshot(), &item, NULL))
				elog(ERROR, "item %s/%s of a map was not found", run_id, failed);
			ds_turn_throw_step_failed(run_id, failed, item.status, item.error_class,
									  item.error_code, item.error_message);
		}
		if (results == NULL)
			PG_RETURN_JSONB_P(DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("[]"))));
		PG_RETURN_JSONB_P(results);
	}

	/*
	 * new: the executor stores it after the turn, and the run waits for its
	 * items
	 */
	memset(&work, 0, sizeof(work));
	work.work = TURN_WORK_MAP;
	work.step_id = step_id;
	work.reason = psprintf("map %s: %d items to settle", step_id, call.items);
	work.step_call = map_call_json(run_id, step_id, &call);
	work.owner = GetUserId();
	work.search_path = namespace_search_path;
	ds_turn_suspend_for_work(&work);
	PG_RETURN_NULL();
}

/*
 * ds_start_map(run_id, step_id, sql, inputs, concurrency, policy, timeout) -> ds_step_result:
 * store map (run_id, step_id) and its items, pending; a map stored before answers as it is.
 */
Datum
ds_start_map(PG_FUNCTION_ARGS)
{
	char	   *run_id = ds_run_id_arg(fcinfo, 0);
	char	   *step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	MapCall		call;
	MapRow		row;
	StoreSpi	spi;
	StepRecord	rec;
	char	   *limit_name = NULL;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			n = 0;
	bool		made = false;
	Oid			caller = GetUserId();

	ds_check_slot_run_id(run_id);
	parse_map_call(fcinfo, 2, 7, &call);
	PreventCommandIfReadOnly("ds_start_map()");
	PreventCommandIfParallelMode("ds_start_map()");

	/*
	 * in the caller's memory: the items are stored after the SPI connection
	 * ends
	 */
	if (call.concurrency > 0)
		limit_name = map_limit_name(run_id, step_id);

	/* a run's map is its owner's to make, as its steps are (42501 otherwise) */
	(void) ds_new_step_run_policy(run_id, false);
	ds_store_spi_begin(&spi);
	/* the caller's: the statements run as the tables' owner */
	row.owner = caller;
	row.items = call.items;
	row.concurrency = call.concurrency;
	row.fingerprint = call.fingerprint;
	if (!ds_store_map_insert(run_id, step_id, &row))
	{
		/*
		 * made before (or just now, by a transaction this one waited for):
		 * the same map, open again -- a turn that finds items to settle asks
		 * this, and the look after this commit finds the map once more
		 */
		if (!ds_store_map_read(run_id, step_id, spi.caller_cxt, &row))
			elog(ERROR, "map %s/%s was not found", run_id, step_id);
		check_stored_map(run_id, step_id, &row, call.fingerprint, caller);
		ds_store_map_reopen(run_id, step_id);
		ds_map_settled_at_commit();
	}
	else
	{
		made = true;
		if (limit_name != NULL)
			ds_store_set_limit_concurrency(limit_name, false, call.concurrency);
		ds_store_spi_end(&spi);

		/*
		 * the items: each a deferred step of the run, stored as ds_run_step
		 * would
		 */
		it = JsonbIteratorInit(&call.inputs->root);
		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			Jsonb	   *item;

			if (tok != WJB_ELEM)
				continue;
			n++;
			item = JsonbValueToJsonb(&v);
			ds_check_size(DS_LIMIT_INPUT, "an item of inputs", VARSIZE_ANY(item));
			if (call.http)
				ds_store_map_http_item(run_id, psprintf("%s/%d", step_id, n), item, call.policy,
									   call.timeout, step_id, limit_name);
			else if (call.task != NULL)
				ds_store_map_task_item(run_id, psprintf("%s/%d", step_id, n), call.task, item,
									   call.policy, call.timeout, step_id, limit_name);
			else
				ds_store_map_item(run_id, psprintf("%s/%d", step_id, n), call.sql, item,
								  call.policy, call.timeout, step_id, limit_name);
			CHECK_FOR_INTERRUPTS();
		}
		ds_store_spi_begin(&spi);
	}
	ds_store_spi_end(&spi);

	/* the answer: the map as a pending step of the run */
	memset(&rec, 0, sizeof(rec));
	rec.run_id = run_id;
	rec.step_id = step_id;
	rec.kind = STEP_KIND_SQL;
	rec.status = STEP_PENDING;
	rec.max_attempts = 1;
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &rec, !made));
}

int
ds_join_settled_maps(int limit)
{
	StoreSpi	spi;
	uint64		n;
	char	  **run_ids;
	char	  **step_ids;

	ds_store_spi_begin(&spi);
	n = ds_store_close_settled_maps(limit);
	run_ids = MemoryContextAlloc(spi.caller_cxt, sizeof(char *) * Max(n, 1));
	step_ids = MemoryContextAlloc(spi.caller_cxt, sizeof(char *) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		run_ids[i] = MemoryContextStrdup(spi.caller_cxt,
										 SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
		step_ids[i] = MemoryContextStrdup(spi.caller_cxt,
										  SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2));
	}
	/* an internal limit has no more use: an item re-armed later runs at once */
	for (uint64 i = 0; i < n; i++)
		(void) ds_store_drop_limit(map_limit_name(run_ids[i], step_ids[i]));
	ds_store_spi_end(&spi);
	for (uint64 i = 0; i < n; i++)
		ds_run_wake_for_step_outcome(run_ids[i], step_ids[i]);
	return (int) n;
}
