-- Retry policies (docs/steps.md, "Retry policy")
\set SHOW_CONTEXT never

-- ds_retry_policy builds a validated policy of the keys it is given; delays in milliseconds
SELECT ds_retry_policy();
SELECT ds_retry_policy(max_attempts => 3);
SELECT ds_retry_policy(max_attempts => 7, initial_delay => '250 ms', max_delay => '1 min',
                       backoff => 'exponential', multiplier => 3, jitter => 0.25);
SELECT ds_retry_policy(initial_delay => '1.5 ms', backoff => 'fixed');

-- bounds: accepted at each bound ...
SELECT ds_retry_policy(max_attempts => 1), ds_retry_policy(max_attempts => 100);
SELECT ds_retry_policy(initial_delay => '0'), ds_retry_policy(max_delay => '24 h');
SELECT ds_retry_policy(multiplier => 1), ds_retry_policy(multiplier => 10);
SELECT ds_retry_policy(jitter => 0), ds_retry_policy(jitter => 1);
-- ... and refused beyond it, with SQLSTATE 22023 and the field named
SELECT ds_retry_policy(max_attempts => 0);
\echo :SQLSTATE
SELECT ds_retry_policy(max_attempts => 101);
\echo :SQLSTATE
SELECT ds_retry_policy(initial_delay => '-1 s');
\echo :SQLSTATE
SELECT ds_retry_policy(max_delay => '24 h 1 s');
\echo :SQLSTATE
SELECT ds_retry_policy(initial_delay => '2 min', max_delay => '1 min');
\echo :SQLSTATE
SELECT ds_retry_policy(multiplier => 0.99);
\echo :SQLSTATE
SELECT ds_retry_policy(multiplier => 10.5);
\echo :SQLSTATE
SELECT ds_retry_policy(jitter => -0.1);
\echo :SQLSTATE
SELECT ds_retry_policy(jitter => 1.01);
\echo :SQLSTATE
SELECT ds_retry_policy(backoff => 'linear');
\echo :SQLSTATE
SELECT ds_retry_policy(multiplier => 'NaN');
\echo :SQLSTATE

-- the jsonb form is checked by the same rules; every error names its field (22023)
SELECT ds_backoff_delay('{"max_attempts": 2.5}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"max_attempts": "3"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"max_attempts": 1e3}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"initial_delay": "soon"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"initial_delay": true}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"initial_delay": -5}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"initial_delay": 86400001}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"max_delay": "25 hours"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"backoff": 1}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"backoff": "Fixed"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"multiplier": "2"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"jitter": null}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('{"retries": 3}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('[1, 2]', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay('"fixed"', 1);
\echo :SQLSTATE
-- accepted: a delay at the 24-hour bound, and the empty policy
SELECT ds_backoff_delay('{"initial_delay": 86400000, "max_delay": "24:00:00"}', 1);
SELECT ds_backoff_delay('{}', 1);

-- ds_backoff_delay: the schedule, exact without jitter
-- built-in defaults: 1 s doubling to a 10 min cap
SELECT n, ds_backoff_delay(NULL, n) FROM generate_series(1, 12) AS n;
-- fixed repeats the initial delay
SELECT n, ds_backoff_delay('{"backoff": "fixed", "initial_delay": "3 s"}', n)
  FROM generate_series(1, 4) AS n;
-- exponential with multiplier 3, capped at 1 minute
SELECT n, ds_backoff_delay('{"initial_delay": 500, "multiplier": 3, "max_delay": "1 min"}', n)
  FROM generate_series(1, 7) AS n;
-- multiplier 1 is fixed in effect; a zero initial delay stays zero
SELECT ds_backoff_delay('{"multiplier": 1}', 50), ds_backoff_delay('{"initial_delay": 0}', 9);
-- a huge attempt number saturates at the cap instead of overflowing
SELECT ds_backoff_delay('{"max_delay": "24 h"}', 2000000000);
-- jitter draws from [d × (1 − jitter), d], after the cap
SELECT min(d) >= interval '6 s' AND max(d) <= interval '8 s' AS within_range,
       count(DISTINCT d) > 1 AS varies
  FROM (SELECT ds_backoff_delay('{"initial_delay": "2 s", "max_delay": "8 s", "jitter": 0.25}', 5) AS d
          FROM generate_series(1, 200)) AS s;
SELECT min(d) >= interval '0' AND max(d) <= interval '4 s' AS full_jitter_in_range
  FROM (SELECT ds_backoff_delay('{"initial_delay": "4 s", "jitter": 1}', 1) AS d
          FROM generate_series(1, 100)) AS s;
-- bad attempt numbers
SELECT ds_backoff_delay(NULL, 0);
\echo :SQLSTATE
SELECT ds_backoff_delay(NULL, NULL);
\echo :SQLSTATE

-- the setting durable_steps.default_retry_policy sits between the built-ins and runs/steps
SET durable_steps.default_retry_policy = '{"initial_delay": "5 s", "max_attempts": 9}';
SELECT ds_backoff_delay(NULL, 1) AS from_setting, ds_backoff_delay('{"initial_delay": 100}', 1) AS step_wins;
-- a bad setting is refused where it is set, and the previous value stays
SET durable_steps.default_retry_policy = '{"max_attempts": 0}';
SET durable_steps.default_retry_policy = 'not json';
SET durable_steps.default_retry_policy = '{"initial_delay": "20 min"}';
SHOW durable_steps.default_retry_policy;

-- precedence on a real step: step policy > run default > setting > built-in
INSERT INTO durable_steps.runs (run_id, workflow, policy, owner)
VALUES ('policy-run', 'manual', '{"max_attempts": 4, "multiplier": 5}', current_user::regrole);
SELECT max_attempts FROM ds_run_step('policy-run', 'no-own-policy', 'SELECT 1');
SELECT policy FROM ds_steps WHERE run_id = 'policy-run' AND step_id = 'no-own-policy';
SELECT max_attempts
  FROM ds_run_step('policy-run', 'own-policy', 'SELECT 1', policy => '{"max_attempts": 2, "backoff": "fixed"}');
SELECT policy FROM ds_steps WHERE run_id = 'policy-run' AND step_id = 'own-policy';
-- without a run, the setting applies under the step's own keys
SELECT max_attempts FROM ds_run_step('policy-no-run', 'x', 'SELECT 1', policy => '{"jitter": 0.5}');
SELECT policy FROM ds_steps WHERE run_id = 'policy-no-run' AND step_id = 'x';
RESET durable_steps.default_retry_policy;
SELECT max_attempts FROM ds_run_step('policy-no-run', 'builtin', 'SELECT 1');
SELECT policy FROM ds_steps WHERE run_id = 'policy-no-run' AND step_id = 'builtin';
-- a merged policy that contradicts itself is refused before anything is claimed
SELECT * FROM ds_run_step('policy-no-run', 'contradiction', 'SELECT 1', policy => '{"initial_delay": "1 h"}');
SELECT count(*) FROM ds_steps WHERE run_id = 'policy-no-run' AND step_id = 'contradiction';

-- PostgreSQL frees the parsed policy of a replaced, reset or rolled-back setting with its own
-- allocator (guc_free from 16): none of these may fail
BEGIN;
SET LOCAL durable_steps.default_retry_policy = '{"max_attempts": 7}';
SET LOCAL durable_steps.default_retry_policy = '{"max_attempts": 8}';
SHOW durable_steps.default_retry_policy;
ROLLBACK;
SHOW durable_steps.default_retry_policy;
SET durable_steps.default_retry_policy = '{"max_attempts": 9}';
SELECT max_attempts FROM ds_run_step('policy-no-run', 'setting-9', 'SELECT 1');
RESET durable_steps.default_retry_policy;
SHOW durable_steps.default_retry_policy;
SELECT max_attempts FROM ds_run_step('policy-no-run', 'setting-reset', 'SELECT 1');
RESET ALL;
