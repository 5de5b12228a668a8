-- ds_stats() labels steps by queue only for the queues an administrator configured
-- (ds_set_queue) and 'default' (docs/operations.md, "Numbers for operators"): any role names a
-- queue when it stores a step, and must not be able to make the metrics' label sets as many, or
-- as strange, as it likes. Every other queue's steps count under the queue '(unconfigured)'.
\set SHOW_CONTEXT never

CREATE ROLE stats_mallory;
GRANT USAGE ON SCHEMA public TO stats_mallory;
CREATE TEMP TABLE stats_before AS
SELECT coalesce(sum(value) FILTER (WHERE queue = '(unconfigured)'), 0) AS unconfigured,
       coalesce(sum(value) FILTER (WHERE queue = 'stats-billing'), 0) AS billing,
       count(DISTINCT queue) AS labels
  FROM ds_stats() WHERE metric = 'steps';
SELECT ds_set_queue('stats-billing', 4);

-- 200 deferred steps in 200 queues named with newlines, braces and quotes, by a plain role
SET ROLE stats_mallory;
SELECT count(*) AS stored
  FROM generate_series(1, 200) i,
       LATERAL ds_run_step('stats-' || i, 's', 'SELECT 1', defer => true,
                           run_at => now() + interval '1 day',
                           queue => E'q\n' || i || '{le="' || i || '"}') r;
-- and 3 in the configured queue
SELECT count(*) AS stored
  FROM generate_series(1, 3) i,
       LATERAL ds_run_step('stats-billing-' || i, 's', 'SELECT 1', defer => true,
                           run_at => now() + interval '1 day', queue => 'stats-billing') r;
RESET ROLE;

-- two labels more at most (the configured queue and '(unconfigured)'), none of the role's names,
-- and every step counted
SELECT count(DISTINCT queue) - (SELECT labels FROM stats_before) <= 2 AS at_most_two_new_labels,
       bool_and(queue !~ '[\n{}"]') AS no_label_of_the_roles_names,
       sum(value) FILTER (WHERE queue = '(unconfigured)') - (SELECT unconfigured FROM stats_before) AS unconfigured_added,
       sum(value) FILTER (WHERE queue = 'stats-billing') - (SELECT billing FROM stats_before) AS billing_added
  FROM ds_stats() WHERE metric = 'steps';
SELECT DISTINCT queue FROM ds_stats() WHERE metric = 'steps_due' AND queue ~ '[\n{}"]';

SELECT count(*) AS cancelled FROM ds_steps s, LATERAL ds_cancel_step(s.run_id, s.step_id) c
 WHERE s.run_id LIKE 'stats-%';
DROP OWNED BY stats_mallory;
DROP ROLE stats_mallory;

-- The steps that need a person, counted through steps_attention_idx (every status, 0 included),
-- and the database the figures are of
CREATE TEMP TABLE attention_before AS
  SELECT label, value FROM ds_stats() WHERE metric = 'steps_needing_person';
SELECT count(*) AS blocked_stored
  FROM generate_series(1, 3) i,
       LATERAL ds_run_step('attention-' || i, 's', $$SELECT ds_blocked('no stock', 'restock')$$) r;
SELECT status FROM ds_run_step('attention-failed', 's', $$SELECT ds_non_retriable('declined')$$);
SELECT s.label, s.value - b.value AS added
  FROM ds_stats() s JOIN attention_before b USING (label)
 WHERE s.metric = 'steps_needing_person' ORDER BY 1;
-- a blocked step re-armed and run to success leaves the count
SELECT status FROM ds_retry_step('attention-1', 's', sql => 'SELECT 1');
SELECT status FROM ds_run_step('attention-1', 's', 'SELECT 1');
SELECT s.label, s.value - b.value AS added
  FROM ds_stats() s JOIN attention_before b USING (label)
 WHERE s.metric = 'steps_needing_person' ORDER BY 1;
SELECT label = current_database() AS names_this_database, value FROM ds_stats() WHERE metric = 'database';
-- ds_attempt_minutes(): minutes of the last hour only, the attempts just recorded in the current
-- minute (or the one before)
SELECT bool_and(minute > clock_timestamp() - interval '1 hour') AND
       bool_or(minute >= date_trunc('minute', clock_timestamp()) - interval '1 minute') AS recent,
       sum(attempts) FILTER (WHERE class = 'correctable') >= 3 AS counts_the_blocked
  FROM ds_attempt_minutes();
-- for pg_monitor and durable_steps_admin only, as ds_stats()
CREATE ROLE attention_plain;
SET ROLE attention_plain;
SELECT count(*) FROM ds_attempt_minutes();
\echo :SQLSTATE
RESET ROLE;
DROP ROLE attention_plain;
SELECT count(*) AS cancelled FROM ds_steps s, LATERAL ds_cancel_step(s.run_id, s.step_id) c
 WHERE s.run_id LIKE 'attention-%' AND s.status NOT IN ('succeeded', 'failed');
