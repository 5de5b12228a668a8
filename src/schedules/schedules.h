/*
 * schedules.h -- ds_schedule, ds_unschedule and the firing of a schedule's pg_cron job
 * (schedules.c, docs/schedules.md). SQL-callable only.
 */
#ifndef DS_SCHEDULES_H
#define DS_SCHEDULES_H

#include "base/compat.h"
#include "fmgr.h"

extern Datum ds_schedule(PG_FUNCTION_ARGS);
extern Datum ds_unschedule(PG_FUNCTION_ARGS);
extern Datum ds_schedule_fire(PG_FUNCTION_ARGS);

#endif							/* DS_SCHEDULES_H */
