/*
 * durable_steps.c -- module entry point: each concern registers its own settings and hooks.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "http/http_addresses.h"
#include "http/http_request.h"
#include "base/policy.h"
#include "store/citus_commit.h"
#include "store/replay_cache.h"
#include "store/retention.h"
#include "store/role_guard.h"
#include "steps/step_attempt.h"
#include "steps/step_context.h"
#include "steps/step_exec.h"
#include "store/store_relations.h"
#include "store/step_store.h"
#include "worker/http_worker.h"
#include "worker/executor.h"
#include "worker/launcher.h"
#include "worker/worker_session.h"
#include "ipc/outcome_waits.h"
#include "ipc/due_floors.h"
#include "ipc/partitions_in_force.h"
#include "ipc/step_counters.h"
#include "ipc/worker_shmem.h"
#include "base/size_limits.h"
#include "base/partition.h"
#include "base/worker_attempt_time.h"

DS_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	ds_citus_commit_init_module();
	ds_store_init_module();
	ds_step_store_init_module();
	ds_policy_init_module();
	ds_replay_cache_init_module();
	ds_worker_attempt_time_init_module();
	ds_step_exec_init_module();
	ds_step_attempt_init_module();
	ds_step_context_init_module();
	ds_retention_init_module();
	ds_worker_session_init_module();
	ds_executor_init_module();
	ds_http_request_init_module();
	ds_http_addresses_init_module();
	ds_http_worker_init_module();
	ds_worker_shmem_init_module();
	ds_outcome_waits_init_module();
	ds_partitions_in_force_init_module();
	ds_due_floors_init_module();
	ds_step_counters_init_module();
	ds_launcher_init_module();
	ds_role_guard_init_module();
	ds_size_limits_init_module();
	ds_partition_init_module();
	MarkGUCPrefixReserved("durable_steps");
}
