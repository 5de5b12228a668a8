/*
 * launcher.c -- the launcher: waits for the database and starts the executors.
 *
 * A background worker can connect to one database for its whole life and fails hard when that
 * database does not exist. So the launcher connects to no database at all (it reads the shared
 * catalog pg_database only), waits politely for durable_steps.database to exist -- one log line,
 * no crash loop -- and then starts durable_steps.max_workers executors connected to it. When an
 * executor ends (DROP DATABASE ... WITH (FORCE), pg_terminate_backend, an error), the launcher
 * starts it again once the database is there.
 */
#include "compat.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "worker.h"
#include "worker_wakeup.h"

char	   *ds_worker_database = NULL;
int			ds_max_workers = 2;

/* how often the launcher looks for the database and at its executors */
#define LAUNCHER_CHECK_MS 1000

void
ds_launcher_init_module(void)
{
	BackgroundWorker worker;

	/* postmaster settings can only be defined while the postmaster loads the library */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomStringVariable("durable_steps.database",
							   "Database whose durable steps the background worker runs.",
							   NULL,
							   &ds_worker_database,
							   "postgres",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);
	DefineCustomIntVariable("durable_steps.max_workers",
							"Number of executor processes that run due steps.",
							"0 disables the background worker. Each executor needs a slot of max_worker_processes.",
							&ds_max_workers,
							2,
							0,
							DS_MAX_WORKERS,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	/*
	 * pg_upgrade starts both clusters in binary-upgrade mode, and in the new one it drops and
	 * recreates the database postgres (the default durable_steps.database): a connected executor
	 * would make the upgrade fail. No step should run during an upgrade anyway.
	 */
	if (ds_max_workers == 0 || IsBinaryUpgrade)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "durable_steps");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "ds_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "durable_steps launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "durable_steps launcher");
	RegisterBackgroundWorker(&worker);
}

/* Does database `name` exist and accept connections (pg_database, no connection needed)? */
static bool
database_exists(const char *name)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		/* a database half-way through DROP DATABASE has datconnlimit -2 and cannot be joined */
		if (strcmp(NameStr(db->datname), name) == 0 && db->datconnlimit != -2)
		{
			found = true;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return found;
}

/* Register executor `slot` as a dynamic background worker; NULL when no slot is free. */
static BackgroundWorkerHandle *
start_executor(int slot)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "durable_steps");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "ds_executor_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "durable_steps worker %d", slot);
	snprintf(worker.bgw_type, BGW_MAXLEN, "durable_steps worker");
	worker.bgw_main_arg = Int32GetDatum(slot);
	worker.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(WARNING,
				(errmsg("durable_steps: could not start executor %d", slot),
				 errhint("Raise max_worker_processes above durable_steps.max_workers.")));
		return NULL;
	}
	return handle;
}

void
ds_launcher_main(Datum arg)
{
	BackgroundWorkerHandle *executors[DS_MAX_WORKERS];
	TimestampTz last_start[DS_MAX_WORKERS];
	bool		said_waiting = false;

	memset(executors, 0, sizeof(executors));
	memset(last_start, 0, sizeof(last_start));
	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("durable_steps launcher");

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		if (!database_exists(ds_worker_database))
		{
			if (!said_waiting)
				ereport(LOG,
						(errmsg("durable_steps: database \"%s\" does not exist; waiting for it",
								ds_worker_database),
						 errhint("Create the database or set durable_steps.database.")));
			said_waiting = true;
		}
		else
		{
			if (said_waiting)
				ereport(LOG,
						(errmsg("durable_steps: database \"%s\" exists; starting the worker",
								ds_worker_database)));
			said_waiting = false;
			for (int i = 0; i < ds_max_workers; i++)
			{
				pid_t		pid;

				if (executors[i] != NULL &&
					GetBackgroundWorkerPid(executors[i], &pid) != BGWH_STOPPED)
					continue;
				/* an executor that keeps failing is started at most once a second */
				if (!TimestampDifferenceExceeds(last_start[i], GetCurrentTimestamp(), 1000))
					continue;
				last_start[i] = GetCurrentTimestamp();
				executors[i] = start_executor(i);
			}
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LAUNCHER_CHECK_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
