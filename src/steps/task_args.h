/*
 * task_args.h -- the checked arguments of the calls of tasks (task_args.c, docs/tasks.md): a
 * malformed one is an error with its own SQLSTATE, before anything is read or written.
 */
#ifndef DS_TASK_ARGS_H
#define DS_TASK_ARGS_H

#include "base/compat.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/jsonb.h"

/* The longest task name (a handler's name, not a document), queue name in a list, worker name. */
#define DS_MAX_TASK_NAME 200

/* Argument `argno`, a task's name: not NULL (22004), 1 to DS_MAX_TASK_NAME bytes (22023). */
extern char *ds_task_name_arg(FunctionCallInfo fcinfo, int argno);

/* A task's name: 1 to DS_MAX_TASK_NAME bytes (22023). */
extern void ds_check_task_name(const char *name);

/*
 * Argument `argno`, an interval in (0, 24 hours], in microseconds (22023 naming it `name`);
 * `if_null` when it is NULL.
 */
extern int64 ds_task_interval_arg(FunctionCallInfo fcinfo, int argno, const char *name,
								  int64 if_null);

/*
 * Argument `argno`, a list of names (tasks, queues): one-dimensional, not empty, each 1 to
 * DS_MAX_TASK_NAME bytes, no NULL element. NULL only when `may_be_null` (22004 otherwise).
 */
extern ArrayType *ds_task_names_arg(FunctionCallInfo fcinfo, int argno, const char *name,
									bool may_be_null);

/* The fingerprint of a task's definition: its name, whether it expects a result, input and hooks. */
extern char *ds_task_fingerprint(const char *task, bool expect_row, Jsonb *input,
								 const char *on_success,
								 const char *on_failure);

#endif							/* DS_TASK_ARGS_H */
