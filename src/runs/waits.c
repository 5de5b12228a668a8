/*
 * waits.c -- ds_wait_step and ds_wait_run: wait, without polling, until a step or a run needs no
 * more work from the worker (docs/steps.md, "Waiting for a step").
 *
 * One statement each, so that they work through a connection pooler in transaction mode, where
 * LISTEN does not. The wait sleeps on the condition variable of the run (ipc/outcome_waits.c),
 * woken by the commit that stops one of its steps or writes the run; each wake-up reads the
 * state again with the latest snapshot (so that a wait in a REPEATABLE READ transaction sees the
 * outcome too). A wait that is its whole statement publishes no xmin while it sleeps, so that
 * VACUUM goes on (ds_outcome_wait_may_release_xmin says when). A wait changes nothing: one that
 * times out, or is cancelled, leaves no trace.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "ipc/outcome_waits.h"
#include "store/run_control_store.h"
#include "store/run_store.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "steps/step_call.h"

PG_FUNCTION_INFO_V1(ds_wait_step);
PG_FUNCTION_INFO_V1(ds_wait_run);

/* The longest wait one call may ask for: a day. */
#define DS_MAX_WAIT_MS (24 * 3600 * INT64CONST(1000))

/* The timeout argument in milliseconds: zero or positive, at most a day. */
static int64
timeout_arg(FunctionCallInfo fcinfo, int argno)
{
	Interval   *i;
	int64		ms;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("timeout must not be null")));
	i = PG_GETARG_INTERVAL_P(argno);
	ms = (int64) (i->month * INT64CONST(30) + i->day) * 24 * 3600 * 1000 + i->time / 1000;
	if (ms < 0 || ms > DS_MAX_WAIT_MS || i->month < 0 || i->day < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be between 0 and 1 day")));
	return ms;
}


/* ---- steps ---- */

typedef struct StepWait
{
	const char *run_id;
	const char *step_id;
	StepRecord	rec;
} StepWait;

static bool
step_stopped(StepStatus status)
{
	return status == STEP_SUCCEEDED || status == STEP_FAILED || status == STEP_BLOCKED ||
		status == STEP_UNCERTAIN || status == STEP_CANCELLED;
}

/* Read the step as the latest snapshot sees it; has it stopped? */
static bool
step_done(void *arg)
{
	StepWait   *w = arg;

	if (!ds_probe_step(w->run_id, w->step_id, GetLatestSnapshot(), &w->rec, NULL) ||
		!ds_store_may_access(w->rec.owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("step %s/%s does not exist", w->run_id, w->step_id)));
	return step_stopped(w->rec.status);
}

/*
 * ds_wait_step(run_id, step_id, timeout) -> ds_step_result: the step once it stopped, or as it
 * is when the timeout passed.
 */
Datum
ds_wait_step(PG_FUNCTION_ARGS)
{
	StepWait	w;
	int64		timeout_ms;

	w.run_id = ds_run_id_arg(fcinfo, 0);
	w.step_id = ds_step_identity_arg(fcinfo, 1, "step_id");
	timeout_ms = timeout_arg(fcinfo, 2);
	ds_outcome_waits_require();
	(void) ds_outcome_wait(w.run_id, timeout_ms, ds_outcome_wait_may_release_xmin(fcinfo),
						   step_done, &w);
	PG_RETURN_DATUM(ds_step_result_datum(fcinfo, &w.rec, true));
}

/* ---- runs ---- */

typedef struct RunWait
{
	const char *run_id;
	RunStatus	status;
	Jsonb	   *output;
	char	   *error_code;
	char	   *error_message;
} RunWait;

/* Read the run as the latest snapshot sees it, as the tables' owner; has it stopped? */
static bool
run_done(void *arg)
{
	RunWait    *w = arg;
	StoreSpi	spi;
	bool		found = false;
	Oid			owner = InvalidOid;

	ds_store_spi_begin(&spi);
	if (ds_store_read_run_latest(w->run_id) == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		MemoryContext spi_cxt = MemoryContextSwitchTo(spi.caller_cxt);
		bool		isnull;
		Datum		d;

		found = true;
		w->status = ds_run_status_from_name(SPI_getvalue(row, td, 1));
		d = SPI_getbinval(row, td, 2, &isnull);
		w->output = isnull ? NULL : DatumGetJsonbPCopy(d);
		w->error_code = SPI_getvalue(row, td, 3);
		w->error_message = SPI_getvalue(row, td, 4);
		owner = DatumGetObjectId(SPI_getbinval(row, td, 5, &isnull));
		MemoryContextSwitchTo(spi_cxt);
	}
	ds_store_spi_end(&spi);
	if (!found || !ds_store_may_access(owner))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("run %s does not exist", w->run_id)));
	return w->status == RUN_SUCCEEDED || w->status == RUN_FAILED ||
		w->status == RUN_CANCELLED || w->status == RUN_BLOCKED;
}

/*
 * ds_wait_run(run_id, timeout) -> (status, output, error_code, error_message): the run once it
 * stopped, or as it is when the timeout passed.
 */
Datum
ds_wait_run(PG_FUNCTION_ARGS)
{
	RunWait		w;
	int64		timeout_ms;
	TupleDesc	td;
	Datum		values[4];
	bool		nulls[4];

	memset(&w, 0, sizeof(w));
	w.run_id = ds_run_id_arg(fcinfo, 0);
	timeout_ms = timeout_arg(fcinfo, 1);
	ds_outcome_waits_require();
	(void) ds_outcome_wait(w.run_id, timeout_ms, ds_outcome_wait_may_release_xmin(fcinfo),
						   run_done, &w);
	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = CStringGetTextDatum(ds_run_status_name(w.status));
	values[1] = w.output ? JsonbPGetDatum(w.output) : (Datum) 0;
	values[2] = w.error_code ? CStringGetTextDatum(w.error_code) : (Datum) 0;
	values[3] = w.error_message ? CStringGetTextDatum(w.error_message) : (Datum) 0;
	nulls[0] = false;
	nulls[1] = w.output == NULL;
	nulls[2] = w.error_code == NULL;
	nulls[3] = w.error_message == NULL;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(td), values, nulls)));
}
