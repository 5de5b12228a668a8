/*
 * map_store.h -- the statements on durable_steps.maps and on a map's items (map_store.c): what
 * ds_map and ds_start_map read and write, and the executors' look for maps to join
 * (runs/run_map.c, docs/runs.md "Fan-out and join: ds_map").
 *
 * Every function runs inside the caller's SPI connection (ds_store_spi_begin).
 */
#ifndef DS_MAP_STORE_H
#define DS_MAP_STORE_H

#include "base/compat.h"
#include "utils/jsonb.h"

/* A map's row. */
typedef struct MapRow
{
	Oid			owner;
	int32		items;
	int32		concurrency;	/* 0: none */
	char	   *fingerprint;
} MapRow;

/* Map (run_id, step_id)'s row into *out (in `cxt`); false when there is none. */
extern bool ds_store_map_read(const char *run_id, const char *step_id, MemoryContext cxt,
							  MapRow *out);

/* Add the map's row, open; false when it was there already. */
extern bool ds_store_map_insert(const char *run_id, const char *step_id, const MapRow *row);

/*
 * Open the map again: an item of it waits again (ds_retry_step), or a turn found items to settle.
 * A map that shows open is left as it is, never waited for (an executor closing it meanwhile
 * holds its row, and may wait for the turn's run): a close that wins is made good by the run's
 * own look again (DS_JOIN_RECHECK_USECS).
 */
extern void ds_store_map_reopen(const char *run_id, const char *step_id);

/*
 * What the map's items are now, into the out arguments (`cxt`): how many are stored and how many
 * have not settled; the first item (by its number) that waits for a person (blocked, uncertain)
 * and the first that failed for good (failed, cancelled), or NULL; and the items' results in
 * their order -- each one's result, or with `outcomes` each one's {status, result, error_code,
 * error_message}.
 */
extern void ds_store_map_items(const char *run_id, const char *step_id, bool outcomes,
							   MemoryContext cxt, int64 *stored, int64 *open,
							   char **needs_person, char **failed, Jsonb **results);

/*
 * The open maps none of whose items is left to settle, at most `limit`, as rows (run_id,
 * step_id), each closed (no longer open) by this call.
 */
extern uint64 ds_store_close_settled_maps(int limit);

#endif							/* DS_MAP_STORE_H */
