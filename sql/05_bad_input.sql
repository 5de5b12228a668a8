-- Bad input (docs/reference.md, "SQLSTATEs"): every malformed argument gets a clear error with a documented SQLSTATE,
-- changes nothing and loses nothing already stored. Each bad call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

-- a stored step that bad calls must not disturb
SELECT status FROM ds_run_step('bad', 'stored', 'SELECT 1');
CREATE TEMP TABLE before_counts AS
    SELECT (SELECT count(*) FROM durable_steps.steps) AS steps,
           (SELECT count(*) FROM durable_steps.attempts) AS attempts,
           (SELECT md5(string_agg(s::text, ',' ORDER BY run_id, step_id)) FROM durable_steps.steps s) AS digest;

-- identities
SELECT ds_run_step(NULL, 's', 'SELECT 1');
\echo :SQLSTATE
SELECT ds_run_step('r', NULL, 'SELECT 1');
\echo :SQLSTATE
SELECT ds_run_step('', 's', 'SELECT 1');
\echo :SQLSTATE
SELECT ds_run_step('r', '', 'SELECT 1');
\echo :SQLSTATE
SELECT ds_run_step(repeat('r', 256), 's', 'SELECT 1');
\echo :SQLSTATE
SELECT ds_run_step('r', repeat('é', 256), 'SELECT 1');
\echo :SQLSTATE
-- the body
SELECT ds_run_step('r', 's', NULL);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', '');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', ' ; ');
\echo :SQLSTATE
-- policy
SELECT ds_run_step('r', 's', 'SELECT 1', policy => '[]');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"max_attempts": 0}');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"max_atempts": 3}');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"initial_delay": "x"}');
\echo :SQLSTATE
SELECT ds_run_step('bad', 'stored', 'SELECT 1', policy => '{"jitter": 2}');
\echo :SQLSTATE
-- timeout
SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '0');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '-1 s');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '25 h');
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '1 mon');
\echo :SQLSTATE
-- nowait, on_timeout
SELECT ds_run_step('r', 's', 'SELECT 1', nowait => NULL);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', on_timeout => NULL);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', on_timeout => 'ignore');
\echo :SQLSTATE
-- classification overrides
SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY['4000']);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY['40p01']);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY[NULL]);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', fail_on => ARRAY['ABCDEF']);
\echo :SQLSTATE
SELECT ds_run_step('r', 's', 'SELECT 1', fail_on => ARRAY[['23', '40']]);
\echo :SQLSTATE
-- re-arming
SELECT ds_retry_step(NULL, 's');
\echo :SQLSTATE
SELECT ds_retry_step('r', '');
\echo :SQLSTATE
SELECT ds_retry_step('bad', 'missing');
\echo :SQLSTATE
SELECT ds_retry_step('bad', 'stored');
\echo :SQLSTATE
-- helpers
SELECT ds_non_retriable(NULL);
\echo :SQLSTATE
SELECT ds_retry_after(NULL, '1 s');
\echo :SQLSTATE
SELECT ds_retry_after('x', NULL);
\echo :SQLSTATE
SELECT ds_retry_after('x', '-1 s');
\echo :SQLSTATE
SELECT ds_retry_after('x', '25 h');
\echo :SQLSTATE
SELECT ds_blocked('x', NULL);
\echo :SQLSTATE
SELECT ds_blocked(NULL, 'fix it');
\echo :SQLSTATE
-- policies and schedules
SELECT ds_retry_policy(max_attempts => -1);
\echo :SQLSTATE
SELECT ds_retry_policy(backoff => '');
\echo :SQLSTATE
SELECT ds_backoff_delay('{"backoff": "random"}', 1);
\echo :SQLSTATE
SELECT ds_backoff_delay(NULL, -3);
\echo :SQLSTATE
-- results
SELECT ds_unwrap(NULL);
\echo :SQLSTATE

-- the helpers, called with good arguments, raise their own SQLSTATEs
SELECT ds_non_retriable('stop');
\echo :SQLSTATE
SELECT ds_retry_after('later', '5 s');
\echo :SQLSTATE
SELECT ds_blocked('blocked', 'fix it');
\echo :SQLSTATE

-- nothing changed, nothing lost
SELECT (SELECT count(*) FROM durable_steps.steps) = steps AS same_steps,
       (SELECT count(*) FROM durable_steps.attempts) = attempts AS same_attempts,
       (SELECT md5(string_agg(s::text, ',' ORDER BY run_id, step_id)) FROM durable_steps.steps s) = digest AS same_rows
  FROM before_counts;
