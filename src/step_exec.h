/*
 * step_exec.h -- running one attempt of a SQL step body in its own subtransaction.
 */
#ifndef DS_STEP_EXEC_H
#define DS_STEP_EXEC_H

#include "compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "classify.h"

/* What an attempt needs to know about the step it runs. */
typedef struct StepBody
{
	const char *run_id;
	const char *step_id;
	const char *sql;
	Jsonb	   *input;			/* bound to $1; NULL binds SQL NULL */
	int64		timeout;		/* microseconds; 0 = none */
	Oid			run_as;			/* role to run as; InvalidOid = the current user */
	const char *search_path;	/* search_path to run under; NULL = the current one */
	const ClassOverrides *overrides;
	/*
	 * Check deferred constraints at the end of the body, inside its subtransaction. The worker
	 * runs several steps in one transaction: a deferred violation must fail its own step, not
	 * that shared transaction's commit.
	 */
	bool		immediate_constraints;
} StepBody;

typedef struct AttemptOutcome
{
	AttemptClass cls;
	Jsonb	   *result;			/* completed attempts only */
	int			sqlerrcode;		/* failed attempts only */
	char	   *message;
	char	   *detail;
	char	   *hint;
	bool		has_retry_after;	/* ds_retry_after() chose the next delay */
	int64		retry_after;	/* microseconds */
	TimestampTz started_at;
	TimestampTz finished_at;
} AttemptOutcome;

extern void step_exec_init_module(void);

/*
 * Run attempt `attempt` of the body. Errors of the body are caught, rolled back with its
 * subtransaction and classified into the outcome; only a cancel that is not the step's own
 * timeout (the caller's statement_timeout, pg_cancel_backend) propagates.
 */
extern void execute_step_attempt(const StepBody *body, int attempt, int max_attempts,
								 AttemptOutcome *outcome);


#endif							/* DS_STEP_EXEC_H */
