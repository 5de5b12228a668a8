/*
 * queues.h -- queues: where the worker takes steps from, each within its concurrency limit
 * (docs/queues.md).
 */
#ifndef DS_QUEUES_H
#define DS_QUEUES_H

#include "base/compat.h"
#include "fmgr.h"

/* Longest queue name, in bytes. */
#define DS_MAX_QUEUE_NAME (NAMEDATALEN - 1)

/*
 * Argument `argno`, a queue name: not NULL (22004), 1 to DS_MAX_QUEUE_NAME bytes (22023).
 * `what` names the argument in the message.
 */
extern char *ds_queue_name_arg(FunctionCallInfo fcinfo, int argno, const char *what);

/*
 * A step's priority, checked: a number below 0 goes before the default of every role's steps,
 * so only superusers and members of durable_steps_admin may give one (42501).
 */
extern int32 ds_priority_arg(FunctionCallInfo fcinfo, int argno);

#endif							/* DS_QUEUES_H */
