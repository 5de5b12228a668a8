/*
 * role_guard.h -- DROP ROLE warns about the unfinished steps the dropped roles own.
 */
#ifndef DS_ROLE_GUARD_H
#define DS_ROLE_GUARD_H

#include "base/compat.h"

/* Install the ProcessUtility hook (from _PG_init), after whatever hook was there before. */
extern void ds_role_guard_init_module(void);

#endif							/* DS_ROLE_GUARD_H */
