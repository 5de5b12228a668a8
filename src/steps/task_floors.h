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
 * role `caller` reads, each with its floor, moved up first to the group's first waiting task
 * unless this transaction took a task out of waiting (a rollback would put it back below);
 * palloc'd in the caller's context. -1 when the registry does not hold them all, or the
 * transaction reads a snapshot of its own: then each (name, owner) is read from its start.
 */
extern int	ds_task_groups_to_read(ArrayType *tasks, Oid caller, DueTaskGroup **groups);

#endif							/* DS_TASK_FLOORS_H */
