/*
 * task_floors.c -- the floors of the task groups, for the claims and the waits of application
 * workers (task_floors.h).
 *
 * A task that finishes leaves steps_task_due_idx, and its entry stays there until VACUUM can
 * remove its old row version: under an old snapshot, a claim that read its (task, owner) range
 * from the start would read every task finished since. Each (task, owner, priority) is a group of
 * the floors' registry instead (ipc/due_floors.h), kept as a step group is: every writer of a
 * waiting task notes it (step_store.c), and the reads here start at the floors.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "store/step_claim_store.h"
#include "store/step_store.h"
#include "store/task_store.h"
#include "steps/task_args.h"
#include "steps/task_floors.h"

StaticAssertDecl(DS_MAX_TASK_NAME < DS_DUE_TASK_NAME_LEN,
				 "the floors' registry holds every task name");

/*
 * Every task group with waiting tasks, found by a walk of steps_task_due_idx, for the registry
 * to hold from now on.
 */
static void
find_groups(void)
{
	uint64		gen = ds_due_groups_generation();
	int			n = (int) ds_store_waiting_task_groups();
	DueTaskGroup *groups = palloc0(sizeof(DueTaskGroup) * Max(n, 1));
	int			k = 0;

	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		char	   *task = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		/*
		 * a name longer than a claim may ask for (only SQL of others writes
		 * one) is never claimed: its group need not be held
		 */
		if (strlen(task) > DS_MAX_TASK_NAME)
			continue;
		strlcpy(groups[k].task, task, DS_DUE_TASK_NAME_LEN);
		groups[k].owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 2, &isnull));
		groups[k].priority = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 3, &isnull));
		k++;
	}
	ds_due_task_groups_found(groups, k, gen);
}

/* ds_task_groups_to_read, inside its SPI connection; `out` in `cxt`. */
static int
groups_to_read(ArrayType *tasks, Oid caller, MemoryContext cxt, DueTaskGroup **out)
{
	DueTaskGroup *all;
	DueTaskGroup *groups;
	DueFloorLook *looks;
	TimestampTz *bounds;
	TimestampTz *first;
	int			n_all;
	int			n = 0;
	int			n_looks = 0;
	Datum	   *elems;
	int			n_names;
	char	  **names;
	uint64		prepared;

	/*
	 * the looks and the walk read the latest snapshot's rows: a wait in a
	 * transaction with a snapshot of its own reads every group from its start
	 */
	if (IsolationUsesXactSnapshot())
		return -1;
	deconstruct_array(tasks, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &n_names);
	names = palloc(sizeof(char *) * Max(n_names, 1));
	for (int i = 0; i < n_names; i++)
		names[i] = TextDatumGetCString(elems[i]);
	if (!ds_due_task_groups_known(names, n_names, &all, &n_all))
	{
		/*
		 * this read starts at the groups' starts; the next ones at their
		 * floors
		 */
		find_groups();
		return -1;
	}

	/*
	 * while a prepared transaction that wrote steps may be in flight, no
	 * floor moves; once none is, they go back to their start
	 */
	prepared = ds_due_floors_prepared();
	if (prepared != 0 && !ds_store_prepared_transactions())
		ds_due_floors_prepared_gone(prepared);

	/*
	 * the groups of the names asked for, of the roles whose tasks the caller
	 * may run
	 */
	for (int i = 0; i < n_all; i++)
		if (has_privs_of_role(caller, all[i].owner))
			all[n++] = all[i];
	groups = MemoryContextAlloc(cxt, sizeof(DueTaskGroup) * Max(n, 1));
	memcpy(groups, all, sizeof(DueTaskGroup) * n);
	looks = palloc(sizeof(DueFloorLook) * Max(n, 1));

	/* the looks, then one statement whose snapshot is later than all of them */
	for (int i = 0; i < n; i++)
		if (ds_due_task_floor_look(&groups[i], &looks[n_looks]))
		{
			DueTaskGroup g = groups[i];

			/* the groups looked at first, in the order of their looks */
			groups[i] = groups[n_looks];
			groups[n_looks] = g;
			groups[n_looks].floor = looks[n_looks].floor;
			n_looks++;
		}
	bounds = palloc(sizeof(TimestampTz) * Max(n_looks, 1));
	first = palloc(sizeof(TimestampTz) * Max(n_looks, 1));
	for (int i = 0; i < n_looks; i++)
		bounds[i] = looks[i].bound;
	if (n_looks > 0)
		ds_store_first_waiting_tasks(groups, bounds, n_looks, first);
	for (int i = 0; i < n_looks; i++)
		ds_due_floor_raise(&looks[i], first[i]);

	/* the reads start at the floors as raised (each read's snapshot is later) */
	for (int i = 0; i < n; i++)
		groups[i].floor = ds_due_task_floor(&groups[i]);
	*out = groups;
	return n;
}

int
ds_task_groups_to_read(ArrayType *tasks, Oid caller, DueTaskGroup **groups)
{
	StoreSpi	spi;
	int			n;

	ds_store_spi_begin(&spi);
	n = groups_to_read(tasks, caller, spi.caller_cxt, groups);
	ds_store_spi_end(&spi);
	return n;
}
