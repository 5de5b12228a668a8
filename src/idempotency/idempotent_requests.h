/*
 * idempotent_requests.h -- idempotent requests: the server side of an Idempotency-Key header
 * (docs/idempotent-requests.md).
 *
 * Its SQL functions (ds_idempotent, ds_idempotent_begin, ds_idempotent_finish,
 * ds_idempotent_abandon) are the module's whole interface; the worker's purge of expired keys
 * is one of retention's statements (store/retention.c).
 */
#ifndef DS_IDEMPOTENT_REQUESTS_H
#define DS_IDEMPOTENT_REQUESTS_H

#include "base/compat.h"
#include "fmgr.h"

extern Datum ds_idempotent(PG_FUNCTION_ARGS);
extern Datum ds_idempotent_begin(PG_FUNCTION_ARGS);
extern Datum ds_idempotent_finish(PG_FUNCTION_ARGS);
extern Datum ds_idempotent_abandon(PG_FUNCTION_ARGS);

#endif							/* DS_IDEMPOTENT_REQUESTS_H */
