#!/usr/bin/env python3
"""test/cron_oracle.py -- random pg_cron schedules and times, with the slots croniter finds.

    cron_oracle.py SEED EXPRESSIONS TIMES [--croniter-day-rule]

Writes one tab-separated line per (schedule, time) to stdout: the schedule, the time (UTC, ISO
8601, never on a whole minute), the next 5 slots after it and the previous 3 before it,
comma-separated, each 'YYYY-MM-DDTHH:MM', and `croniter` or `walk`: who answered. A line whose
slots croniter cannot find (a schedule of days no month has, `0 0 30 2 *`) is not written:
croniter searches a bounded span and raises. TAP 075 compares ds_cron_slots with these lines.

The answer is croniter's (python3-croniter) unless a plain walk over the days disagrees with it:
the walk takes the values of each field from croniter's own reading of the schedule
(croniter.expanded) and tries every day in turn, hours and minutes in order. Where the two
disagree the line carries the walk's answer, marked `walk`, and stderr names the schedule: croniter
1.3.5 skips the first days of a month after one that lacks a later listed day (`0 0 1,31 * *` from
21 February answers 31 March, not 1 March).

The schedules are drawn from pg_cron 1.4's grammar as docs/schedules.md describes it: five
fields of lists of `*`, `*/n`, `n`, `a-b`, `a-b/n`, month and weekday names in any case, weekday
7, and the @ names. croniter is told pg_cron's day rule: a day matches by both day fields when
either begins with `*`, by either one otherwise (croniter's own default ORs them unless a field is
exactly `*`; --croniter-day-rule keeps that default, to show the difference). A bare `*` in a day
field's list comes first (see field()).
"""
import datetime
import random
import sys

from croniter import croniter

FIELDS = [(0, 59, None), (0, 23, None), (1, 31, None),
          (1, 12, ['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']),
          (0, 7, ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'])]
SPECIALS = {'@hourly': '0 * * * *', '@daily': '0 0 * * *', '@midnight': '0 0 * * *',
            '@weekly': '0 0 * * 0', '@monthly': '0 0 1 * *', '@yearly': '0 0 1 1 *',
            '@annually': '0 0 1 1 *'}
UTC = datetime.timezone.utc


def value(rng, low, high, names):
    v = rng.randint(low, high)
    if names and v - low < len(names) and rng.random() < 0.4:
        name = names[v - low]
        return rng.choice([name, name.upper(), name.capitalize()]), v
    return (str(v).zfill(2) if rng.random() < 0.05 else str(v)), v


def element(rng, low, high, names, tight):
    """One range of a field; `tight` keeps it wide enough that the schedule is not too rare."""
    r = rng.random()
    if r < (0.5 if tight else 0.25):
        return '*'
    if r < 0.45 if not tight else r < 0.65:
        return '*/' + str(rng.randint(1, high - low + 3))
    if r < 0.65:
        return value(rng, low, high, names)[0]
    a_text, a = value(rng, low, high, names)
    b = rng.randint(a, high)
    b_text = names[b - low] if names and b - low < len(names) and rng.random() < 0.3 else str(b)
    if rng.random() < 0.5:
        return '%s-%s' % (a_text, b_text)
    return '%s-%s/%d' % (a_text, b_text, rng.randint(1, high - low + 1))


def field(rng, i):
    low, high, names = FIELDS[i]
    if rng.random() < (0.35 if i >= 2 else 0.1):
        return '*'
    n = 1 if rng.random() < 0.6 else rng.randint(2, 4)
    elements = [element(rng, low, high, names, i >= 2) for _ in range(n)]
    if i in (2, 4):
        # croniter reads a day field that holds a bare `*` anywhere as `*`; pg_cron (Vixie) looks
        # at its first character only, so `5,*` is a restricted field of every day there: bare
        # stars go first in the day fields, where both read them alike
        elements.sort(key=lambda e: e != '*')
    return ','.join(elements)


def schedule(rng):
    if rng.random() < 0.05:
        return rng.choice(list(SPECIALS))
    return ' '.join(field(rng, i) for i in range(5))


def walk(expr, fields, start, n, step):
    """The n slots after (step 1) or before (step -1) start, trying every day in turn."""
    sets = []
    for i, values in enumerate(croniter(expr).expanded):
        low, high, _ = FIELDS[i]
        sets.append(set(range(low, high + 1)) if '*' in values else set(int(v) for v in values))
    sets[4] = set(d % 7 for d in sets[4])
    both = fields[2].startswith('*') or fields[4].startswith('*')
    minutes = [(h, m) for h in sorted(sets[1]) for m in sorted(sets[0])]
    if step < 0:
        minutes.reverse()
    day = start.date()
    found = []
    for _ in range(60 * 366):
        by_date = day.day in sets[2]
        by_weekday = day.isoweekday() % 7 in sets[4]
        if day.month in sets[3] and ((by_date and by_weekday) if both else (by_date or by_weekday)):
            for h, m in minutes:
                t = datetime.datetime(day.year, day.month, day.day, h, m, tzinfo=UTC)
                if (t > start if step > 0 else t < start):
                    found.append(fmt(t))
                    if len(found) == n:
                        return found
        day += datetime.timedelta(days=step)
    return found


def fmt(t):
    return t.strftime('%Y-%m-%dT%H:%M')


def main():
    seed, n_expr, n_times = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    croniter_rule = '--croniter-day-rule' in sys.argv
    rng = random.Random(seed)
    for _ in range(n_expr):
        expr = schedule(rng)
        fields = SPECIALS.get(expr, expr).split()
        day_or = not (fields[2].startswith('*') or fields[4].startswith('*'))
        for _ in range(n_times):
            start = datetime.datetime(2000, 1, 1, tzinfo=UTC) + datetime.timedelta(
                minutes=rng.randint(0, 40 * 366 * 24 * 60), seconds=rng.randint(1, 59))
            try:
                it = croniter(expr, start) if croniter_rule else croniter(expr, start, day_or=day_or)
                nexts = [fmt(it.get_next(datetime.datetime)) for _ in range(5)]
                it = croniter(expr, start) if croniter_rule else croniter(expr, start, day_or=day_or)
                prevs = [fmt(it.get_prev(datetime.datetime)) for _ in range(3)]
            except Exception as e:  # croniter's bounded search found no slot
                print('skipped\t%s\t%s' % (expr, type(e).__name__), file=sys.stderr)
                continue
            who = 'croniter'
            walked = (walk(expr, fields, start, 5, 1), walk(expr, fields, start, 3, -1))
            if walked != (nexts, prevs):
                print('croniter differs\t%s\t%s' % (expr, start), file=sys.stderr)
                nexts, prevs = walked
                who = 'walk'
            print('%s\t%s\t%s\t%s\t%s' % (expr, start.strftime('%Y-%m-%dT%H:%M:%SZ'),
                                          ','.join(nexts), ','.join(prevs), who))


if __name__ == '__main__':
    main()
