/*
 * queue_store.c -- the statements on durable_steps.queues of ds_set_queue (queue_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "store/queue_store.h"
#include "store/step_store.h"

static SPIPlanPtr upsert_plan = NULL;

void
ds_store_set_queue(const char *name, int32 concurrency, bool unlimited)
{
	Oid			types[2] = {TEXTOID, INT4OID};
	Datum		values[2];
	char		nulls[2] = {' ', ' '};

	values[0] = CStringGetTextDatum(name);
	if (unlimited)
		nulls[1] = 'n';
	else
		values[1] = Int32GetDatum(concurrency);
	(void) ds_store_execute(&upsert_plan,
							"INSERT INTO durable_steps.queues AS q (name, concurrency) "
							"VALUES ($1, $2) ON CONFLICT (name) DO UPDATE "
							"SET concurrency = EXCLUDED.concurrency, "
							"updated_at = pg_catalog.clock_timestamp()",
							2, types, values, nulls, false, 0, SPI_OK_INSERT,
							"setting queue \"%s\"", name);
}
