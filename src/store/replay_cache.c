/*
 * replay_cache.c -- the answers of succeeded steps, remembered per backend.
 *
 * A succeeded step is final: nothing the extension does changes its row again, and only its
 * deletion (retention, or by hand) ends it. Its replays are the commonest call of all, so a
 * backend keeps the answers of the succeeded steps it has read, and a replay that finds one
 * needs no index probe.
 *
 * An entry is correct for as long as its row exists unchanged. A generation counter in shared
 * memory makes sure of that:
 *  - Every SQL statement that deletes, updates or truncates durable_steps.steps bumps it, from
 *    the statement trigger steps_forget_replays, before its transaction can commit (the
 *    extension's own claim UPDATE, which never touches a succeeded row, is exempt). The
 *    extension's direct row writes fire no statement trigger, and never write a succeeded row.
 *  - An entry is tagged with the generation read before its row's header was checked; only rows
 *    committed by another transaction, with no deleter or updater, are remembered. A lookup
 *    first reads the generation and forgets everything when it has moved. A deletion that a
 *    statement's snapshot can see committed after its bump, so that statement's lookup sees the
 *    bump; a deletion that starts after the header check bumps after the entry was stored.
 *  - Lookups are made only under READ COMMITTED; a transaction-level snapshot may predate the
 *    step and must not see it. Nor on a standby, where the primary's deletions arrive as WAL
 *    and fire no trigger.
 *  - Without the shared memory (library not preloaded) there is no cache.
 * Not covered: rows changed with the trigger disabled (ALTER TABLE ... DISABLE TRIGGER) or by
 * logical replication apply, which fires no statement triggers. The caller still checks the
 * step's owner against the current role on every hit.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "store/replay_cache.h"
#include "store/store_relations.h"
#include "store/step_probe.h"
#include "store/step_store.h"
#include "ipc/worker_shmem.h"

/* durable_steps.replay_cache_entries: answers a backend keeps at most (0: none) */
static int	max_entries = 16384;

/* answers whose SQL, input and result together are larger than this are not remembered */
#define REPLAY_CACHE_MAX_BYTES 8192

typedef struct ReplayEntry
{
	uint64		hash;			/* key: hash of run_id and step_id */
	char	   *run_id;			/* set last: NULL while the entry is not
								 * complete */
	char	   *step_id;
	Oid			owner;

	/*
	 * The definition the step was stored with, as a caller passed it: a call
	 * passing the same bytes has the same fingerprint, so a hit needs neither
	 * the fingerprint nor the row.
	 */
	char	   *sql;
	Jsonb	   *input;			/* NULL: none */
	HeapTuple	answer;			/* the ds_step_result a replay returns */
} ReplayEntry;

static HTAB *entries = NULL;
static MemoryContext cache_cxt = NULL;
static Oid	cached_relid = InvalidOid;	/* durable_steps.steps when the
										 * entries were read */
static uint64 cached_generation = 0;	/* the shared generation the entries
										 * belong to */

/* the local transaction in which the extension's own UPDATE runs (an error ends it) */
static LocalTransactionId internal_update_lxid = InvalidLocalTransactionId;

/* Forget every remembered answer. */
static void
forget_all(void)
{
	if (cache_cxt != NULL)
		MemoryContextReset(cache_cxt);
	entries = NULL;
	cached_relid = InvalidOid;
}

/*
 * Relcache callback, registered by this module as PostgreSQL's own caches register theirs
 * (plancache.c, typcache.c): DROP EXTENSION and a new CREATE give the table a new OID, and
 * entries of the old one go (InvalidOid: any relation may have changed).
 */
static void
replay_cache_relcache_changed(Datum arg, Oid relid)
{
	if (entries != NULL && (relid == InvalidOid || relid == cached_relid))
		forget_all();
}

/* The hash key of identity (run_id, step_id). */
static uint64
identity_hash(const char *run_id, const char *step_id)
{
	uint64		h = hash_bytes_extended((const unsigned char *) run_id, (int) strlen(run_id), 0);

	return hash_bytes_extended((const unsigned char *) step_id, (int) strlen(step_id), h);
}

/* The entry of (run_id, step_id); with create, a new empty one when there is none. */
static ReplayEntry *
find_entry(const char *run_id, const char *step_id, bool create)
{
	uint64		hash = identity_hash(run_id, step_id);
	ReplayEntry *e;
	bool		found;

	if (entries == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		if (cache_cxt == NULL)
			cache_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps replay cache",
											  ALLOCSET_DEFAULT_SIZES);
		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(ReplayEntry);
		ctl.hcxt = cache_cxt;
		entries = hash_create("durable_steps replay cache", 256, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	e = hash_search(entries, &hash, create ? HASH_ENTER : HASH_FIND, &found);
	if (e == NULL)
		return NULL;
	if (!found)
		e->run_id = NULL;
	else if (e->run_id != NULL &&
			 (strcmp(e->run_id, run_id) != 0 || strcmp(e->step_id, step_id) != 0))
	{
		/* two identities with one 64-bit hash: the newer one takes the slot */
		if (!create)
			return NULL;
		e->run_id = NULL;
	}
	return e;
}

void
ds_replay_cache_init_module(void)
{
	DefineCustomIntVariable("durable_steps.replay_cache_entries",
							"Answers of succeeded steps each backend remembers for replays.",
							"A replay of a remembered step needs no index lookup. 0 turns this off.",
							&max_entries,
							16384,
							0,
							1024 * 1024,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);
	CacheRegisterRelcacheCallback(replay_cache_relcache_changed, (Datum) 0);
}

/* May this call use the cache? See the file header. */
static bool
cache_applies(void)
{
	return !IsolationUsesXactSnapshot() && !RecoveryInProgress();
}

/* The shared generation; false when there is no cache (not preloaded, or turned off). */
static bool
read_generation(uint64 *generation)
{
	WorkerShared *shared = ds_worker_shared();

	if (shared == NULL || max_entries == 0)
		return false;
	*generation = pg_atomic_read_u64(&shared->replay_generation);

	/*
	 * what the caller reads next (a row's header) is read after the
	 * generation
	 */
	pg_read_barrier();
	return true;
}

bool
ds_replay_cache_lookup(const char *run_id, const char *step_id, const char *sql, Jsonb *input,
					   Oid *owner, HeapTuple *answer)
{
	ReplayEntry *e;
	uint64		generation;

	if (entries == NULL || !cache_applies() || !read_generation(&generation))
		return false;
	if (generation != cached_generation)
	{
		/* steps were deleted or changed by SQL since these answers were read */
		forget_all();
		return false;
	}
	/* and DROP EXTENSION: relcache invalidations are processed here */
	AcceptInvalidationMessages();
	e = find_entry(run_id, step_id, false);
	if (e == NULL || e->run_id == NULL || strcmp(e->sql, sql) != 0)
		return false;
	if ((input == NULL) != (e->input == NULL) ||
		(input != NULL &&
		 (VARSIZE(input) != VARSIZE(e->input) || memcmp(input, e->input, VARSIZE(input)) != 0)))
		return false;			/* another definition, or the same one written
								 * differently */
	*owner = e->owner;
	*answer = heap_copytuple(e->answer);
	return true;
}

bool
ds_replay_cache_probe(const char *run_id, const char *step_id, Snapshot snapshot,
					  StepRecord *out, ReplayTicket *ticket)
{
	bool		found;
	bool		settled = false;

	/* the generation first, then the row's header (inside the probe) */
	ticket->may_remember = cache_applies() && read_generation(&ticket->generation);
	found = ds_probe_step(run_id, step_id, snapshot, out,
						  ticket->may_remember ? &settled : NULL);
	ticket->may_remember = ticket->may_remember && found && settled &&
		out->status == STEP_SUCCEEDED;
	ticket->steps_relid = ds_store_relations()->steps;
	return found;
}

void
ds_replay_cache_remember(const ReplayTicket *ticket, const char *run_id, const char *step_id,
						 Oid owner, const char *sql, Jsonb *input, HeapTupleHeader answer)
{
	Oid			steps_relid = ticket->steps_relid;
	uint64		generation = ticket->generation;
	ReplayEntry *e;
	MemoryContext old;
	size_t		bytes = strlen(sql) + (input ? VARSIZE(input) : 0) +
		HeapTupleHeaderGetDatumLength(answer);
	HeapTupleData tuple;

	if (!ticket->may_remember || max_entries == 0 || bytes > REPLAY_CACHE_MAX_BYTES)
		return;
	if (entries != NULL && (cached_relid != steps_relid || cached_generation != generation))
		forget_all();

	/*
	 * a full cache keeps what it has: starting over would make a larger
	 * working set thrash
	 */
	if (entries != NULL && hash_get_num_entries(entries) >= max_entries)
		return;
	e = find_entry(run_id, step_id, true);
	if (e->run_id != NULL)
		return;					/* already known */
	cached_relid = steps_relid;
	cached_generation = generation;
	old = MemoryContextSwitchTo(cache_cxt);
	e->step_id = pstrdup(step_id);
	e->owner = owner;
	e->sql = pstrdup(sql);
	e->input = input ? (Jsonb *) pg_detoast_datum_copy((struct varlena *) input) : NULL;
	tuple.t_len = HeapTupleHeaderGetDatumLength(answer);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = answer;
	e->answer = heap_copytuple(&tuple);

	/*
	 * last: an allocation failure above leaves the entry unused, not half
	 * made
	 */
	e->run_id = pstrdup(run_id);
	MemoryContextSwitchTo(old);
}

void
ds_replay_cache_internal_update(bool on)
{
	internal_update_lxid = on ? DS_MY_LXID : InvalidLocalTransactionId;
}

PG_FUNCTION_INFO_V1(ds_forget_replays);

/*
 * Statement trigger AFTER DELETE OR UPDATE OR TRUNCATE ON durable_steps.steps (ENABLE ALWAYS):
 * bumps the generation before the statement's transaction can commit, so that every backend
 * forgets its remembered answers.
 */
Datum
ds_forget_replays(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	WorkerShared *shared = ds_worker_shared();

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "ds_forget_replays() must be called as a trigger");
	if (shared != NULL &&
		!(internal_update_lxid == DS_MY_LXID && internal_update_lxid != InvalidLocalTransactionId &&
		  TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		pg_atomic_fetch_add_u64(&shared->replay_generation, 1);
	PG_RETURN_POINTER(NULL);
}
