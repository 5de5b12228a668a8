-- Limits (docs/limits.md): ds_set_rate_limit, ds_set_concurrency_limit, ds_drop_limit, their
-- arguments and permissions; a step that names a limit in its policy is held until the
-- executors admit it; the ds_limits view. No step here is admitted: each is held by a limit of
-- concurrency 0 or waits for a time an hour ahead, whether or not a worker serves this database
-- (test/t/101_limits.pl checks the admission, the rates and the 429s).
\set SHOW_CONTEXT never

-- the settings: a rate with a burst, a concurrency, both on one limit
SELECT ds_set_rate_limit('api', 50, interval '1 second', 5);
SELECT ds_set_rate_limit('slow', 10, interval '1 minute');
SELECT ds_set_concurrency_limit('one_each', 1);
SELECT ds_set_concurrency_limit('closed', 0);
SELECT ds_set_concurrency_limit('api', 3);
SELECT name, rate, per, burst, concurrency FROM durable_steps.limits ORDER BY name;
-- set again: the new values replace the old; NULL removes a rate or a concurrency
SELECT ds_set_rate_limit('slow', 20, interval '1 minute', 2);
SELECT ds_set_concurrency_limit('api', NULL);
SELECT ds_set_rate_limit('one_each', NULL, NULL);
SELECT name, rate, per, burst, concurrency FROM durable_steps.limits ORDER BY name;

-- malformed arguments are refused and change nothing
SELECT ds_set_rate_limit(NULL, 1, interval '1 second');
SELECT ds_set_rate_limit('', 1, interval '1 second');
SELECT ds_set_rate_limit(repeat('l', 64), 1, interval '1 second');
SELECT ds_set_rate_limit('api', 0, interval '1 second');
SELECT ds_set_rate_limit('api', -5, interval '1 second');
SELECT ds_set_rate_limit('api', 5, NULL);
SELECT ds_set_rate_limit('api', NULL, interval '1 second');
SELECT ds_set_rate_limit('api', 5, interval '0');
SELECT ds_set_rate_limit('api', 5, interval '-1 second');
SELECT ds_set_rate_limit('api', 5, interval '25 hours');
SELECT ds_set_rate_limit('api', 5, interval '1 second', -1);
SELECT ds_set_rate_limit('api', 5, interval '1 second', NULL);
SELECT ds_set_concurrency_limit('api', -1);
SELECT ds_set_concurrency_limit(NULL, 1);
SELECT name, rate, per, burst, concurrency FROM durable_steps.limits ORDER BY name;

-- a step names its limit and key in its policy
SELECT status FROM ds_run_step('limits', 'a', 'SELECT 1', defer => true,
                               policy => '{"limit": "closed", "limit_key": "cust:1"}');
SELECT status FROM ds_run_step('limits', 'b', 'SELECT 1', run_at => now() + interval '1 hour',
                               policy => '{"limit": "api"}');
-- held: no claim sees it (next_attempt_at NULL) until its admission; held_from says from when
SELECT step_id, status, next_attempt_at IS NULL AS held, held_from IS NOT NULL AS from_set,
       "limit", limit_key FROM ds_steps WHERE run_id = 'limits' ORDER BY step_id;
SELECT held_from > now() + interval '59 minutes' AS an_hour_ahead
  FROM ds_steps WHERE run_id = 'limits' AND step_id = 'b';
-- a repeat answers with the stored step, whatever limit it names (a limit is not part of the
-- definition, as a queue is not)
SELECT status, replayed FROM ds_run_step('limits', 'a', 'SELECT 1', defer => true,
                                         policy => '{"limit": "api"}');
SELECT "limit", limit_key FROM ds_steps WHERE run_id = 'limits' AND step_id = 'a';
-- HTTP steps and tasks name limits the same way
SELECT status FROM ds_http_step('limits', 'h', '{"method": "GET", "url": "https://api.example.com/x"}',
                                policy => '{"limit": "closed", "limit_key": "api.example.com"}');
SELECT status FROM ds_task_step('limits', 't', 'send', '{"n": 1}',
                                policy => '{"limit": "closed", "limit_key": "cust:1"}');
SELECT step_id, kind, next_attempt_at IS NULL AS held FROM ds_steps
 WHERE run_id = 'limits' AND step_id IN ('h', 't') ORDER BY step_id;
-- a held task is no claim's: a worker of its name finds nothing
SELECT count(*) FROM ds_claim_tasks(ARRAY['send'], 10);
-- the view: per limit and key, the steps held, admitted and running
SELECT "limit", key, rate, per, burst, concurrency, held, admitted, running
  FROM ds_limits ORDER BY 1, 2 NULLS FIRST;

-- refused at the call, storing nothing: a limit that does not exist, a step that would run in
-- its caller's transaction, a key without a limit, bad types and lengths
SELECT status FROM ds_run_step('limits', 'bad1', 'SELECT 1', defer => true, policy => '{"limit": "nope"}');
SELECT status FROM ds_run_step('limits', 'bad2', 'SELECT 1', policy => '{"limit": "api"}');
SELECT status FROM ds_run_step('limits', 'bad3', 'SELECT 1', defer => true, policy => '{"limit_key": "k"}');
SELECT status FROM ds_run_step('limits', 'bad4', 'SELECT 1', defer => true, policy => '{"limit": 5}');
SELECT status FROM ds_run_step('limits', 'bad5', 'SELECT 1', defer => true, policy => '{"limit": ""}');
SELECT status FROM ds_run_step('limits', 'bad6', 'SELECT 1', defer => true,
                               policy => jsonb_build_object('limit', 'api', 'limit_key', repeat('k', 201)));
SELECT status FROM ds_run_step('limits', 'bad7', 'SELECT 1', defer => true,
                               policy => '{"limit": "api", "limit_key": null}');
SELECT count(*) FROM ds_steps WHERE run_id = 'limits' AND step_id LIKE 'bad%';
-- 200 bytes is the longest key
SELECT status FROM ds_run_step('limits', 'long', 'SELECT 1', run_at => now() + interval '1 hour',
                               policy => jsonb_build_object('limit', 'api', 'limit_key', repeat('k', 200)));
SELECT length(limit_key) FROM ds_steps WHERE run_id = 'limits' AND step_id = 'long';
-- a limit is a step's own: not in a run's policy, nor under every step
SELECT ds_start_run('limits_workflow', '{}', policy => '{"limit": "api"}');
SET durable_steps.default_retry_policy = '{"limit": "api"}';
SHOW durable_steps.default_retry_policy;

-- a cancelled step is held no more
SELECT status FROM ds_cancel_step('limits', 'b');
SELECT status, next_attempt_at, held_from FROM ds_steps WHERE run_id = 'limits' AND step_id = 'b';

-- only superusers and members of durable_steps_admin configure limits; anybody may name one,
-- and sees only its own steps counted
CREATE ROLE limit_user;
CREATE ROLE limit_admin IN ROLE durable_steps_admin;
GRANT USAGE ON SCHEMA public TO limit_user;
SET ROLE limit_user;
SELECT ds_set_rate_limit('api', 1000000, interval '1 second');
SELECT ds_set_concurrency_limit('closed', 100);
SELECT ds_drop_limit('closed');
SELECT status FROM ds_run_step('limits-user', 'u', 'SELECT 1', defer => true,
                               policy => '{"limit": "closed", "limit_key": "cust:1"}');
SELECT "limit", key, held FROM ds_limits WHERE "limit" = 'closed' ORDER BY key;
-- another role's held step is not this role's to see
SELECT count(*) FROM ds_steps WHERE run_id = 'limits';
RESET ROLE;
SELECT name, rate, per, burst, concurrency FROM durable_steps.limits ORDER BY name;
SET ROLE limit_admin;
SELECT ds_set_concurrency_limit('admins', 2);
SELECT ds_drop_limit('admins');
SELECT ds_drop_limit('admins');
RESET ROLE;
SELECT "limit", key, held FROM ds_limits WHERE "limit" = 'closed' ORDER BY key;

-- dropping a limit lets its held steps go as steps of no limit (the executors admit them)
SELECT ds_drop_limit('slow');
SELECT name FROM durable_steps.limits ORDER BY name;

-- clean up
SELECT s, (ds_cancel_step('limits', s)).status FROM unnest(ARRAY['a', 'h', 't', 'long']) s;
DELETE FROM durable_steps.steps WHERE run_id IN ('limits', 'limits-user', 'limits-run');
DELETE FROM durable_steps.attempts WHERE run_id IN ('limits', 'limits-user', 'limits-run');
SELECT ds_drop_limit(name) FROM durable_steps.limits ORDER BY name;
REVOKE USAGE ON SCHEMA public FROM limit_user;
DROP ROLE limit_user;
DROP ROLE limit_admin;
