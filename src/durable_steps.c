/*
 * durable_steps.c -- module entry point: each concern registers its own settings and hooks.
 */
#include "compat.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "policy.h"
#include "replay_cache.h"
#include "retention.h"
#include "role_guard.h"
#include "step_context.h"
#include "step_exec.h"
#include "worker.h"
#include "worker_wakeup.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	policy_init_module();
	replay_cache_init_module();
	step_exec_init_module();
	step_context_init_module();
	retention_init_module();
	executor_init_module();
	worker_shmem_init_module();
	launcher_init_module();
	role_guard_init_module();
	MarkGUCPrefixReserved("durable_steps");
}
