/*
 * key.h -- canonical keys (README, "Keys").
 */
#ifndef DS_KEY_H
#define DS_KEY_H

#include "compat.h"
#include "lib/stringinfo.h"

/* Append one key part with ':' and '\\' escaped, so joined parts can never run together. */
extern void ds_append_escaped_key_part(StringInfo buf, const char *s, int len);

#endif							/* DS_KEY_H */
