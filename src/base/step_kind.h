/*
 * step_kind.h -- the kinds of step and what each kind means to the code that handles a step
 * (docs/steps.md; docs/http.md; docs/runs.md, "Events").
 *
 * A step's kind is stored by name in durable_steps.steps.kind. Code asks the kind's entry of the
 * table below what it needs to know (who runs its attempts, whether a lost one may have acted
 * outside the database) instead of comparing names, so that a new kind is one new entry.
 */
#ifndef DS_STEP_KIND_H
#define DS_STEP_KIND_H

#include "base/compat.h"

typedef enum StepKind
{
	STEP_KIND_SQL,				/* a SQL body, run by its caller or an
								 * executor */
	STEP_KIND_HTTP,				/* a request, sent by the HTTP worker */
	STEP_KIND_SLEEP,			/* a run's ds_sleep: its record only */
	STEP_KIND_EVENT,			/* a run's ds_await_event: its record only */
	STEP_KIND_PATCH,			/* a run's ds_patched: its answer, recorded
								 * once */
	STEP_KIND_TASK				/* application code, run by a worker outside
								 * the database (docs/tasks.md) */
} StepKind;

#define N_STEP_KINDS (STEP_KIND_TASK + 1)

typedef struct StepKindInfo
{
	const char *name;			/* as stored in durable_steps.steps.kind */
	bool		has_sql_body;	/* an attempt runs its SQL; executors claim it */

	/*
	 * The HTTP worker runs its attempts: a commit that makes one due wakes
	 * that worker, and a run that created it (ds_http) waits for its outcome
	 */
	bool		sent_by_http_worker;

	/*
	 * An attempt acts outside the database: a lost one may have taken effect,
	 * so repeating it must be safe (an idempotency key) or a person decides
	 */
	bool		acts_outside;

	/*
	 * An application worker claims its attempts (ds_claim_tasks) and records
	 * their outcomes under a lease; no executor runs or recovers them
	 */
	bool		run_by_app_worker;
} StepKindInfo;

extern const StepKindInfo ds_step_kinds[N_STEP_KINDS];

/* The kind named `name` (a stored kind column); an unknown name raises an error. */
extern StepKind ds_step_kind_from_name(const char *name);

#endif							/* DS_STEP_KIND_H */
