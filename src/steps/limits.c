/*
 * limits.c -- rate limits and concurrency per key (docs/limits.md).
 *
 * A limit is a rate (so many per interval, with a burst) and a concurrency, each held per key
 * of the limit: a customer, an API host. A step names its limit and key in its policy. While it
 * waits it is held (step_store.c: its next_attempt_at is NULL, so that no claim of any claimer
 * -- an executor, the HTTP worker, an application worker's ds_claim_tasks -- sees it) until the
 * executors' admission here makes it due: when its key's bucket has a token and the key has a
 * free slot. One admission for every claimer is what holds the limit across claimers,
 * processes and restarts: the buckets are rows, and an admitted step counts against its key
 * until the attempt it was admitted for ends.
 *
 * The bucket holds at most max(burst, 1) tokens, refilled at `rate` per `per`; a step admitted
 * but not yet claimed keeps its token in the bucket's count (the bucket never holds more than
 * its capacity less those), so that steps admitted while the claimers were busy do not all
 * start at once: in any interval of `per`, at most rate + max(burst, 1) attempts of a key
 * start, and over a long backlog `rate` per `per`.
 */
#include "base/compat.h"

#include <math.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "base/policy.h"
#include "ipc/worker_shmem.h"
#include "steps/limits.h"
#include "store/limit_store.h"
#include "store/step_lock.h"
#include "store/step_probe.h"

PG_FUNCTION_INFO_V1(ds_set_rate_limit);
PG_FUNCTION_INFO_V1(ds_set_concurrency_limit);
PG_FUNCTION_INFO_V1(ds_drop_limit);

/* The most steps one look admits, over all keys: the rest in the next, at once. */
#define ADMIT_BATCH 1000

/* How often the buckets that are full again are forgotten. */
#define FORGET_EVERY_USECS ((int64) 60 * USECS_PER_SEC)

/* A step held by a caller's transaction for a moment: looked at again this soon. */
#define LOCKED_STEP_RETRY_USECS ((int64) 5000)

/* How long a 429 pauses its key at least, and when it asks for no wait. */
#define DEFAULT_429_PAUSE_USECS ((int64) USECS_PER_SEC)

static TimestampTz last_forget = 0;

/* A superuser, or a member of durable_steps_admin? */
static bool
is_limit_admin(void)
{
	Oid			admin = get_role_oid("durable_steps_admin", true);

	return superuser() || (OidIsValid(admin) && has_privs_of_role(GetUserId(), admin));
}

/* Argument 0, a limit's name; the caller must be allowed to set limits. */
static char *
limit_name_arg(FunctionCallInfo fcinfo, const char *what)
{
	char	   *name;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("name must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (name[0] == '\0' || strlen(name) > DS_MAX_LIMIT_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("name must be a limit name of 1 to %d bytes", DS_MAX_LIMIT_NAME)));
	if (!is_limit_admin())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s limit \"%s\"", what, name),
				 errdetail("Only superusers and members of durable_steps_admin may configure limits: a limit holds back every role's steps that name it.")));
	PreventCommandIfReadOnly("a change of a limit");
	PreventCommandIfParallelMode("a change of a limit");
	return name;
}

/* After a change of a limit: its held steps may be admitted now, or later. */
static void
limits_changed(void)
{
	ds_limit_admission_at_commit();
}

/*
 * ds_set_rate_limit(name, limit, per, burst) -> void: at most `limit` attempts of each key of
 * the limit start per `per`, and `burst` more at once after a quiet spell. A NULL limit and per
 * remove the rate (the concurrency stays).
 */
Datum
ds_set_rate_limit(PG_FUNCTION_ARGS)
{
	char	   *name = limit_name_arg(fcinfo, "set");
	bool		no_rate = PG_ARGISNULL(1) && PG_ARGISNULL(2);
	int32		rate = 0;
	Interval   *per = NULL;
	int32		burst;
	StoreSpi	spi;

	if (!no_rate && (PG_ARGISNULL(1) || PG_ARGISNULL(2)))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("limit and per must both be given, or both be null to remove the rate")));
	if (!no_rate)
	{
		int64		usecs;

		rate = PG_GETARG_INT32(1);
		per = PG_GETARG_INTERVAL_P(2);
		if (rate < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("limit must be at least 1"),
					 errhint("To hold back every step of the limit, set its concurrency to 0.")));
		usecs = ds_interval_to_usecs(per);
		if (usecs < 1000 || usecs > DS_MAX_DELAY_USECS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("per must be between 1 millisecond and 24 hours")));
	}
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("burst must not be null")));
	burst = PG_GETARG_INT32(3);
	if (burst < 0 || burst > 1000000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("burst must be between 0 and 1000000")));
	ds_store_spi_begin(&spi);
	ds_store_set_limit_rate(name, no_rate, rate, per, burst);
	ds_store_spi_end(&spi);
	limits_changed();
	PG_RETURN_VOID();
}

/*
 * ds_set_concurrency_limit(name, concurrency) -> void: at most `concurrency` steps of each key
 * of the limit are admitted at once (0 holds them all; NULL: no such limit, the rate stays).
 */
Datum
ds_set_concurrency_limit(PG_FUNCTION_ARGS)
{
	char	   *name = limit_name_arg(fcinfo, "set");
	StoreSpi	spi;

	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("concurrency must be 0 or more, or NULL for no limit")));
	ds_store_spi_begin(&spi);
	ds_store_set_limit_concurrency(name, PG_ARGISNULL(1), PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1));
	ds_store_spi_end(&spi);
	limits_changed();
	PG_RETURN_VOID();
}

/*
 * ds_drop_limit(name) -> boolean: the limit and its keys' buckets are gone; the steps it held
 * are admitted as steps of no limit. False when there was no such limit.
 */
Datum
ds_drop_limit(PG_FUNCTION_ARGS)
{
	char	   *name = limit_name_arg(fcinfo, "drop");
	StoreSpi	spi;
	bool		dropped;

	ds_store_spi_begin(&spi);
	dropped = ds_store_drop_limit(name);
	ds_store_spi_end(&spi);
	if (dropped)
		limits_changed();
	PG_RETURN_BOOL(dropped);
}

void
ds_limit_check_step(const char *name, bool synchronous)
{
	StoreSpi	spi;
	bool		exists;

	if (synchronous)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("a step of limit \"%s\" cannot run in its caller's transaction", name),
				 errdetail("A step of a limit waits for its admission, which the worker gives."),
				 errhint("Store it with defer => true (ds_run_step), or make it an HTTP step or a task.")));
	if (strncmp(name, DS_MAP_LIMIT_PREFIX, strlen(DS_MAP_LIMIT_PREFIX)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("limit \"%s\" is a map's own", name),
				 errdetail("A limit named \"%s...\" admits the items of one map (ds_map): no step may name it.",
						   DS_MAP_LIMIT_PREFIX)));
	ds_store_spi_begin(&spi);
	exists = ds_store_limit_exists(name);
	ds_store_spi_end(&spi);
	if (!exists)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("limit \"%s\" does not exist", name),
				 errhint("A member of durable_steps_admin makes it with ds_set_rate_limit() or ds_set_concurrency_limit().")));
}

/* The most tokens a key's bucket holds. */
static double
bucket_capacity(const LimitSettings *limit)
{
	return (double) Max(limit->burst, 1);
}

/*
 * How many steps of key `key` may be admitted now, with the bucket refilled to `now`; *next is
 * when one more may be, when the bucket is what holds them (0 otherwise).
 */
static int
admission_room(const LimitSettings *limit, LimitBucket *bucket, int64 admitted,
			   int64 not_started, TimestampTz now, TimestampTz *next, bool *clamped)
{
	double		room = ADMIT_BATCH;

	*next = 0;
	*clamped = false;
	if (!limit->exists)
		return ADMIT_BATCH;
	if (bucket->paused_until > now)
	{
		*next = bucket->paused_until;
		return 0;
	}
	if (!limit->no_concurrency)
		room = Min(room, (double) (limit->concurrency - admitted));
	if (!limit->no_rate)
	{
		double		interval = (double) limit->per / (double) limit->rate;	/* usecs per token */
		double		capacity = bucket_capacity(limit);
		double		elapsed = (double) Max(now - bucket->refilled_at, 0);

		bucket->tokens = Min(capacity, bucket->tokens + elapsed / interval);

		/*
		 * the steps admitted and not yet claimed still hold their tokens:
		 * what this takes is lost for good, so the bucket is written then
		 */
		if (bucket->tokens > capacity - (double) not_started)
		{
			bucket->tokens = capacity - (double) not_started;
			*clamped = true;
		}
		bucket->refilled_at = now;
		if (bucket->tokens < room)
		{
			room = floor(bucket->tokens);
			if (room < 1)
				*next = now + (int64) ceil((1.0 - bucket->tokens) * interval);
		}
	}
	return room < 1 ? 0 : (int) room;
}

/*
 * Admit step (run_id, step_id) when it is still held and may be admitted at `now`; false when
 * it is not (anymore). *busy: a caller's transaction holds it for a moment.
 */
static bool
admit_step(const char *run_id, const char *step_id, TimestampTz now, bool *busy)
{
	StepRecord	rec;

	*busy = false;
	if (!ds_step_lock_acquire(run_id, step_id, true))
	{
		*busy = true;
		return false;
	}
	if (!ds_lock_step_row(run_id, step_id, &rec) || rec.limit_not_before == 0 ||
		rec.limit_not_before > now ||
		(rec.status != STEP_PENDING && rec.status != STEP_RETRYING))
		return false;
	rec.limit_not_before = 0;
	rec.limit_admitted = rec.attempts + 1;
	rec.next_attempt_at = now;
	ds_store_update_step(&rec);
	/* its claimers look again after the commit */
	ds_worker_wake_kind_at_commit(rec.kind);
	return true;
}

/*
 * Admit what key (name, key) may, at most `cap`; returns how many, *next as
 * ds_admit_limited_steps. A key that can admit nothing is only read: no lock, no write, so that
 * a look over many held keys costs no WAL.
 */
static int
admit_key(const char *name, const char *key, TimestampTz now, int cap, TimestampTz *next)
{
	LimitSettings limit;
	LimitBucket bucket;
	LimitBucket peek;
	int64		admitted = 0;
	int64		not_started = 0;
	int			room;
	int			n = 0;
	uint64		held;
	char	  **run_ids;
	char	  **step_ids;
	Oid		   *owners;
	StoreSpi	spi;
	bool		any_busy = false;
	bool		clamped = false;

	*next = 0;
	ds_store_spi_begin(&spi);
	ds_store_limit_settings(name, &limit);
	if (limit.exists)
	{
		/*
		 * a first look, without a lock: most keys of a busy limit have no
		 * room
		 */
		memset(&peek, 0, sizeof(peek));
		if (!ds_store_read_bucket(name, key, &peek))
		{
			peek.tokens = bucket_capacity(&limit);
			peek.refilled_at = now;
		}
		ds_store_admitted_counts(name, key, &admitted, &not_started);
		if (admission_room(&limit, &peek, admitted, not_started, now, next, &clamped) == 0 &&
			!clamped)
		{
			ds_store_spi_end(&spi);
			return 0;
		}
		/* the limit stays while its bucket is written (ds_drop_limit waits) */
		if (!ds_store_lock_limit_share(name) ||
			!ds_store_lock_bucket(name, key, bucket_capacity(&limit), now, &bucket))
		{
			/*
			 * dropped meanwhile, or another executor admits this key's steps
			 * now
			 */
			ds_store_spi_end(&spi);
			*next = now + LOCKED_STEP_RETRY_USECS;
			return 0;
		}
		/* under the lock, as it is now */
		ds_store_admitted_counts(name, key, &admitted, &not_started);
	}
	else
		memset(&bucket, 0, sizeof(bucket));
	room = Min(admission_room(&limit, &bucket, admitted, not_started, now, next, &clamped), cap);
	if (room == 0)
	{
		if (limit.exists && clamped)
			ds_store_write_bucket(name, key, &bucket);
		ds_store_spi_end(&spi);
		return 0;
	}
	held = ds_store_held_steps(name, key, now, room, bucket.last_owner);
	run_ids = palloc(sizeof(char *) * Max(held, 1));
	step_ids = palloc(sizeof(char *) * Max(held, 1));
	owners = palloc(sizeof(Oid) * Max(held, 1));
	for (uint64 i = 0; i < held; i++)
	{
		bool		isnull;

		run_ids[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		step_ids[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
		owners[i] = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc, 3, &isnull));
	}
	for (uint64 i = 0; i < held; i++)
	{
		bool		busy;

		if (admit_step(run_ids[i], step_ids[i], now, &busy))
		{
			n++;
			/* the next look starts its turn from the role after this one */
			bucket.last_owner = owners[i];
		}
		any_busy |= busy;
	}
	if (limit.exists && !limit.no_rate)
	{
		bucket.tokens -= n;
		/* what the admitted took: when the next token comes */
		if (bucket.tokens < 1 && *next == 0)
			*next = now + (int64) ceil((1.0 - bucket.tokens) *
									   ((double) limit.per / (double) limit.rate));
	}

	/*
	 * a bucket is written only when it gave tokens or lost some: its refill
	 * is computed from its row
	 */
	if (limit.exists && (n > 0 || clamped))
		ds_store_write_bucket(name, key, &bucket);
	ds_store_spi_end(&spi);
	if (any_busy)
		*next = (*next == 0) ? now + LOCKED_STEP_RETRY_USECS : Min(*next, now + LOCKED_STEP_RETRY_USECS);
	return n;
}

int
ds_admit_limited_steps(TimestampTz now, TimestampTz *next)
{
	StoreSpi	spi;
	uint64		nkeys;
	char	  **names;
	char	  **keys;
	TimestampTz *firsts;
	int			admitted = 0;

	*next = 0;
	ds_store_spi_begin(&spi);
	if (now - last_forget >= FORGET_EVERY_USECS)
	{
		ds_store_forget_full_buckets(now);
		last_forget = now;
	}
	nkeys = ds_store_held_keys();
	/* copied out of SPI's memory, which its end frees */
	names = MemoryContextAlloc(spi.caller_cxt, sizeof(char *) * Max(nkeys, 1));
	keys = MemoryContextAlloc(spi.caller_cxt, sizeof(char *) * Max(nkeys, 1));
	firsts = MemoryContextAlloc(spi.caller_cxt, sizeof(TimestampTz) * Max(nkeys, 1));
	for (uint64 i = 0; i < nkeys; i++)
	{
		bool		isnull;

		names[i] = MemoryContextStrdup(spi.caller_cxt,
									   SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
		keys[i] = MemoryContextStrdup(spi.caller_cxt,
									  SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2));
		firsts[i] = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[i],
													  SPI_tuptable->tupdesc, 3, &isnull));
	}
	ds_store_spi_end(&spi);

	for (uint64 i = 0; i < nkeys; i++)
	{
		TimestampTz key_next;

		CHECK_FOR_INTERRUPTS();
		if (admitted >= ADMIT_BATCH)
		{
			/*
			 * one look admits at most a batch, whose steps' locks its
			 * transaction holds: the rest at once, in the next
			 */
			*next = now;
			break;
		}
		if (firsts[i] > now)
			key_next = firsts[i];	/* its first may be admitted then */
		else
		{
			int			n = admit_key(names[i], keys[i], now, ADMIT_BATCH - admitted, &key_next);

			admitted += n;
			/* a full batch may have left more that may be admitted: at once */
			if (admitted >= ADMIT_BATCH)
				key_next = now;
		}
		if (key_next != 0 && (*next == 0 || key_next < *next))
			*next = key_next;
	}
	return admitted;
}

void
ds_limit_pause_for_429(StepRecord *rec, int64 wait_usecs, TimestampTz now)
{
	StoreSpi	spi;

	/*
	 * at least the default: a 429 that asks for no wait (Retry-After: 0) must
	 * not send the key's steps again at once, over and over
	 */
	TimestampTz until = now + Max(wait_usecs, DEFAULT_429_PAUSE_USECS);

	ds_store_spi_begin(&spi);
	ds_store_pause_bucket(rec->limit_name, rec->limit_key, until);
	ds_store_spi_end(&spi);

	/*
	 * the attempt was the limit's, not the step's: given back, and the step
	 * held again until the key's pause ends
	 */
	rec->attempts--;
	rec->status = rec->attempts > rec->attempt_base ? STEP_RETRYING : STEP_PENDING;
	rec->claimed_by = 0;
	rec->lease_expires_at = 0;
	rec->limit_admitted = 0;
	rec->next_attempt_at = until;
}
