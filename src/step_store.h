/*
 * step_store.h -- reading and writing durable_steps.steps and durable_steps.attempts.
 */
#ifndef DS_STEP_STORE_H
#define DS_STEP_STORE_H

#include "compat.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "step_exec.h"

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
	char	   *status;
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
} StepRecord;

/* Read the whole step and lock its row for the transaction; false when there is no such step. */
extern bool store_lock_step(const char *run_id, const char *step_id, StepRecord *out);
extern void store_update_step(const StepRecord *rec);
extern void store_insert_step_with_attempt(const StepRecord *rec, int attempt,
										   const AttemptOutcome *outcome);
extern void store_update_step_finish_attempt(const StepRecord *rec, int attempt,
											 const AttemptOutcome *outcome);
extern void store_insert_attempt(const StepRecord *rec, int attempt,
								 const AttemptOutcome *outcome, const char *executor);

/* The saved plan in *slot, prepared (and kept for the backend's life) on first use. */
extern SPIPlanPtr prepare_kept(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes);

/* Can the current user see and act on steps owned by `owner`? */
extern bool store_may_access(Oid owner);

#endif							/* DS_STEP_STORE_H */
