/*
 * cron_schedule.c -- pg_cron's five-field schedules (docs/schedules.md, "Schedule syntax").
 *
 * pg_cron 1.4 reads a schedule with Vixie cron's parser and fires a job in the minutes it
 * matches, in GMT: `minute hour day-of-month month day-of-week`, each field a list of ranges
 * (`*`, `n`, `n-m`, `*` or `n-m` with a `/step`), months and days of week also by their
 * three-letter English names, 7 also Sunday; or one of @hourly, @daily, @midnight, @weekly,
 * @monthly, @yearly, @annually. A day matches by both day fields when either of them begins with
 * `*`, and by either one otherwise (Vixie's rule: `0 0 1 * mon` runs on the 1st and on every
 * Monday, `0 0 1-31/2 * mon` on the odd days and on every Monday, but a day-of-month field of
 * `*` with a step of 2 only on the odd days that are Mondays).
 *
 * What pg_cron would take in a way nobody means -- a range running backwards (it matches
 * nothing), a field with trailing characters (Vixie skips them), words after the fifth field
 * (taken for a crontab's command) -- is refused here rather than read as pg_cron reads it, and so
 * are @reboot (its firings have no slot) and the seconds and `$` forms of later pg_cron versions.
 * Every refusal is 22023 with the reason in its detail.
 *
 * Slots are found by walking whole days: a day that matches is searched hour by hour and minute by
 * minute, a day that does not is skipped at once, so a schedule that matches nothing in a long
 * span (`0 0 30 2 *`) costs one test per day of it.
 */
#include "base/compat.h"

#include <ctype.h>

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "base/cron_schedule.h"

PG_FUNCTION_INFO_V1(ds_cron_slots);

static const char *const month_names[] = {
	"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec", NULL
};
static const char *const weekday_names[] = {
	"sun", "mon", "tue", "wed", "thu", "fri", "sat", NULL
};

/* One field of the five: its name, bounds, and the names its values may go by. */
typedef struct CronField
{
	const char *name;
	int			low;
	int			high;
	const char *const *names;	/* names[i] is low + i; NULL: numbers only */
} CronField;

static const CronField fields[5] = {
	{"minute", 0, 59, NULL},
	{"hour", 0, 23, NULL},
	{"day of month", 1, 31, NULL},
	{"month", 1, 12, month_names},
	{"day of week", 0, 7, weekday_names},
};

/* Where the reader stands in the schedule, for its errors. */
typedef struct CronReader
{
	const char *text;			/* the whole schedule */
	const char *p;
} CronReader;

pg_noreturn static void
refuse(CronReader *r, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid schedule \"%s\"", r->text),
			 errdetail_internal("%s", detail),
			 errhint("A schedule is pg_cron's: five fields \"minute hour day-of-month month day-of-week\" in UTC, or @hourly, @daily, @weekly, @monthly, @yearly.")));
}

static bool
is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* A value of field f: digits, or one of its names. */
static int
read_value(CronReader *r, const CronField *f)
{
	const char *start = r->p;
	int			len;
	long		v = 0;

	while (isalnum((unsigned char) *r->p))
		r->p++;
	len = r->p - start;
	if (len == 0)
		refuse(r, psprintf("The %s field lacks a value at \"%s\".", f->name, start));
	if (isdigit((unsigned char) start[0]))
	{
		for (int i = 0; i < len; i++)
		{
			if (!isdigit((unsigned char) start[i]))
				refuse(r, psprintf("\"%.*s\" is not a %s.", len, start, f->name));
			/* more digits than any bound has: out of range either way */
			if (v <= 1000)
				v = v * 10 + (start[i] - '0');
		}
		if (v < f->low || v > f->high)
			refuse(r, psprintf("%.*s is out of range for the %s field (%d-%d).", len, start,
							   f->name, f->low, f->high));
		return (int) v;
	}
	if (f->names)
	{
		for (int i = 0; f->names[i]; i++)
			if (len == 3 && pg_strncasecmp(start, f->names[i], 3) == 0)
				return f->low + i;
	}
	refuse(r, psprintf("\"%.*s\" is not a %s.", len, start, f->name));
}

/* A step: a positive number. */
static int
read_step(CronReader *r, const CronField *f)
{
	const char *start = r->p;
	long		v = 0;

	while (isdigit((unsigned char) *r->p))
	{
		if (v <= 1000)
			v = v * 10 + (*r->p - '0');
		r->p++;
	}
	if (r->p == start || isalpha((unsigned char) *r->p))
		refuse(r, psprintf("The step of the %s field must be a number.", f->name));
	if (v == 0)
		refuse(r, psprintf("The step of the %s field must be positive.", f->name));
	return (int) v;
}

/* One field: a comma-separated list of ranges; the bits of its values (bit v for value v). */
static uint64
read_field(CronReader *r, const CronField *f, bool *star)
{
	uint64		bits = 0;

	*star = *r->p == '*';
	for (;;)
	{
		int			first;
		int			last;
		int			step = 1;

		if (*r->p == '*')
		{
			r->p++;
			first = f->low;
			last = f->high;
			if (*r->p == '/')
			{
				r->p++;
				step = read_step(r, f);
			}
		}
		else
		{
			first = last = read_value(r, f);
			if (*r->p == '/')
				refuse(r, psprintf("A step in the %s field needs a range (\"*/n\" or \"a-b/n\"), not a single value.", f->name));
			if (*r->p == '-')
			{
				r->p++;
				last = read_value(r, f);
				if (last < first)
					refuse(r, psprintf("The range %d-%d of the %s field runs backwards.", first,
									   last, f->name));
				if (*r->p == '/')
				{
					r->p++;
					step = read_step(r, f);
				}
			}
		}
		for (int v = first; v <= last; v += step)
			bits |= UINT64CONST(1) << v;
		if (*r->p != ',')
			break;
		r->p++;
	}
	if (*r->p != '\0' && !is_blank(*r->p))
		refuse(r, psprintf("Unexpected \"%c\" in the %s field.", *r->p, f->name));
	return bits;
}

/* The named schedules; @reboot and @restart are refused: their firings are not for a slot. */
static void
read_special(CronReader *r, CronSchedule *s)
{
	const char *start = ++r->p;
	char	   *word;

	while (*r->p && !is_blank(*r->p))
		r->p++;
	word = pnstrdup(start, r->p - start);
	s->minutes = 1;
	s->hours = 1;
	s->days = 0xFFFFFFFE;
	s->months = 0x1FFE;
	s->weekdays = 0x7F;
	if (strcmp(word, "hourly") == 0)
		s->hours = 0xFFFFFF;
	else if (strcmp(word, "daily") == 0 || strcmp(word, "midnight") == 0)
		s->days_star = false;	/* every day at midnight: the defaults */
	else if (strcmp(word, "weekly") == 0)
	{
		s->days_star = true;
		s->weekdays = 1;
	}
	else if (strcmp(word, "monthly") == 0)
	{
		s->days = 1 << 1;
		s->weekdays_star = true;
	}
	else if (strcmp(word, "yearly") == 0 || strcmp(word, "annually") == 0)
	{
		s->days = 1 << 1;
		s->months = 1 << 1;
		s->weekdays_star = true;
	}
	else if (strcmp(word, "reboot") == 0 || strcmp(word, "restart") == 0)
		refuse(r, "@reboot runs a job when pg_cron starts: its firings are for no slot of time.");
	else
		refuse(r, psprintf("\"@%s\" is not a named schedule.", word));
}

/* pg_cron 1.5's "[1-59] seconds" */
static bool
mentions_seconds(const char *text)
{
	for (const char *p = text; *p; p++)
		if (pg_strncasecmp(p, "second", 6) == 0)
			return true;
	return false;
}

void
ds_cron_parse(const char *text, CronSchedule *out)
{
	CronReader	r;
	bool		star;

	r.text = text;
	r.p = text;

	memset(out, 0, sizeof(*out));
	while (is_blank(*r.p))
		r.p++;
	if (*r.p == '\0')
		refuse(&r, "The schedule is empty.");
	if (*r.p == '@')
		read_special(&r, out);
	else if (strchr(text, '$'))
		refuse(&r, "\"$\" (the last day of the month) is not supported by pg_cron 1.4.");
	else if (mentions_seconds(text))
		refuse(&r, "Schedules in seconds are not supported: slots are whole minutes.");
	else
	{
		for (int i = 0; i < 5; i++)
		{
			uint64		bits;

			if (*r.p == '\0')
				refuse(&r, psprintf("The schedule has %d fields, not 5.", i));
			bits = read_field(&r, &fields[i], &star);
			switch (i)
			{
				case 0:
					out->minutes = bits;
					break;
				case 1:
					out->hours = (uint32) bits;
					break;
				case 2:
					out->days = (uint32) bits;
					out->days_star = star;
					break;
				case 3:
					out->months = (uint32) bits;
					break;
				case 4:
					/* 7 is Sunday too */
					out->weekdays = (uint32) ((bits | (bits >> 7)) & 0x7F);
					out->weekdays_star = star;
					break;
			}
			while (is_blank(*r.p))
				r.p++;
		}
	}
	while (is_blank(*r.p))
		r.p++;
	if (*r.p != '\0')
		refuse(&r, psprintf("Unexpected \"%s\" after the schedule.", r.p));
}

/* The day `day` (days since 2000-01-01) matches the schedule's day fields and month. */
static bool
day_matches(const CronSchedule *s, int64 day)
{
	int			julian = (int) (day + POSTGRES_EPOCH_JDATE);
	int			year;
	int			month;
	int			mday;
	bool		by_date;
	bool		by_weekday;

	j2date(julian, &year, &month, &mday);
	if (!(s->months & (1U << month)))
		return false;
	by_date = (s->days & (1U << mday)) != 0;
	by_weekday = (s->weekdays & (1U << j2day(julian))) != 0;
	if (s->days_star || s->weekdays_star)
		return by_date && by_weekday;
	return by_date || by_weekday;
}

/* floor(t / unit), also for times before 2000 */
static int64
floor_div(int64 t, int64 unit)
{
	return t / unit - (t % unit < 0 ? 1 : 0);
}

bool
ds_cron_next(const CronSchedule *s, TimestampTz from, TimestampTz to, TimestampTz *slot)
{
	int64		minute = floor_div(from, USECS_PER_MINUTE);
	int64		last_day = floor_div(to, USECS_PER_DAY);

	if (minute * USECS_PER_MINUTE < from)
		minute++;
	for (int64 day = floor_div(minute * USECS_PER_MINUTE, USECS_PER_DAY); day <= last_day; day++)
	{
		int64		first = day == floor_div(minute * USECS_PER_MINUTE, USECS_PER_DAY) ?
			minute - day * MINS_PER_HOUR * HOURS_PER_DAY : 0;

		CHECK_FOR_INTERRUPTS();
		if (!day_matches(s, day))
			continue;
		for (int64 m = first; m < MINS_PER_HOUR * HOURS_PER_DAY; m++)
		{
			TimestampTz t;

			if (!(s->hours & (1U << (m / MINS_PER_HOUR))))
			{
				m = (m / MINS_PER_HOUR + 1) * MINS_PER_HOUR - 1;
				continue;
			}
			if (!(s->minutes & (UINT64CONST(1) << (m % MINS_PER_HOUR))))
				continue;
			t = (day * MINS_PER_HOUR * HOURS_PER_DAY + m) * USECS_PER_MINUTE;
			if (t > to)
				return false;
			*slot = t;
			return true;
		}
	}
	return false;
}

bool
ds_cron_prev(const CronSchedule *s, TimestampTz from, TimestampTz to, TimestampTz *slot)
{
	int64		minute = floor_div(to, USECS_PER_MINUTE);
	int64		first_day = floor_div(from, USECS_PER_DAY);
	int64		top_day = floor_div(minute * USECS_PER_MINUTE, USECS_PER_DAY);

	for (int64 day = top_day; day >= first_day; day--)
	{
		int64		last = day == top_day ?
			minute - day * MINS_PER_HOUR * HOURS_PER_DAY : MINS_PER_HOUR * HOURS_PER_DAY - 1;

		CHECK_FOR_INTERRUPTS();
		if (!day_matches(s, day))
			continue;
		for (int64 m = last; m >= 0; m--)
		{
			TimestampTz t;

			if (!(s->hours & (1U << (m / MINS_PER_HOUR))))
			{
				m = (m / MINS_PER_HOUR) * MINS_PER_HOUR;
				continue;
			}
			if (!(s->minutes & (UINT64CONST(1) << (m % MINS_PER_HOUR))))
				continue;
			t = (day * MINS_PER_HOUR * HOURS_PER_DAY + m) * USECS_PER_MINUTE;
			if (t < from)
				return false;
			*slot = t;
			return true;
		}
	}
	return false;
}

/* The state of a ds_cron_slots scan: the schedule, the next time to look from, the end. */
typedef struct CronSlotScan
{
	CronSchedule schedule;
	TimestampTz from;
	TimestampTz to;
	bool		ascending;		/* from <= to when the scan began */
} CronSlotScan;

static TimestampTz
finite_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	TimestampTz t = PG_GETARG_TIMESTAMPTZ(argno);

	if (TIMESTAMP_NOT_FINITE(t))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a finite time", name)));
	return t;
}

/*
 * ds_cron_slots(schedule, from, to) -> SETOF timestamptz: the slots of `schedule` between `from`
 * and `to`, both included, in the order from `from` to `to`: earliest first when from <= to,
 * latest first when from > to. One slot per call, so that a LIMIT stops the walk.
 */
Datum
ds_cron_slots(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	CronSlotScan *scan;
	TimestampTz slot;

	if (SRF_IS_FIRSTCALL())
	{
		MemoryContext old;

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		scan = palloc(sizeof(CronSlotScan));
		ds_cron_parse(text_to_cstring(PG_GETARG_TEXT_PP(0)), &scan->schedule);
		scan->from = finite_arg(fcinfo, 1, "from");
		scan->to = finite_arg(fcinfo, 2, "to");
		scan->ascending = scan->from <= scan->to;
		funcctx->user_fctx = scan;
		MemoryContextSwitchTo(old);
	}
	funcctx = SRF_PERCALL_SETUP();
	scan = funcctx->user_fctx;
	if (scan->ascending)
	{
		if (scan->from <= scan->to && ds_cron_next(&scan->schedule, scan->from, scan->to, &slot))
		{
			scan->from = slot + USECS_PER_MINUTE;
			SRF_RETURN_NEXT(funcctx, TimestampTzGetDatum(slot));
		}
	}
	else if (scan->from >= scan->to && ds_cron_prev(&scan->schedule, scan->to, scan->from, &slot))
	{
		scan->from = slot - USECS_PER_MINUTE;
		SRF_RETURN_NEXT(funcctx, TimestampTzGetDatum(slot));
	}
	SRF_RETURN_DONE(funcctx);
}
