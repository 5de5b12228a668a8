/*
 * task_floors.h -- where the claims and the waits of application workers begin to read the
 * waiting tasks (task_floors.c, docs/internals.md, "Claims under a held horizon").
 */
#ifndef DS_TASK_FLOORS_H
#define DS_TASK_FLOORS_H

#include "base/compat.h"
#include "utils/array.h"

#include "ipc/due_floors.h"

/*
 * The task groups (name, owner, priority) that a claim or a wait for the names in `tasks` by
 * role `caller` reads, each with its floor, moved up first to the group's first waiting task;
 * -1 when the registry does not hold them all, and then each (name, owner) is read from its
 * start. Before this transaction has claimed any task: a claim it then rolled back would put its
 * tasks back below a floor.
 */
extern int	ds_task_groups_to_read(ArrayType *tasks, Oid caller, DueTaskGroup **groups);

#endif							/* DS_TASK_FLOORS_H */
