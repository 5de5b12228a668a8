/*
 * step_context.c -- the attempt context of the step bodies executing in this backend.
 *
 * Step bodies can call ds_run_step themselves, so the contexts form a stack; the functions below
 * answer for the innermost one. The stack lives in TopMemoryContext and is emptied at the end of
 * every transaction, so an error that escapes past a body can never leave a stale context behind.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "base/ds_errcodes.h"
#include "base/key.h"
#include "steps/step_context.h"

#define MAX_STEP_NESTING 64

static StepContext stack[MAX_STEP_NESTING];
static int	depth = 0;

PG_FUNCTION_INFO_V1(ds_idempotency_key);
PG_FUNCTION_INFO_V1(ds_attempt_key);
PG_FUNCTION_INFO_V1(ds_attempt_number);
PG_FUNCTION_INFO_V1(ds_max_attempts);
PG_FUNCTION_INFO_V1(ds_run_id);
PG_FUNCTION_INFO_V1(ds_step_id);

/* Free the identity strings of a context entry. */
static void
release_entry(StepContext *ctx)
{
	pfree(ctx->run_id);
	pfree(ctx->step_id);
	ctx->run_id = ctx->step_id = NULL;
}

void
ds_step_context_push(const char *run_id, const char *step_id, int attempt, int max_attempts)
{
	StepContext *ctx;

	if (depth >= MAX_STEP_NESTING)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_RECURSION),
				 errmsg("durable steps nested more than %d deep", MAX_STEP_NESTING)));
	ctx = &stack[depth];
	ctx->run_id = MemoryContextStrdup(TopMemoryContext, run_id);
	ctx->step_id = MemoryContextStrdup(TopMemoryContext, step_id);
	ctx->attempt = attempt;
	ctx->max_attempts = max_attempts;
	depth++;
}

void
ds_step_context_pop(void)
{
	Assert(depth > 0);
	if (depth > 0)
		release_entry(&stack[--depth]);
}

bool
ds_step_context_is_executing(const char *run_id, const char *step_id)
{
	for (int i = 0; i < depth; i++)
		if (strcmp(stack[i].run_id, run_id) == 0 && strcmp(stack[i].step_id, step_id) == 0)
			return true;
	return false;
}

const StepContext *
ds_step_context_innermost(void)
{
	return depth > 0 ? &stack[depth - 1] : NULL;
}

/* Transaction callback: no context outlives its transaction. */
static void
reset_at_transaction_end(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
	{
		while (depth > 0)
			release_entry(&stack[--depth]);
	}
}

void
ds_step_context_init_module(void)
{
	RegisterXactCallback(reset_at_transaction_end, NULL);
}

/* The innermost executing step's context; an error outside any step. */
static StepContext *
current_context(const char *function)
{
	if (depth == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_NO_STEP_CONTEXT),
				 errmsg("%s() can only be called inside a durable step", function),
				 errhint("Call it from the SQL that ds_run_step executes.")));
	return &stack[depth - 1];
}

/*
 * <run_id>:<step_id> as the HTTP worker sends it (key.h): run ('a:b', 'c') and run ('a', 'b:c')
 * must not hand the same idempotency key to a provider, nor may a CR or LF reach a header.
 */
static void
append_identity(StringInfo buf, const StepContext *ctx)
{
	ds_append_step_key(buf, ctx->run_id, ctx->step_id);
}

Datum
ds_idempotency_key(PG_FUNCTION_ARGS)
{
	StepContext *ctx = current_context("ds_idempotency_key");
	StringInfoData buf;

	initStringInfo(&buf);
	append_identity(&buf, ctx);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

Datum
ds_attempt_key(PG_FUNCTION_ARGS)
{
	StepContext *ctx = current_context("ds_attempt_key");
	StringInfoData buf;

	initStringInfo(&buf);
	append_identity(&buf, ctx);
	appendStringInfo(&buf, ":%d", ctx->attempt);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

Datum
ds_attempt_number(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(current_context("ds_attempt_number")->attempt);
}

Datum
ds_max_attempts(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(current_context("ds_max_attempts")->max_attempts);
}

Datum
ds_run_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(current_context("ds_run_id")->run_id));
}

Datum
ds_step_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(current_context("ds_step_id")->step_id));
}
