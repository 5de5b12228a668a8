/*
 * step_store.h -- reading and writing durable_steps.steps and durable_steps.attempts.
 */
#ifndef DS_STEP_STORE_H
#define DS_STEP_STORE_H

#include "base/compat.h"
#include "access/htup.h"
#include "access/tupdesc.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "base/policy.h"
#include "base/step_kind.h"
#include "base/attempt_outcome.h"
#include "store/kept_plan.h"

/*
 * A step's status (docs/steps.md, "Step statuses"). The column holds its name; ds_step_status_name and
 * ds_step_status_from_name are the one mapping between the two.
 */
typedef enum StepStatus
{
	STEP_PENDING,
	STEP_RUNNING,
	STEP_RETRYING,
	STEP_SUCCEEDED,
	STEP_FAILED,
	STEP_BLOCKED,
	STEP_UNCERTAIN,
	STEP_CANCELLED
} StepStatus;

extern const char *ds_step_status_name(StepStatus status);

/* The status named `name`; an unknown name is an error (a row written by hand). */
extern StepStatus ds_step_status_from_name(const char *name);

/* Finished for good or waiting for a person: no attempt will run unless someone re-arms it. */
static inline bool
ds_step_status_is_settled(StepStatus status)
{
	return status == STEP_SUCCEEDED || status == STEP_FAILED || status == STEP_BLOCKED ||
		status == STEP_UNCERTAIN || status == STEP_CANCELLED;
}

/* A step row, as the C code sees it. NULL pointers stand for SQL NULLs. */
typedef struct StepRecord
{
	char	   *run_id;
	char	   *step_id;
	StepKind	kind;
	char	   *sql;
	Jsonb	   *input;
	Jsonb	   *request;
	char	   *idempotency_header; /* HTTP steps: header carrying the key;
									 * NULL = none */
	char	   *fingerprint;
	int			max_attempts;	/* of the resolved policy */

	/*
	 * The rest of the resolved policy: the backoff schedule (initial_delay,
	 * max_delay, exponential, multiplier, jitter; `set` and `max_attempts`
	 * are not columns and stay 0). Stored as typed columns rather than as the
	 * policy's jsonb, which was half of a step row's bytes, and so of the WAL
	 * each claim and outcome writes (README, "Benchmarks").
	 */
	RetryPolicy backoff;
	int			attempt_base;
	int			attempts;		/* number of the last attempt started */
	int64		timeout;		/* microseconds; 0 = none */
	char	   *on_timeout;
	ArrayType  *retry_on;
	ArrayType  *fail_on;
	Oid			owner;
	char	   *search_path;
	char	   *notify;			/* channel NOTIFYed when the step stops; NULL
								 * = none */
	char	   *on_success;		/* hook SQL run when the step succeeds; NULL =
								 * none */
	char	   *on_failure;		/* hook SQL run when the step fails for good;
								 * NULL = none */
	char	   *queue;			/* the queue the worker serves it from
								 * (docs/queues.md) */
	int			priority;		/* lower numbers first within the queue */
	bool		expect_row;		/* SQL steps: no row returned is a failure
								 * (docs/steps.md, "Expecting a row") */
	StepStatus	status;
	Jsonb	   *result;
	char	   *error_class;
	char	   *error_code;
	char	   *error_message;
	char	   *error_detail;
	char	   *remediation;
	TimestampTz next_attempt_at;	/* 0 = NULL */
	TimestampTz lease_expires_at;	/* 0 = NULL */
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz finished_at;	/* 0 = NULL */
	int			claimed_by;		/* pid of the executor that claimed the
								 * running attempt; 0 = NULL */

	/*
	 * A worker's attempt that succeeded, recorded in the step row rather than
	 * in the attempts table (ds_store_finish_claimed_attempt): its claim and
	 * its start; 0 = NULL, as for every other step.
	 */
	TimestampTz attempt_claimed_at;
	TimestampTz attempt_started_at;

	/*
	 * a running step's queue when it has a concurrency limit, counted against
	 * it; NULL otherwise
	 */
	char	   *running_queue;

	/*
	 * An HTTP attempt's outcome the HTTP worker kept for an executor to
	 * record with the step's outcome hook (outcome_json.h): the step stays
	 * running meanwhile. NULL otherwise.
	 */
	Jsonb	   *kept_outcome;

	/*
	 * Tasks (docs/tasks.md): the handler's name (NULL for every other kind);
	 * what a lease that ran out means ("uncertain", or NULL: a lost attempt,
	 * retried); the application worker that claimed the attempt now running.
	 */
	char	   *task;
	char	   *on_lost;
	char	   *worker;

	/*
	 * The limit that admits the step's attempts (docs/limits.md) and its key
	 * within it ("" for none); NULL for a step of no limit. A waiting step of
	 * a limit is held -- limit_not_before says when it may be admitted, and
	 * its next_attempt_at is NULL, so that no claim sees it -- until the
	 * admission (steps/limits.c) makes it due; limit_admitted is then the
	 * number of the attempt it was admitted for, until that attempt ends.
	 */
	char	   *limit_name;
	char	   *limit_key;
	TimestampTz limit_not_before;	/* 0 = NULL: not held */
	int			limit_admitted; /* 0 = NULL: not admitted */

	/*
	 * an item of a map (ds_map): the map's step id in the same run; NULL
	 * otherwise
	 */
	char	   *map_step;

	/*
	 * where this transaction last read or wrote the row; invalid when unknown
	 * (not a column)
	 */
	ItemPointerData tid;
} StepRecord;

/* Read the whole step and lock its row for the transaction; false when there is no such step. */
extern bool ds_store_lock_step(const char *run_id, const char *step_id, StepRecord *out);
extern void ds_store_update_step(StepRecord *rec);

/* A new step's row alone (a deferred step: no attempt has run). */
extern void ds_store_insert_step(StepRecord *rec);
extern void ds_store_insert_step_with_attempt(const StepRecord *rec, int attempt,
											  const AttemptOutcome *outcome);

/*
 * The outcome of an attempt a worker claimed at `claimed_at` (the step row was then committed as
 * running): the step updated, and the attempt's one row added, unless the attempt succeeded
 * (the step row then records it).
 */
extern void ds_store_finish_claimed_attempt(StepRecord *rec, int attempt, TimestampTz claimed_at,
											const AttemptOutcome *outcome);

/*
 * An attempt recorded by a person rather than run (ds_resolve_step): the step updated, the
 * attempt added with executor 'operator' and its message and detail kept whatever its class.
 */
extern void ds_store_update_step_insert_operator_attempt(StepRecord *rec, int attempt,
														 const AttemptOutcome *outcome);

/* A synchronous caller's attempt of an existing step: the step updated, the attempt added. */
extern void ds_store_update_step_insert_attempt(StepRecord *rec, int attempt,
												const AttemptOutcome *outcome);

/*
 * The layout of durable_steps.steps (sql/durable_steps--0.1.0.sql), as pg_cron's cron_job.h
 * lays out its table: one entry per column, naming the column, the StepRecord field that holds
 * it and how. Statement column lists, direct writes, SPI tuple readers and index probes all
 * derive from it; a new column is one line here and one in the install script.
 */
typedef enum StepColumn
{
	STEP_COL_RUN_ID,
	STEP_COL_STEP_ID,
	STEP_COL_KIND,
	STEP_COL_SQL,
	STEP_COL_INPUT,
	STEP_COL_REQUEST,
	STEP_COL_IDEMPOTENCY_HEADER,
	STEP_COL_FINGERPRINT,
	STEP_COL_MAX_ATTEMPTS,
	STEP_COL_RETRY_INITIAL_DELAY,
	STEP_COL_RETRY_MAX_DELAY,
	STEP_COL_RETRY_MULTIPLIER,
	STEP_COL_RETRY_JITTER,
	STEP_COL_RETRY_EXPONENTIAL,
	STEP_COL_ATTEMPT_BASE,
	STEP_COL_ATTEMPTS,
	STEP_COL_TIMEOUT,
	STEP_COL_ON_TIMEOUT,
	STEP_COL_RETRY_ON,
	STEP_COL_FAIL_ON,
	STEP_COL_OWNER,
	STEP_COL_SEARCH_PATH,
	STEP_COL_NOTIFY,
	STEP_COL_ON_SUCCESS,
	STEP_COL_ON_FAILURE,
	STEP_COL_QUEUE,
	STEP_COL_PRIORITY,
	STEP_COL_STATUS,
	STEP_COL_RESULT,
	STEP_COL_ERROR_CLASS,
	STEP_COL_ERROR_CODE,
	STEP_COL_ERROR_MESSAGE,
	STEP_COL_ERROR_DETAIL,
	STEP_COL_REMEDIATION,
	STEP_COL_NEXT_ATTEMPT_AT,
	STEP_COL_LEASE_EXPIRES_AT,
	STEP_COL_CLAIMED_BY,
	STEP_COL_ATTEMPT_CLAIMED_AT,
	STEP_COL_ATTEMPT_STARTED_AT,
	STEP_COL_RUNNING_QUEUE,
	STEP_COL_CREATED_AT,
	STEP_COL_UPDATED_AT,
	STEP_COL_FINISHED_AT,
	STEP_COL_KEPT_OUTCOME,
	STEP_COL_TASK,
	STEP_COL_ON_LOST,
	STEP_COL_WORKER,
	STEP_COL_EXPECT_ROW,
	STEP_COL_LIMIT_NAME,
	STEP_COL_LIMIT_KEY,
	STEP_COL_LIMIT_NOT_BEFORE,
	STEP_COL_LIMIT_ADMITTED,
	STEP_COL_MAP_STEP
} StepColumn;

#define N_STEP_COLUMNS (STEP_COL_MAP_STEP + 1)
/* the primary key is the first two columns */
#define N_STEP_KEY_COLUMNS 2

/* How a column's value sits in its StepRecord field. */
typedef enum StepFieldType
{
	FIELD_TEXT,					/* char *, NULL = SQL NULL */
	FIELD_STATUS,				/* StepStatus, stored as its name */
	FIELD_KIND,					/* StepKind, stored as its name */
	FIELD_VARLENA,				/* Jsonb * or ArrayType * as stored (maybe
								 * compressed or out of line: detoast before
								 * reading), NULL = SQL NULL */
	FIELD_INT4,					/* int, never NULL */
	FIELD_INT4_ZERO_NULL,		/* int, 0 = SQL NULL */
	FIELD_INT8,					/* int64 (bigint), never NULL */
	FIELD_FLOAT8,				/* double, never NULL */
	FIELD_BOOL,					/* bool, never NULL */
	FIELD_BOOL_FALSE_NULL,		/* bool, false = SQL NULL */
	FIELD_OID,					/* Oid (regrole), never NULL */
	FIELD_USECS,				/* int64 microseconds of an interval, 0 = SQL
								 * NULL */
	FIELD_TIMESTAMPTZ			/* TimestampTz, 0 = SQL NULL */
} StepFieldType;

typedef struct StepColumnDesc
{
	const char *name;
	StepFieldType type;
	size_t		field;			/* offsetof(StepRecord, ...) */
} StepColumnDesc;

extern const StepColumnDesc ds_step_columns[N_STEP_COLUMNS];

/* "run_id, step_id, kind, ...": every column, in StepColumn order, for SELECT lists. */
extern const char *ds_step_column_list(void);

/* Set the field of `col` in *rec from a column value, copying into `cxt`. */
extern void ds_step_set_field(StepRecord *rec, StepColumn col, Datum value, bool isnull,
							  MemoryContext cxt);

/*
 * Fill *out from columns offset+1 .. offset+N_STEP_COLUMNS of a row read through SPI (the list
 * of ds_step_column_list()), followed by the row's ctid (out->tid).
 */
extern void ds_store_record_from_tuple(HeapTuple t, TupleDesc td, int offset, MemoryContext cxt,
									   StepRecord *out);

/* The columns of durable_steps.attempts, whose rows are written once and never read back. */
typedef enum AttemptColumn
{
	ATTEMPT_COL_RUN_ID,
	ATTEMPT_COL_STEP_ID,
	ATTEMPT_COL_ATTEMPT,
	ATTEMPT_COL_CLASS,
	ATTEMPT_COL_ERROR_CODE,
	ATTEMPT_COL_ERROR_MESSAGE,
	ATTEMPT_COL_ERROR_DETAIL,
	ATTEMPT_COL_EXECUTOR,
	ATTEMPT_COL_BACKEND_PID,
	ATTEMPT_COL_ROLE,
	ATTEMPT_COL_CLAIMED_AT,
	ATTEMPT_COL_STARTED_AT,
	ATTEMPT_COL_FINISHED_AT
} AttemptColumn;

#define N_ATTEMPT_COLUMNS (ATTEMPT_COL_FINISHED_AT + 1)

extern const char *const ds_attempt_column_names[N_ATTEMPT_COLUMNS];

/* From _PG_init: registers both layouts' column names with the storage root (store_relations.h). */
extern void ds_step_store_init_module(void);

/*
 * The extension's own statements: run as the tables' owner, through SPI, planned with
 * sequential scans disabled (see step_store.c). Every internal statement goes between these.
 */
typedef struct StoreSpi
{
	int			planning_level;
	Oid			save_userid;
	int			save_sec_context;
	MemoryContext caller_cxt;	/* where results are copied to */
} StoreSpi;

extern void ds_store_spi_begin(StoreSpi *s);
extern void ds_store_spi_end(StoreSpi *s);

/*
 * The one timestamptz (a min(...)) that the kept statement `sql` with `nargs` arguments (`nulls`
 * as SPI_execute_plan takes them) answers,
 * run as the tables' owner in the latest snapshot whatever the transaction's isolation (the looks
 * of ipc/due_floors.h need one later than their start); 0 when it is NULL. `what` names the
 * statement in its error.
 */
extern TimestampTz ds_store_query_time(SPIPlanPtr *slot, const char *sql, int nargs, Oid *types,
									   Datum *args, const char *nulls, const char *what);

/* Can the current user see and act on steps owned by `owner`? */
extern bool ds_store_may_access(Oid owner);

#endif							/* DS_STEP_STORE_H */
