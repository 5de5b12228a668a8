/*
 * durable_steps.c -- module entry point: each concern registers its own settings and hooks.
 */
#include "compat.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "http_request.h"
#include "policy.h"
#include "replay_cache.h"
#include "retention.h"
#include "role_guard.h"
#include "step_attempt.h"
#include "step_context.h"
#include "step_exec.h"
#include "store.h"
#include "worker.h"
#include "worker_wakeup.h"
#include "size_limits.h"

DS_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	ds_store_init_module();
	ds_policy_init_module();
	ds_replay_cache_init_module();
	ds_step_exec_init_module();
	ds_step_attempt_init_module();
	ds_step_context_init_module();
	ds_retention_init_module();
	ds_executor_init_module();
	ds_http_request_init_module();
	ds_http_worker_init_module();
	ds_worker_shmem_init_module();
	ds_launcher_init_module();
	ds_role_guard_init_module();
	ds_size_limits_init_module();
	MarkGUCPrefixReserved("durable_steps");
}
