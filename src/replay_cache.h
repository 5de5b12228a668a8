/*
 * replay_cache.h -- the answers of succeeded steps, remembered per backend (see replay_cache.c).
 */
#ifndef DS_REPLAY_CACHE_H
#define DS_REPLAY_CACHE_H

#include "compat.h"

#include "step_store.h"

/* Defines durable_steps.replay_cache_entries; called from _PG_init. */
extern void replay_cache_init_module(void);

/*
 * The remembered answer of succeeded step (run_id, step_id), copied into *out (status,
 * fingerprint, owner, result, attempt counters); false when there is none. Only for READ
 * COMMITTED callers; the caller checks the owner and the fingerprint.
 */
extern bool replay_cache_lookup(const char *run_id, const char *step_id, StepRecord *out);

/*
 * Remember *rec, read from `steps_relid` just now, if it is a succeeded step. The caller must
 * have checked that the row version was committed by another transaction and has no deleter,
 * and must call this before anything that could process invalidation messages.
 */
extern void replay_cache_remember(Oid steps_relid, const StepRecord *rec);

#endif							/* DS_REPLAY_CACHE_H */
