/*
 * step_counters.h -- counters of what the steps did since the server started, in shared memory,
 * for ds_stats() and the Prometheus metrics (docs/operations.md, "Numbers for operators").
 *
 * An attempt is counted when the transaction that records it commits: a recording that rolls
 * back (the caller's transaction, a savepoint, an executor that ended) counts nothing, and a
 * lost attempt is counted once, when its loss is recorded. Each count goes to a cumulative
 * counter, to the second it committed in, of a ring of the last 60 seconds, and to its minute,
 * of a ring of the last 60 minutes (the operator's console draws the last hour from it). An HTTP response
 * is counted by the HTTP worker when it arrives, whatever becomes of its recording. A crash or
 * a restart of the server starts every counter again from zero, as PostgreSQL's own statistics
 * do; Prometheus's rate() and increase() read such a reset as one.
 */
#ifndef DS_STEP_COUNTERS_H
#define DS_STEP_COUNTERS_H

#include "base/compat.h"

#include "base/classify.h"
#include "base/step_kind.h"

/* the attempt classes counted: AttemptClass */
#define DS_COUNTED_CLASSES (ATTEMPT_UNCERTAIN + 1)

/* the step statuses counted (StepStatus of store/step_store.h, which checks the number) */
#define DS_COUNTED_STATUSES 8

/* HTTP responses by the first digit of their status (1xx .. 5xx), and transfers with none */
#define DS_HTTP_NO_RESPONSE 0
#define DS_COUNTED_HTTP_CLASSES 6

/* How many seconds back ds_read_step_counters sums the recent attempts. */
#define DS_RECENT_SECONDS 60

/* How many minutes back ds_read_step_counters reads the attempts of each minute. */
#define DS_RECENT_MINUTES 60

/* A reading of the counters. */
typedef struct StepCounters
{
	/* attempts recorded, by kind of step and class, since the server started */
	uint64		attempts[N_STEP_KINDS][DS_COUNTED_CLASSES];
	/* of them, attempts recorded as lost with their process (DS007) */
	uint64		lost[N_STEP_KINDS];
	/* the status each recorded attempt left its step in */
	uint64		outcomes[N_STEP_KINDS][DS_COUNTED_STATUSES];

	/*
	 * attempts recorded in the last DS_RECENT_SECONDS seconds, by kind and
	 * class
	 */
	uint64		recent[N_STEP_KINDS][DS_COUNTED_CLASSES];
	/* HTTP transfers finished, by status class (DS_HTTP_NO_RESPONSE: none) */
	uint64		http[DS_COUNTED_HTTP_CLASSES];

	/*
	 * attempts recorded in each of the last DS_RECENT_MINUTES minutes, by
	 * class: minutes[i] is minute minute_of[i] (minutes since the epoch; 0:
	 * none recorded in it)
	 */
	int64		minute_of[DS_RECENT_MINUTES];
	uint64		minutes[DS_RECENT_MINUTES][DS_COUNTED_CLASSES];
	TimestampTz since;			/* when the counters started (the server's
								 * start) */
} StepCounters;

extern void ds_step_counters_init_module(void);

/*
 * Count, when the current transaction commits, one attempt of a step of `kind` recorded with
 * class `cls` (`lost`: as lost with its process), which left its step in status `status`.
 */
extern void ds_count_attempt_at_commit(StepKind kind, AttemptClass cls, bool lost, int status);

/* In the HTTP worker: a transfer finished with HTTP status `status` (0: no response). */
extern void ds_count_http_response(long status);

/* Read the counters; false when the library was not preloaded (no shared memory). */
extern bool ds_read_step_counters(StepCounters *out);

#endif							/* DS_STEP_COUNTERS_H */
