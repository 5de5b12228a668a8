/*
 * size_limits.h -- the largest definitions a role may store (docs/reference.md, "Settings").
 */
#ifndef DS_SIZE_LIMITS_H
#define DS_SIZE_LIMITS_H

#include "base/compat.h"

/* What a limit bounds; each has its superuser setting. */
typedef enum DsSizeLimit
{
	DS_LIMIT_SQL,				/* a step's body or hook:
								 * durable_steps.max_sql_size */
	DS_LIMIT_INPUT,				/* a step's or a run's input:
								 * durable_steps.max_input_size */
	DS_LIMIT_REQUEST,			/* an HTTP step's request:
								 * durable_steps.max_request_size */
	DS_LIMIT_EVENT_PAYLOAD		/* an event's payload:
								 * durable_steps.max_event_payload_size */
} DsSizeLimit;

extern void ds_size_limits_init_module(void);

/*
 * Raise 54000 (program_limit_exceeded), naming the argument and the setting, when `bytes` is over
 * the limit `which`; before anything is stored.
 */
extern void ds_check_size(DsSizeLimit which, const char *argument, Size bytes);

#endif							/* DS_SIZE_LIMITS_H */
