-- Schedules (docs/schedules.md) where pg_cron is not installed: the schedule syntax through
-- ds_cron_slots, every refusal of a malformed argument, and ds_schedule's error without pg_cron.
SET TimeZone = 'UTC';

-- every quarter hour from 9 to 10, Monday to Friday (2026-12-04 is a Friday)
SELECT * FROM ds_cron_slots('*/15 9-10 * * mon-fri', '2026-12-04 10:20', '2026-12-07 09:20');
-- latest first when from is after to
SELECT * FROM ds_cron_slots('0 */6 * * *', '2026-12-04 13:00', '2026-12-03 20:00');
-- both ends included; a time between minutes is not a slot
SELECT * FROM ds_cron_slots('* * * * *', '2026-12-04 10:00', '2026-12-04 10:02');
SELECT * FROM ds_cron_slots('* * * * *', '2026-12-04 10:00:30', '2026-12-04 10:02:30');
-- names in any case, 7 is Sunday, lists of ranges with steps, leading zeros, blanks around
SELECT to_char(s, 'YYYY-MM-DD Dy HH24:MI') FROM ds_cron_slots(' 05 0 * Jan,DEC-dec sat-7 ', '2026-12-25', '2027-01-04') s;
SELECT to_char(s, 'YYYY-MM-DD Dy HH24:MI') FROM ds_cron_slots('0 12 1-10/3,31 feb-apr *', '2027-02-01', '2027-04-01') s;
-- the day rule: both day fields when one begins with *, either one otherwise
SELECT to_char(s, 'YYYY-MM-DD Dy') FROM ds_cron_slots('0 0 13 * fri', '2026-11-01', '2026-12-01') s;
SELECT to_char(s, 'YYYY-MM-DD Dy') FROM ds_cron_slots('0 0 */13 * fri', '2026-11-01', '2026-12-01') s;
-- the named schedules
SELECT n, (SELECT string_agg(to_char(s, 'YYYY-MM-DD Dy HH24:MI'), ', ')
             FROM ds_cron_slots(n, '2026-12-30 22:30', '2027-01-12') s
            WHERE s < '2026-12-31 02:00' OR n <> '@hourly') AS slots
  FROM unnest(ARRAY['@hourly', '@daily', '@midnight', '@weekly', '@monthly', '@yearly', '@annually']) n;
-- a schedule of days no month has: no slot, and quickly
SELECT count(*) FROM ds_cron_slots('0 0 30 2 *', '2000-01-01', '2100-01-01');

-- what pg_cron 1.4 does not read, or reads in a way nobody means: 22023 with the reason
\set VERBOSITY default
SELECT ds_cron_slots('', now(), now());
\echo :SQLSTATE
SELECT ds_cron_slots('* * * *', now(), now());
SELECT ds_cron_slots('* * * * * *', now(), now());
SELECT ds_cron_slots('60 * * * *', now(), now());
SELECT ds_cron_slots('* 24 * * *', now(), now());
SELECT ds_cron_slots('* * 0 * *', now(), now());
SELECT ds_cron_slots('* * * 13 *', now(), now());
SELECT ds_cron_slots('* * * * 8', now(), now());
SELECT ds_cron_slots('5-1 * * * *', now(), now());
SELECT ds_cron_slots('1/5 * * * *', now(), now());
SELECT ds_cron_slots('*/0 * * * *', now(), now());
SELECT ds_cron_slots('*/x * * * *', now(), now());
SELECT ds_cron_slots('5, * * * *', now(), now());
SELECT ds_cron_slots('5! * * * *', now(), now());
SELECT ds_cron_slots('* * * * monday', now(), now());
SELECT ds_cron_slots('jan * * * *', now(), now());
SELECT ds_cron_slots('0 0 $ * *', now(), now());
SELECT ds_cron_slots('30 seconds', now(), now());
SELECT ds_cron_slots('@reboot', now(), now());
SELECT ds_cron_slots('@often', now(), now());
SELECT ds_cron_slots('@daily 0', now(), now());
SELECT ds_cron_slots('* * * * *', 'infinity', now());

-- ds_schedule: every malformed argument is refused before anything is created
CREATE FUNCTION sched_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT input $$;
SELECT ds_schedule(NULL, '* * * * *', 'sched_wf');
SELECT ds_schedule('', '* * * * *', 'sched_wf');
SELECT ds_schedule(repeat('j', 64), '* * * * *', 'sched_wf');
SELECT ds_schedule('j', NULL, 'sched_wf');
SELECT ds_schedule('j', 'every minute', 'sched_wf');
SELECT ds_schedule('j', '* * * * *');
SELECT ds_schedule('j', '* * * * *', 'sched_wf', sql => 'SELECT 1');
SELECT ds_schedule('j', '* * * * *', 'sched_wf', input => NULL);
SELECT ds_schedule('j', '* * * * *', 'sched_wf', input => '[1]');
SELECT ds_schedule('j', '* * * * *', 'sched_wf', input => '"s"');
SELECT ds_schedule('j', '* * * * *', 'sched_wf', backfill => NULL);
SELECT ds_schedule('j', '* * * * *', 'sched_wf', backfill => '-1 minute');
\echo :SQLSTATE
SELECT ds_schedule('j', '* * * * *', 'no_such_workflow');
SELECT ds_schedule('j', '* * * * *', sql => 'SELECT 1; SELECT 2');
-- a well-formed schedule, without pg_cron: 55000 and how to install it
SELECT ds_schedule('j', '* * * * *', 'sched_wf');
\echo :SQLSTATE
SELECT count(*) FROM ds_schedules;
SELECT count(*) FROM durable_steps.schedules;
-- schedules that do not exist
SELECT ds_unschedule('j');
\echo :SQLSTATE
SELECT ds_schedule_fire('j');
SELECT ds_schedule_fire('j', now() + interval '1 hour');
DROP FUNCTION sched_wf(text, jsonb);
