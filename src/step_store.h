/*
 * step_store.h -- reading and writing durable_steps.steps and durable_steps.attempts.
 */
#ifndef DS_STEP_STORE_H
#define DS_STEP_STORE_H

#include "compat.h"
#include "access/htup.h"
#include "access/tupdesc.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "step_exec.h"

/*
 * A step's status (README, "Step statuses"). The column holds its name; ds_step_status_name and
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
	char	   *kind;
	char	   *sql;
	Jsonb	   *input;
	Jsonb	   *request;
	char	   *fingerprint;
	Jsonb	   *policy;			/* resolved policy, every key set */
	int			max_attempts;
	int			attempt_base;
	int			attempts;		/* number of the last attempt started */
	int64		timeout;		/* microseconds; 0 = none */
	char	   *on_timeout;
	ArrayType  *retry_on;
	ArrayType  *fail_on;
	Oid			owner;
	char	   *search_path;
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
	int			claimed_by;		/* pid of the executor that claimed the running attempt; 0 = NULL */
	/* where this transaction last read or wrote the row; invalid when unknown (not a column) */
	ItemPointerData tid;
} StepRecord;

/* Read the whole step and lock its row for the transaction; false when there is no such step. */
extern bool ds_store_lock_step(const char *run_id, const char *step_id, StepRecord *out);
extern void ds_store_update_step(StepRecord *rec);
extern void ds_store_insert_step_with_attempt(const StepRecord *rec, int attempt,
										   const AttemptOutcome *outcome);
/*
 * The outcome of an attempt a worker claimed at `claimed_at` (the step row was then committed as
 * running): the step updated, the attempt's one row added.
 */
extern void ds_store_finish_claimed_attempt(StepRecord *rec, int attempt, TimestampTz claimed_at,
										 const AttemptOutcome *outcome);
/* A synchronous caller's attempt of an existing step: the step updated, the attempt added. */
extern void ds_store_update_step_insert_attempt(StepRecord *rec, int attempt,
											 const AttemptOutcome *outcome);

/*
 * Fill *out (but run_id, step_id) from columns offset+1.. of a row in STEP_COLUMNS order
 * followed by the row's ctid (out->tid).
 */
extern void ds_store_record_from_tuple(HeapTuple t, TupleDesc td, int offset, MemoryContext cxt,
									StepRecord *out);
/* Plan the statements run between these with sequential scans disabled (see step_store.c). */
extern int	ds_index_planning_begin(void);
extern void ds_index_planning_end(int level);

#define STEP_COLUMNS \
	"kind, sql, input, fingerprint, policy, max_attempts, attempt_base, attempts, timeout, " \
	"on_timeout, retry_on, fail_on, owner, search_path, status, result, error_class, " \
	"error_code, error_message, error_detail, remediation, next_attempt_at, created_at, " \
	"updated_at, finished_at, request, lease_expires_at, claimed_by"

/* The saved plan in *slot, prepared (and kept for the backend's life) on first use. */
extern SPIPlanPtr ds_prepare_kept(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes);

/* Can the current user see and act on steps owned by `owner`? */
extern bool ds_store_may_access(Oid owner);

#endif							/* DS_STEP_STORE_H */
