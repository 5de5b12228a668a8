/*
 * idempotency_store.h -- the statements on durable_steps.idempotency_keys of ds_idempotent
 * (idempotency_store.c; the policy is idempotency/idempotent_requests.c's). An entry is one (owning role,
 * scope, key). Each runs inside the caller's SPI connection (ds_store_spi_begin), as the tables'
 * owner.
 */
#ifndef DS_IDEMPOTENCY_STORE_H
#define DS_IDEMPOTENCY_STORE_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

/*
 * The entry of (owner, scope, key), its row locked (FOR UPDATE): rows (done bool, request,
 * status, body, token, lease_expires_at, live bool: not expired, and done or within its lease),
 * one at most, in SPI_tuptable.
 */
extern uint64 ds_store_lock_idempotency_entry(Oid owner, const char *scope, const char *key);

/*
 * The same row as the latest snapshot shows it, without a row lock: what another transaction
 * committed after this one's snapshot, for a REPEATABLE READ caller that waited for it.
 */
extern uint64 ds_store_read_idempotency_entry_latest(Oid owner, const char *scope,
													 const char *key);

/*
 * Write the entry of (owner, scope, key), over the one there: `done` with the response
 * (`status`, `body`, NULL: null), else held with a new token until `lease_expires_at`; kept until
 * `expires_at`. The token written (when held) in *token, unless token is NULL.
 */
extern void ds_store_write_idempotency_entry(Oid owner, const char *scope, const char *key,
											 Jsonb *request, bool done, int32 status,
											 Jsonb *body, TimestampTz lease_expires_at,
											 TimestampTz expires_at, pg_uuid_t *token);

/* The held entry of (owner, scope, key) done with the response (`status`, `body`, NULL: null). */
extern void ds_store_finish_idempotency_entry(Oid owner, const char *scope, const char *key,
											  int32 status, Jsonb *body);

/*
 * The held entry of (owner, scope, key) held until `lease_expires_at`, and kept at least as long
 * (expires_at).
 */
extern void ds_store_renew_idempotency_entry(Oid owner, const char *scope, const char *key,
											 TimestampTz lease_expires_at);

/* The held entry of (owner, scope, key) removed. */
extern void ds_store_delete_idempotency_entry(Oid owner, const char *scope, const char *key);

#endif							/* DS_IDEMPOTENCY_STORE_H */
