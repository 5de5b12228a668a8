/*
 * worker_session.c -- what the background workers' processes share (worker_session.h).
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "worker/worker_session.h"

/* durable_steps.paused */
static bool worker_paused = false;

void
ds_worker_session_init_module(void)
{
	DefineCustomBoolVariable("durable_steps.paused",
							 "Keeps the background worker from running steps and sending HTTP requests.",
							 "For a restored copy of a cluster: set it before the copy first starts, so that nothing due acts before it is looked at. Callers' own attempts still run.",
							 &worker_paused,
							 false,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
}

Oid
ds_worker_connect(const char *appname, bool database, bool cancel)
{
	Oid			dbid = InvalidOid;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	if (cancel)
		pqsignal(SIGINT, StatementCancelHandler);
	BackgroundWorkerUnblockSignals();
	if (database)
	{
		memcpy(&dbid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
		BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	}
	else
		BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(appname);
	return dbid;
}

void
ds_worker_reload_settings_if_asked(ReloadedSettingsHook reapply)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	if (reapply != NULL)
		reapply();
}

/*
 * Isolation level of the next transaction ds_worker_begin_transaction starts: -1 for the default, or
 * XACT_READ_COMMITTED for a claim (whose count of a queue's running steps must see the claims
 * committed before it took the queue's lock, whatever default_transaction_isolation says).
 */
static int	next_isolation = -1;

void
ds_worker_begin_transaction(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (next_isolation >= 0)
		XactIsoLevel = next_isolation;
	next_isolation = -1;
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

void
ds_worker_commit(void)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * A transaction that works on the extension's tables. It first takes a shared lock on the
 * extension itself: DROP EXTENSION takes that lock exclusively before it locks any table, so it
 * waits for this transaction instead of deadlocking with it (the executor would otherwise hold
 * one table while the DROP held another). Returns false, with no transaction open, when the
 * extension is gone (a DROP committed meanwhile): the loop then waits for it again.
 */
bool
ds_worker_begin_work(const char *activity)
{
	Oid			ext;

	ds_worker_begin_transaction(activity);
	ext = get_extension_oid("durable_steps", true);
	if (OidIsValid(ext))
	{
		LockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock);
		/* the lock's wait may have been for a DROP that committed: look again */
		if (get_extension_oid("durable_steps", true) != ext)
			ext = InvalidOid;
	}
	if (!OidIsValid(ext))
	{
		ds_worker_commit();
		return false;
	}
	return true;
}

bool
ds_worker_begin_work_isolated(const char *activity, int isolation)
{
	next_isolation = isolation;
	return ds_worker_begin_work(activity);
}

/* Log once when a reason to wait comes or goes: *said holds what was last logged. */
static void
log_wait_change(bool now, bool *said, const char *begins, const char *ends)
{
	if (now != *said)
		ereport(LOG, errmsg("durable_steps: %s", now ? begins : ends));
	*said = now;
}

bool
ds_worker_must_wait(void)
{
	static bool said_paused = false;
	static bool said_refused = false;

	log_wait_change(worker_paused, &said_paused,
					"the worker is paused (durable_steps.paused); nothing due runs until it is turned off",
					"the worker is no longer paused; running steps");
	log_wait_change(DefaultXactReadOnly, &said_refused,
					"the server is read-only (default_transaction_read_only); waiting for it to accept writes",
					"the server accepts writes again; running steps");
	return worker_paused || DefaultXactReadOnly;
}

bool
ds_worker_waits(void)
{
	return worker_paused || DefaultXactReadOnly;
}
