/*
 * due_floors.c -- where the claims of waiting steps begin to read (due_floors.h).
 *
 * A step that finishes leaves steps_due_idx: its row's new version is in no entry, and its old
 * entry stays until VACUUM removes the old version -- which it cannot do while any snapshot older
 * than the finish is held. Claims read the index in next_attempt_at order, so those entries come
 * first: under an idle transaction with an xid held for five minutes, every claim read every step
 * finished since. Each group (queue, priority) of a database has here a floor instead, and every
 * read of the group starts at it (step_claim_store.c): the claims never walk the finished steps
 * before it, however many an old snapshot keeps.
 *
 * The floor must never pass a waiting step that a claim could miss. It moves up only to what a
 * look found (ds_due_floor_look, ds_due_floor_raise): the group's first waiting step in a snapshot
 * taken after the look began, and no further than
 *  - the clock when the look began, less a quarter second, which the look says (last_look)
 *    before it reads the writer slots: a writer that publishes after they were read sees that
 *    time, and a step it makes due before it (not one due now: the margin) lowers the group's
 *    floor itself, under the lock, and voids the group's raises in flight (`lowered`);
 *  - the earliest time any transaction in flight may make a step of the database wait with
 *    (its writer slot, published before its row is written and cleared once its commit is
 *    visible): such a step is invisible to the look.
 * A look's own transaction must not have taken steps of the group out of waiting (a claim that
 * rolls back would return them below the floor): claims look first (step_claims.c).
 * SQL written by others (a restore, a partition import, an operator's UPDATE) may write any
 * group: its transaction holds every floor of the database where it is until it ends, and then
 * every floor goes back to the start and the groups are found again by a query.
 * A prepared transaction's steps become visible when it is committed, by any session: while one
 * that wrote steps is prepared, no floor of its database moves.
 *
 * Tasks wait in an index of their own, steps_task_due_idx (task, owner, priority,
 * next_attempt_at): each (task, owner, priority) is a group with a floor of its own, kept the same
 * way, for the claims and the waits of the application workers (steps/task_floors.c).
 *
 * The registry holds DUE_GROUPS groups; past that, claims find the groups by a query each time
 * and read those it does not hold from their start, as before there were floors.
 */
#include "base/compat.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "ipc/due_floors.h"

/*
 * How far behind the clock a floor stays: a writer's due time, read a moment before it publishes
 * it, is then never below a look's, and the common write takes no lock.
 */
#define FLOOR_MARGIN_USECS (250 * 1000)

/*
 * Groups the registry holds; a power of two (open addressing). The task groups (a task name, an
 * owner, a priority) share it with the step groups.
 */
#define DUE_GROUPS 2048
#define DUE_DATABASES 64

typedef struct SharedGroup
{
	pg_atomic_uint32 dboid;		/* InvalidOid: free; set last, never reset */
	int32		priority;
	Oid			owner;			/* a task group's owner; InvalidOid: a step
								 * group */
	char		queue[DS_DUE_TASK_NAME_LEN];	/* a step group's queue, a
												 * task group's task name */
	TimestampTz floor;			/* under the lock */
	uint64		lowered;		/* under the lock: moves when a writer may
								 * have made a step wait below a look's clock,
								 * which voids the raises in flight */
} SharedGroup;

typedef struct SharedDatabase
{
	Oid			dboid;
	bool		complete;		/* every group with waiting steps is held */
	bool		tasks_complete; /* every task group with waiting tasks is held */
	int			prepared;		/* prepared transactions that wrote steps may
								 * be in flight */
	int			preparing;		/* transactions between their PRE_PREPARE and
								 * their end */
	uint64		prepared_generation;
} SharedDatabase;

/* A backend's transaction in flight: the earliest time it may make a step wait with. */
typedef struct WriterSlot
{
	pg_atomic_uint32 dboid;
	pg_atomic_uint64 bound;		/* a TimestampTz; DT_NOEND: none */
} WriterSlot;

typedef struct DueFloors
{
	LWLock	   *lock;
	uint64		generation;		/* moves when a database's groups are to be
								 * found again (reset_database) */
	pg_atomic_uint64 last_look; /* the latest clock a look began at (a
								 * TimestampTz) */
	bool		overflow;
	SharedDatabase dbs[DUE_DATABASES];
	SharedGroup groups[DUE_GROUPS];
	int			n_slots;
	WriterSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} DueFloors;

static DueFloors *floors = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* this backend's transaction */
static TimestampTz my_bound = DT_NOEND;
static bool my_sql_write = false;
static bool my_task_left_waiting = false;
static bool own_statement = false;
static bool preparing = false;
static bool callback_registered = false;

static int
slot_count(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts + 1;
}

static Size
floors_size(void)
{
	return add_size(offsetof(DueFloors, slots), mul_size(slot_count(), sizeof(WriterSlot)));
}

static void
floors_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(floors_size()));
	RequestNamedLWLockTranche("durable_steps due floors", 1);
}

static void
floors_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	floors = ShmemInitStruct("durable_steps due floors", floors_size(), &found);
	if (!found)
	{
		memset(floors, 0, floors_size());
		floors->lock = &(GetNamedLWLockTranche("durable_steps due floors"))->lock;
		pg_atomic_init_u64(&floors->last_look, (uint64) DT_NOBEGIN);
		for (int i = 0; i < DUE_GROUPS; i++)
			pg_atomic_init_u32(&floors->groups[i].dboid, InvalidOid);
		floors->n_slots = slot_count();
		for (int i = 0; i < floors->n_slots; i++)
		{
			pg_atomic_init_u32(&floors->slots[i].dboid, InvalidOid);
			pg_atomic_init_u64(&floors->slots[i].bound, (uint64) DT_NOEND);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

void
ds_due_floors_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = floors_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = floors_shmem_startup;
}

/* This backend's writer slot; NULL in a process without one. */
static WriterSlot *
my_slot(void)
{
	int			n = MyProc != NULL ? (int) DS_MY_PROC_NUMBER : -1;

	return n >= 0 && n < floors->n_slots ? &floors->slots[n] : NULL;
}

/* Under the lock: the database's record, added when `add`; NULL when full or not there. */
static SharedDatabase *
find_database(Oid dboid, bool add)
{
	SharedDatabase *free_db = NULL;

	for (int i = 0; i < DUE_DATABASES; i++)
	{
		if (floors->dbs[i].dboid == dboid)
			return &floors->dbs[i];
		if (floors->dbs[i].dboid == InvalidOid && free_db == NULL)
			free_db = &floors->dbs[i];
	}
	if (add && free_db != NULL)
	{
		memset(free_db, 0, sizeof(*free_db));
		free_db->dboid = dboid;
	}
	return add ? free_db : NULL;
}

static uint32
group_hash(Oid dboid, Oid owner, const char *queue, int32 priority)
{
	uint32		h = hash_bytes((const unsigned char *) queue, (int) strlen(queue));

	h = hash_combine(h, murmurhash32(owner));
	return hash_combine(hash_combine(h, murmurhash32((uint32) priority)), murmurhash32(dboid));
}

/*
 * The registry's group, added when `add` (taking the lock unless `locked`); NULL when it is not
 * held. Entries are filled once and never emptied, so a lookup needs no lock.
 */
static SharedGroup *
find_group(Oid dboid, Oid owner, const char *queue, int32 priority, bool add, bool locked)
{
	uint32		start = group_hash(dboid, owner, queue, priority) & (DUE_GROUPS - 1);

	/* a step group's queue is a name (DueGroup), a task group's a task name */
	if (strlen(queue) >= (owner == InvalidOid ? NAMEDATALEN : DS_DUE_TASK_NAME_LEN))
		return NULL;
	for (int k = 0; k < DUE_GROUPS; k++)
	{
		SharedGroup *g = &floors->groups[(start + k) & (DUE_GROUPS - 1)];
		Oid			d = pg_atomic_read_u32(&g->dboid);

		if (d == InvalidOid)
		{
			bool		filled;

			if (!add)
				return NULL;
			if (!locked)
				LWLockAcquire(floors->lock, LW_EXCLUSIVE);
			/* another may have filled it since */
			filled = pg_atomic_read_u32(&g->dboid) != InvalidOid;
			if (!filled)
			{
				g->priority = priority;
				g->owner = owner;
				strlcpy(g->queue, queue, DS_DUE_TASK_NAME_LEN);
				g->floor = DS_NO_FLOOR;
				pg_write_barrier();
				pg_atomic_write_u32(&g->dboid, dboid);
			}
			if (!locked)
				LWLockRelease(floors->lock);
			if (!filled)
				return g;
			d = pg_atomic_read_u32(&g->dboid);
		}
		pg_read_barrier();
		if (d == dboid && g->priority == priority && g->owner == owner &&
			strcmp(g->queue, queue) == 0)
			return g;
	}
	if (add)
	{
		if (!locked)
			LWLockAcquire(floors->lock, LW_EXCLUSIVE);
		if (!floors->overflow)
			ereport(LOG,
					(errmsg("durable_steps: more than %d groups of queue and priority or of task, owner and priority have waited; claims read the groups past them from their start",
							DUE_GROUPS)));
		floors->overflow = true;
		if (!locked)
			LWLockRelease(floors->lock);
	}
	return NULL;
}

/* Under the exclusive lock: every group of the database is read from its start, and found again. */
static void
reset_database(Oid dboid)
{
	SharedDatabase *db = find_database(dboid, false);

	if (db != NULL)
	{
		db->complete = false;
		db->tasks_complete = false;
	}
	for (int i = 0; i < DUE_GROUPS; i++)
		if (pg_atomic_read_u32(&floors->groups[i].dboid) == dboid)
		{
			floors->groups[i].floor = DS_NO_FLOOR;
			floors->groups[i].lowered++;
		}
	floors->generation++;
}

/* Transaction callback: what this transaction held back is let go once its end is visible. */
static void
floors_at_end_of_xact(XactEvent event, void *arg)
{
	WriterSlot *slot;

	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PARALLEL_PRE_COMMIT)
		return;
	if (event == XACT_EVENT_PRE_PREPARE)
	{
		/* its steps are visible only when it is committed, by any session */
		if (my_bound != DT_NOEND)
		{
			SharedDatabase *db;

			LWLockAcquire(floors->lock, LW_EXCLUSIVE);
			db = find_database(MyDatabaseId, true);
			if (db != NULL)
			{
				db->prepared++;
				db->preparing++;
				db->prepared_generation++;
				preparing = true;
			}
			else
				floors->overflow = true;
			LWLockRelease(floors->lock);
		}
		return;
	}
	if (preparing)
	{
		SharedDatabase *db;

		LWLockAcquire(floors->lock, LW_EXCLUSIVE);
		db = find_database(MyDatabaseId, false);
		if (db != NULL)
		{
			db->preparing--;
			db->prepared_generation++;
		}
		LWLockRelease(floors->lock);
		preparing = false;
	}
	if (my_sql_write)
	{
		LWLockAcquire(floors->lock, LW_EXCLUSIVE);
		reset_database(MyDatabaseId);
		LWLockRelease(floors->lock);
	}
	slot = my_slot();
	if (slot != NULL && my_bound != DT_NOEND)
		pg_atomic_write_u64(&slot->bound, (uint64) DT_NOEND);
	my_bound = DT_NOEND;
	my_sql_write = false;
	my_task_left_waiting = false;
	own_statement = false;
}

/* Publish `t` as the earliest this transaction may make a step wait with. */
static void
publish_bound(TimestampTz t)
{
	WriterSlot *slot;

	if (!callback_registered)
	{
		RegisterXactCallback(floors_at_end_of_xact, NULL);
		callback_registered = true;
	}
	if (t >= my_bound)
		return;
	slot = my_slot();
	if (slot == NULL)
		elog(ERROR, "durable_steps: process %d has no writer slot", MyProcPid);
	my_bound = t;
	pg_atomic_write_u32(&slot->dboid, MyDatabaseId);
	pg_write_barrier();
	pg_atomic_write_u64(&slot->bound, (uint64) t);
	pg_memory_barrier();
}

static void
note_waiting(Oid owner, const char *queue, int32 priority, TimestampTz t)
{
	SharedGroup *g;

	if (floors == NULL || t == 0)
		return;
	publish_bound(t);
	g = find_group(MyDatabaseId, owner, queue, priority, true, false);

	/*
	 * A look that read the slots before the bound was published has said when
	 * it began, before it read them (ds_due_floor_look): either it saw the
	 * bound, or this sees its clock. A step due before that clock may be
	 * passed by its raise: the floor goes down to it, and the raise is
	 * voided.
	 */
	if (g != NULL && t < (TimestampTz) pg_atomic_read_u64(&floors->last_look))
	{
		LWLockAcquire(floors->lock, LW_EXCLUSIVE);
		if (t < g->floor)
			g->floor = t;
		g->lowered++;
		LWLockRelease(floors->lock);
	}
}

void
ds_due_floor_note_waiting(const char *queue, int32 priority, TimestampTz t)
{
	note_waiting(InvalidOid, queue, priority, t);
}

void
ds_due_floor_note_waiting_task(const char *task, Oid owner, int32 priority, TimestampTz t)
{
	note_waiting(owner, task, priority, t);
}

void
ds_due_floor_note_task_left_waiting(void)
{
	if (floors == NULL)
		return;
	/* registered for the reset at the transaction's end */
	if (!callback_registered)
	{
		RegisterXactCallback(floors_at_end_of_xact, NULL);
		callback_registered = true;
	}
	my_task_left_waiting = true;
}

void
ds_due_floor_note_sql_write(void)
{
	if (floors == NULL)
		return;
	publish_bound(DS_NO_FLOOR);
	my_sql_write = true;
}

void
ds_due_floor_own_statement(bool on)
{
	own_statement = on;
}

int
ds_due_group_compare(const void *a, const void *b)
{
	const DueGroup *x = a;
	const DueGroup *y = b;
	int			c = strcmp(x->queue, y->queue);

	if (c != 0)
		return c;
	return x->priority < y->priority ? -1 : x->priority > y->priority ? 1 : 0;
}

/* Under the lock: does the registry hold every group of this database, of steps or of tasks? */
static bool
all_held(bool tasks)
{
	SharedDatabase *db = find_database(MyDatabaseId, false);

	return !floors->overflow && db != NULL && (tasks ? db->tasks_complete : db->complete);
}

static bool sql_writer_in_flight(void);

/*
 * Under the exclusive lock, after a walk (read when the generation was `gen`) found this
 * database's groups of steps or of tasks, and `held` says whether the registry holds each: from
 * now on it knows them all, unless a SQL write came since or is in flight.
 */
static void
found_all(bool tasks, bool held, uint64 gen)
{
	SharedDatabase *db = find_database(MyDatabaseId, true);

	if (db == NULL || !held || floors->overflow || floors->generation != gen ||
		sql_writer_in_flight())
		return;
	if (tasks)
		db->tasks_complete = true;
	else
		db->complete = true;
}

bool
ds_due_groups_known(DueGroup **groups, int *n)
{
	DueGroup   *out;
	int			k = 0;

	*groups = NULL;
	*n = 0;
	if (floors == NULL)
		return false;
	out = palloc(sizeof(DueGroup) * DUE_GROUPS);
	LWLockAcquire(floors->lock, LW_SHARED);
	if (!all_held(false))
	{
		LWLockRelease(floors->lock);
		pfree(out);
		return false;
	}
	for (int i = 0; i < DUE_GROUPS; i++)
	{
		SharedGroup *g = &floors->groups[i];

		if (pg_atomic_read_u32(&g->dboid) != MyDatabaseId || g->owner != InvalidOid)
			continue;
		memcpy(out[k].queue, g->queue, NAMEDATALEN);
		out[k].priority = g->priority;
		out[k].floor = g->floor;
		k++;
	}
	LWLockRelease(floors->lock);
	qsort(out, k, sizeof(DueGroup), ds_due_group_compare);
	*groups = out;
	*n = k;
	return true;
}

uint64
ds_due_groups_generation(void)
{
	uint64		gen;

	if (floors == NULL)
		return 0;
	LWLockAcquire(floors->lock, LW_SHARED);
	gen = floors->generation;
	LWLockRelease(floors->lock);
	return gen;
}

/* Is a transaction of SQL writes to steps of this database in flight? */
static bool
sql_writer_in_flight(void)
{
	for (int i = 0; i < floors->n_slots; i++)
	{
		WriterSlot *s = &floors->slots[i];
		TimestampTz b = (TimestampTz) pg_atomic_read_u64(&s->bound);

		pg_read_barrier();
		if (b == DS_NO_FLOOR && pg_atomic_read_u32(&s->dboid) == MyDatabaseId)
			return true;
	}
	return false;
}

void
ds_due_groups_found(DueGroup *groups, int n, uint64 gen)
{
	bool		held = true;

	if (floors == NULL)
	{
		for (int i = 0; i < n; i++)
			groups[i].floor = DS_NO_FLOOR;
		return;
	}
	pg_memory_barrier();
	LWLockAcquire(floors->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		SharedGroup *g = find_group(MyDatabaseId, InvalidOid, groups[i].queue, groups[i].priority,
									true, true);

		groups[i].floor = g != NULL ? g->floor : DS_NO_FLOOR;
		held &= g != NULL;
	}
	found_all(false, held, gen);
	LWLockRelease(floors->lock);
}

bool
ds_due_task_groups_known(char *const *names, int n_names, DueTaskGroup **groups, int *n)
{
	DueTaskGroup *out;
	int			room = 8;
	int			k = 0;

	*groups = NULL;
	*n = 0;
	if (floors == NULL)
		return false;

	/*
	 * a claim's few groups, not the registry's size: this is every claim's
	 * path
	 */
	out = palloc(sizeof(DueTaskGroup) * room);
	LWLockAcquire(floors->lock, LW_SHARED);
	if (!all_held(true))
	{
		LWLockRelease(floors->lock);
		pfree(out);
		return false;
	}
	for (int i = 0; i < DUE_GROUPS; i++)
	{
		SharedGroup *g = &floors->groups[i];

		bool		named = false;

		if (pg_atomic_read_u32(&g->dboid) != MyDatabaseId || g->owner == InvalidOid)
			continue;
		for (int j = 0; j < n_names && !named; j++)
			named = strcmp(g->queue, names[j]) == 0;
		if (!named)
			continue;
		if (k == room)
		{
			room *= 2;
			out = repalloc(out, sizeof(DueTaskGroup) * room);
		}
		memcpy(out[k].task, g->queue, DS_DUE_TASK_NAME_LEN);
		out[k].owner = g->owner;
		out[k].priority = g->priority;
		out[k].floor = g->floor;
		k++;
	}
	LWLockRelease(floors->lock);
	*groups = out;
	*n = k;
	return true;
}

void
ds_due_task_groups_found(DueTaskGroup *groups, int n, uint64 gen)
{
	bool		held = true;

	if (floors == NULL)
	{
		for (int i = 0; i < n; i++)
			groups[i].floor = DS_NO_FLOOR;
		return;
	}
	pg_memory_barrier();
	LWLockAcquire(floors->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		SharedGroup *g = find_group(MyDatabaseId, groups[i].owner, groups[i].task,
									groups[i].priority, true, true);

		groups[i].floor = g != NULL ? g->floor : DS_NO_FLOOR;
		held &= g != NULL;
	}
	found_all(true, held, gen);
	LWLockRelease(floors->lock);
}

TimestampTz
ds_due_task_floor(const DueTaskGroup *group)
{
	SharedGroup *g;
	TimestampTz floor;

	if (floors == NULL)
		return DS_NO_FLOOR;
	g = find_group(MyDatabaseId, group->owner, group->task, group->priority, false, false);
	if (g == NULL)
		return DS_NO_FLOOR;
	LWLockAcquire(floors->lock, LW_SHARED);
	floor = g->floor;
	LWLockRelease(floors->lock);
	return floor;
}

TimestampTz
ds_due_floor(const char *queue, int32 priority)
{
	SharedGroup *g;
	TimestampTz floor;

	if (floors == NULL)
		return DS_NO_FLOOR;
	g = find_group(MyDatabaseId, InvalidOid, queue, priority, false, false);
	if (g == NULL)
		return DS_NO_FLOOR;
	LWLockAcquire(floors->lock, LW_SHARED);
	floor = g->floor;
	LWLockRelease(floors->lock);
	return floor;
}

static bool
floor_look(Oid owner, const char *queue, int32 priority, DueFloorLook *look)
{
	SharedGroup *g;
	SharedDatabase *db;
	WriterSlot *mine;
	bool		prepared;

	look->slot = -1;
	if (floors == NULL)
		return false;
	g = find_group(MyDatabaseId, owner, queue, priority, false, false);
	if (g == NULL)
		return false;
	LWLockAcquire(floors->lock, LW_SHARED);
	db = find_database(MyDatabaseId, false);
	prepared = db != NULL && db->prepared > 0;
	look->floor = g->floor;
	look->generation = g->lowered;
	LWLockRelease(floors->lock);
	if (prepared)
		return false;
	look->slot = (int) (g - floors->groups);

	/*
	 * The clock first, less a margin, said before the slots are read: a
	 * writer that publishes after they are read sees it
	 * (ds_due_floor_note_waiting), and one that makes a step due now, as most
	 * do, is not below it.
	 */
	look->bound = GetCurrentTimestamp() - FLOOR_MARGIN_USECS;
	for (;;)
	{
		uint64		last = pg_atomic_read_u64(&floors->last_look);

		if ((TimestampTz) last >= look->bound ||
			pg_atomic_compare_exchange_u64(&floors->last_look, &last, (uint64) look->bound))
			break;
	}
	pg_memory_barrier();
	mine = my_slot();
	for (int i = 0; i < floors->n_slots; i++)
	{
		WriterSlot *s = &floors->slots[i];
		TimestampTz b;

		if (s == mine)
			continue;			/* this transaction's own steps are visible to
								 * its look */
		b = (TimestampTz) pg_atomic_read_u64(&s->bound);
		pg_read_barrier();
		if (b < look->bound && pg_atomic_read_u32(&s->dboid) == MyDatabaseId)
			look->bound = b;
	}
	return true;
}

bool
ds_due_floor_look(const char *queue, int32 priority, DueFloorLook *look)
{
	return floor_look(InvalidOid, queue, priority, look);
}

bool
ds_due_task_floor_look(const DueTaskGroup *group, DueFloorLook *look)
{
	look->slot = -1;
	if (my_task_left_waiting)
		return false;
	return floor_look(group->owner, group->task, group->priority, look);
}

void
ds_due_floor_raise(const DueFloorLook *look, TimestampTz first)
{
	SharedGroup *g;
	TimestampTz to = Min(first, look->bound);

	if (floors == NULL || look->slot < 0 || to <= look->floor)
		return;
	g = &floors->groups[look->slot];
	LWLockAcquire(floors->lock, LW_EXCLUSIVE);
	if (g->lowered == look->generation && g->floor == look->floor)
		g->floor = to;
	LWLockRelease(floors->lock);
}

/*
 * While a prepared transaction that wrote steps may be in flight in this database: its
 * generation (for ds_due_floors_prepared_gone), or 0 when none.
 */
uint64
ds_due_floors_prepared(void)
{
	SharedDatabase *db;
	uint64		gen = 0;

	if (floors == NULL)
		return 0;
	LWLockAcquire(floors->lock, LW_SHARED);
	db = find_database(MyDatabaseId, false);
	if (db != NULL && db->prepared > 0)
		gen = db->prepared_generation;
	LWLockRelease(floors->lock);
	return gen;
}

void
ds_due_floors_prepared_gone(uint64 gen)
{
	SharedDatabase *db;

	if (floors == NULL)
		return;
	LWLockAcquire(floors->lock, LW_EXCLUSIVE);
	db = find_database(MyDatabaseId, false);
	if (db != NULL && db->prepared > 0 && db->preparing == 0 && db->prepared_generation == gen)
	{
		/* their steps are visible now, wherever they are */
		db->prepared = 0;
		reset_database(MyDatabaseId);
	}
	LWLockRelease(floors->lock);
}

PG_FUNCTION_INFO_V1(ds_note_step_writes);

/*
 * Statement trigger AFTER INSERT OR UPDATE ON durable_steps.steps (ENABLE ALWAYS): a statement
 * not of the extension's own may have made steps wait anywhere (ds_due_floor_note_sql_write).
 */
Datum
ds_note_step_writes(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "ds_note_step_writes() must be called as a trigger");
	if (!own_statement)
		ds_due_floor_note_sql_write();
	PG_RETURN_POINTER(NULL);
}
