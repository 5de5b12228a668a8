/*
 * event_store.c -- durable_steps.events and the runs waiting for them (event_store.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "ipc/due_floors.h"
#include "store/event_store.h"
#include "store/step_store.h"

static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr wake_plan = NULL;
static SPIPlanPtr emitted_events_plan = NULL;
static SPIPlanPtr event_plan = NULL;

bool
ds_store_read_event(Oid owner, const char *name, MemoryContext cxt, Jsonb **payload)
{
	Oid			types[2] = {OIDOID, TEXTOID};
	Datum		args[2] = {ObjectIdGetDatum(owner), CStringGetTextDatum(name)};
	bool		isnull;
	Datum		d;
	MemoryContext old;

	*payload = NULL;

	/*
	 * a statement of its own in READ COMMITTED: it sees every event committed
	 * before it
	 */
	if (ds_store_execute(&read_plan,
						 "SELECT payload FROM durable_steps.events"
						 " WHERE owner OPERATOR(pg_catalog.=) $1"
						 " AND name OPERATOR(pg_catalog.=) $2", 2, types,
						 args, NULL, false, 1, SPI_OK_SELECT, "event lookup") != 1)
		return false;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	old = MemoryContextSwitchTo(cxt);
	*payload = isnull ? NULL : DatumGetJsonbPCopy(d);
	MemoryContextSwitchTo(old);
	return true;
}

bool
ds_store_insert_event(Oid owner, const char *name, Jsonb *payload)
{
	Oid			types[3] = {OIDOID, TEXTOID, JSONBOID};
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};

	args[0] = ObjectIdGetDatum(owner);
	args[1] = CStringGetTextDatum(name);
	args[2] = payload ? JsonbPGetDatum(payload) : (Datum) 0;
	nulls[2] = payload ? ' ' : 'n';
	return ds_store_execute(&insert_plan,
							"INSERT INTO durable_steps.events (owner, name, payload)"
							" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
							3, types, args, nulls, false, 0, SPI_OK_INSERT,
							"recording event") == 1;
}

uint64
ds_store_wake_event_waiters(Oid owner, const char *name)
{
	Oid			types[2] = {OIDOID, TEXTOID};
	Datum		args[2] = {ObjectIdGetDatum(owner), CStringGetTextDatum(name)};

	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	return ds_store_execute(&wake_plan,
							"UPDATE durable_steps.runs"
							" SET next_wake_at = pg_catalog.clock_timestamp()"
							" WHERE status OPERATOR(pg_catalog.=) 'waiting'"
							" AND wait_event OPERATOR(pg_catalog.=) $2"
							" AND owner OPERATOR(pg_catalog.=) $1",
							2, types, args, NULL, false, 0, SPI_OK_UPDATE, "waking runs");
}

void
ds_store_wake_runs_with_emitted_events(void)
{
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	/* through runs_event_idx: the runs that wait for an event */
	(void) ds_store_execute(&emitted_events_plan,
							"UPDATE durable_steps.runs r"
							" SET next_wake_at = pg_catalog.clock_timestamp()"
							" WHERE r.status OPERATOR(pg_catalog.=) 'waiting'"
							" AND r.wait_event IS NOT NULL"
							" AND (r.next_wake_at IS NULL"
							"  OR r.next_wake_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())"
							" AND EXISTS (SELECT FROM durable_steps.events e"
							"  WHERE e.owner OPERATOR(pg_catalog.=) r.owner"
							"  AND e.name OPERATOR(pg_catalog.=) r.wait_event)",
							0, NULL, NULL, NULL, false, 0, SPI_OK_UPDATE,
							"looking for emitted events");
	ds_store_spi_end(&spi);
}

void
ds_store_wake_if_event_emitted(const char *run_id, const char *event, bool emit_in_flight)
{
	Oid			types[3] = {TEXTOID, TEXTOID, BOOLOID};
	Datum		args[3] = {CStringGetTextDatum(run_id), CStringGetTextDatum(event),
	BoolGetDatum(emit_in_flight)};
	StoreSpi	spi;

	ds_store_spi_begin(&spi);
	ds_due_floor_note_waiting(DS_RUNS_GROUP, 0, GetCurrentTimestamp());
	(void) ds_store_execute(&event_plan,
							"UPDATE durable_steps.runs r"
							" SET next_wake_at = CASE WHEN $3"
							"  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
							"   pg_catalog.current_setting('durable_steps.poll_interval')::pg_catalog.interval"
							"  ELSE pg_catalog.clock_timestamp() END"
							" WHERE r.run_id OPERATOR(pg_catalog.=) $1"
							" AND r.status OPERATOR(pg_catalog.=) 'waiting'"
							" AND r.wait_event OPERATOR(pg_catalog.=) $2"
							" AND ($3 OR EXISTS (SELECT FROM durable_steps.events e"
							"  WHERE e.owner OPERATOR(pg_catalog.=) r.owner"
							"  AND e.name OPERATOR(pg_catalog.=) $2))",
							3, types, args, NULL, false, 0, SPI_OK_UPDATE,
							"looking for event %s", event);
	ds_store_spi_end(&spi);
}
