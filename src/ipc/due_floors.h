/*
 * due_floors.h -- where the claims of waiting steps begin to read, per (queue, priority) group
 * of a database (due_floors.c, docs/internals.md, "Claims under a held horizon").
 *
 * A claim reads steps_due_idx from a group's floor: no waiting step of the group that is visible
 * now, or that a transaction in flight may make visible, is due before it. Finished steps leave
 * the index as dead entries that VACUUM cannot remove while an old snapshot is held (a long
 * pg_dump, an idle transaction with an xid); the floor moves past them, so that a claim costs
 * the same with ten or a million of them.
 */
#ifndef DS_DUE_FLOORS_H
#define DS_DUE_FLOORS_H

#include "base/compat.h"
#include "datatype/timestamp.h"

/* The room for a task group's task name in the registry, its terminator included. */
#define DS_DUE_TASK_NAME_LEN 208

/* The floor of a group nothing is known of: the group is read from its start. */
#define DS_NO_FLOOR DT_NOBEGIN

/*
 * The group of the runs' turns (runs_due_idx): a queue name no step has (a queue is named by 1
 * byte or more), at priority 0.
 */
#define DS_RUNS_GROUP ""

/* From _PG_init: the shared registry of groups and floors. */
extern void ds_due_floors_init_module(void);

/*
 * This transaction is about to make a step of group (queue, priority) wait (pending, retrying)
 * with next_attempt_at `t`. Called before the row is written, by every writer of a waiting step
 * (step_store.c): until the transaction ends, no floor of the database passes `t`.
 */
extern void ds_due_floor_note_waiting(const char *queue, int32 priority, TimestampTz t);

/* The same for a task of name `task` and owner `owner`: its group is (task, owner, priority). */
extern void ds_due_floor_note_waiting_task(const char *task, Oid owner, int32 priority,
										   TimestampTz t);

/*
 * A SQL statement not of the extension's own wrote steps (the statement trigger
 * steps_note_writes): any group, any time. Until the transaction ends no floor moves, and after
 * it every group of the database is read from its start and found again.
 */
extern void ds_due_floor_note_sql_write(void);

/*
 * This transaction takes a task out of the waiting states (a claim, a cancel, an outcome): until
 * it ends, its task looks refuse (ds_due_task_floor_look), since a rollback would put the task
 * back below a floor its look raised.
 */
extern void ds_due_floor_note_task_left_waiting(void);

/* The extension's own next SQL statement on steps is noted by its caller, not by the trigger. */
extern void ds_due_floor_own_statement(bool on);

/* A group with its floor, as the registry knows it. */
typedef struct DueGroup
{
	char		queue[NAMEDATALEN];
	int32		priority;
	TimestampTz floor;
} DueGroup;

/* qsort order of DueGroups: queue by bytes (C collation), then priority. */
extern int	ds_due_group_compare(const void *a, const void *b);

/*
 * The groups of this database known to have had waiting steps since the server started, in
 * (queue by bytes, priority) order, with their floors; false when the registry does not know
 * them all (after a start, after a SQL write): the caller finds them (ds_due_groups_found).
 */
extern bool ds_due_groups_known(DueGroup **groups, int *n);

/* A generation of the registry, read before the groups are found by a query. */
extern uint64 ds_due_groups_generation(void);

/*
 * The groups a query found (waiting steps of every group of this database, read when the
 * generation was `gen`): registered, and the registry then knows them all unless a SQL write
 * came since. Their floors are returned in `groups` (DS_NO_FLOOR for those it cannot hold).
 */
extern void ds_due_groups_found(DueGroup *groups, int n, uint64 gen);

/* The floor of group (queue, priority) of this database; DS_NO_FLOOR when unknown. */
extern TimestampTz ds_due_floor(const char *queue, int32 priority);

/* What a claim read before it looked for a group's first waiting step (ds_due_floor_raise). */
typedef struct DueFloorLook
{
	int			slot;			/* in the registry; -1: none */
	TimestampTz floor;
	uint64		generation;
	TimestampTz bound;			/* no floor may pass it: writers in flight,
								 * the clock */
} DueFloorLook;

/*
 * Before a look for the first waiting step of group (queue, priority) from its floor: the floor
 * and what bounds the next one. The look must take its snapshot after this call, in a
 * transaction that has made no step of the group leave the waiting states. False when the
 * registry does not hold the group.
 */
extern bool ds_due_floor_look(const char *queue, int32 priority, DueFloorLook *look);

/*
 * The groups of tasks: a task name, an owner, a priority. Each is a range of steps_task_due_idx
 * (task, owner, priority, next_attempt_at) with a floor of its own, kept like a step group's.
 */
typedef struct DueTaskGroup
{
	char		task[DS_DUE_TASK_NAME_LEN];
	Oid			owner;
	int32		priority;
	TimestampTz floor;
} DueTaskGroup;

/*
 * The task groups of this database whose task is one of names[0..n_names-1], known to have had
 * waiting tasks since the server started, with their floors, in no order; false when the
 * registry does not know them all: the caller finds them (ds_due_task_groups_found, with a
 * generation read before its query).
 */
extern bool ds_due_task_groups_known(char *const *names, int n_names, DueTaskGroup **groups,
									 int *n);
extern void ds_due_task_groups_found(DueTaskGroup *groups, int n, uint64 gen);

/*
 * ds_due_floor_look and ds_due_floor for a task group; the look is refused (false) once this
 * transaction has taken a task out of the waiting states.
 */
extern bool ds_due_task_floor_look(const DueTaskGroup *group, DueFloorLook *look);
extern TimestampTz ds_due_task_floor(const DueTaskGroup *group);

/*
 * After the look: its first waiting step was due at `first` (DT_NOEND: none). The floor moves up
 * to it, and no further than the look's bound, unless a writer lowered a floor meanwhile.
 */
extern void ds_due_floor_raise(const DueFloorLook *look, TimestampTz first);

/*
 * While a transaction that wrote steps may be prepared and not yet committed in this database,
 * no floor of it moves: ds_due_floors_prepared says so with a generation (0: none), and once the
 * caller has seen that no transaction of the database is prepared any more,
 * ds_due_floors_prepared_gone with that generation reads every group from its start again.
 */
extern uint64 ds_due_floors_prepared(void);
extern void ds_due_floors_prepared_gone(uint64 gen);

#endif							/* DS_DUE_FLOORS_H */
