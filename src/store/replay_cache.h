/*
 * replay_cache.h -- the answers of succeeded steps, remembered per backend (see replay_cache.c).
 */
#ifndef DS_REPLAY_CACHE_H
#define DS_REPLAY_CACHE_H

#include "base/compat.h"

#include "access/htup.h"
#include "utils/jsonb.h"

#include "store/step_store.h"

/* Defines durable_steps.replay_cache_entries; called from _PG_init. */
extern void ds_replay_cache_init_module(void);

/*
 * The protocol a replay follows, all of it here:
 *
 *   if (ds_replay_cache_lookup(...))          -> the remembered answer (check its owner)
 *   found = ds_replay_cache_probe(..., &ticket) -> the row, read through its primary key
 *   ... answer from the row ...
 *   ds_replay_cache_remember(&ticket, ...)     -> remembered, if the ticket allows it
 */

/* What a probe found out about remembering the answer of the row it read. */
typedef struct ReplayTicket
{
	bool		may_remember;
	uint64		generation;		/* read before the row's header was checked */
	Oid			steps_relid;
} ReplayTicket;

/*
 * The remembered answer of succeeded step (run_id, step_id), if it was stored with exactly this
 * sql and input: a copy of its ds_step_result tuple in *answer, and its owner in *owner. False
 * where the cache does not apply (see replay_cache.c). The caller checks the owner.
 */
extern bool ds_replay_cache_lookup(const char *run_id, const char *step_id, const char *sql,
								   Jsonb *input, Oid *owner, HeapTuple *answer);

/*
 * Read step (run_id, step_id) as `snapshot` sees it (ds_probe_step); false when there is none.
 * *ticket tells ds_replay_cache_remember whether its answer may be remembered.
 */
extern bool ds_replay_cache_probe(const char *run_id, const char *step_id, Snapshot snapshot,
								  StepRecord *out, ReplayTicket *ticket);

/*
 * Remember the answer of the succeeded step a probe read, for calls with this sql and input
 * (which matched its stored definition); nothing unless the probe's ticket allows it.
 */
extern void ds_replay_cache_remember(const ReplayTicket *ticket, const char *run_id,
									 const char *step_id, Oid owner, const char *sql,
									 Jsonb *input, HeapTupleHeader answer);

/*
 * Around the extension's own UPDATE statements of durable_steps.steps (claims), which never
 * touch a succeeded row: they do not make the backends forget.
 */
extern void ds_replay_cache_internal_update(bool on);

#endif							/* DS_REPLAY_CACHE_H */
