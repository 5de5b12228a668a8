/*
 * replay_cache.c -- the answers of succeeded steps, remembered per backend.
 *
 * A succeeded step is final: nothing the extension does changes its row again, and only its
 * deletion (retention, or by hand) ends it. Its replays are the commonest call of all, so a
 * backend keeps the answers of the succeeded steps it has read, and a replay that finds one
 * needs no index probe.
 *
 * An entry is correct for as long as its row exists unchanged:
 *  - Only rows some other transaction committed, with no deleter, are remembered. The check is
 *    made on the row as the probe found it, and the entry stored before anything can process
 *    an invalidation: a DELETE after the check commits after the store, so its invalidation
 *    (below) empties the cache afterwards, never before.
 *  - Every DELETE and TRUNCATE of durable_steps.steps (the statement trigger
 *    steps_forget_replays) invalidates the table's relcache entry when it commits; every
 *    backend empties its cache when it processes that, which a lookup makes it do first.
 *    DROP EXTENSION does the same.
 *  - Lookups are made only under READ COMMITTED, whose every statement would see a committed
 *    row anyway; a transaction-level snapshot may predate the step and must not see it.
 * The caller still checks the step's owner against the current role on every hit.
 */
#include "compat.h"

#include "commands/trigger.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

#include "replay_cache.h"

/* durable_steps.replay_cache_entries: answers a backend keeps at most (0: none) */
static int	max_entries = 16384;

typedef struct ReplayEntry
{
	uint64		hash;			/* key: hash of run_id and step_id */
	char	   *run_id;
	char	   *step_id;
	char	   *fingerprint;
	Oid			owner;
	Jsonb	   *result;
	int			attempts;
	int			attempt_base;
	int			max_attempts;
} ReplayEntry;

static HTAB *entries = NULL;
static MemoryContext cache_cxt = NULL;
static Oid	cached_relid = InvalidOid;	/* durable_steps.steps when the entries were read */
static bool callback_registered = false;

static void
forget_all(void)
{
	if (cache_cxt != NULL)
		MemoryContextReset(cache_cxt);
	entries = NULL;
	cached_relid = InvalidOid;
}

static void
relcache_changed(Datum arg, Oid relid)
{
	if (entries != NULL && (relid == InvalidOid || relid == cached_relid))
		forget_all();
}

static uint64
identity_hash(const char *run_id, const char *step_id)
{
	uint64		h = hash_bytes_extended((const unsigned char *) run_id, (int) strlen(run_id), 0);

	return hash_bytes_extended((const unsigned char *) step_id, (int) strlen(step_id), h);
}

static ReplayEntry *
find(const char *run_id, const char *step_id, bool create)
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
	else if (strcmp(e->run_id, run_id) != 0 || strcmp(e->step_id, step_id) != 0)
	{
		/* two identities with one 64-bit hash: the newer one takes the slot */
		if (!create)
			return NULL;
		e->run_id = NULL;
	}
	return e;
}

void
replay_cache_init_module(void)
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
}

bool
replay_cache_lookup(const char *run_id, const char *step_id, StepRecord *out)
{
	ReplayEntry *e;

	if (max_entries == 0)
		return false;
	/* see deletions committed since this backend last looked */
	AcceptInvalidationMessages();
	e = find(run_id, step_id, false);
	if (e == NULL || e->run_id == NULL)
		return false;
	memset(out, 0, sizeof(*out));
	out->run_id = pstrdup(run_id);
	out->step_id = pstrdup(step_id);
	out->status = "succeeded";
	out->fingerprint = pstrdup(e->fingerprint);
	out->owner = e->owner;
	out->result = e->result ? (Jsonb *) pg_detoast_datum_copy((struct varlena *) e->result) : NULL;
	out->attempts = e->attempts;
	out->attempt_base = e->attempt_base;
	out->max_attempts = e->max_attempts;
	return true;
}

void
replay_cache_remember(Oid steps_relid, const StepRecord *rec)
{
	ReplayEntry *e;
	MemoryContext old;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
		callback_registered = true;
	}
	if (max_entries == 0 || strcmp(rec->status, "succeeded") != 0 || rec->next_attempt_at != 0 ||
		rec->error_class || rec->error_code || rec->error_message || rec->error_detail ||
		rec->remediation)
		return;
	if (entries != NULL && cached_relid != steps_relid)
		forget_all();
	/* a full cache keeps what it has: starting over would make a larger working set thrash */
	if (entries != NULL && hash_get_num_entries(entries) >= max_entries)
		return;
	e = find(rec->run_id, rec->step_id, true);
	if (e->run_id != NULL)
		return;					/* already known */
	cached_relid = steps_relid;
	old = MemoryContextSwitchTo(cache_cxt);
	e->run_id = pstrdup(rec->run_id);
	e->step_id = pstrdup(rec->step_id);
	e->fingerprint = pstrdup(rec->fingerprint);
	e->owner = rec->owner;
	e->result = rec->result ?
		(Jsonb *) pg_detoast_datum_copy((struct varlena *) rec->result) : NULL;
	e->attempts = rec->attempts;
	e->attempt_base = rec->attempt_base;
	e->max_attempts = rec->max_attempts;
	MemoryContextSwitchTo(old);
}

PG_FUNCTION_INFO_V1(ds_forget_replays);

/*
 * Statement trigger AFTER DELETE OR TRUNCATE ON durable_steps.steps: every backend's remembered
 * answers go when the deleting transaction commits.
 */
Datum
ds_forget_replays(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "ds_forget_replays() must be called as a trigger");
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	PG_RETURN_POINTER(NULL);
}
