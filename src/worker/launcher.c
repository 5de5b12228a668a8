/*
 * launcher.c -- the launcher: finds the databases to serve and starts their executors.
 *
 * A background worker can connect to one database for its whole life and fails hard when that
 * database does not exist. So the launcher connects to no database at all (it reads the shared
 * catalog pg_database only) and starts, for each database it serves, up to
 * durable_steps.max_workers executors connected to it (served_databases.c says which: every
 * database with the extension, found by probing, or the listed ones, each waited for politely --
 * one log line, no crash loop -- while it does not exist). When an executor ends (DROP DATABASE
 * ... WITH (FORCE), pg_terminate_backend, an error), the launcher starts it again once the
 * database is there; a database that leaves the setting has its executors stopped.
 */
#include "base/compat.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "ipc/executor_slot.h"
#include "ipc/served_databases.h"
#include "worker/http_worker.h"
#include "worker/executor.h"
#include "worker/launcher.h"
#include "worker/worker_session.h"
#include "ipc/worker_shmem.h"

int			ds_max_workers = 2;
static int	ds_max_extra_workers = 2;

/* how often the launcher looks for the database and at its executors */
#define LAUNCHER_CHECK_MS 1000

void
ds_launcher_init_module(void)
{
	BackgroundWorker worker;

	/*
	 * postmaster settings can only be defined while the postmaster loads the
	 * library
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;

	ds_served_databases_init_module();
	DefineCustomIntVariable("durable_steps.max_workers",
							"Number of executor processes that run due steps in each served database.",
							"0 disables the background worker. Each executor needs a slot of max_worker_processes.",
							&ds_max_workers,
							2,
							0,
							DS_MAX_WORKERS,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("durable_steps.max_extra_workers",
							"Most extra executors per served database, started while every executor runs one long attempt.",
							"An extra executor runs only the steps of roles whose work holds no executor, and leaves once an executor is free. Each needs a slot of max_worker_processes.",
							&ds_max_extra_workers,
							2,
							0,
							DS_MAX_WORKERS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	/*
	 * pg_upgrade starts both clusters in binary-upgrade mode, and in the new
	 * one it drops and recreates the database postgres (the default
	 * durable_steps.database): a connected executor would make the upgrade
	 * fail. No step should run during an upgrade anyway.
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

/* how many databases the launcher keeps track of */
#define MAX_SERVED_DATABASES 64

/* A database the launcher serves (or waits for) and its executors. */
typedef struct ServedDatabase
{
	char		name[NAMEDATALEN];
	Oid			dbid;			/* InvalidOid while a listed database does not
								 * exist */
	bool		wanted;			/* still to be served after this pass's look
								 * at the catalog */

	/*
	 * every-database mode: its probing executor found no extension; left
	 * alone until asked
	 */
	bool		no_extension;

	/*
	 * a backend there committed work after the probe began: probe again if it
	 * finds nothing
	 */
	bool		probe_again;
	/* a listed database's absence was logged */
	bool		said_missing;
	int			slot[DS_MAX_WORKERS];	/* its executors' slots, -1 for none */
	TimestampTz last_start[DS_MAX_WORKERS];
	/* its HTTP worker (http_worker.c); NULL when none was started */
	BackgroundWorkerHandle *http_worker;
	TimestampTz http_last_start;
	/* when its last extra executor was started (serve_extra_executors) */
	TimestampTz extra_last_start;

	/*
	 * an extra executor found no free slot of max_worker_processes, and that
	 * was logged
	 */
	bool		said_no_extra;

	/*
	 * an executor, or the HTTP worker, found no free slot, and that was
	 * logged; cleared once one starts. The callers of this database hear it
	 * while none runs (ds_note_starved_database).
	 */
	bool		said_no_executor;
	bool		said_no_http;
} ServedDatabase;

static ServedDatabase databases[MAX_SERVED_DATABASES];
static int	n_databases = 0;

/* the executor started in each shared slot; NULL when the slot is free */
static BackgroundWorkerHandle *slot_handle[DS_MAX_WORKERS];

/* A database of pg_database the worker may connect to. */
typedef struct CatalogDatabase
{
	Oid			dbid;
	char		name[NAMEDATALEN];
} CatalogDatabase;

/*
 * Read pg_database (no connection needed): the databases that accept connections and are not
 * templates, into *found (allocated in `cxt`); returns how many.
 */
static int
read_databases(MemoryContext cxt, CatalogDatabase **found)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	int			n = 0;
	int			cap = 16;
	CatalogDatabase *dbs = MemoryContextAlloc(cxt, cap * sizeof(CatalogDatabase));

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		/*
		 * a database half-way through DROP DATABASE has datconnlimit -2 and
		 * cannot be joined
		 */
		if (db->datconnlimit == -2 || !db->datallowconn || db->datistemplate)
			continue;
		if (n == cap)
		{
			cap *= 2;
			dbs = repalloc(dbs, cap * sizeof(CatalogDatabase));
		}
		dbs[n].dbid = db->oid;
		strlcpy(dbs[n].name, NameStr(db->datname), NAMEDATALEN);
		n++;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	*found = dbs;
	return n;
}

/* Is the executor in `slot` still there? */
static bool
slot_running(int slot)
{
	pid_t		pid;

	return slot >= 0 && slot_handle[slot] != NULL &&
		GetBackgroundWorkerPid(slot_handle[slot], &pid) != BGWH_STOPPED;
}

/* A shared slot whose executor is gone; -1 when all are taken. */
static int
free_slot(void)
{
	for (int s = 0; s < DS_MAX_WORKERS; s++)
	{
		bool		taken = false;

		if (slot_running(s))
			continue;

		/*
		 * a stopped executor's slot stays its database's until that database
		 * lets it go
		 */
		for (int d = 0; d < n_databases && !taken; d++)
			for (int i = 0; i < DS_MAX_WORKERS; i++)
				if (databases[d].slot[i] == s)
					taken = true;
		if (!taken)
			return s;
	}
	return -1;
}

/*
 * Register executor `slot` for database `db` as a dynamic background worker; an `extra` one
 * (ds_max_extra_workers) says so in its bgw_extra, after the database's OID.
 */
static bool
start_executor(ServedDatabase *db, int slot, bool extra)
{
	BackgroundWorker worker;
	WorkerShared *shared = ds_worker_shared();

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "durable_steps");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "ds_executor_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "durable_steps %sworker %d", extra ? "extra " : "", slot);
	snprintf(worker.bgw_type, BGW_MAXLEN, "durable_steps %sworker", extra ? "extra " : "");
	worker.bgw_main_arg = Int32GetDatum(slot);
	memcpy(worker.bgw_extra, &db->dbid, sizeof(Oid));
	memcpy(worker.bgw_extra + sizeof(Oid), &extra, sizeof(bool));
	worker.bgw_notify_pid = MyProcPid;
	if (shared != NULL)
	{
		pg_atomic_write_u32(&shared->executor[slot].state, EXECUTOR_STARTING);
		pg_atomic_write_u32(&shared->executor[slot].leave_requested, 0);
	}
	if (slot_handle[slot] != NULL)
		pfree(slot_handle[slot]);
	if (!RegisterDynamicBackgroundWorker(&worker, &slot_handle[slot]))
	{
		slot_handle[slot] = NULL;

		/*
		 * said once until one starts, not every second; an extra executor is
		 * a bonus, logged only
		 */
		if (!extra && !db->said_no_executor)
			ereport(WARNING,
					(errmsg("durable_steps: could not start an executor for database \"%s\"", db->name),
					 errhint("Raise max_worker_processes: each served database needs durable_steps.max_workers of them, and one for its HTTP worker.")));
		else if (extra && !db->said_no_extra)
			ereport(LOG,
					(errmsg("durable_steps: could not start an extra executor for database \"%s\"", db->name),
					 errhint("Every slot of max_worker_processes is taken; raise it, or lower durable_steps.max_extra_workers.")));
		db->said_no_extra |= extra;
		db->said_no_executor |= !extra;
		return false;
	}
	if (extra)
		db->said_no_extra = false;
	else
		db->said_no_executor = false;
	return true;
}

/* Stop database `db`'s executors and let their slots go (it is no longer served). */
static void
stop_executors(ServedDatabase *db)
{
	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		int			slot = db->slot[i];

		if (slot < 0)
			continue;
		if (slot_running(slot))
			TerminateBackgroundWorker(slot_handle[slot]);
		db->slot[i] = -1;
	}
	/* it lacks nothing any more: it is not served */
	db->said_no_executor = false;
	db->said_no_http = false;
	if (db->http_worker != NULL)
	{
		TerminateBackgroundWorker(db->http_worker);
		pfree(db->http_worker);
		db->http_worker = NULL;
	}
}

/* The launcher's entry of database `name`, added (with no executor) when missing. */
static ServedDatabase *
database_entry(const char *name)
{
	ServedDatabase *db;

	for (int d = 0; d < n_databases; d++)
		if (strcmp(databases[d].name, name) == 0)
			return &databases[d];
	if (n_databases == MAX_SERVED_DATABASES)
	{
		ereport(WARNING,
				(errmsg("durable_steps: serving at most %d databases; database \"%s\" is not served",
						MAX_SERVED_DATABASES, name)));
		return NULL;
	}
	db = &databases[n_databases++];
	memset(db, 0, sizeof(*db));
	strlcpy(db->name, name, NAMEDATALEN);
	for (int i = 0; i < DS_MAX_WORKERS; i++)
		db->slot[i] = -1;
	return db;
}

/* Forget the databases not wanted any more, stopping their executors. */
static void
drop_unwanted_databases(void)
{
	int			kept = 0;

	for (int d = 0; d < n_databases; d++)
	{
		if (!databases[d].wanted)
		{
			stop_executors(&databases[d]);
			continue;
		}
		if (kept != d)
			databases[kept] = databases[d];
		kept++;
	}
	n_databases = kept;
}

/*
 * Look at pg_database: mark the databases to serve in this pass (wanted, with their current
 * OID) and log, once each, a listed database that does not exist.
 */
static void
find_databases(MemoryContext cxt)
{
	CatalogDatabase *catalog;
	int			n = read_databases(cxt, &catalog);

	for (int d = 0; d < n_databases; d++)
		databases[d].wanted = false;
	if (ds_serves_every_database())
	{
		for (int c = 0; c < n; c++)
		{
			ServedDatabase *db = database_entry(catalog[c].name);

			if (db == NULL)
				continue;
			if (db->dbid != catalog[c].dbid)
			{
				/*
				 * a new database, or one dropped and created again under the
				 * same name
				 */
				stop_executors(db);
				db->no_extension = false;
			}
			db->dbid = catalog[c].dbid;
			db->wanted = true;
		}
	}
	else
	{
		List	   *names = ds_listed_databases();
		ListCell   *lc;

		foreach(lc, names)
		{
			const char *name = lfirst(lc);
			ServedDatabase *db = database_entry(name);
			Oid			dbid = InvalidOid;

			if (db == NULL)
				continue;
			for (int c = 0; c < n; c++)
				if (strcmp(catalog[c].name, name) == 0)
					dbid = catalog[c].dbid;
			db->wanted = true;
			db->no_extension = false;
			if (!OidIsValid(dbid) || dbid != db->dbid)
				stop_executors(db); /* gone, or dropped and created again */
			if (!OidIsValid(dbid) && !db->said_missing)
				ereport(LOG,
						(errmsg("durable_steps: database \"%s\" does not exist; waiting for it", name),
						 errhint("Create the database or change durable_steps.database.")));
			else if (OidIsValid(dbid) && db->said_missing)
				ereport(LOG,
						(errmsg("durable_steps: database \"%s\" exists; starting the worker", name)));
			db->said_missing = !OidIsValid(dbid);
			db->dbid = dbid;
		}
	}
	drop_unwanted_databases();
}

/* A backend committed work in a database none of whose executors ran: probe it again. */
static void
take_serve_requests(void)
{
	Oid			dbid;

	while (OidIsValid(dbid = ds_take_serve_request()))
		for (int d = 0; d < n_databases; d++)
			if (databases[d].dbid == dbid)
			{
				databases[d].no_extension = false;
				databases[d].probe_again = true;
			}
}

/*
 * Is the extension known to be installed in database `db`? A listed database is served as if it
 * were; in every-database mode, one of its running executors must have found it.
 */
static bool
extension_confirmed(ServedDatabase *db)
{
	WorkerShared *shared = ds_worker_shared();

	if (!ds_serves_every_database())
		return true;
	for (int i = 0; i < DS_MAX_WORKERS; i++)
		if (db->slot[i] >= 0 && slot_running(db->slot[i]) && shared != NULL &&
			pg_atomic_read_u32(&shared->executor[db->slot[i]].state) == EXECUTOR_SERVING)
			return true;
	return false;
}

/* The executor slot asked to leave for a database without a worker; -1 when none is. */
static int	donated_slot = -1;

/* Does an executor of database `db` run? */
static bool
executor_running(const ServedDatabase *db)
{
	for (int i = 0; i < DS_MAX_WORKERS; i++)
		if (slot_running(db->slot[i]))
			return true;
	return false;
}

/*
 * Database `needy` has no executor, or no HTTP worker (`for_http`), and no slot was free for
 * one: ask the last executor of a database that runs two or more to leave after its pass
 * (executor.c), so that every database is served before any has a second. For an HTTP worker,
 * `needy`'s own second executor is the first asked. The launcher is woken when it has left, and
 * its next pass gives the freed slot to the databases without a worker first. One at a time.
 */
static void
ask_a_donor(const ServedDatabase *needy, bool for_http)
{
	WorkerShared *shared = ds_worker_shared();

	/*
	 * one asked before is still to leave (its slot's next executor clears the
	 * ask)
	 */
	if (shared == NULL ||
		(donated_slot >= 0 && slot_running(donated_slot) &&
		 pg_atomic_read_u32(&shared->executor[donated_slot].leave_requested) != 0))
		return;
	donated_slot = -1;
	for (int k = -1; k < n_databases; k++)
	{
		const ServedDatabase *donor;
		int			running = 0;
		int			last = -1;

		/* itself first, and only for its HTTP worker; then the others */
		if (k < 0)
		{
			if (!for_http)
				continue;
			donor = needy;
		}
		else
		{
			donor = &databases[k];
			if (donor == needy)
				continue;
		}

		/*
		 * the highest entry first: an extra executor, then the last regular
		 * one
		 */
		for (int i = 0; i < DS_MAX_WORKERS; i++)
			if (slot_running(donor->slot[i]))
			{
				running++;
				last = donor->slot[i];
			}
		if (running >= 2)
		{
			Latch	   *latch = shared->executor[last].latch;

			pg_atomic_write_u32(&shared->executor[last].leave_requested, 1);
			/* a latch of an exited executor belongs to a PGPROC: harmless */
			if (latch != NULL)
				SetLatch(latch);
			donated_slot = last;
			return;
		}
	}
}

/*
 * Keep database `db`'s first `upto` executors running. In every-database mode one executor looks
 * for the extension first; the others start once it has found it, and none when it has not.
 */
static void
serve_database(ServedDatabase *db, int upto)
{
	WorkerShared *shared = ds_worker_shared();
	int			wanted;

	if (!OidIsValid(db->dbid) || db->no_extension)
		return;
	wanted = extension_confirmed(db) ? ds_max_workers : 1;

	for (int i = 0; i < DS_MAX_WORKERS; i++)
	{
		int			slot = db->slot[i];

		if (i >= ds_max_workers)
			break;				/* the extra executors' entries
								 * (serve_extra_executors) */
		if (i >= upto)
		{
			/*
			 * not started now, but a stopped one's slot is let go: another
			 * database may need it
			 */
			if (slot >= 0 && !slot_running(slot))
				db->slot[i] = -1;
			continue;
		}
		if (slot >= 0 && slot_running(slot))
			continue;
		if (slot >= 0 && shared != NULL && ds_serves_every_database() &&
			pg_atomic_read_u32(&shared->executor[slot].state) == EXECUTOR_NO_EXTENSION &&
			!db->probe_again)
		{
			/*
			 * the extension is not installed here: stop serving until asked
			 * again
			 */
			db->no_extension = true;
			stop_executors(db);
			return;
		}
		db->slot[i] = -1;
		if (i >= wanted)
			continue;
		/* an executor that keeps failing is started at most once a second */
		if (!TimestampDifferenceExceeds(db->last_start[i], GetCurrentTimestamp(), 1000))
			continue;
		slot = free_slot();
		if (slot < 0)
		{
			if (!db->said_no_executor)
				ereport(WARNING,
						(errmsg("durable_steps: all %d executor slots are taken; database \"%s\" waits for one",
								DS_MAX_WORKERS, db->name)));
			db->said_no_executor = true;
			if (i == 0 && !executor_running(db))
				ask_a_donor(db, false);
			return;
		}
		db->last_start[i] = GetCurrentTimestamp();
		if (start_executor(db, slot, false))
		{
			db->slot[i] = slot;

			/*
			 * this executor looks for the extension after the request that
			 * asked for it
			 */
			db->probe_again = false;
		}
		else if (i == 0 && !executor_running(db))
			ask_a_donor(db, false);
	}
}

/*
 * Start one extra executor for database `db` when every executor it has has run one attempt for
 * long (executor_slot.h), at most durable_steps.max_extra_workers of them; an extra executor
 * leaves by itself once an executor is free. One at a time, DS_BUSY_ATTEMPT_MS apart: the one
 * started must connect and run an attempt of its own for long before another is due (the
 * launcher's latch is set as it starts, and a pass then comes before it is connected).
 */
static void
serve_extra_executors(ServedDatabase *db)
{
	WorkerShared *shared = ds_worker_shared();
	int			free_entry = -1;
	bool		starting = false;
	int			slot;

	/*
	 * nor while the worker waits (paused, read-only): an extra would leave at
	 * once
	 */
	if (shared == NULL || !OidIsValid(db->dbid) || db->no_extension || !extension_confirmed(db) ||
		ds_worker_waits())
		return;
	for (int i = ds_max_workers; i < DS_MAX_WORKERS; i++)
	{
		slot = db->slot[i];

		/*
		 * One beyond a lowered durable_steps.max_extra_workers is not
		 * stopped: it leaves by itself once an executor is free, never in the
		 * middle of an attempt.
		 */
		if (slot >= 0 && slot_running(slot))
		{
			/*
			 * started, not yet connected: it does not count as an executor
			 * yet
			 */
			if (pg_atomic_read_u32(&shared->executor[slot].pid) == 0)
				starting = true;
			continue;
		}
		db->slot[i] = -1;
		if (free_entry < 0 && i < ds_max_workers + ds_max_extra_workers)
			free_entry = i;
	}
	if (free_entry < 0 || starting || !ds_executors_all_busy(db->dbid, -1))
		return;
	if (!TimestampDifferenceExceeds(db->extra_last_start, GetCurrentTimestamp(),
									DS_BUSY_ATTEMPT_MS))
		return;
	slot = free_slot();
	if (slot < 0)
		return;
	db->extra_last_start = GetCurrentTimestamp();
	if (start_executor(db, slot, true))
		db->slot[free_entry] = slot;
}

/* While no extra executor may start: the slots of those that stopped are let go. */
static void
let_go_stopped_extras(ServedDatabase *db)
{
	for (int i = ds_max_workers; i < DS_MAX_WORKERS; i++)
		if (db->slot[i] >= 0 && !slot_running(db->slot[i]))
			db->slot[i] = -1;
}

/*
 * Keep database `db`'s HTTP worker running once the database is served (in every-database mode:
 * once an executor found the extension there): started again when it ends, at most once a second.
 */
static void
keep_http_worker(ServedDatabase *db)
{
	pid_t		pid;

	if (!OidIsValid(db->dbid) || db->no_extension || !extension_confirmed(db))
		return;
	if (db->http_worker != NULL && GetBackgroundWorkerPid(db->http_worker, &pid) != BGWH_STOPPED)
		return;
	if (!TimestampDifferenceExceeds(db->http_last_start, GetCurrentTimestamp(), 1000))
		return;
	db->http_last_start = GetCurrentTimestamp();
	if (db->http_worker != NULL)
		pfree(db->http_worker);
	db->http_worker = ds_http_worker_register(db->dbid, db->name);
	if (db->http_worker == NULL && !db->said_no_http)
		ereport(WARNING,
				(errmsg("durable_steps: could not start the HTTP worker of database \"%s\"", db->name),
				 errhint("Raise max_worker_processes: the HTTP worker needs a slot besides the executors.")));
	db->said_no_http = db->http_worker == NULL;
	if (db->said_no_http)
		ask_a_donor(db, true);
}

/*
 * What database `db` lacks (DS_STARVED_*): an executor when none runs and one could not start;
 * its HTTP worker when it could not start.
 */
static uint32
lacks_of(ServedDatabase *db)
{
	uint32		lacks = 0;

	/*
	 * a database that is gone, or has no extension, is not served: it lacks
	 * nothing
	 */
	if (!OidIsValid(db->dbid) || db->no_extension)
		return 0;

	if (db->said_no_executor)
	{
		bool		running = false;

		for (int i = 0; i < DS_MAX_WORKERS && !running; i++)
			running = slot_running(db->slot[i]);
		if (!running)
			lacks |= DS_STARVED_EXECUTOR;
	}
	if (db->said_no_http)
		lacks |= DS_STARVED_HTTP;
	return lacks;
}

/* After a reload of the settings: look for the extension again in every database. */
static void
look_for_extensions_again(void)
{
	for (int d = 0; d < n_databases; d++)
		databases[d].no_extension = false;
}

void
ds_launcher_main(Datum arg)
{
	MemoryContext pass_cxt;
	WorkerShared *shared = ds_worker_shared();
	bool		starved;

	(void) ds_worker_connect("durable_steps launcher", false, false);
	pass_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps launcher pass",
									 ALLOCSET_DEFAULT_SIZES);
	if (shared != NULL)
		shared->launcher_latch = MyLatch;

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		ds_worker_reload_settings_if_asked(look_for_extensions_again);

		find_databases(pass_cxt);
		take_serve_requests();

		/*
		 * every database its first executor and its HTTP worker before any
		 * gets a second: with too few slots of max_worker_processes, each
		 * database is served, slower, rather than some not at all. While one
		 * lacks a worker, no database starts a second executor (one that has
		 * two gives one back: ask_a_donor), so that a slot let go is its.
		 */
		starved = false;
		for (int d = 0; d < n_databases; d++)
		{
			serve_database(&databases[d], 1);
			keep_http_worker(&databases[d]);
		}
		for (int d = 0; d < DS_STARVED_DATABASES; d++)
		{
			uint32		lacks = d < n_databases ? lacks_of(&databases[d]) : 0;

			starved |= lacks != 0;
			ds_note_starved_database(d, d < n_databases ? databases[d].dbid : InvalidOid, lacks);
		}
		for (int d = 0; d < n_databases && !starved; d++)
			serve_database(&databases[d], DS_MAX_WORKERS);
		for (int d = 0; d < n_databases; d++)
			if (starved)
				let_go_stopped_extras(&databases[d]);
			else
				serve_extra_executors(&databases[d]);
		MemoryContextReset(pass_cxt);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LAUNCHER_CHECK_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
