/*
 * idempotent_requests.c -- idempotent requests: the server side of an Idempotency-Key header
 * (docs/idempotent-requests.md).
 *
 * An entry of durable_steps.idempotency_keys is one (owning role, scope, key): the request it was
 * first used with, and either the response stored for it (`done`) or the token of the
 * application that holds it while it works (`held`, by ds_idempotent_begin, until its lease
 * runs out). An entry past its expiry, or held past its lease, counts as absent; the worker
 * purges those (store/retention.c).
 *
 * Calls on one key are serialized by a heavyweight lock on it, held to the end of the
 * transaction: an advisory-type tag whose fourth field is our own ('DI'), so that it never
 * collides with the application's pg_advisory_lock() keys nor with the step locks ('DS'). A
 * second ds_idempotent on a key whose first call has not committed finds the lock taken: it
 * answers DS409 at once, or waits up to its `wait` for the first to commit and then replays it.
 * The handler runs as the caller, in the caller's transaction, and the response is written after
 * it returned: a handler that raises stores nothing.
 *
 * A key held by ds_idempotent_begin is held across transactions, so no lock stands for it: a
 * repeat that may `wait` sleeps on the condition variable of the key (ipc/outcome_waits.c), which
 * the commit of its finish or abandon wakes, or until its lease runs out; it never polls.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/ds_errcodes.h"
#include "base/interval_bounds.h"
#include "base/partition.h"
#include "base/size_limits.h"
#include "base/sql_text.h"
#include "idempotency/idempotent_requests.h"
#include "ipc/outcome_waits.h"
#include "store/idempotency_store.h"
#include "store/step_store.h"

/* 'DI' in the objsubid column of pg_locks */
#define DS_IDEMPOTENCY_LOCKTAG_FIELD4 0x4449

/* The longest scope or key, in characters. */
#define DS_IDEMPOTENCY_KEY_MAX 255

PG_FUNCTION_INFO_V1(ds_idempotent);
PG_FUNCTION_INFO_V1(ds_idempotent_begin);
PG_FUNCTION_INFO_V1(ds_idempotent_finish);
PG_FUNCTION_INFO_V1(ds_idempotent_abandon);
PG_FUNCTION_INFO_V1(ds_idempotent_renew);

/* One key of the calling role. */
typedef struct IdempotencyKey
{
	Oid			owner;
	char	   *scope;
	char	   *key;
} IdempotencyKey;

/* An entry as stored. */
typedef struct IdempotencyEntry
{
	bool		found;			/* a row exists, live or not */
	bool		live;			/* not expired, and done or held within its
								 * lease */
	bool		done;			/* state: done (else held) */
	Jsonb	   *request;
	int32		status;
	bool		has_status;
	Jsonb	   *body;			/* NULL: null */
	pg_uuid_t	token;
	bool		has_token;
	TimestampTz lease_expires_at;
} IdempotencyEntry;

/* The keys whose ds_idempotent handler runs now in this backend: a handler that uses its own key. */
typedef struct KeyInFlight
{
	IdempotencyKey key;
	struct KeyInFlight *next;
} KeyInFlight;

static KeyInFlight *keys_in_flight = NULL;

/* The text argument `name`: 1 to 255 characters. */
static char *
identity_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	char	   *s;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	s = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	len = pg_mbstrlen(s);
	if (len < 1 || len > DS_IDEMPOTENCY_KEY_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be 1 to %d characters long, not %d", name,
						DS_IDEMPOTENCY_KEY_MAX, len)));
	return s;
}

static IdempotencyKey
key_args(FunctionCallInfo fcinfo)
{
	IdempotencyKey k;

	k.owner = GetUserId();
	k.scope = identity_arg(fcinfo, 0, "scope");
	k.key = identity_arg(fcinfo, 1, "key");
	/* a partitioned server serves its partitions' keys (docs/partitions.md) */
	ds_partition_check_idempotency_key(k.key);
	return k;
}

/* A jsonb argument that must be given. */
static Jsonb *
jsonb_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	Jsonb	   *j;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	j = PG_GETARG_JSONB_P(argno);
	ds_check_size(DS_LIMIT_INPUT, name, VARSIZE(j));
	return j;
}

static TimestampTz after(TimestampTz now, Interval *i, const char *name);

/* An interval argument that must be given: positive (or, `may_be_zero`, not negative). */
static Interval *
interval_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool may_be_zero)
{
	Interval   *i;
	Interval   *zero = palloc0(sizeof(Interval));
	int32		cmp;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	i = PG_GETARG_INTERVAL_P(argno);
	cmp = DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(i),
											IntervalPGetDatum(zero)));
	if (cmp < 0 || (!may_be_zero && cmp == 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s", name, may_be_zero ? "zero or positive" : "positive")));
	(void) after(GetCurrentTimestamp(), i, name);
	return i;
}

/*
 * now + interval, for argument `name`: past the last timestamp is the caller's mistake (22023,
 * naming the argument), found before anything is locked, run or written.
 */
static TimestampTz
after(TimestampTz now, Interval *i, const char *name)
{
	TimestampTz t;

	if (!ds_timestamptz_shift(now, i, 1, &t))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long: it would end past the last timestamp", name)));
	return t;
}

/* An HTTP status: 100 to 599. */
static void
check_status(int32 status)
{
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status (100 to 599)", status)));
}

/* The lock tag of a key: the NULs between the parts keep ("ab","c") and ("a","bc") apart. */
static void
key_locktag(LOCKTAG *tag, const IdempotencyKey *k)
{
	StringInfoData buf;
	uint64		hash;

	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, (const char *) &k->owner, sizeof(Oid));
	appendBinaryStringInfo(&buf, k->scope, strlen(k->scope) + 1);
	appendBinaryStringInfo(&buf, k->key, strlen(k->key));
	hash = hash_bytes_extended((const unsigned char *) buf.data, buf.len, 0);
	pfree(buf.data);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 DS_IDEMPOTENCY_LOCKTAG_FIELD4);
}

static void
raise_in_progress(const IdempotencyKey *k)
{
	ereport(ERROR,
			(errcode(ERRCODE_DS_IN_PROGRESS),
			 errmsg("idempotency key %s/%s is in progress", k->scope, k->key),
			 errdetail("Another request with this key has not finished."),
			 errhint("Retry after a moment: the finished request's response is then replayed.")));
}

/* How a call took its key's lock. */
typedef enum KeyLock
{
	KEY_LOCK_TAKEN,				/* at once */
	KEY_LOCK_WAITED,			/* after waiting for the transaction that held
								 * it */
	KEY_LOCK_HELD_ALREADY		/* this transaction held it already */
} KeyLock;

/*
 * Take the key's lock to the end of the transaction: at once, or waiting up to `wait_ms` (0: not
 * at all) for the transaction that holds it; DS409 when it is still held.
 */
static KeyLock
lock_key(const IdempotencyKey *k, int64 wait_ms)
{
	LOCKTAG		tag;
	MemoryContext cxt = CurrentMemoryContext;
	int			guc_level;
	LockAcquireResult taken;

	key_locktag(&tag, k);
	taken = LockAcquire(&tag, ExclusiveLock, false, true);
	if (taken == LOCKACQUIRE_OK)
		return KEY_LOCK_TAKEN;
	if (taken != LOCKACQUIRE_NOT_AVAIL)
		return KEY_LOCK_HELD_ALREADY;
	if (wait_ms <= 0)
		raise_in_progress(k);

	/* a lock wait, not a polling loop: it ends when the holder commits */
	guc_level = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", psprintf(INT64_FORMAT, Min(wait_ms, (int64) INT_MAX)),
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	PG_TRY();
	{
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			PG_RE_THROW();
		FlushErrorState();
		raise_in_progress(k);
	}
	PG_END_TRY();
	AtEOXact_GUC(true, guc_level);
	return KEY_LOCK_WAITED;
}

/* Let go of the key's lock that lock_key took (not one the transaction held before it). */
static void
unlock_key(const IdempotencyKey *k)
{
	LOCKTAG		tag;

	key_locktag(&tag, k);
	(void) LockRelease(&tag, ExclusiveLock, false);
}

/* What the waiters of a held key sleep on, and the commit of its finish or abandon wakes. */
static char *
key_wake_name(const IdempotencyKey *k)
{
	return psprintf("idempotency key %u/%s/%s", k->owner, k->scope, k->key);
}

/*
 * Read the key's entry as the tables' owner: locked for update, in the transaction's snapshot;
 * or (`latest`) as the latest snapshot shows it, without a row lock (the key's lock, which every
 * writer of the entry takes first, is held).
 */
static void
read_entry_as(const IdempotencyKey *k, IdempotencyEntry *e, bool latest)
{
	StoreSpi	spi;

	memset(e, 0, sizeof(*e));
	ds_store_spi_begin(&spi);
	if ((latest ? ds_store_read_idempotency_entry_latest(k->owner, k->scope, k->key) :
		 ds_store_lock_idempotency_entry(k->owner, k->scope, k->key)) == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		MemoryContext spi_cxt = MemoryContextSwitchTo(spi.caller_cxt);
		bool		isnull;
		Datum		d;

		e->found = true;
		e->done = DatumGetBool(SPI_getbinval(row, td, 1, &isnull));
		e->request = DatumGetJsonbPCopy(SPI_getbinval(row, td, 2, &isnull));
		d = SPI_getbinval(row, td, 3, &isnull);
		e->has_status = !isnull;
		e->status = isnull ? 0 : DatumGetInt32(d);
		d = SPI_getbinval(row, td, 4, &isnull);
		e->body = isnull ? NULL : DatumGetJsonbPCopy(d);
		d = SPI_getbinval(row, td, 5, &isnull);
		e->has_token = !isnull;
		if (!isnull)
			memcpy(&e->token, DatumGetUUIDP(d), sizeof(pg_uuid_t));
		d = SPI_getbinval(row, td, 6, &isnull);
		e->lease_expires_at = isnull ? 0 : DatumGetTimestampTz(d);
		e->live = DatumGetBool(SPI_getbinval(row, td, 7, &isnull));
		MemoryContextSwitchTo(spi_cxt);
	}
	ds_store_spi_end(&spi);
}

static void
read_entry(const IdempotencyKey *k, IdempotencyEntry *e)
{
	read_entry_as(k, e, false);
}

/*
 * Write the key's entry, over one that is no longer live: `done`, the response (status, body);
 * else held with a new token (returned in *token) until `lease_expires_at`.
 */
static void
write_entry(const IdempotencyKey *k, Jsonb *request, bool done, int32 status, Jsonb *body,
			TimestampTz lease_expires_at, TimestampTz expires_at, pg_uuid_t *token)
{
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	ds_store_write_idempotency_entry(k->owner, k->scope, k->key, request, done, status, body,
									 lease_expires_at, expires_at, token);
	ds_store_spi_end(&spi);
}

/* The key's held entry held until `lease_expires_at`. */
static void
renew_entry(const IdempotencyKey *k, TimestampTz lease_expires_at)
{
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	ds_store_renew_idempotency_entry(k->owner, k->scope, k->key, lease_expires_at);
	ds_store_spi_end(&spi);
}

/* Finish (the response) or abandon (`status` < 0: delete) the key's held entry. */
static void
settle_entry(const IdempotencyKey *k, int32 status, Jsonb *body)
{
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	if (status >= 0)
		ds_store_finish_idempotency_entry(k->owner, k->scope, k->key, status, body);
	else
		ds_store_delete_idempotency_entry(k->owner, k->scope, k->key);
	ds_store_spi_end(&spi);
}

/* Another request under a key that has one already: DS422. */
static void
check_same_request(const IdempotencyKey *k, const IdempotencyEntry *e, Jsonb *request)
{
	if (!DatumGetBool(DirectFunctionCall2(jsonb_eq, JsonbPGetDatum(e->request),
										  JsonbPGetDatum(request))))
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_CONFLICT),
				 errmsg("idempotency key %s/%s was used with another request", k->scope, k->key),
				 errdetail("A key stands for one request; its first request was different."),
				 errhint("Use a new key for a new request.")));
}

static bool
same_key(const IdempotencyKey *a, const IdempotencyKey *b)
{
	return a->owner == b->owner && strcmp(a->scope, b->scope) == 0 && strcmp(a->key, b->key) == 0;
}

/* Run the handler with $1 = request, as the caller; its one row (status, body). */
static void
run_handler(const char *handler, Jsonb *request, int32 *status, Jsonb **body)
{
	Oid			types[1] = {JSONBOID};
	Datum		args[1];
	MemoryContext caller_cxt = CurrentMemoryContext;
	TupleDesc	td;
	bool		isnull;
	Datum		d;
	int			rc;

	args[0] = JsonbPGetDatum(request);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(handler, 1, types, args, NULL, false, 2);
	if (rc < 0)
		elog(ERROR, "the handler failed: %s", SPI_result_code_string(rc));
	if (SPI_tuptable == NULL || SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_CARDINALITY_VIOLATION),
				 errmsg("the handler must return one row (status, body), not %s",
						SPI_tuptable == NULL ? "none" :
						SPI_processed == 0 ? "no row" : "several")));
	td = SPI_tuptable->tupdesc;
	if (td->natts != 2 || SPI_gettypeid(td, 1) != INT4OID || SPI_gettypeid(td, 2) != JSONBOID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the handler must return two columns (status integer, body jsonb)"),
				 errhint("For instance: SELECT 201, jsonb_build_object('id', id) FROM orders ...")));
	d = SPI_getbinval(SPI_tuptable->vals[0], td, 1, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the handler returned a null status")));
	*status = DatumGetInt32(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], td, 2, &isnull);
	if (isnull)
		*body = NULL;
	else
	{
		MemoryContext spi_cxt = MemoryContextSwitchTo(caller_cxt);

		*body = DatumGetJsonbPCopy(d);
		MemoryContextSwitchTo(spi_cxt);
	}
	SPI_finish();
	check_status(*status);
	if (*body != NULL)
		ds_check_size(DS_LIMIT_INPUT, "the handler's body", VARSIZE(*body));
}

/* (status integer, body jsonb, replayed boolean) */
static Datum
response_tuple(FunctionCallInfo fcinfo, int32 status, Jsonb *body, bool replayed)
{
	TupleDesc	td;
	Datum		values[3];
	bool		nulls[3] = {false, body == NULL, false};

	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = Int32GetDatum(status);
	values[1] = body ? JsonbPGetDatum(body) : (Datum) 0;
	values[2] = BoolGetDatum(replayed);
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(td), values, nulls));
}

/*
 * ds_idempotent(scope, key, request, handler, ttl, wait) -> (status, body, replayed)
 */
Datum
ds_idempotent(PG_FUNCTION_ARGS)
{
	IdempotencyKey k = key_args(fcinfo);
	Jsonb	   *request = jsonb_arg(fcinfo, 2, "request");
	char	   *handler;
	Interval   *ttl = interval_arg(fcinfo, 4, "ttl", false);
	int64		wait_ms = 0;
	IdempotencyEntry e;
	KeyInFlight in_flight;
	int32		status;
	Jsonb	   *body;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("handler must not be null")));
	handler = text_to_cstring(PG_GETARG_TEXT_PP(3));
	ds_check_size(DS_LIMIT_SQL, "handler", strlen(handler));
	ds_check_one_statement("handler", handler);
	if (!PG_ARGISNULL(5))
	{
		Interval   *wait = interval_arg(fcinfo, 5, "wait", true);

		wait_ms = (after(0, wait, "wait") + 999) / 1000;
	}

	for (KeyInFlight *f = keys_in_flight; f != NULL; f = f->next)
		if (same_key(&f->key, &k))
			ereport(ERROR,
					(errcode(ERRCODE_DS_IN_PROGRESS),
					 errmsg("idempotency key %s/%s is in progress: its handler uses it again", k.scope,
							k.key)));

	/*
	 * A repeat that waited for the first request's transaction: under
	 * REPEATABLE READ or SERIALIZABLE its snapshot, taken before the wait,
	 * cannot see the entry that transaction committed, and writing over it
	 * would fail to serialize (40001). The entry is read as committed now,
	 * and a stored response replayed, as in READ COMMITTED
	 * (docs/idempotent-requests.md).
	 */
	if (lock_key(&k, wait_ms) == KEY_LOCK_WAITED && IsolationUsesXactSnapshot())
	{
		read_entry_as(&k, &e, true);
		if (e.live)
		{
			check_same_request(&k, &e, request);
			if (!e.done)
				raise_in_progress(&k);
			PG_RETURN_DATUM(response_tuple(fcinfo, e.status, e.body, true));
		}
	}
	read_entry(&k, &e);
	if (e.live)
	{
		check_same_request(&k, &e, request);
		if (!e.done)
			raise_in_progress(&k);
		PG_RETURN_DATUM(response_tuple(fcinfo, e.status, e.body, true));
	}

	in_flight.key = k;
	in_flight.next = keys_in_flight;
	keys_in_flight = &in_flight;
	PG_TRY();
	{
		run_handler(handler, request, &status, &body);
	}
	PG_FINALLY();
	{
		keys_in_flight = in_flight.next;
	}
	PG_END_TRY();

	write_entry(&k, request, true, status, body, 0, after(GetCurrentTimestamp(), ttl, "ttl"),
				NULL);
	PG_RETURN_DATUM(response_tuple(fcinfo, status, body, false));
}

/* A repeat waiting for the request that holds its key. */
typedef struct HeldKeyWait
{
	const IdempotencyKey *k;
	IdempotencyEntry e;
} HeldKeyWait;

/* Read the key's entry as committed now: is it no longer held (finished, abandoned, lapsed)? */
static bool
key_let_go(void *arg)
{
	HeldKeyWait *w = arg;

	read_entry_as(w->k, &w->e, true);
	return !w->e.live || w->e.done;
}

/* Milliseconds from now until `t`, at least 0. */
static int64
ms_until(TimestampTz t)
{
	TimestampTz now = GetCurrentTimestamp();

	return t <= now ? 0 : (t - now + 999) / 1000;
}

/*
 * ds_idempotent_begin(scope, key, request, ttl, lease, wait) -> (state, status, body, token)
 *
 * A key held by another request is DS409 at once, or, with `wait`, once `wait` has passed
 * without its holder finishing, abandoning or losing it. The wait releases the key's lock while
 * it sleeps (the holder's finish takes it) and reads the entry again, as committed, each time it
 * is woken or the holder's lease runs out.
 */
Datum
ds_idempotent_begin(PG_FUNCTION_ARGS)
{
	IdempotencyKey k = key_args(fcinfo);
	Jsonb	   *request = jsonb_arg(fcinfo, 2, "request");
	Interval   *ttl = interval_arg(fcinfo, 3, "ttl", false);
	Interval   *lease = interval_arg(fcinfo, 4, "lease", false);
	TimestampTz deadline = GetCurrentTimestamp();
	IdempotencyEntry e;
	TupleDesc	td;
	Datum		values[4];
	bool		nulls[4] = {false, true, true, true};
	pg_uuid_t  *token;
	TimestampTz now;

	if (PG_NARGS() > 5 && !PG_ARGISNULL(5))
		deadline = after(deadline, interval_arg(fcinfo, 5, "wait", true), "wait");
	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	for (;;)
	{
		KeyLock		taken = lock_key(&k, ms_until(deadline));
		HeldKeyWait w;

		/*
		 * The entry as committed now, without a row lock: the key's lock
		 * keeps every other writer out until this transaction ends, a row
		 * lock would also keep out the holder's finish that a wait is for,
		 * and a REPEATABLE READ snapshot taken before a wait would not see
		 * it. Writing over a row newer than that snapshot fails to serialize
		 * (40001), as any write of such a row does.
		 */
		read_entry_as(&k, &e, true);
		if (!e.live)
			break;
		check_same_request(&k, &e, request);
		if (e.done)
		{
			values[0] = CStringGetTextDatum("replay");
			values[1] = Int32GetDatum(e.status);
			nulls[1] = false;
			values[2] = e.body ? JsonbPGetDatum(e.body) : (Datum) 0;
			nulls[2] = e.body == NULL;
			PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(td), values, nulls)));
		}

		/* held by a request that has not finished */
		if (taken == KEY_LOCK_HELD_ALREADY || ms_until(deadline) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_DS_IN_PROGRESS),
					 errmsg("idempotency key %s/%s is in progress", k.scope, k.key),
					 errdetail("The request that holds it has not finished, and its lease has not run out (ds_idempotency_keys shows when it does)."),
					 errhint("Retry after a moment: the finished request's response is then replayed.")));
		ds_outcome_waits_require();
		unlock_key(&k);
		w.k = &k;
		(void) ds_outcome_wait(key_wake_name(&k),
							   Min(ms_until(deadline), ms_until(e.lease_expires_at)),
							   ds_outcome_wait_may_release_xmin(fcinfo), key_let_go, &w);
	}
	now = GetCurrentTimestamp();
	token = palloc(sizeof(pg_uuid_t));
	/* never purged while it is held */
	write_entry(&k, request, false, 0, NULL, after(now, lease, "lease"),
				Max(after(now, ttl, "ttl"), after(now, lease, "lease")), token);
	values[0] = CStringGetTextDatum("new");
	values[3] = UUIDPGetDatum(token);
	nulls[3] = false;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(td), values, nulls)));
}

/* The key's entry must be held with `token`: DS404 when there is none, DS409 when it is not. */
static void
check_holder(const IdempotencyKey *k, const IdempotencyEntry *e, const pg_uuid_t *token)
{
	if (!e->found)
		ereport(ERROR,
				(errcode(ERRCODE_DS_STEP_NOT_FOUND),
				 errmsg("idempotency key %s/%s does not exist", k->scope, k->key),
				 errdetail("It was abandoned, or it expired and was purged.")));
	if (e->done || !e->has_token || memcmp(&e->token, token, sizeof(pg_uuid_t)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_IN_PROGRESS),
				 errmsg("idempotency key %s/%s is not held with this token", k->scope, k->key),
				 errdetail(e->done ? "Its response is stored already." :
						   "It is held with another token: this one's lease ran out and another request took the key, or the token is not its holder's.")));
}

/*
 * ds_idempotent_finish(scope, key, token, status, body)
 */
Datum
ds_idempotent_finish(PG_FUNCTION_ARGS)
{
	IdempotencyKey k = key_args(fcinfo);
	IdempotencyEntry e;
	Jsonb	   *body = NULL;
	int32		status;

	if (PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(2) ? "token" : "status")));
	status = PG_GETARG_INT32(3);
	check_status(status);
	if (!PG_ARGISNULL(4))
	{
		body = PG_GETARG_JSONB_P(4);
		ds_check_size(DS_LIMIT_INPUT, "body", VARSIZE(body));
	}
	(void) lock_key(&k, INT_MAX);
	read_entry(&k, &e);
	check_holder(&k, &e, PG_GETARG_UUID_P(2));
	settle_entry(&k, status, body);
	ds_outcome_wake_at_commit(key_wake_name(&k));
	PG_RETURN_VOID();
}

/*
 * ds_idempotent_abandon(scope, key, token)
 */
Datum
ds_idempotent_abandon(PG_FUNCTION_ARGS)
{
	IdempotencyKey k = key_args(fcinfo);
	IdempotencyEntry e;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	(void) lock_key(&k, INT_MAX);
	read_entry(&k, &e);
	check_holder(&k, &e, PG_GETARG_UUID_P(2));
	settle_entry(&k, -1, NULL);
	ds_outcome_wake_at_commit(key_wake_name(&k));
	PG_RETURN_VOID();
}

/*
 * ds_idempotent_renew(scope, key, token, lease) -> timestamptz: the held key's lease runs for
 * `lease` from now, the time it runs out is returned. A holder whose work may outlast its lease
 * renews it while it works, so that a client's retry meanwhile is answered DS409 (or waits)
 * instead of beginning the work a second time; a holder whose token is refused (DS409, DS404)
 * has lost the key and learns it before it finishes (docs/idempotent-requests.md).
 */
Datum
ds_idempotent_renew(PG_FUNCTION_ARGS)
{
	IdempotencyKey k = key_args(fcinfo);
	Interval   *lease = interval_arg(fcinfo, 3, "lease", false);
	IdempotencyEntry e;
	TimestampTz lease_expires_at;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	lease_expires_at = after(GetCurrentTimestamp(), lease, "lease");
	(void) lock_key(&k, INT_MAX);
	read_entry(&k, &e);
	check_holder(&k, &e, PG_GETARG_UUID_P(2));
	renew_entry(&k, lease_expires_at);
	PG_RETURN_TIMESTAMPTZ(lease_expires_at);
}
