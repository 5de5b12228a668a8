/*
 * replay_cache.h -- the answers of succeeded steps, remembered per backend (see replay_cache.c).
 */
#ifndef DS_REPLAY_CACHE_H
#define DS_REPLAY_CACHE_H

#include "compat.h"

#include "access/htup.h"
#include "utils/jsonb.h"

#include "step_store.h"

/* Defines durable_steps.replay_cache_entries; called from _PG_init. */
extern void ds_replay_cache_init_module(void);

/*
 * The remembered answer of succeeded step (run_id, step_id), if it was stored with exactly this
 * sql and input: a copy of its ds_step_result tuple in *answer, and its owner in *owner. Only
 * for READ COMMITTED callers; the caller checks the owner.
 */
extern bool ds_replay_cache_lookup(const char *run_id, const char *step_id, const char *sql,
								Jsonb *input, Oid *owner, HeapTuple *answer);

/*
 * The shared generation, read before a row's header is checked for ds_replay_cache_remember;
 * false when there is no cache (not preloaded, or turned off).
 */
extern bool ds_replay_cache_generation(uint64 *generation);

/*
 * Remember the answer of a succeeded step read from `steps_relid` whose stored definition a call
 * with this sql and input matched. The caller read `generation` (ds_replay_cache_generation)
 * before it checked that the row version was committed by another transaction and has no
 * deleter or updater (ds_probe_step does both).
 */
extern void ds_replay_cache_remember(Oid steps_relid, uint64 generation, const char *run_id,
								  const char *step_id, Oid owner, const char *sql, Jsonb *input,
								  HeapTupleHeader answer);

/*
 * Around the extension's own UPDATE statements of durable_steps.steps (claims), which never
 * touch a succeeded row: they do not make the backends forget.
 */
extern void ds_replay_cache_internal_update(bool on);

/* Relation `relid` changed (InvalidOid: any may have): entries of a table gone are forgotten. */
extern void ds_replay_cache_relcache_changed(Oid relid);

#endif							/* DS_REPLAY_CACHE_H */
