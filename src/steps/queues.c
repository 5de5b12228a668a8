/*
 * queues.c -- ds_set_queue and the checks of queue names (docs/queues.md).
 *
 * A queue is only a name on its steps: the worker claims each batch from one queue, and a queue
 * with a row in durable_steps.queues is held to its concurrency there (step_claims.c). A step
 * may name a queue nobody configured; it then has no limit.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "steps/queues.h"
#include "store/queue_store.h"
#include "store/run_store.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"

PG_FUNCTION_INFO_V1(ds_set_queue);

char *
ds_queue_name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	char	   *name;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (name[0] == '\0' || strlen(name) > DS_MAX_QUEUE_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a queue name of 1 to %d bytes", what, DS_MAX_QUEUE_NAME)));
	return name;
}

/* A superuser, or a member of durable_steps_admin? */
static bool
is_queue_admin(void)
{
	Oid			admin = get_role_oid("durable_steps_admin", true);

	return superuser() || (OidIsValid(admin) && has_privs_of_role(GetUserId(), admin));
}

int32
ds_priority_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		priority;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("priority must not be null")));
	priority = PG_GETARG_INT32(argno);
	if (priority < 0 && !is_queue_admin())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for priority %d", priority),
				 errdetail("A priority below 0 goes before every role's steps of the queue: only superusers and members of durable_steps_admin may give one."),
				 errhint("Use 0 or more; lower numbers run first among your own steps.")));
	return priority;
}

/*
 * ds_set_queue(name, concurrency) -> void: at most `concurrency` steps of the queue run in the
 * worker at once (NULL: no limit; 0: none, the queue is paused). Members of durable_steps_admin
 * and superusers only: the limit holds back every role's steps.
 */
Datum
ds_set_queue(PG_FUNCTION_ARGS)
{
	char	   *name;
	StoreSpi	spi;

	name = ds_queue_name_arg(fcinfo, 0, "name");
	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("concurrency must be 0 or more, or NULL for no limit")));
	if (!is_queue_admin())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to set queue \"%s\"", name),
				 errdetail("Only superusers and members of durable_steps_admin may configure queues.")));
	PreventCommandIfReadOnly("ds_set_queue()");
	PreventCommandIfParallelMode("ds_set_queue()");

	ds_store_spi_begin(&spi);
	ds_store_set_queue(name, PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1), PG_ARGISNULL(1));
	ds_store_spi_end(&spi);
	/* runs whose step waits for this queue to be opened look again */
	ds_run_wake_for_queue(name);

	/*
	 * a raised limit may let due steps run now: the executors look again
	 * after the commit
	 */
	ds_worker_wake_at_commit();

	/*
	 * and the sessions waiting for tasks: the queue's tasks may be claimed
	 * now, or not
	 */
	ds_worker_wake_kind_at_commit(STEP_KIND_TASK);
	PG_RETURN_VOID();
}
