/*
 * limit_store.c -- the statements on limits, their buckets and the held steps (limit_store.h).
 *
 * They run as the tables' owner, in the executors (search_path pg_catalog) or in the session of
 * a caller of ds_set_rate_limit and the like: every name is qualified, every operator too.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "store/limit_store.h"
#include "store/step_store.h"

static SPIPlanPtr set_rate_plan = NULL;
static SPIPlanPtr set_concurrency_plan = NULL;
static SPIPlanPtr drop_plan = NULL;
static SPIPlanPtr exists_plan = NULL;
static SPIPlanPtr held_keys_plan = NULL;
static SPIPlanPtr settings_plan = NULL;
static SPIPlanPtr new_bucket_plan = NULL;
static SPIPlanPtr lock_bucket_plan = NULL;
static SPIPlanPtr write_bucket_plan = NULL;
static SPIPlanPtr pause_plan = NULL;
static SPIPlanPtr admitted_plan = NULL;
static SPIPlanPtr held_steps_plan = NULL;
static SPIPlanPtr forget_plan = NULL;
static SPIPlanPtr read_bucket_plan = NULL;
static SPIPlanPtr share_plan = NULL;

/*
 * The roles o(owner) that hold steps in key ($1, $2), walked through steps_limit_held_idx one
 * role at a time (the "loose index scan" of step_claim_store.c).
 */
#define HELD_ROLES(name, key) \
	"WITH RECURSIVE o(owner) AS (" \
	" (SELECT s.owner FROM durable_steps.steps s" \
	"   WHERE s.limit_name OPERATOR(pg_catalog.=) " name " AND s.limit_key OPERATOR(pg_catalog.=) " key \
	"     AND s.limit_not_before IS NOT NULL ORDER BY s.owner LIMIT 1)" \
	" UNION ALL" \
	" SELECT n.owner FROM o CROSS JOIN LATERAL" \
	"  (SELECT s.owner FROM durable_steps.steps s" \
	"    WHERE s.limit_name OPERATOR(pg_catalog.=) " name " AND s.limit_key OPERATOR(pg_catalog.=) " key \
	"      AND s.limit_not_before IS NOT NULL AND s.owner OPERATOR(pg_catalog.>) o.owner" \
	"    ORDER BY s.owner LIMIT 1) n) "

void
ds_store_set_limit_rate(const char *name, bool no_rate, int32 rate, const Interval *per,
						int32 burst)
{
	Oid			types[4] = {TEXTOID, INT4OID, INTERVALOID, INT4OID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	values[0] = CStringGetTextDatum(name);
	values[1] = Int32GetDatum(rate);
	values[2] = PointerGetDatum(per);
	values[3] = Int32GetDatum(burst);
	if (no_rate)
		nulls[1] = nulls[2] = 'n';
	(void) ds_store_execute(&set_rate_plan,
							"INSERT INTO durable_steps.limits AS l (name, rate, per, burst)"
							" VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE"
							" SET rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst,"
							" updated_at = pg_catalog.clock_timestamp()",
							4, types, values, nulls, false, 0, SPI_OK_INSERT,
							"setting the rate of limit \"%s\"", name);
}

void
ds_store_set_limit_concurrency(const char *name, bool no_concurrency, int32 concurrency)
{
	Oid			types[2] = {TEXTOID, INT4OID};
	Datum		values[2];
	char		nulls[2] = {' ', ' '};

	values[0] = CStringGetTextDatum(name);
	values[1] = Int32GetDatum(concurrency);
	if (no_concurrency)
		nulls[1] = 'n';
	(void) ds_store_execute(&set_concurrency_plan,
							"INSERT INTO durable_steps.limits AS l (name, concurrency)"
							" VALUES ($1, $2) ON CONFLICT (name) DO UPDATE"
							" SET concurrency = EXCLUDED.concurrency,"
							" updated_at = pg_catalog.clock_timestamp()",
							2, types, values, nulls, false, 0, SPI_OK_INSERT,
							"setting the concurrency of limit \"%s\"", name);
}

bool
ds_store_drop_limit(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(name);
	return ds_store_execute(&drop_plan,
							"DELETE FROM durable_steps.limits WHERE name OPERATOR(pg_catalog.=) $1",
							1, types, values, NULL, false, 0, SPI_OK_DELETE,
							"dropping limit \"%s\"", name) > 0;
}

bool
ds_store_limit_exists(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(name);
	return ds_store_execute(&exists_plan,
							"SELECT FROM durable_steps.limits WHERE name OPERATOR(pg_catalog.=) $1",
							1, types, values, NULL, true, 0, SPI_OK_SELECT,
							"looking for limit \"%s\"", name) > 0;
}

uint64
ds_store_held_keys(void)
{
	/*
	 * the keys, one descent each; then each key's roles, one descent each;
	 * then each role's first held step
	 */
	return ds_store_execute(&held_keys_plan,
							"WITH RECURSIVE k(limit_name, limit_key) AS ("
							" (SELECT s.limit_name, s.limit_key FROM durable_steps.steps s"
							"   WHERE s.limit_not_before IS NOT NULL"
							"   ORDER BY s.limit_name, s.limit_key LIMIT 1)"
							" UNION ALL"
							" SELECT n.limit_name, n.limit_key FROM k CROSS JOIN LATERAL"
							"  (SELECT s.limit_name, s.limit_key FROM durable_steps.steps s"
							"    WHERE s.limit_not_before IS NOT NULL"
							"      AND (s.limit_name, s.limit_key) > (k.limit_name, k.limit_key)"
							"    ORDER BY s.limit_name, s.limit_key LIMIT 1) n),"
							" o(limit_name, limit_key, owner) AS ("
							" SELECT k.limit_name, k.limit_key, f.owner FROM k CROSS JOIN LATERAL"
							"  (SELECT s.owner FROM durable_steps.steps s"
							"    WHERE s.limit_name OPERATOR(pg_catalog.=) k.limit_name"
							"      AND s.limit_key OPERATOR(pg_catalog.=) k.limit_key"
							"      AND s.limit_not_before IS NOT NULL ORDER BY s.owner LIMIT 1) f"
							" UNION ALL"
							" SELECT o.limit_name, o.limit_key, f.owner FROM o CROSS JOIN LATERAL"
							"  (SELECT s.owner FROM durable_steps.steps s"
							"    WHERE s.limit_name OPERATOR(pg_catalog.=) o.limit_name"
							"      AND s.limit_key OPERATOR(pg_catalog.=) o.limit_key"
							"      AND s.limit_not_before IS NOT NULL AND s.owner OPERATOR(pg_catalog.>) o.owner"
							"    ORDER BY s.owner LIMIT 1) f)"
							" SELECT o.limit_name, o.limit_key, pg_catalog.min(m.first) FROM o CROSS JOIN LATERAL"
							"  (SELECT s.limit_not_before AS first FROM durable_steps.steps s"
							"    WHERE s.limit_name OPERATOR(pg_catalog.=) o.limit_name"
							"      AND s.limit_key OPERATOR(pg_catalog.=) o.limit_key"
							"      AND s.owner OPERATOR(pg_catalog.=) o.owner AND s.limit_not_before IS NOT NULL"
							"    ORDER BY s.limit_not_before LIMIT 1) m"
							" GROUP BY 1, 2",
							0, NULL, NULL, NULL, false, 0, SPI_OK_SELECT, "held key query");
}

void
ds_store_limit_settings(const char *name, LimitSettings *out)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];
	HeapTuple	row;
	TupleDesc	td;
	bool		isnull;
	Datum		d;

	memset(out, 0, sizeof(*out));
	out->no_rate = true;
	out->no_concurrency = true;
	values[0] = CStringGetTextDatum(name);
	if (ds_store_execute(&settings_plan,
						 "SELECT rate, (EXTRACT(EPOCH FROM per) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8,"
						 " burst, concurrency FROM durable_steps.limits"
						 " WHERE name OPERATOR(pg_catalog.=) $1",
						 1, types, values, NULL, false, 0, SPI_OK_SELECT,
						 "reading limit \"%s\"", name) == 0)
		return;
	row = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	out->exists = true;
	d = SPI_getbinval(row, td, 1, &isnull);
	if (!isnull)
	{
		out->no_rate = false;
		out->rate = DatumGetInt32(d);
		out->per = DatumGetInt64(SPI_getbinval(row, td, 2, &isnull));
	}
	out->burst = DatumGetInt32(SPI_getbinval(row, td, 3, &isnull));
	d = SPI_getbinval(row, td, 4, &isnull);
	if (!isnull)
	{
		out->no_concurrency = false;
		out->concurrency = DatumGetInt32(d);
	}
}

/* The bucket in the first row of SPI_tuptable: (tokens, refilled_at, paused_until, last_owner). */
static void
bucket_from_row(LimitBucket *out)
{
	HeapTuple	row = SPI_tuptable->vals[0];
	TupleDesc	td = SPI_tuptable->tupdesc;
	bool		isnull;
	Datum		d;

	out->tokens = DatumGetFloat8(SPI_getbinval(row, td, 1, &isnull));
	out->refilled_at = DatumGetTimestampTz(SPI_getbinval(row, td, 2, &isnull));
	d = SPI_getbinval(row, td, 3, &isnull);
	out->paused_until = isnull ? 0 : DatumGetTimestampTz(d);
	d = SPI_getbinval(row, td, 4, &isnull);
	out->last_owner = isnull ? InvalidOid : DatumGetObjectId(d);
}

bool
ds_store_lock_bucket(const char *name, const char *key, double full, TimestampTz now,
					 LimitBucket *out)
{
	Oid			types[4] = {TEXTOID, TEXTOID, FLOAT8OID, TIMESTAMPTZOID};
	Datum		values[4];

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	values[2] = Float8GetDatum(full);
	values[3] = TimestampTzGetDatum(now);
	(void) ds_store_execute(&new_bucket_plan,
							"INSERT INTO durable_steps.limit_keys (limit_name, key, tokens, refilled_at)"
							" SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT FROM durable_steps.limits"
							"  WHERE name OPERATOR(pg_catalog.=) $1)"
							" ON CONFLICT (limit_name, key) DO NOTHING",
							4, types, values, NULL, false, 0, SPI_OK_INSERT,
							"adding the bucket of limit \"%s\"", name);
	if (ds_store_execute(&lock_bucket_plan,
						 "SELECT tokens, refilled_at, paused_until, last_owner FROM durable_steps.limit_keys"
						 " WHERE limit_name OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
						 " FOR UPDATE SKIP LOCKED",
						 2, types, values, NULL, false, 0, SPI_OK_SELECT,
						 "locking the bucket of limit \"%s\"", name) == 0)
		return false;
	bucket_from_row(out);
	return true;
}

bool
ds_store_read_bucket(const char *name, const char *key, LimitBucket *out)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	if (ds_store_execute(&read_bucket_plan,
						 "SELECT tokens, refilled_at, paused_until, last_owner FROM durable_steps.limit_keys"
						 " WHERE limit_name OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
						 2, types, values, NULL, true, 0, SPI_OK_SELECT,
						 "reading the bucket of limit \"%s\"", name) == 0)
		return false;
	bucket_from_row(out);
	return true;
}

bool
ds_store_lock_limit_share(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(name);
	return ds_store_execute(&share_plan,
							"SELECT FROM durable_steps.limits WHERE name OPERATOR(pg_catalog.=) $1"
							" FOR SHARE",
							1, types, values, NULL, false, 0, SPI_OK_SELECT,
							"locking limit \"%s\"", name) > 0;
}

void
ds_store_write_bucket(const char *name, const char *key, const LimitBucket *bucket)
{
	Oid			types[5] = {TEXTOID, TEXTOID, FLOAT8OID, TIMESTAMPTZOID, OIDOID};
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	values[2] = Float8GetDatum(bucket->tokens);
	values[3] = TimestampTzGetDatum(bucket->refilled_at);
	values[4] = ObjectIdGetDatum(bucket->last_owner);
	if (!OidIsValid(bucket->last_owner))
		nulls[4] = 'n';
	(void) ds_store_execute(&write_bucket_plan,
							"UPDATE durable_steps.limit_keys SET tokens = $3, refilled_at = $4, last_owner = $5"
							" WHERE limit_name OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
							5, types, values, nulls, false, 0, SPI_OK_UPDATE,
							"writing the bucket of limit \"%s\"", name);
}

void
ds_store_pause_bucket(const char *name, const char *key, TimestampTz until)
{
	Oid			types[3] = {TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[3];

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	values[2] = TimestampTzGetDatum(until);
	(void) ds_store_execute(&pause_plan,
							"INSERT INTO durable_steps.limit_keys AS b"
							"  (limit_name, key, tokens, refilled_at, paused_until)"
							" SELECT $1, $2, 0, $3, $3 WHERE EXISTS (SELECT FROM durable_steps.limits"
							"  WHERE name OPERATOR(pg_catalog.=) $1)"
							" ON CONFLICT (limit_name, key) DO UPDATE SET tokens = 0,"
							"  refilled_at = GREATEST(b.refilled_at, $3),"
							"  paused_until = GREATEST(b.paused_until, $3)",
							3, types, values, NULL, false, 0, SPI_OK_INSERT,
							"pausing a key of limit \"%s\"", name);
}

void
ds_store_admitted_counts(const char *name, const char *key, int64 *admitted, int64 *not_started)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	bool		isnull;

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	(void) ds_store_execute(&admitted_plan,
							"SELECT pg_catalog.count(*),"
							" pg_catalog.count(*) FILTER (WHERE status OPERATOR(pg_catalog.<>) 'running')"
							" FROM durable_steps.steps"
							" WHERE limit_name OPERATOR(pg_catalog.=) $1 AND limit_key OPERATOR(pg_catalog.=) $2"
							" AND limit_admitted IS NOT NULL",
							2, types, values, NULL, false, 0, SPI_OK_SELECT,
							"counting the admitted steps of limit \"%s\"", name);
	*admitted = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											&isnull));
	*not_started = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
											   &isnull));
}

uint64
ds_store_held_steps(const char *name, const char *key, TimestampTz now, int limit, Oid last_owner)
{
	Oid			types[5] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT4OID, OIDOID};
	Datum		values[5];

	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(key);
	values[2] = TimestampTzGetDatum(now);
	values[3] = Int32GetDatum(limit);
	values[4] = ObjectIdGetDatum(last_owner);

	/*
	 * each role's first `limit` at most, numbered; the roles' firsts, then
	 * their seconds ..., each turn from the role after the last one admitted,
	 * round; steps of the partitions this node serves only
	 */
	return ds_store_execute(&held_steps_plan,
							HELD_ROLES("$1", "$2")
							"SELECT h.run_id, h.step_id, o.owner::pg_catalog.oid FROM o CROSS JOIN LATERAL"
							" (SELECT t.run_id, t.step_id, t.limit_not_before,"
							"   pg_catalog.row_number() OVER (ORDER BY t.limit_not_before) AS turn"
							"  FROM (SELECT s.run_id, s.step_id, s.limit_not_before FROM durable_steps.steps s"
							"   WHERE s.limit_name OPERATOR(pg_catalog.=) $1 AND s.limit_key OPERATOR(pg_catalog.=) $2"
							"     AND s.owner OPERATOR(pg_catalog.=) o.owner AND s.limit_not_before IS NOT NULL"
							"     AND s.limit_not_before OPERATOR(pg_catalog.<=) $3"
							"     AND durable_steps.ds_partition_owned(s.run_id)"
							"   ORDER BY s.limit_not_before LIMIT $4) t) h"
							" ORDER BY h.turn, o.owner::pg_catalog.oid OPERATOR(pg_catalog.<=) $5,"
							"  o.owner::pg_catalog.oid LIMIT $4",
							5, types, values, NULL, false, 0, SPI_OK_SELECT,
							"held step query of limit \"%s\"", name);
}

void
ds_store_forget_full_buckets(TimestampTz now)
{
	Oid			types[1] = {TIMESTAMPTZOID};
	Datum		values[1];

	values[0] = TimestampTzGetDatum(now);

	/*
	 * full: its tokens plus what flowed in since make max(burst, 1) (a limit
	 * without a rate has no use for a bucket but its pause)
	 */
	(void) ds_store_execute(&forget_plan,
							"DELETE FROM durable_steps.limit_keys b USING durable_steps.limits l"
							" WHERE l.name OPERATOR(pg_catalog.=) b.limit_name"
							"   AND (b.paused_until IS NULL OR b.paused_until OPERATOR(pg_catalog.<=) $1)"
							"   AND (l.rate IS NULL OR b.tokens OPERATOR(pg_catalog.+)"
							"        EXTRACT(EPOCH FROM $1 OPERATOR(pg_catalog.-) b.refilled_at)::pg_catalog.float8"
							"        OPERATOR(pg_catalog.*) l.rate OPERATOR(pg_catalog./)"
							"        EXTRACT(EPOCH FROM l.per)::pg_catalog.float8"
							"        OPERATOR(pg_catalog.>=) GREATEST(l.burst, 1))",
							1, types, values, NULL, false, 0, SPI_OK_DELETE,
							"forgetting full buckets");
}
