/*
 * limit_store.h -- the statements on limits, their keys' buckets and the held steps
 * (limit_store.c): what ds_set_rate_limit, ds_set_concurrency_limit and ds_drop_limit write,
 * and what the executors' admission reads (steps/limits.c, docs/limits.md).
 *
 * Every function runs inside the caller's SPI connection (ds_store_spi_begin).
 */
#ifndef DS_LIMIT_STORE_H
#define DS_LIMIT_STORE_H

#include "base/compat.h"
#include "utils/timestamp.h"

/* A limit's settings; a field of a setting it does not have is 0 with its `no_` flag set. */
typedef struct LimitSettings
{
	bool		exists;			/* false: dropped (its held steps are let go) */
	bool		no_rate;
	int32		rate;			/* so many per `per` */
	int64		per;			/* microseconds */
	int32		burst;
	bool		no_concurrency;
	int32		concurrency;
} LimitSettings;

/* A key's bucket, locked for this transaction. */
typedef struct LimitBucket
{
	double		tokens;
	TimestampTz refilled_at;
	TimestampTz paused_until;	/* 0 = not paused */
	Oid			last_owner;		/* whose step it admitted last; InvalidOid:
								 * none yet */
} LimitBucket;

/* Set limit `name`'s rate (no_rate: none), or its concurrency (no_concurrency: none). */
extern void ds_store_set_limit_rate(const char *name, bool no_rate, int32 rate, const Interval *per,
									int32 burst);
extern void ds_store_set_limit_concurrency(const char *name, bool no_concurrency,
										   int32 concurrency);

/* Drop limit `name` (its buckets go with it); false when there was none. */
extern bool ds_store_drop_limit(const char *name);

/* Does limit `name` exist? */
extern bool ds_store_limit_exists(const char *name);

/*
 * The keys that hold steps: rows (limit_name, limit_key, first), `first` the earliest time one
 * of them may be admitted. Each key is one descent of steps_limit_held_idx per role that holds
 * steps in it, however many it holds.
 */
extern uint64 ds_store_held_keys(void);

/* Limit `name`'s settings. */
extern void ds_store_limit_settings(const char *name, LimitSettings *out);

/*
 * Lock the bucket of key `key` of limit `name`, first writing a full one (`full` tokens at `now`)
 * when it has none; false when another transaction holds it (that one admits its steps).
 */
extern bool ds_store_lock_bucket(const char *name, const char *key, double full, TimestampTz now,
								 LimitBucket *out);

/* Key `key`'s bucket as it is, without a lock; false when it has none (a full bucket). */
extern bool ds_store_read_bucket(const char *name, const char *key, LimitBucket *out);

/*
 * Lock limit `name`'s row against its drop (FOR SHARE) until the end of the transaction, before
 * a bucket of it is written: false when it no longer exists.
 */
extern bool ds_store_lock_limit_share(const char *name);

/* Write the locked bucket back. */
extern void ds_store_write_bucket(const char *name, const char *key, const LimitBucket *bucket);

/*
 * Pause key `key` of limit `name` until `until` (a later pause stands), its bucket emptied: the
 * receiver's 429 (docs/limits.md, "When the receiver says 429").
 */
extern void ds_store_pause_bucket(const char *name, const char *key, TimestampTz until);

/* The key's admitted steps: all of them (due and running), and those not running yet. */
extern void ds_store_admitted_counts(const char *name, const char *key, int64 *admitted,
									 int64 *not_started);

/*
 * Up to `limit` held steps of the key that may be admitted at `now`, as rows (run_id, step_id,
 * owner): each role's oldest first, the roles taking turns (the first of every role, then the
 * second ...; within a turn from the role after `last_owner`, the one admitted last), so that
 * one role's backlog does not keep another's steps waiting.
 */
extern uint64 ds_store_held_steps(const char *name, const char *key, TimestampTz now, int limit,
								  Oid last_owner);

/* Forget the buckets that are full again by `now` and not paused: a key without one is full. */
extern void ds_store_forget_full_buckets(TimestampTz now);

#endif							/* DS_LIMIT_STORE_H */
