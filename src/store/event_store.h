/*
 * event_store.h -- durable_steps.events and the runs waiting for them (event_store.c): the
 * statements of ds_emit_event and ds_wait_event (runs/workflow_calls.c) and of the worker's
 * looks for emitted events (runs/run_claims.c).
 */
#ifndef DS_EVENT_STORE_H
#define DS_EVENT_STORE_H

#include "base/compat.h"
#include "utils/jsonb.h"

/*
 * Event `name` of role `owner`, read by a statement of its own: false when there is none; else
 * its payload (NULL for a SQL NULL) in *payload, allocated in `cxt`. Runs inside the caller's
 * SPI connection.
 */
extern bool ds_store_read_event(Oid owner, const char *name, MemoryContext cxt, Jsonb **payload);

/*
 * Record event `name` of role `owner` with `payload` (NULL: SQL NULL), the first write winning:
 * true when this one recorded it. Runs inside the caller's SPI connection.
 */
extern bool ds_store_insert_event(Oid owner, const char *name, Jsonb *payload);

/*
 * Wake now the runs of `owner` that wait for its event `name`; returns how many. Runs inside the
 * caller's SPI connection.
 */
extern uint64 ds_store_wake_event_waiters(Oid owner, const char *name);

/* Wake now every waiting run whose event has been emitted (its own SPI connection). */
extern void ds_store_wake_runs_with_emitted_events(void);

/*
 * Wake run `run_id` when it waits for its owner's event `event` and the event is there; when
 * `emit_in_flight`, in a poll interval rather than now, whether or not it is there (its own SPI
 * connection).
 */
extern void ds_store_wake_if_event_emitted(const char *run_id, const char *event,
										   bool emit_in_flight);

#endif							/* DS_EVENT_STORE_H */
