/*
 * task_batch.c -- the batched outcomes of tasks: ds_complete_tasks (docs/tasks.md, "The
 * lifecycle").
 *
 * A worker whose handlers returned without a transaction of their own records their successes
 * together, in one statement and one commit. Every token that still holds its lease is recorded
 * exactly as ds_complete_task records it (task_lease.c: the same lock, the same fence, the same
 * hooks), in the caller's transaction. A token whose lease is gone -- it ran out while the batch
 * waited, the step was cancelled, the token is spent -- is not an error here but an answer,
 * held = false with the step's status as it is, so that one stale token does not roll back the
 * others. A token of a task the caller may not act on still raises (DS404, 42501) and refuses
 * the whole batch: that is a mistake or an attack, not a lease that ran out.
 *
 * Every argument is checked before the first task is locked. The tasks are then locked in the
 * order of their identities, so that two batches never wait for each other in a circle; the rows
 * come back in the order of the tokens. Each task's lock is held to the end of the transaction,
 * as ds_complete_task's is.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/tuplestore.h"

#include "base/ds_errcodes.h"
#include "store/step_store.h"
#include "steps/step_exec.h"
#include "steps/task_lease.h"

PG_FUNCTION_INFO_V1(ds_complete_tasks);

/* The most tokens one call records. */
#define MAX_BATCH 1000

/* One token of the batch, and its answer. */
typedef struct BatchItem
{
	int			index;			/* its place in the arguments */
	text	   *token;
	TaskToken	t;
	Jsonb	   *result;			/* NULL: JSON null */
	const char *status;
	bool		held;
} BatchItem;

/* By the step's identity, then by place: the order the tasks are locked in. */
static int
item_cmp(const void *a, const void *b)
{
	const BatchItem *x = *(BatchItem *const *) a;
	const BatchItem *y = *(BatchItem *const *) b;
	int			c = strcmp(x->t.run_id, y->t.run_id);

	if (c == 0)
		c = strcmp(x->t.step_id, y->t.step_id);
	if (c == 0)
		c = x->index - y->index;
	return c;
}

/* ds_complete_tasks(tokens text[], results jsonb[]) -> setof (token text, status text, held boolean) */
Datum
ds_complete_tasks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *tokens;
	ArrayType  *results;
	Datum	   *token_datums;
	bool	   *token_nulls;
	Datum	   *result_datums;
	bool	   *result_nulls;
	int			n;
	int			n_results;
	BatchItem  *items;
	BatchItem **order;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(0) ? "tokens" : "results")));
	tokens = PG_GETARG_ARRAYTYPE_P(0);
	results = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(tokens) > 1 || ARR_NDIM(results) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens and results must be one-dimensional arrays")));
	deconstruct_array(tokens, TEXTOID, -1, false, TYPALIGN_INT, &token_datums, &token_nulls, &n);
	deconstruct_array(results, JSONBOID, -1, false, TYPALIGN_INT, &result_datums, &result_nulls,
					  &n_results);
	if (n != n_results)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens and results must have the same length"),
				 errdetail("There are %d tokens and %d results.", n, n_results)));
	if (n > MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("at most %d tokens may be completed in one call", MAX_BATCH),
				 errdetail("There are %d tokens.", n)));
	InitMaterializedSRF(fcinfo, 0);

	/* every argument checked before anything is locked or recorded */
	items = palloc0(sizeof(BatchItem) * Max(n, 1));
	order = palloc(sizeof(BatchItem *) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		BatchItem  *it = &items[i];

		if (token_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("tokens must not contain null"),
					 errdetail("Token %d is null.", i + 1)));
		it->index = i;
		it->token = DatumGetTextPP(token_datums[i]);
		ds_task_token_parse(text_to_cstring(it->token), &it->t);
		it->result = result_nulls[i] ? NULL : DatumGetJsonbP(result_datums[i]);
		if (it->result != NULL && VARSIZE(it->result) > (Size) ds_max_result_size())
			ereport(ERROR,
					(errcode(ERRCODE_DS_RESULT_TOO_LARGE),
					 errmsg("task result is too large"),
					 errdetail("Result %d has %u bytes; durable_steps.max_result_size is %d bytes.",
							   i + 1, (unsigned) VARSIZE(it->result), ds_max_result_size()),
					 errhint("Nothing of the batch is recorded: complete that task on its own, or fail it.")));
		order[i] = it;
	}
	if (n > 1)
		qsort(order, n, sizeof(BatchItem *), item_cmp);

	for (int i = 0; i < n; i++)
	{
		BatchItem  *it = order[i];
		StepRecord	rec;

		/*
		 * DS404 or 42501 for a task the caller may not act on: the batch is
		 * refused
		 */
		it->held = ds_lock_task_lease(&it->t, &rec);
		if (it->held)
			ds_record_task_success(&rec, it->result);
		it->status = ds_step_status_name(rec.status);
	}

	for (int i = 0; i < n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = PointerGetDatum(items[i].token);
		values[1] = CStringGetTextDatum(items[i].status);
		values[2] = BoolGetDatum(items[i].held);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_NULL();
}
