/*
 * idempotency_store.c -- the statements on durable_steps.idempotency_keys
 * (idempotency_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "store/idempotency_store.h"
#include "store/store_relations.h"
#include "store/step_store.h"

/*
 * An entry by (owner, scope, key): done, request, status, body, token, lease_expires_at, and
 * whether it is live (not expired, and done or within its lease).
 */
#define ENTRY_QUERY \
	"SELECT state OPERATOR(pg_catalog.=) 'done', request, status, body, token, lease_expires_at," \
	" expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()" \
	" AND (state OPERATOR(pg_catalog.=) 'done'" \
	"  OR lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())" \
	" FROM durable_steps.idempotency_keys" \
	" WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.regrole" \
	" AND scope OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3"

static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr write_plan = NULL;
static SPIPlanPtr finish_plan = NULL;
static SPIPlanPtr abandon_plan = NULL;
static SPIPlanPtr renew_plan = NULL;
static SPIPlanPtr latest_plan = NULL;

uint64
ds_store_lock_idempotency_entry(Oid owner, const char *scope, const char *key)
{
	Oid			types[3] = {OIDOID, TEXTOID, TEXTOID};
	Datum		args[3];

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	return ds_store_execute(&read_plan,
							ENTRY_QUERY " FOR UPDATE", 3, types,
							args, NULL, false, 1, SPI_OK_SELECT, "reading an idempotency key");
}

uint64
ds_store_read_idempotency_entry_latest(Oid owner, const char *scope, const char *key)
{
	Oid			types[3] = {OIDOID, TEXTOID, TEXTOID};
	Datum		args[3];
	int			rc;

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	(void) ds_store_relations();
	rc = SPI_execute_snapshot(ds_prepare_kept(&latest_plan, ENTRY_QUERY, 3, types),
							  args, NULL, GetLatestSnapshot(), InvalidSnapshot, true, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading an idempotency key failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

void
ds_store_write_idempotency_entry(Oid owner, const char *scope, const char *key, Jsonb *request,
								 bool done, int32 status, Jsonb *body,
								 TimestampTz lease_expires_at, TimestampTz expires_at,
								 pg_uuid_t *token)
{
	Oid			types[9] = {OIDOID, TEXTOID, TEXTOID, JSONBOID, BOOLOID, INT4OID, JSONBOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[9];
	char		nulls[9] = "         ";

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	args[3] = JsonbPGetDatum(request);
	args[4] = BoolGetDatum(done);
	args[5] = Int32GetDatum(status);
	nulls[5] = done ? ' ' : 'n';
	args[6] = body ? JsonbPGetDatum(body) : (Datum) 0;
	nulls[6] = body ? ' ' : 'n';
	args[7] = TimestampTzGetDatum(lease_expires_at);
	nulls[7] = done ? 'n' : ' ';
	args[8] = TimestampTzGetDatum(expires_at);
	if (ds_store_execute(&write_plan,
						 "INSERT INTO durable_steps.idempotency_keys AS i"
						 " (owner, scope, key, request, state, status, body, token,"
						 "  lease_expires_at, expires_at, created_at, finished_at)"
						 " SELECT $1::pg_catalog.regrole, $2, $3, $4,"
						 "  CASE WHEN $5 THEN 'done' ELSE 'held' END, $6, $7,"
						 "  CASE WHEN $5 THEN NULL ELSE pg_catalog.gen_random_uuid() END,"
						 "  $8, $9, pg_catalog.clock_timestamp(),"
						 "  CASE WHEN $5 THEN pg_catalog.clock_timestamp() END"
						 " ON CONFLICT (owner, scope, key) DO UPDATE SET"
						 "  request = excluded.request, state = excluded.state,"
						 "  status = excluded.status, body = excluded.body, token = excluded.token,"
						 "  lease_expires_at = excluded.lease_expires_at,"
						 "  expires_at = excluded.expires_at, created_at = excluded.created_at,"
						 "  finished_at = excluded.finished_at"
						 " RETURNING token", 9, types,
						 args, nulls, false, 1, SPI_OK_INSERT_RETURNING,
						 "writing an idempotency key") != 1)
		elog(ERROR, "writing an idempotency key failed: %s",
			 SPI_result_code_string(SPI_OK_INSERT_RETURNING));
	if (token != NULL)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			memcpy(token, DatumGetUUIDP(d), sizeof(pg_uuid_t));
	}
}

void
ds_store_finish_idempotency_entry(Oid owner, const char *scope, const char *key, int32 status,
								  Jsonb *body)
{
	Oid			types[5] = {OIDOID, TEXTOID, TEXTOID, INT4OID, JSONBOID};
	Datum		args[5];
	char		nulls[5] = "     ";

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	args[3] = Int32GetDatum(status);
	args[4] = body ? JsonbPGetDatum(body) : (Datum) 0;
	nulls[4] = body ? ' ' : 'n';
	(void) ds_store_execute(&finish_plan,
							"UPDATE durable_steps.idempotency_keys SET state = 'done',"
							" status = $4, body = $5, token = NULL, lease_expires_at = NULL,"
							" finished_at = pg_catalog.clock_timestamp()"
							" WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.regrole"
							" AND scope OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3",
							5, types, args, nulls, false, 0, SPI_OK_UPDATE,
							"writing an idempotency key");
}

void
ds_store_renew_idempotency_entry(Oid owner, const char *scope, const char *key,
								 TimestampTz lease_expires_at)
{
	Oid			types[4] = {OIDOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		args[4];

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	args[3] = TimestampTzGetDatum(lease_expires_at);
	(void) ds_store_execute(&renew_plan,
							"UPDATE durable_steps.idempotency_keys SET lease_expires_at = $4,"
							" expires_at = GREATEST(expires_at, $4)"
							" WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.regrole"
							" AND scope OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3",
							4, types, args, NULL, false, 0, SPI_OK_UPDATE,
							"writing an idempotency key");
}

void
ds_store_delete_idempotency_entry(Oid owner, const char *scope, const char *key)
{
	Oid			types[3] = {OIDOID, TEXTOID, TEXTOID};
	Datum		args[3];

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(scope);
	args[2] = CStringGetTextDatum(key);
	(void) ds_store_execute(&abandon_plan,
							"DELETE FROM durable_steps.idempotency_keys"
							" WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.regrole"
							" AND scope OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3",
							3, types, args, NULL, false, 0, SPI_OK_DELETE,
							"writing an idempotency key");
}
