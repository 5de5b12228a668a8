/*
 * outcome_json.h -- an attempt's outcome as jsonb, kept on its step while the step waits for an
 * executor to record it (docs/steps.md, "Outcome hooks": the hooks of HTTP steps).
 */
#ifndef DS_OUTCOME_JSON_H
#define DS_OUTCOME_JSON_H

#include "base/compat.h"
#include "utils/jsonb.h"

#include "base/attempt_outcome.h"

/* What is kept: the outcome, the claim it belongs to and the process that ran the attempt. */
typedef struct KeptOutcome
{
	AttemptOutcome outcome;
	TimestampTz claimed_at;
	int			pid;
} KeptOutcome;

extern Jsonb *ds_outcome_to_jsonb(const KeptOutcome *kept);

/* The outcome kept in `j`; a value not written by ds_outcome_to_jsonb is an error. */
extern void ds_outcome_from_jsonb(Jsonb *j, KeptOutcome *kept);

#endif							/* DS_OUTCOME_JSON_H */
