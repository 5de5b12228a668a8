/*
 * task_wait.c -- CALL ds_wait_for_tasks (docs/tasks.md, "Waiting for work").
 *
 * An idle application worker waits here for a task it may claim, without LISTEN (which a pooler
 * in transaction mode cannot carry): the commit that makes a task wait broadcasts to every
 * waiting session (worker_shmem.c), which then looks again; a task scheduled for later ends the
 * wait when it is due. A procedure rather than a function: called outside a transaction block,
 * it commits before each sleep, so that a waiting worker holds no snapshot, and the horizon
 * VACUUM needs is not held by idle workers.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "libpq/libpq.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/dest.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "ipc/worker_shmem.h"
#include "steps/task_args.h"
#include "steps/task_floors.h"
#include "store/task_store.h"

PG_FUNCTION_INFO_V1(ds_wait_for_tasks);

/* How often a waiting session looks whether its client is still there. */
#define CONNECTION_CHECK_MS 1000

/* CALL ds_wait_for_tasks(tasks, timeout, queues, INOUT due boolean) */
Datum
ds_wait_for_tasks(PG_FUNCTION_ARGS)
{
	ArrayType  *tasks = ds_task_names_arg(fcinfo, 0, "tasks", false);
	int64		timeout;
	ArrayType  *queues = ds_task_names_arg(fcinfo, 2, "queues", true);
	bool		nonatomic = fcinfo->context != NULL && IsA(fcinfo->context, CallContext) &&
		!castNode(CallContext, fcinfo->context)->atomic;
	Oid			caller = GetUserId();
	TimestampTz until;
	bool		due = false;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("timeout must not be null")));
	timeout = ds_task_interval_arg(fcinfo, 1, "timeout", 0);
	until = GetCurrentTimestamp() + timeout;
	if (nonatomic && SPI_connect_ext(SPI_OPT_NONATOMIC) != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect_ext failed");
	for (;;)
	{
		/*
		 * read before the look: a commit after it moves it, and the sleep
		 * ends at once
		 */
		uint64		seen = ds_tasks_generation();
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz next;
		const char *paused;
		long		ms;

		CHECK_FOR_INTERRUPTS();

		/*
		 * the operator's pause holds every claim: nothing is due until the
		 * timeout
		 */
		paused = GetConfigOption("durable_steps.paused", true, false);
		if (paused != NULL && strcmp(paused, "on") == 0)
			next = until;
		else
		{
			DueTaskGroup *groups = NULL;
			int			n_groups = ds_task_groups_to_read(tasks, caller, &groups);

			if (ds_store_next_task_time(tasks, queues, caller, now, false, groups, n_groups) != 0)
			{
				due = true;
				break;
			}
			/* the first one due within the wait, if any, ends it */
			next = ds_store_next_task_time(tasks, queues, caller, until, true, groups, n_groups);
			/* a wait looks again at every commit, for up to a day */
			if (groups != NULL)
				pfree(groups);
		}
		if (now >= until)
			break;
		ms = TimestampDifferenceMilliseconds(now, next != 0 && next < until ? next : until);

		/*
		 * the looks' snapshots and the CALL's own go with the commit: nothing
		 * of this session holds the horizon while it sleeps
		 */
		if (nonatomic)
			SPI_commit();

		/*
		 * Slept in slices: a client that went away is noticed within one, not
		 * at the timeout, so its backend is not kept waiting for nobody.
		 * Nothing is read again until a commit moved the generation or the
		 * time to look came.
		 */
		ms = Max(ms, 1);
		while (ms > 0)
		{
			long		slice = Min(ms, CONNECTION_CHECK_MS);

			if (ds_tasks_wait(seen, slice))
				break;
			ms -= slice;
			if (whereToSendOutput == DestRemote && !pq_check_connection())
			{
				ClientConnectionLost = true;
				InterruptPending = true;
				CHECK_FOR_INTERRUPTS();
			}
		}
	}
	if (nonatomic)
		SPI_finish();
	/* a procedure's output parameters are its result row */
	{
		TupleDesc	desc;
		Datum		value = BoolGetDatum(due);
		bool		isnull = false;

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "ds_wait_for_tasks must return a row");
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), &value, &isnull)));
	}
}
