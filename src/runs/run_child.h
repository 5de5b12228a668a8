/*
 * run_child.h -- child runs: ds_start_child_run, ds_join_child and ds_start_child (run_child.c,
 * docs/runs.md "Child runs"). SQL functions only.
 */
#ifndef DS_RUN_CHILD_H
#define DS_RUN_CHILD_H

#include "base/compat.h"

#endif							/* DS_RUN_CHILD_H */
