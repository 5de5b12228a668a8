/*
 * attempt_outcome.h -- what one attempt of a step ended with: the value that travels from the
 * body's execution (step_exec.c) or an HTTP answer (http_response.c) to the state rules
 * (step_attempt.c) and the store (step_store.c).
 */
#ifndef DS_ATTEMPT_OUTCOME_H
#define DS_ATTEMPT_OUTCOME_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "base/classify.h"

typedef struct AttemptOutcome
{
	AttemptClass cls;
	Jsonb	   *result;			/* completed attempts only */
	int			sqlerrcode;		/* failed attempts only */

	/*
	 * the code a task's handler gave its failure (docs/tasks.md), recorded
	 * instead of the SQLSTATE's; NULL for every other attempt
	 */
	const char *error_code;
	char	   *message;
	char	   *detail;
	char	   *hint;
	bool		has_retry_after;	/* ds_retry_after() chose the next delay */
	int64		retry_after;	/* microseconds */
	TimestampTz started_at;
	TimestampTz finished_at;
} AttemptOutcome;

#endif							/* DS_ATTEMPT_OUTCOME_H */
