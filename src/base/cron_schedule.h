/*
 * cron_schedule.h -- pg_cron's five-field schedules, read and evaluated in UTC (cron_schedule.c,
 * docs/schedules.md).
 */
#ifndef DS_CRON_SCHEDULE_H
#define DS_CRON_SCHEDULE_H

#include "base/compat.h"
#include "datatype/timestamp.h"

/* The minutes a schedule matches: one bit per allowed value of each field. */
typedef struct CronSchedule
{
	uint64		minutes;		/* bit m: minute m, 0-59 */
	uint32		hours;			/* bit h: hour h, 0-23 */
	uint32		days;			/* bit d: day of month d, 1-31 */
	uint32		months;			/* bit m: month m, 1-12 */
	uint32		weekdays;		/* bit d: day of week d, 0-6, 0 = Sunday */
	bool		days_star;		/* the day-of-month field began with '*' */
	bool		weekdays_star;	/* the day-of-week field began with '*' */
} CronSchedule;

/*
 * Read `text` as pg_cron reads a schedule of minute granularity; raises 22023 naming what is
 * wrong (or not supported) for anything else.
 */
extern void ds_cron_parse(const char *text, CronSchedule *out);

/* The earliest slot in [from, to]; false when there is none. */
extern bool ds_cron_next(const CronSchedule *s, TimestampTz from, TimestampTz to,
						 TimestampTz *slot);

/* The latest slot in [from, to]; false when there is none. */
extern bool ds_cron_prev(const CronSchedule *s, TimestampTz from, TimestampTz to,
						 TimestampTz *slot);

#endif							/* DS_CRON_SCHEDULE_H */
