/*
 * worker_attempt_time.h -- how long an attempt may run in the background worker: the settings
 * durable_steps.max_worker_attempt_time and durable_steps.default_timeout (docs/worker.md).
 *
 * The executors bound a step body, a hook or a workflow's turn by them (steps/step_exec.c), the
 * HTTP worker a request (worker/http_worker.c), and the claims write them into a claimed step's
 * lease.
 */
#ifndef DS_WORKER_ATTEMPT_TIME_H
#define DS_WORKER_ATTEMPT_TIME_H

#include "base/compat.h"

extern void ds_worker_attempt_time_init_module(void);

/* durable_steps.max_worker_attempt_time, in microseconds: no worker attempt runs longer. */
extern int64 ds_max_worker_attempt_usecs(void);

/* How long a worker attempt of a step with this timeout (0 = none) may run, in microseconds. */
extern int64 ds_worker_attempt_limit_usecs(int64 step_timeout);

#endif							/* DS_WORKER_ATTEMPT_TIME_H */
