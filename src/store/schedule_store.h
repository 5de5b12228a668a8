/*
 * schedule_store.h -- the statements on durable_steps.schedules (schedule_store.c) of
 * ds_schedule, ds_unschedule and ds_schedule_fire (schedules/schedules.c). Each runs inside the
 * caller's SPI connection (ds_store_spi_begin), as the tables' owner.
 */
#ifndef DS_SCHEDULE_STORE_H
#define DS_SCHEDULE_STORE_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/*
 * Schedule `job_name`, its row locked (FOR UPDATE): rows (owner oid, schedule, workflow, input,
 * sql, backfill, jobid, created_at), one at most, in SPI_tuptable.
 */
extern uint64 ds_store_lock_schedule(const char *job_name);

/*
 * Store schedule `job_name` of `owner` (created now), over the one of that name if there is one.
 * `workflow` or `sql` is NULL.
 */
extern void ds_store_put_schedule(const char *job_name, Oid owner, const char *schedule,
								  const char *workflow, Jsonb *input, const char *sql,
								  Interval *backfill, int64 jobid);

/* Remove schedule `job_name`. */
extern void ds_store_delete_schedule(const char *job_name);

/*
 * Record a firing of schedule `job_name` now, and its latest slot `latest` (when `has_latest`)
 * when later than the one recorded.
 */
extern void ds_store_record_schedule_firing(const char *job_name, TimestampTz latest,
											bool has_latest);

#endif							/* DS_SCHEDULE_STORE_H */
