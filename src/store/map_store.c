/*
 * map_store.c -- the statements on durable_steps.maps and on a map's items (map_store.h).
 *
 * They run as the tables' owner, in a turn's executor or in the session of a caller of
 * ds_start_map, under its search_path: every name is qualified, every operator too.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "store/map_store.h"
#include "store/step_store.h"

static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr reopen_plan = NULL;
static SPIPlanPtr items_plan = NULL;
static SPIPlanPtr close_plan = NULL;

bool
ds_store_map_read(const char *run_id, const char *step_id, MemoryContext cxt, MapRow *out)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	HeapTuple	row;
	TupleDesc	td;
	bool		isnull;
	Datum		d;

	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	if (ds_store_execute(&read_plan,
						 "SELECT owner::pg_catalog.oid, items, concurrency, fingerprint"
						 " FROM durable_steps.maps WHERE run_id OPERATOR(pg_catalog.=) $1"
						 " AND step_id OPERATOR(pg_catalog.=) $2",
						 2, types, values, NULL, false, 0, SPI_OK_SELECT,
						 "reading map %s/%s", run_id, step_id) == 0)
		return false;
	row = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	out->owner = DatumGetObjectId(SPI_getbinval(row, td, 1, &isnull));
	out->items = DatumGetInt32(SPI_getbinval(row, td, 2, &isnull));
	d = SPI_getbinval(row, td, 3, &isnull);
	out->concurrency = isnull ? 0 : DatumGetInt32(d);
	out->fingerprint = MemoryContextStrdup(cxt, SPI_getvalue(row, td, 4));
	return true;
}

bool
ds_store_map_insert(const char *run_id, const char *step_id, const MapRow *row)
{
	Oid			types[6] = {TEXTOID, TEXTOID, OIDOID, INT4OID, INT4OID, TEXTOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	values[2] = ObjectIdGetDatum(row->owner);
	values[3] = Int32GetDatum(row->items);
	values[4] = Int32GetDatum(row->concurrency);
	if (row->concurrency == 0)
		nulls[4] = 'n';
	values[5] = CStringGetTextDatum(row->fingerprint);
	return ds_store_execute(&insert_plan,
							"INSERT INTO durable_steps.maps (run_id, step_id, owner, items, concurrency,"
							" fingerprint) VALUES ($1, $2, $3::pg_catalog.regrole, $4, $5, $6)"
							" ON CONFLICT (run_id, step_id) DO NOTHING",
							6, types, values, nulls, false, 0, SPI_OK_INSERT,
							"storing map %s/%s", run_id, step_id) > 0;
}

void
ds_store_map_reopen(const char *run_id, const char *step_id)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];

	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	(void) ds_store_execute(&reopen_plan,
							"UPDATE durable_steps.maps SET open = true"
							" WHERE run_id OPERATOR(pg_catalog.=) $1 AND step_id OPERATOR(pg_catalog.=) $2"
							" AND NOT open",
							2, types, values, NULL, false, 0, SPI_OK_UPDATE,
							"opening map %s/%s", run_id, step_id);
}

void
ds_store_map_items(const char *run_id, const char *step_id, bool outcomes, MemoryContext cxt,
				   int64 *stored, int64 *open, char **needs_person, char **failed,
				   Jsonb **results)
{
	Oid			types[3] = {TEXTOID, TEXTOID, BOOLOID};
	Datum		values[3];
	HeapTuple	row;
	TupleDesc	td;
	bool		isnull;
	Datum		d;

	values[0] = CStringGetTextDatum(run_id);
	values[1] = CStringGetTextDatum(step_id);
	values[2] = BoolGetDatum(outcomes);

	/*
	 * the items are the run's steps "<step_id>/<n>": one range of the primary
	 * key ('/' then '0' in the C collation), numbered by their n
	 */
	(void) ds_store_execute(&items_plan,
							"SELECT pg_catalog.count(*),"
							" pg_catalog.count(*) FILTER (WHERE t.next_attempt_at IS NOT NULL"
							"  OR t.limit_not_before IS NOT NULL),"
							" (pg_catalog.array_agg(t.step_id ORDER BY t.n) FILTER"
							"  (WHERE t.status OPERATOR(pg_catalog.=) ANY ('{blocked,uncertain}')))[1],"
							" (pg_catalog.array_agg(t.step_id ORDER BY t.n) FILTER"
							"  (WHERE t.status OPERATOR(pg_catalog.=) ANY ('{failed,cancelled}')))[1],"
							" CASE WHEN $3 THEN pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object("
							"   'status', t.status, 'result', t.result, 'error_code', t.error_code,"
							"   'error_message', t.error_message) ORDER BY t.n)"
							"  ELSE pg_catalog.jsonb_agg(t.result ORDER BY t.n) END"
							" FROM (SELECT s.step_id, s.status, s.result, s.error_code, s.error_message,"
							"   s.next_attempt_at, s.limit_not_before,"
							"   pg_catalog.substr(s.step_id, pg_catalog.length($2) OPERATOR(pg_catalog.+) 2)::pg_catalog.int4 AS n"
							"  FROM durable_steps.steps s WHERE s.run_id OPERATOR(pg_catalog.=) $1"
							"   AND s.step_id OPERATOR(pg_catalog.>) ($2 OPERATOR(pg_catalog.||) '/')"
							"   AND s.step_id OPERATOR(pg_catalog.<) ($2 OPERATOR(pg_catalog.||) '0')"
							"   AND s.map_step OPERATOR(pg_catalog.=) $2) t",
							3, types, values, NULL, true, 0, SPI_OK_SELECT,
							"reading the items of map %s/%s", run_id, step_id);
	row = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	*stored = DatumGetInt64(SPI_getbinval(row, td, 1, &isnull));
	*open = DatumGetInt64(SPI_getbinval(row, td, 2, &isnull));
	d = SPI_getbinval(row, td, 3, &isnull);
	*needs_person = isnull ? NULL : MemoryContextStrdup(cxt, TextDatumGetCString(d));
	d = SPI_getbinval(row, td, 4, &isnull);
	*failed = isnull ? NULL : MemoryContextStrdup(cxt, TextDatumGetCString(d));
	d = SPI_getbinval(row, td, 5, &isnull);
	if (isnull)
		*results = NULL;
	else
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		*results = DatumGetJsonbPCopy(d);
		MemoryContextSwitchTo(old);
	}
}

uint64
ds_store_close_settled_maps(int limit)
{
	Oid			types[1] = {INT4OID};
	Datum		values[1];

	values[0] = Int32GetDatum(limit);

	/*
	 * an open map is read through maps_open_idx, its items through
	 * steps_map_open_idx: one probe each
	 */
	return ds_store_execute(&close_plan,
							"UPDATE durable_steps.maps m SET open = false"
							" WHERE (m.run_id, m.step_id) IN (SELECT o.run_id, o.step_id"
							"  FROM durable_steps.maps o WHERE o.open AND NOT EXISTS"
							"  (SELECT FROM durable_steps.steps s WHERE s.run_id OPERATOR(pg_catalog.=) o.run_id"
							"    AND s.map_step OPERATOR(pg_catalog.=) o.step_id AND s.map_step IS NOT NULL"
							"    AND (s.next_attempt_at IS NOT NULL OR s.limit_not_before IS NOT NULL))"
							"  LIMIT $1 FOR UPDATE OF o SKIP LOCKED)"
							" RETURNING m.run_id, m.step_id",
							1, types, values, NULL, false, 0, SPI_OK_UPDATE_RETURNING,
							"closing the maps whose items settled");
}
