/*
 * queues.h -- queues: where the worker takes steps from, each within its concurrency limit
 * (README, "Queues").
 */
#ifndef DS_QUEUES_H
#define DS_QUEUES_H

#include "compat.h"
#include "fmgr.h"

/* Longest queue name, in bytes. */
#define DS_MAX_QUEUE_NAME (NAMEDATALEN - 1)

/*
 * Argument `argno`, a queue name: not NULL (22004), 1 to DS_MAX_QUEUE_NAME bytes (22023).
 * `what` names the argument in the message.
 */
extern char *ds_queue_name_arg(FunctionCallInfo fcinfo, int argno, const char *what);

#endif							/* DS_QUEUES_H */
