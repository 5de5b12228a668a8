/*
 * runs.h -- starting and steering runs (runs.c, docs/runs.md).
 */
#ifndef DS_RUNS_H
#define DS_RUNS_H

#include "base/compat.h"

/*
 * The workflow named by `name`: a signature ("checkout(text, jsonb)") or a name, which then
 * means the one taking (text, jsonb). Raises unless it is a plain function or procedure of that
 * signature, returning one value, that the current user may execute.
 */
extern Oid	ds_resolve_workflow(const char *name);

#endif							/* DS_RUNS_H */
