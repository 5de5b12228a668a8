/*
 * step_claims.c -- the worker's view of durable_steps.steps.
 *
 * What to claim, and for whom; the statements are store/step_claim_store.c's. Executors claim
 * and count SQL steps only (kind 'sql'): HTTP steps are the HTTP worker's (http_claims.c).
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "base/ds_errcodes.h"
#include "base/policy.h"
#include "base/worker_attempt_time.h"
#include "store/replay_cache.h"
#include "steps/step_attempt.h"
#include "worker/step_claims.h"
#include "steps/step_exec.h"
#include "store/step_claim_store.h"
#include "store/task_store.h"
#include "store/step_lock.h"
#include "store/step_probe.h"
#include "store/step_store.h"

/* the owners of a limited queue's running steps counted apart (more are rare: see below) */
#define DS_QUEUE_HOLDERS_MAX 64
/*
 * How many due steps of one priority a limited queue's share looks through for another owner's
 * (take_due_steps): the first ones, in due order
 */
#define DS_SHARE_WINDOW 1000

/*
 * A queue with due steps: its groups (one per priority, in priority order, each with the floor
 * its reads start at: ipc/due_floors.h) from its first with due steps, and its concurrency as
 * last read (-1: none, no limit).
 */
typedef struct DueQueue
{
	char	   *name;
	const DueGroup *groups;
	int			n_groups;
	int			concurrency;
} DueQueue;

/*
 * The (queue, priority) groups of the database that may have waiting steps, with their floors,
 * in (queue by bytes, priority) order: the registry's when it holds them all, else those a walk
 * of steps_due_idx finds, which it then holds.
 */
static int
due_groups(DueGroup **groups)
{
	int			n;
	uint64		gen;

	if (ds_due_groups_known(groups, &n))
	{
		int			k = 0;

		/* the runs' group is not the steps' (run_claims.c) */
		for (int i = 0; i < n; i++)
			if (strcmp((*groups)[i].queue, DS_RUNS_GROUP) != 0)
				(*groups)[k++] = (*groups)[i];
		return k;
	}
	gen = ds_due_groups_generation();
	n = (int) ds_store_waiting_groups();
	*groups = palloc(sizeof(DueGroup) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		strlcpy((*groups)[i].queue, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1),
				NAMEDATALEN);
		(*groups)[i].priority = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc, 2, &isnull));
	}
	qsort(*groups, n, sizeof(DueGroup), ds_due_group_compare);
	ds_due_groups_found(*groups, n, gen);
	return n;
}

/*
 * Move each group's floor up to its first waiting step (ipc/due_floors.h). Before this
 * transaction claims anything: a claim it then rolled back would put its steps back below.
 */
static LocalTransactionId claimed_lxid = InvalidLocalTransactionId;

static void
raise_floors(DueGroup *groups, int n)
{
	uint64		prepared = ds_due_floors_prepared();

	if (claimed_lxid == DS_MY_LXID)
		return;
	claimed_lxid = DS_MY_LXID;
	if (prepared != 0 && !ds_store_prepared_transactions())
		ds_due_floors_prepared_gone(prepared);
	for (int i = 0; i < n; i++)
	{
		DueFloorLook look;

		if (!ds_due_floor_look(groups[i].queue, groups[i].priority, &look))
			continue;
		ds_due_floor_raise(&look, ds_store_first_waiting_time(groups[i].queue, groups[i].priority,
															  look.floor, look.bound));
	}
}

/* The queues with due steps, in name order (C collation: byte order, as strcmp). */
static int
due_queues(TimestampTz now, DueQueue **out)
{
	DueGroup   *groups;
	int			n_groups = due_groups(&groups);
	int			n;
	int			k = 0;
	bool		isnull;

	raise_floors(groups, n_groups);
	/* the reads start at the floors as raised (each read's snapshot is later) */
	for (int i = 0; i < n_groups; i++)
		groups[i].floor = ds_due_floor(groups[i].queue, groups[i].priority);
	n = (int) ds_store_due_queues(now, groups, n_groups);
	*out = palloc(sizeof(DueQueue) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		bool		unlimited;
		Datum		c = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &unlimited);
		int32		priority;
		int			first;
		int			end;

		/* a queue's first row is its first priority with due steps */
		if (k > 0 && strcmp((*out)[k - 1].name, name) == 0)
			continue;
		priority = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3,
											   &isnull));
		for (first = 0; first < n_groups; first++)
			if (strcmp(groups[first].queue, name) == 0 && groups[first].priority == priority)
				break;
		if (first == n_groups)
			continue;
		for (end = first; end < n_groups && strcmp(groups[end].queue, name) == 0; end++)
			;
		(*out)[k].name = name;
		(*out)[k].concurrency = unlimited ? -1 : DatumGetInt32(c);
		(*out)[k].groups = &groups[first];
		(*out)[k].n_groups = end - first;
		k++;
	}
	return k;
}

/* The steps of a limited queue running now, by owner (queue_capacity). */
typedef struct QueueHolders
{
	int			concurrency;	/* as read under the queue's row lock; -1: no
								 * limit */
	int			n;
	Oid			owner[DS_QUEUE_HOLDERS_MAX];
	int			running[DS_QUEUE_HOLDERS_MAX];
} QueueHolders;

/*
 * How many steps of a limited queue this claim may take: its concurrency less the steps of it
 * claimed and not yet recorded (running_queue names it), at most `limit`; *holders says whose
 * they are. The queue's row stays locked
 * until the claim commits, so executors claiming from the same queue take turns and each counts
 * the claims committed before it; an executor that finds the row locked passes the queue by (0)
 * and serves another. Runs under READ COMMITTED (see executor.c): the count's snapshot is taken
 * after the row lock.
 */
static int
queue_capacity(const char *queue, int limit, QueueHolders *holders)
{
	bool		isnull;
	uint64		n_owners;
	int64		running = 0;
	int			concurrency;

	holders->n = 0;
	holders->concurrency = -1;

	/*
	 * another executor is claiming from it (or the row went away): serve
	 * another queue
	 */
	if (!ds_store_lock_queue_row(queue, &concurrency, &isnull))
		return 0;
	if (isnull)
		return limit;
	holders->concurrency = concurrency;
	if (concurrency <= 0)
		return 0;
	n_owners = ds_store_running_by_owner(queue);
	for (uint64 i = 0; i < n_owners; i++)
	{
		HeapTuple	t = SPI_tuptable->vals[i];
		int64		n = DatumGetInt64(SPI_getbinval(t, SPI_tuptable->tupdesc, 2, &isnull));

		running += n;
		if (holders->n < DS_QUEUE_HOLDERS_MAX)
		{
			holders->owner[holders->n] = DatumGetObjectId(SPI_getbinval(t, SPI_tuptable->tupdesc,
																		1, &isnull));
			holders->running[holders->n] = (int) Min(n, (int64) PG_INT32_MAX);
			holders->n++;
		}
	}
	return (int) Min((int64) limit, Max((int64) concurrency - running, 0));
}

/*
 * Take up to `limit` due steps of `queue`, lowest priority number first and, within a priority,
 * earliest due first: each priority is one range of steps_due_idx, read up to its first step
 * not yet due. A step is taken by its step lock (step_lock.c), the lock every executor and
 * synchronous caller takes before it runs or claims a step, and not by a row lock: FOR UPDATE
 * would write a WAL record (and often a full-page image) for every claimed row, which is a
 * tenth of a drained step's WAL, for an exclusion the step lock already gives. The price is
 * that two executors reading at once see the same rows: the one that loses a step lock reads
 * the range again, passing the rows it lost (ctid <> ALL), a few times at most (the winner's
 * claim commits within milliseconds, and the rows then leave the range). A row read here may
 * change before it is claimed: ds_mark_steps_running checks again that it is due. The first
 * `offset` steps of the first range read are passed: other executors are claiming them now.
 * The steps taken are all one owner's, the owner of the first step taken (docs/queues.md, "Fair share between roles"): a batch runs its steps one after another, and another role's step must not
 * wait in it behind a slow one; no step of an owner in passed_owners[0..n_passed_owners-1] is
 * taken. Rows of other owners are passed over like rows others hold, in C rather than by the
 * statement: a filter on the owner would make the planner expect a handful of rows and sort the
 * whole range instead of reading the index in order (the statement is the drain's hottest).
 * With `holders` (a limited queue's running steps by owner), the owner takes no more than brings
 * its running steps to `share`. Appends to the arrays from *n on; counts the steps others held
 * in *skipped.
 */
#define CLAIM_READS_PER_PRIORITY 4

static bool
owner_passed(Oid owner, const Oid *passed_owners, int n_passed_owners)
{
	for (int i = 0; i < n_passed_owners; i++)
		if (passed_owners[i] == owner)
			return true;
	return false;
}

/* How many more steps of a limited queue `owner` may hold: `share` less those it runs now. */
static int
owner_share_left(const QueueHolders *holders, int share, Oid owner)
{
	for (int i = 0; i < holders->n; i++)
		if (holders->owner[i] == owner)
			return Max(share - holders->running[i], 0);
	return share;
}

static void
take_due_steps(const DueQueue *queue, int limit, int offset, TimestampTz now,
			   const Oid *passed_owners, int n_passed_owners, const QueueHolders *holders,
			   int share, char **run_ids, char **step_ids, ItemPointerData *tids, int *n,
			   int *skipped)
{
	ArrayType  *owners_array = NULL;
	Oid			batch_owner = InvalidOid;
	int			taken = 0;
	bool		isnull;

	/*
	 * rows passed over by the range's next read -- those others held, other
	 * owners', and those taken: at most `limit` a read
	 */
	Datum	   *passed = palloc(sizeof(Datum) * limit * CLAIM_READS_PER_PRIORITY);
	ItemPointerData *passed_tids = palloc(sizeof(ItemPointerData) * limit * CLAIM_READS_PER_PRIORITY);
	int			n_passed = 0;

	if (holders != NULL)
	{
		Datum	   *owners = palloc(sizeof(Datum) * Max(n_passed_owners, 1));

		for (int i = 0; i < n_passed_owners; i++)
			owners[i] = ObjectIdGetDatum(passed_owners[i]);
		owners_array = construct_array(owners, n_passed_owners, OIDOID, sizeof(Oid), true,
									   TYPALIGN_INT);
	}
	for (int g = 0; g < queue->n_groups && taken < limit; g++)
	{
		int32		priority = queue->groups[g].priority;
		TimestampTz floor = queue->groups[g].floor;
		int			first_offset;

		/* rows passed over in another priority's range are not in this one */
		n_passed = 0;

		/*
		 * the steps other executors are claiming now are the first of the
		 * first range (due_queues() found it)
		 */
		first_offset = g == 0 ? offset : 0;
		for (int read = 0; read < CLAIM_READS_PER_PRIORITY && taken < limit; read++)
		{
			int			lost = 0;
			int			others = 0;
			int			read_limit = limit - taken;
			ArrayType  *passed_array;
			uint64		n_read;

			passed_array = construct_array(passed, n_passed, TIDOID, sizeof(ItemPointerData),
										   false, TYPALIGN_SHORT);

			/*
			 * `now`, not clock_timestamp(): the bound of the index range, not
			 * a filter
			 */
			if (holders == NULL)
				n_read = ds_store_read_due_steps(queue->name, priority, floor, read_limit, now,
												 passed_array, first_offset);
			else
				n_read = ds_store_read_due_steps_share(queue->name, priority, floor, read_limit,
													   now, passed_array, first_offset,
													   DS_SHARE_WINDOW, owners_array);

			/*
			 * a limited queue's share may have lowered the limit after the
			 * read
			 */
			for (uint64 i = 0; i < n_read && taken < limit; i++)
			{
				HeapTuple	t = SPI_tuptable->vals[i];
				TupleDesc	td = SPI_tuptable->tupdesc;
				char	   *run_id = SPI_getvalue(t, td, 1);
				char	   *step_id = SPI_getvalue(t, td, 2);
				ItemPointer tid = (ItemPointer) DatumGetPointer(SPI_getbinval(t, td, 3, &isnull));
				Oid			owner = DatumGetObjectId(SPI_getbinval(t, td, 4, &isnull));

				/*
				 * another owner's than the batch's, or a busy one's: the next
				 * claim's, or another executor's
				 */
				if ((OidIsValid(batch_owner) && owner != batch_owner) ||
					owner_passed(owner, passed_owners, n_passed_owners))
				{
					passed_tids[n_passed] = *tid;
					passed[n_passed] = PointerGetDatum(&passed_tids[n_passed]);
					n_passed++;
					others++;
					continue;
				}
				/* another executor, or a synchronous caller, has it */
				if (!ds_step_lock_try_session(run_id, step_id))
				{
					passed_tids[n_passed] = *tid;
					passed[n_passed] = PointerGetDatum(&passed_tids[n_passed]);
					n_passed++;
					lost++;
					(*skipped)++;
					continue;
				}
				run_ids[*n] = run_id;
				step_ids[*n] = step_id;
				tids[*n] = *tid;
				(*n)++;
				taken++;

				/*
				 * a limited queue's share: the owner's running steps and
				 * these, at most `share`
				 */
				if (!OidIsValid(batch_owner) && holders != NULL)
					limit = Min(limit, owner_share_left(holders, share, owner));
				batch_owner = owner;

				/*
				 * the range's next read passes it too: it stays due until the
				 * claim commits
				 */
				passed_tids[n_passed] = *tid;
				passed[n_passed] = PointerGetDatum(&passed_tids[n_passed]);
				n_passed++;
			}

			/*
			 * the range is read to its end, or nobody else nor another owner
			 * was in it
			 */
			if ((lost == 0 && others == 0) || n_read < (uint64) read_limit)
				break;
		}
	}
}

/*
 * Take up to this claim's share of queue q's due steps (its size, its concurrency's room),
 * passing the first `offset` due steps, which other executors are claiming.
 */
static void
claim_from_queue(const ClaimSizer *sizer, const DueQueue *q, int limit, int offset,
				 TimestampTz now, const Oid *passed_owners, int n_passed_owners, char **run_ids,
				 char **step_ids, ItemPointerData *tids, int *n, int *skipped)
{
	int			capacity = ds_claim_size(sizer, q->name, limit, FIRST_STEP_CLAIM_SIZE);
	QueueHolders holders = {0};

	if (q->concurrency > 0)
		capacity = queue_capacity(q->name, capacity, &holders);
	if (capacity <= 0)
		return;
	/* while it reads, others that come read past as many steps as it may take */
	ds_claim_announce(q->name, capacity);
	if (holders.concurrency >= 2)
	{
		/*
		 * A limited queue's last slot goes to an owner that holds all the
		 * others only when no other owner's step is due in it
		 * (docs/queues.md, "Fair share between roles"): first the owners
		 * holding concurrency - 1 of its slots are passed by and the others
		 * take up to that share; then, when that found nothing, anybody's
		 * steps as the room allows.
		 */
		Oid		   *passed = palloc(sizeof(Oid) * (n_passed_owners + holders.n + 1));
		int			n_passed = n_passed_owners;
		int			before = *n;

		if (n_passed_owners > 0)
			memcpy(passed, passed_owners, sizeof(Oid) * n_passed_owners);
		for (int i = 0; i < holders.n; i++)
			if (holders.running[i] >= holders.concurrency - 1)
				passed[n_passed++] = holders.owner[i];
		take_due_steps(q, capacity, offset, now, passed, n_passed, &holders,
					   holders.concurrency - 1, run_ids, step_ids, tids, n, skipped);
		if (*n == before)
			take_due_steps(q, capacity, offset, now, passed_owners, n_passed_owners, NULL, 0,
						   run_ids, step_ids, tids, n, skipped);
	}
	else
		take_due_steps(q, capacity, offset, now, passed_owners, n_passed_owners, NULL, 0,
					   run_ids, step_ids, tids, n, skipped);

	/*
	 * then past those it took: a claim whose UPDATE waits for a row lock (an
	 * operator's open transaction) may keep its turn for long, and must not
	 * hide more steps than it holds
	 */
	ds_claim_announce(q->name, *n);
}

/*
 * Wait for the claim lock of `queue`, which another executor holds while it claims without
 * having said yet how many steps it takes (so that they cannot be read past): a claim's
 * transaction lasts milliseconds. A claim that waits longer (its UPDATE waits for a row lock an
 * operator's transaction holds) is not waited for: the caller then reads the range anyway,
 * passing the rows it loses (take_due_steps). Returns whether the lock was taken.
 */
#define CLAIM_TURN_WAIT_MS 50
#define CLAIM_TURN_POLL_US 200

static bool
wait_for_claim_turn(const char *queue)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), CLAIM_TURN_WAIT_MS);

	while (!ds_queue_claim_lock_try(queue))
	{
		if (GetCurrentTimestamp() >= until)
			return false;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(CLAIM_TURN_POLL_US);
	}
	return true;
}

/*
 * Claims in the order executors run them: those whose last attempt was lost after all others
 * (each then runs alone: executor.c), then priority, then owner (one transaction each), then due
 * time.
 */
static int
compare_step_claims(const void *a, const void *b)
{
	const StepRecord *x = &((const ClaimedStep *) a)->rec;
	const StepRecord *y = &((const ClaimedStep *) b)->rec;
	bool		x_alone = ((const ClaimedStep *) a)->alone;
	bool		y_alone = ((const ClaimedStep *) b)->alone;

	if (x_alone != y_alone)
		return x_alone ? 1 : -1;
	if (x->priority != y->priority)
		return x->priority < y->priority ? -1 : 1;
	if (x->owner != y->owner)
		return x->owner < y->owner ? -1 : 1;
	if (x->next_attempt_at != y->next_attempt_at)
		return x->next_attempt_at < y->next_attempt_at ? -1 : 1;
	return 0;
}

int
ds_mark_steps_running(Datum *tids, int n, bool limited, MemoryContext cxt, ClaimedStep **claims,
					  int (*order) (const void *, const void *))
{
	int			n_claimed;

	n_claimed = (int) ds_store_mark_steps_running(construct_array(tids, n, TIDOID,
																  sizeof(ItemPointerData), false,
																  TYPALIGN_SHORT),
												  GetCurrentTimestamp(), MyProcPid,

	/*
	 * no worker attempt runs longer than the ceiling, whatever its own
	 * timeout
	 */
												  ds_usecs_to_interval(ds_max_worker_attempt_usecs()),

	/*
	 * and a step without a timeout of its own has
	 * durable_steps.default_timeout
	 */
												  ds_usecs_to_interval(ds_worker_attempt_limit_usecs(0)),
												  limited);
	*claims = MemoryContextAlloc(cxt, sizeof(ClaimedStep) * Max(n_claimed, 1));
	for (int i = 0; i < n_claimed; i++)
	{
		ClaimedStep *claim = &(*claims)[i];

		ds_store_record_from_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 0, cxt,
								   &claim->rec);
		claim->run_id = claim->rec.run_id;
		claim->step_id = claim->rec.step_id;
		claim->attempt = claim->rec.attempts;

		/*
		 * the error of the attempt before this one: its process ended while
		 * running it
		 */
		claim->alone = claim->rec.error_code != NULL &&
			strcmp(claim->rec.error_code, unpack_sql_state(ERRCODE_DS_INVOCATION_LOST)) == 0;
	}

	/*
	 * sorted here rather than by the statement, which would copy every row
	 * once more to sort it
	 */
	qsort(*claims, n_claimed, sizeof(ClaimedStep), order);
	return n_claimed;
}

int
ds_claim_due_steps(const ClaimSizer *sizer, int limit, const char *after_queue,
				   const Oid *passed_owners, int n_passed_owners, ClaimedQueue *served,
				   MemoryContext cxt, ClaimedStep **claims, int *skipped)
{
	char	  **run_ids;
	char	  **step_ids;
	ItemPointerData *row_tids;
	Datum	   *tids;
	int			n_locked = 0;
	int			n_claimed = 0;
	StoreSpi	spi;
	DueQueue   *queues;
	int			n_queues;
	int			first = 0;
	DueQueue   *busy = NULL;
	TimestampTz now;

	*skipped = 0;
	*claims = NULL;
	served->name[0] = '\0';
	served->limited = false;
	ds_store_spi_begin(&spi);
	now = GetCurrentTimestamp();
	n_queues = due_queues(now, &queues);
	run_ids = palloc(sizeof(char *) * limit);
	step_ids = palloc(sizeof(char *) * limit);
	row_tids = palloc(sizeof(ItemPointerData) * limit);
	tids = palloc(sizeof(Datum) * limit);

	/*
	 * fair serving: each executor takes the queues in turn, from the one
	 * after its last
	 */
	while (first < n_queues && strcmp(queues[first].name, after_queue) <= 0)
		first++;
	for (int k = 0; k < n_queues && n_locked == 0; k++)
	{
		DueQueue   *q = &queues[(first + k) % n_queues];
		bool		turn;
		int			offset = 0;

		if (q->concurrency == 0)
			continue;			/* paused */
		turn = ds_queue_claim_lock_try(q->name);
		if (!turn)
		{
			/*
			 * another executor is claiming from it: read past the steps it
			 * takes
			 */
			offset = ds_claims_in_progress(q->name);
			/* it has not said how many yet: serve another queue first */
			if (offset == 0)
			{
				if (busy == NULL)
					busy = q;
				continue;
			}
		}
		claim_from_queue(sizer, q, limit, offset, now, passed_owners, n_passed_owners, run_ids,
						 step_ids, row_tids, &n_locked, skipped);
		if (n_locked > 0)
		{
			strlcpy(served->name, q->name, sizeof(served->name));
			served->limited = q->concurrency > 0;
		}
		else if (turn)
			ds_queue_claim_lock_release(q->name);	/* a claim holds one
													 * queue's lock at most */
	}

	/*
	 * every queue with due steps was being claimed from: wait for the first
	 * one's turn
	 */
	if (n_locked == 0 && busy != NULL)
	{
		bool		turn = wait_for_claim_turn(busy->name);

		claim_from_queue(sizer, busy, limit, 0, now, passed_owners, n_passed_owners, run_ids,
						 step_ids, row_tids, &n_locked, skipped);
		if (turn && n_locked == 0)
			ds_queue_claim_lock_release(busy->name);
		if (n_locked > 0)
		{
			strlcpy(served->name, busy->name, sizeof(served->name));
			served->limited = busy->concurrency > 0;
		}
	}
	for (int i = 0; i < n_locked; i++)
		tids[i] = PointerGetDatum(&row_tids[i]);
	if (n_locked > 0)
	{
		/*
		 * the steps are ours (their step locks); their rows are where they
		 * were read, or moved
		 */
		n_claimed = ds_mark_steps_running(tids, n_locked, served->limited, cxt, claims,
										  compare_step_claims);
		if (n_claimed < n_locked)
		{
			/*
			 * A row changed since it was read (an operator re-armed,
			 * cancelled or deferred the step): it is not claimed, and its
			 * step lock must not outlive this claim.
			 */
			for (int i = 0; i < n_locked; i++)
				ds_step_lock_release_session(run_ids[i], step_ids[i]);
			for (int i = 0; i < n_claimed; i++)
				(void) ds_step_lock_try_session((*claims)[i].run_id, (*claims)[i].step_id);
		}
	}
	ds_store_spi_end(&spi);
	return n_claimed;
}

/*
 * The (run_id, step_id) of every row SPI just read (its first two columns), copied into cxt out
 * of SPI's memory, which SPI_finish() releases. Returns how many.
 */
static uint64
copy_identities(MemoryContext cxt, char ***run_ids, char ***step_ids)
{
	uint64		n = SPI_processed;

	*run_ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n, 1));
	*step_ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		(*run_ids)[i] = MemoryContextStrdup(cxt, SPI_getvalue(SPI_tuptable->vals[i],
															  SPI_tuptable->tupdesc, 1));
		(*step_ids)[i] = MemoryContextStrdup(cxt, SPI_getvalue(SPI_tuptable->vals[i],
															   SPI_tuptable->tupdesc, 2));
	}
	return n;
}

int
ds_recover_lost_attempts(int limit, MemoryContext cxt, ClaimedStep **recovered)
{
	int			n = 0;
	uint64		n_running;
	StoreSpi	spi;
	char	  **run_ids;
	char	  **step_ids;

	*recovered = NULL;
	ds_store_spi_begin(&spi);

	/*
	 * Every running step, not the first `limit` of them: those of live
	 * executors, which may be many, would otherwise hide the lost ones behind
	 * them.
	 */
	(void) ds_store_read_running_steps();
	n_running = copy_identities(cxt, &run_ids, &step_ids);
	ds_store_spi_end(&spi);

	*recovered = MemoryContextAlloc(cxt, sizeof(ClaimedStep) * Max(Min(n_running, (uint64) limit), 1));
	for (uint64 i = 0; i < n_running && n < limit; i++)
	{
		StepRecord	rec;

		/*
		 * a free lock on a running step means its executor is gone: that is
		 * the lease ending
		 */
		if (!ds_step_lock_try_session(run_ids[i], step_ids[i]))
			continue;
		(*recovered)[n].run_id = run_ids[i];
		(*recovered)[n].step_id = step_ids[i];
		n++;

		/*
		 * a kept HTTP outcome (kept since the running steps were read) is an
		 * executor's to record
		 */
		if (!ds_lock_step_row(run_ids[i], step_ids[i], &rec) ||
			rec.status != STEP_RUNNING || rec.kept_outcome != NULL)
			continue;
		(*recovered)[n - 1].attempt = rec.attempts;
		ds_record_lost_attempt(&rec);
	}
	return n;
}

int
ds_find_kept_outcomes(int limit, MemoryContext cxt, char ***run_ids, char ***step_ids)
{
	int			n;
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	(void) ds_store_read_kept_outcomes(limit);
	n = (int) copy_identities(cxt, run_ids, step_ids);
	ds_store_spi_end(&spi);
	return n;
}

int
ds_find_expired_task_leases(TimestampTz now, int limit, MemoryContext cxt, char ***run_ids,
							char ***step_ids)
{
	int			n;
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	(void) ds_store_expired_task_leases(now, limit);
	n = (int) copy_identities(cxt, run_ids, step_ids);
	ds_store_spi_end(&spi);
	return n;
}

TimestampTz
ds_next_due_time(void)
{
	StoreSpi	spi;
	DueGroup   *groups;
	int			n;
	TimestampTz next;

	ds_store_spi_begin(&spi);
	n = due_groups(&groups);
	next = ds_store_next_due_step_time(groups, n);
	ds_store_spi_end(&spi);
	return next;
}
