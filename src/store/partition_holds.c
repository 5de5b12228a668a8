/*
 * partition_holds.c -- what ds_partition_export holds while it reads a fenced partition
 * (docs/partitions.md, "Moving a partition").
 *
 * An export must read a partition that nothing changes any more: no attempt or turn still in
 * flight whose outcome would be recorded here after the rows left for another server, where the
 * step would then run again. A worker's attempt and a run's turn hold their identity's lock from
 * the claim's commit to the outcome's commit (step_lock.c), so the export takes each running
 * identity's lock, without waiting, until it commits: taken, nothing runs it (its executor is
 * gone, and the new owner records the attempt as lost); not taken, it is still running, and the
 * export refuses rather than copy a state that is about to change.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "store/step_lock.h"

PG_FUNCTION_INFO_V1(ds_partition_hold_step);

/*
 * durable_steps.ds_partition_hold_step(run_id, step_id) -> boolean: the identity's lock, taken
 * to the end of the transaction without waiting; false when an attempt (step_id '': a turn) holds
 * it.
 */
Datum
ds_partition_hold_step(PG_FUNCTION_ARGS)
{
	char	   *run_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *step_id = text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_BOOL(ds_step_lock_acquire(run_id, step_id, true));
}
