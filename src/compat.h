/*
 * compat.h -- every PG_VERSION_NUM guard of the extension lives here.
 *
 * durable_steps targets PostgreSQL 15; later majors are accepted where the APIs it uses did not
 * change. Older majors are refused at build time rather than half-working.
 */
#ifndef DS_COMPAT_H
#define DS_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "durable_steps requires PostgreSQL 15 or later"
#endif

#endif							/* DS_COMPAT_H */
