/*
 * run_map.h -- ds_map and ds_start_map: fan-out and join in a SQL workflow (run_map.c,
 * docs/runs.md "Fan-out and join: ds_map"); the executors' join of maps whose items settled.
 */
#ifndef DS_RUN_MAP_H
#define DS_RUN_MAP_H

#include "base/compat.h"

/*
 * In an executor, after commits that settled items of maps: close the open maps none of whose
 * items is left to settle (at most `limit`), drop their internal limits and wake their runs, in
 * the caller's transaction. Returns how many it closed.
 */
extern int	ds_join_settled_maps(int limit);

#endif							/* DS_RUN_MAP_H */
