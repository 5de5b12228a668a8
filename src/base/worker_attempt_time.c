/*
 * worker_attempt_time.c -- how long an attempt may run in the background worker
 * (worker_attempt_time.h).
 */
#include "base/compat.h"

#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/worker_attempt_time.h"

static int	max_worker_attempt_time_s = 3600;
static int	default_timeout_s = 300;

int64
ds_max_worker_attempt_usecs(void)
{
	return (int64) max_worker_attempt_time_s * USECS_PER_SEC;
}

int64
ds_worker_attempt_limit_usecs(int64 step_timeout)
{
	int64		limit = step_timeout > 0 ? step_timeout : (int64) default_timeout_s * USECS_PER_SEC;

	return Min(limit, ds_max_worker_attempt_usecs());
}

void
ds_worker_attempt_time_init_module(void)
{
	DefineCustomIntVariable("durable_steps.max_worker_attempt_time",
							"Longest time any attempt may run in the background worker.",
							"Applies whatever timeout the step asks for; an attempt past it is stopped and recorded as timed out.",
							&max_worker_attempt_time_s,
							3600,
							1,
							24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("durable_steps.default_timeout",
							"Timeout of worker attempts whose step sets none.",
							"A step's own timeout applies instead; durable_steps.max_worker_attempt_time bounds both.",
							&default_timeout_s,
							300,
							1,
							24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}
