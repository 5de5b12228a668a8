/*
 * step_attempt.h -- run the next attempt of a step and record what it did.
 */
#ifndef DS_STEP_ATTEMPT_H
#define DS_STEP_ATTEMPT_H

#include "compat.h"

#include "step_store.h"

/*
 * Run attempt rec->attempts + 1 of the step in `rec`, apply its outcome to `rec` (status, result,
 * error, next attempt time) and persist both the step (inserted when is_new, else updated) and
 * the attempt row, all in the current transaction. The caller holds the step's lock.
 * `run_as_owner` runs the body as rec->owner under rec->search_path (the worker); otherwise the
 * body runs as the current user under the current search_path (the synchronous caller).
 */
extern void run_next_attempt(StepRecord *rec, bool is_new, const char *executor,
							 bool run_as_owner);

/* Parse a stored step's retry_on / fail_on / on_timeout into classifier overrides. */
extern void overrides_from_record(const StepRecord *rec, ClassOverrides *out);

#endif							/* DS_STEP_ATTEMPT_H */
