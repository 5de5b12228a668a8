/*
 * worker_session.h -- what the background workers' processes share (worker_session.c): their
 * set-up as background workers, the reload of their settings, their transactions on the
 * extension's tables, and when they must wait (durable_steps.paused, a read-only server). The
 * launcher, the executors and the HTTP worker are each built on it; none of them borrows from
 * another.
 */
#ifndef DS_WORKER_SESSION_H
#define DS_WORKER_SESSION_H

#include "base/compat.h"

/* From _PG_init: defines durable_steps.paused. */
extern void ds_worker_session_init_module(void);

/*
 * The start of a worker process: SIGTERM ends it, SIGHUP asks for a reload (ConfigReloadPending),
 * and with `cancel` SIGINT cancels the statement running (an executor's attempt); then connect
 * -- to the database whose OID the launcher put first in bgw_extra, or with `database` false to
 * none (the launcher reads only shared catalogs) -- and show `appname` in pg_stat_activity.
 * Returns the database connected to (InvalidOid for none).
 */
extern Oid	ds_worker_connect(const char *appname, bool database, bool cancel);

/* What a process re-applies from its settings after a reload (ds_worker_reload_settings_if_asked). */
typedef void (*ReloadedSettingsHook) (void);

/*
 * Apply a reload of the configuration file if SIGHUP asked for one (ConfigReloadPending), then
 * call `reapply` (NULL: none) for what the process itself takes from the new settings. Returns
 * whether it did: a reload may have made the server read-only (default_transaction_read_only),
 * and a process that is to write after it looks again (ds_worker_must_wait) before it does.
 */
extern bool ds_worker_reload_settings_if_asked(ReloadedSettingsHook reapply);

/* Start a transaction with a snapshot, and say `activity` in pg_stat_activity. */
extern void ds_worker_begin_transaction(const char *activity);

/*
 * A transaction on the extension's tables, share-locking the extension against DROP EXTENSION;
 * false, with no transaction open, when the extension is not installed. End it with
 * ds_worker_commit().
 */
extern bool ds_worker_begin_work(const char *activity);

/* The same at isolation level `isolation` (XACT_READ_COMMITTED for a claim: step_claims.c). */
extern bool ds_worker_begin_work_isolated(const char *activity, int isolation);

/* Commit either, report the statistics, and say the process is idle. */
extern void ds_worker_commit(void);

/*
 * Must the workers wait, claiming, running and recording nothing, and look again later? While
 * durable_steps.paused is on (a restored copy, docs/backups.md), or while the database refuses
 * writes: the server is in recovery, default_transaction_read_only is on in the configuration (as
 * a failover manager sets it while it hands a primary over) or in the stored settings of the
 * database or the role (ALTER DATABASE ... SET, read again every second) -- rather than fail on
 * the first write and be restarted every second. Logs each change once.
 */
extern bool ds_worker_must_wait(void);

/* The same, without the log lines: for the launcher, which starts no extra executor meanwhile. */
extern bool ds_worker_waits(void);

/*
 * In a PG_CATCH of a worker process: is the error a write refused because the server turned
 * read-only (SQLSTATE 25006 while default_transaction_read_only is on or the server is in
 * recovery)? Then every level of the transaction is rolled back and the error cleared (logged
 * at DEBUG1 only): the process lets go of what it held and waits, as ds_worker_must_wait then
 * says once, instead of ending with an error and being restarted. Otherwise (false) nothing is
 * touched, and the caller re-throws the error.
 */
extern bool ds_worker_caught_read_only(void);

/*
 * End the process (exit code 0, one log line) when its settings are outdated: the launcher starts
 * another, which connects with the database's settings of now. Called where the process holds no
 * attempt.
 */
extern void ds_worker_end_if_outdated(void);

#endif							/* DS_WORKER_SESSION_H */
