/*
 * ds_errcodes.h -- the extension's own SQLSTATEs (class DS).
 *
 * The SQLSTATE table of docs/reference.md documents every code here; keep the two in step. The last three
 * digits of the conflict codes echo the HTTP status they are the analogue of.
 */
#ifndef DS_ERRCODES_H
#define DS_ERRCODES_H

#include "utils/elog.h"

/* Raised by step bodies through the helpers, and classified (docs/steps.md, "Outcome classes"). */
#define ERRCODE_DS_NON_RETRIABLE		MAKE_SQLSTATE('D','S','0','0','1')
#define ERRCODE_DS_RETRY_AFTER			MAKE_SQLSTATE('D','S','0','0','2')
#define ERRCODE_DS_BLOCKED				MAKE_SQLSTATE('D','S','0','0','3')
/* Recorded on attempts by the extension itself. */
#define ERRCODE_DS_STEP_TIMEOUT			MAKE_SQLSTATE('D','S','0','0','4')
#define ERRCODE_DS_RESULT_TOO_LARGE		MAKE_SQLSTATE('D','S','0','0','5')
#define ERRCODE_DS_TOO_MANY_ROWS		MAKE_SQLSTATE('D','S','0','0','6')
#define ERRCODE_DS_INVOCATION_LOST		MAKE_SQLSTATE('D','S','0','0','7')
#define ERRCODE_DS_NO_ROW				MAKE_SQLSTATE('D','S','0','0','8')
/* Recorded on the attempts of HTTP steps (docs/http.md). */
#define ERRCODE_DS_HTTP_STATUS			MAKE_SQLSTATE('D','S','0','1','0')
#define ERRCODE_DS_HTTP_NOT_SENT		MAKE_SQLSTATE('D','S','0','1','1')
#define ERRCODE_DS_HTTP_UNCERTAIN		MAKE_SQLSTATE('D','S','0','1','2')
#define ERRCODE_DS_HTTP_BAD_RESPONSE	MAKE_SQLSTATE('D','S','0','1','3')
#define ERRCODE_DS_RESOLVED_FAILED		MAKE_SQLSTATE('D','S','0','1','4')
/* Raised to callers. */
#define ERRCODE_DS_NO_STEP_CONTEXT		MAKE_SQLSTATE('D','S','1','0','1')
#define ERRCODE_DS_STEP_NOT_SUCCEEDED	MAKE_SQLSTATE('D','S','1','0','2')
#define ERRCODE_DS_INVALID_STEP_STATE	MAKE_SQLSTATE('D','S','1','0','3')
#define ERRCODE_DS_STEP_RECURSION		MAKE_SQLSTATE('D','S','1','0','4')
/* Runs (docs/runs.md): a ds_step()/ds_sleep()/ds_await_event() outside a run's workflow. */
#define ERRCODE_DS_NO_RUN_CONTEXT		MAKE_SQLSTATE('D','S','1','0','5')
/* Internal: ends a workflow's turn that must wait. A workflow never needs to catch it. */
#define ERRCODE_DS_RUN_SUSPENDED		MAKE_SQLSTATE('D','S','1','0','6')
/* ds_await_event() whose timeout passed before the event was emitted. */
#define ERRCODE_DS_EVENT_TIMEOUT		MAKE_SQLSTATE('D','S','4','0','8')
#define ERRCODE_DS_STEP_NOT_FOUND		MAKE_SQLSTATE('D','S','4','0','4')
#define ERRCODE_DS_IN_PROGRESS			MAKE_SQLSTATE('D','S','4','0','9')
#define ERRCODE_DS_STEP_CONFLICT		MAKE_SQLSTATE('D','S','4','2','2')
/* a task's token no longer holds its attempt's lease (docs/tasks.md) */
#define ERRCODE_DS_LEASE_LOST			MAKE_SQLSTATE('D','S','4','1','0')
/* Partitions (docs/partitions.md): a call naming a run of a partition this server does not own. */
#define ERRCODE_DS_WRONG_PARTITION		MAKE_SQLSTATE('D','S','2','0','1')
/*
 * The extension installed in this database is of another version than the library the server
 * loaded: ALTER EXTENSION durable_steps UPDATE has not run yet (the analogue of HTTP 426).
 */
#define ERRCODE_DS_VERSION_MISMATCH		MAKE_SQLSTATE('D','S','4','2','6')

#endif							/* DS_ERRCODES_H */
