/*
 * key.h -- canonical keys (docs/steps.md, "Keys").
 */
#ifndef DS_KEY_H
#define DS_KEY_H

#include "base/compat.h"
#include "lib/stringinfo.h"

/* Append one key part with ':' and '\\' escaped, so joined parts can never run together. */
extern void ds_append_escaped_key_part(StringInfo buf, const char *s, int len);

/*
 * Append the key of the step (run_id, step_id) as ds_idempotency_key() hands it to a body and an
 * HTTP step sends it in its idempotency header: the escaped parts joined by ':', then every byte
 * that is not a visible ASCII character, and '%', written as %XX. Injective (two identities never
 * give one key) and safe in an HTTP header value: no CR, LF, space or control byte.
 */
extern void ds_append_step_key(StringInfo buf, const char *run_id, const char *step_id);

#endif							/* DS_KEY_H */
