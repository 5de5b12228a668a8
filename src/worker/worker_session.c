/*
 * worker_session.c -- what the background workers' processes share (worker_session.h).
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_db_role_setting.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"	/* get_database_name() from 19 */
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/partition.h"
#include "ipc/executor_slot.h"
#include "ipc/partitions_in_force.h"
#include "ipc/worker_shmem.h"
#include "store/store_relations.h"
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

static void look_at_stored_settings(void);

/* The database this worker process serves, for its log lines; NULL in the launcher. */
static char *served_database_name = NULL;
static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * The worker's own log lines name the database they are about, unless they do already: a server
 * may serve several, and log_line_prefix's %d names a client's database only.
 */
static void
name_the_database(ErrorData *edata)
{
	static const char prefix[] = "durable_steps: ";

	if (served_database_name != NULL && edata->output_to_server && edata->message != NULL &&
		strncmp(edata->message, prefix, sizeof(prefix) - 1) == 0 &&
		strstr(edata->message, "database \"") == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(ErrorContext);

		edata->message = psprintf("%s (database \"%s\")", edata->message, served_database_name);
		MemoryContextSwitchTo(old);
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
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
		StartTransactionCommand();
		{
			char	   *name = get_database_name(dbid);

			if (name != NULL)
				served_database_name = MemoryContextStrdup(TopMemoryContext, name);
		}
		CommitTransactionCommand();
		prev_emit_log_hook = emit_log_hook;
		emit_log_hook = name_the_database;
		/* what the stored settings say as the process took them, connecting */
		look_at_stored_settings();
	}
	else
		BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(appname);
	return dbid;
}

bool
ds_worker_reload_settings_if_asked(ReloadedSettingsHook reapply)
{
	uint64		partitions_before;

	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	partitions_before = ds_partition_settings_key();
	ProcessConfigFile(PGC_SIGHUP);

	/*
	 * Partitions this server takes (back) may have running steps whose
	 * executors are gone, left unrecorded while another server owned them:
	 * the executors look for lost attempts now, not at their backstop a
	 * minute later (docs/partitions.md).
	 */
	if (ds_partition_settings_key() != partitions_before)
		ds_attempts_may_be_lost();

	/*
	 * the partitions of this reload are in force for every process now
	 * (docs/partitions.md)
	 */
	ds_partitions_in_force_publish();

	/*
	 * every claim after this one serves the partitions reloaded
	 * (docs/partitions.md)
	 */
	ds_fence_note_applied();
	if (reapply != NULL)
		reapply();
	return true;
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
 * extension is gone (a DROP committed meanwhile) or installed at another version than this
 * library's (docs/operations.md, "Upgrades"): the loop then waits for it again.
 */
bool
ds_worker_begin_work(const char *activity)
{
	Oid			ext;
	char	   *version;

	ds_worker_begin_transaction(activity);
	ext = ds_store_extension(&version);
	if (OidIsValid(ext))
	{
		LockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock);

		/*
		 * the lock's wait may have been for a DROP (or an UPDATE) that
		 * committed: look again
		 */
		if (ds_store_extension(&version) != ext || strcmp(version, DS_EXTENSION_VERSION) != 0)
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

/*
 * What the stored settings (ALTER DATABASE / ALTER ROLE ... SET) say of default_transaction_read_only
 * for a new session of this process's database and role: the first of the four places a session
 * takes them from, in PostgreSQL's order of precedence (database and role, role, database, every
 * database and role), that names it.
 */
typedef enum StoredReadOnly
{
	STORED_NONE,
	STORED_ON,
	STORED_OFF,
} StoredReadOnly;

/* The setting of default_transaction_read_only in one row of pg_db_role_setting, if it names it. */
static StoredReadOnly
stored_read_only_of(Relation rel, Oid dbid, Oid roleid)
{
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple	tuple;
	StoredReadOnly found = STORED_NONE;

	ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(dbid));
	ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(roleid));
	scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true, NULL, 2, keys);
	while (found == STORED_NONE && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_db_role_setting_setconfig,
									 RelationGetDescr(rel), &isnull);
		Datum	   *elems;
		bool	   *nulls;
		int			n;

		if (isnull)
			continue;
		deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &nulls, &n);
		for (int i = 0; i < n; i++)
		{
			char	   *item;
			char	   *name;
			char	   *value;
			bool		on;

			if (nulls[i])
				continue;
			item = TextDatumGetCString(elems[i]);
			ParseLongOption(item, &name, &value);
			/* the last of a name wins, as when PostgreSQL applies the array */
			if (value != NULL && pg_strcasecmp(name, "default_transaction_read_only") == 0 &&
				parse_bool(value, &on))
				found = on ? STORED_ON : STORED_OFF;
		}
	}
	systable_endscan(scan);
	return found;
}

static StoredReadOnly
stored_read_only(void)
{
	Oid			role = GetSessionUserId();
	Oid			places[4][2] = {{MyDatabaseId, role}, {InvalidOid, role},
	{MyDatabaseId, InvalidOid}, {InvalidOid, InvalidOid}};
	StoredReadOnly found = STORED_NONE;
	Relation	rel;

	ds_worker_begin_transaction("durable_steps: is the database read-only?");
	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	for (int i = 0; i < 4 && found == STORED_NONE; i++)
		found = stored_read_only_of(rel, places[i][0], places[i][1]);
	table_close(rel, AccessShareLock);
	ds_worker_commit();
	return found;
}

/*
 * How often a process connected to a database reads its stored settings again (a change of them
 * signals nobody): so a database made read-only, or writable again, is seen within a second.
 */
#define STORED_SETTINGS_LOOK_MS 1000

/* What the stored settings said when this process first looked (at its start), and say now. */
static bool stored_looked = false;
static StoredReadOnly stored_at_start = STORED_NONE;
static StoredReadOnly stored_now = STORED_NONE;
static TimestampTz stored_looked_at = 0;

/*
 * Look at the stored settings again when a second has passed. Only in a process connected to a
 * database, with no transaction open (the callers' loops look between their transactions).
 */
static void
look_at_stored_settings(void)
{
	if (!OidIsValid(MyDatabaseId) || IsTransactionState())
		return;
	if (stored_looked &&
		!TimestampDifferenceExceeds(stored_looked_at, GetCurrentTimestamp(),
									STORED_SETTINGS_LOOK_MS))
		return;
	stored_now = stored_read_only();
	stored_looked_at = GetCurrentTimestamp();
	if (!stored_looked)
		stored_at_start = stored_now;
	stored_looked = true;
}

/*
 * Have the stored settings of default_transaction_read_only changed since this process connected,
 * so that its own value is no longer a new session's? A reload never takes them again; only a new
 * process does.
 */
static bool
settings_outdated(void)
{
	look_at_stored_settings();

	/*
	 * The process took default_transaction_read_only from the stored settings
	 * when it connected, and a reload never takes them again: once they
	 * changed, only a new process has the value a new session has. A database
	 * made read-only since needs none: the process just waits (and, made
	 * writable again, writes on: its own value never said read-only).
	 */
	return stored_looked && stored_now != stored_at_start && stored_now != STORED_ON;
}

/*
 * Does the server or the database refuse this process's writes now? A server in recovery (a
 * standby, a standby being promoted), default_transaction_read_only from the configuration (as
 * pg_auto_failover sets it while it hands a primary over) or from the stored settings of the
 * database or the role (ALTER DATABASE ... SET default_transaction_read_only = on), and stored
 * settings that say so now.
 */
static bool
writes_refused(void)
{
	if (RecoveryInProgress() || DefaultXactReadOnly)
		return true;
	if (!OidIsValid(MyDatabaseId))
		return false;
	look_at_stored_settings();

	/*
	 * Outdated settings alone refuse nothing: a process whose own value is
	 * off may write (an HTTP worker that holds outcomes records them before
	 * it is replaced, and is never left holding them and their steps' locks).
	 */
	return stored_now == STORED_ON;
}

void
ds_worker_end_if_outdated(void)
{
	if (!settings_outdated())
		return;
	ereport(LOG,
			(errmsg("durable_steps: default_transaction_read_only of the database or role changed since this process connected; a new one takes its place")));
	proc_exit(0);
}

bool
ds_worker_must_wait(void)
{
	static bool said_paused = false;
	static bool said_refused = false;
	bool		refused = writes_refused();
	const char *why;

	if (RecoveryInProgress())
		why = "the server is in recovery; waiting for it to accept writes";
	else if (DefaultXactReadOnly)
		why = "the server is read-only (default_transaction_read_only); waiting for it to accept writes";
	else
		why = "the database is read-only (default_transaction_read_only of the database or role); waiting for it to accept writes";
	log_wait_change(worker_paused, &said_paused,
					"the worker is paused (durable_steps.paused); nothing due runs until it is turned off",
					"the worker is no longer paused; running steps");
	log_wait_change(refused, &said_refused, why,
					"the server accepts writes again; running steps");
	return worker_paused || refused;
}

bool
ds_worker_waits(void)
{
	return worker_paused || writes_refused();
}

/*
 * A write this process's transaction began was refused (25006, read_only_sql_transaction) because
 * the server turned read-only: a reload made default_transaction_read_only on (only a reload
 * changes it in a worker's process, and a transaction takes it as it begins), or the server is
 * in recovery. Any other error, or a 25006 while the server accepts writes, is not the server's
 * and goes on as an error.
 */
bool
ds_worker_caught_read_only(void)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	ErrorData  *edata = CopyErrorData();

	MemoryContextSwitchTo(oldcxt);
	if (edata->sqlerrcode != ERRCODE_READ_ONLY_SQL_TRANSACTION ||
		!(RecoveryInProgress() || DefaultXactReadOnly))
	{
		FreeErrorData(edata);
		return false;
	}

	/*
	 * every level of the transaction, with its snapshots, SPI connections,
	 * GUC nest levels, user id and locks
	 */
	AbortOutOfAnyTransaction();
	MemoryContextSwitchTo(TopMemoryContext);
	FlushErrorState();

	/*
	 * not an error of the process: the wait that follows says once why
	 * (ds_worker_must_wait)
	 */
	ereport(DEBUG1,
			(errmsg("durable_steps: a write met the server read-only: %s", edata->message)));
	FreeErrorData(edata);
	pgstat_report_activity(STATE_IDLE, NULL);
	return true;
}
