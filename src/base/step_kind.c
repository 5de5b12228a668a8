/*
 * step_kind.c -- the table of step kinds (step_kind.h).
 */
#include "base/compat.h"

#include "base/step_kind.h"

const StepKindInfo ds_step_kinds[N_STEP_KINDS] = {
	[STEP_KIND_SQL] = {.name = "sql",.has_sql_body = true},
	[STEP_KIND_HTTP] = {.name = "http",.sent_by_http_worker = true,.acts_outside = true},
	[STEP_KIND_SLEEP] = {.name = "sleep"},
	[STEP_KIND_EVENT] = {.name = "event"},
	[STEP_KIND_PATCH] = {.name = "patch"},
	[STEP_KIND_TASK] = {.name = "task",.acts_outside = true,.run_by_app_worker = true},
};

StepKind
ds_step_kind_from_name(const char *name)
{
	for (int k = 0; k < N_STEP_KINDS; k++)
		if (name != NULL && strcmp(ds_step_kinds[k].name, name) == 0)
			return (StepKind) k;
	elog(ERROR, "durable_steps.steps holds a step of unknown kind \"%s\"", name ? name : "(null)");
	pg_unreachable();
}
