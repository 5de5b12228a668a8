-- Bad input (README "SQLSTATEs"): every malformed argument gets a clear error with a documented SQLSTATE,
-- changes nothing and loses nothing already stored.

CREATE FUNCTION try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- a stored step that bad calls must not disturb
SELECT status FROM ds_run_step('bad', 'stored', 'SELECT 1');
CREATE TEMP TABLE before_counts AS
    SELECT (SELECT count(*) FROM durable_steps.steps) AS steps,
           (SELECT count(*) FROM durable_steps.attempts) AS attempts,
           (SELECT md5(string_agg(s::text, ',' ORDER BY run_id, step_id)) FROM durable_steps.steps s) AS digest;

SELECT q, try(q) FROM (VALUES
    -- identities
    ($$SELECT ds_run_step(NULL, 's', 'SELECT 1')$$),
    ($$SELECT ds_run_step('r', NULL, 'SELECT 1')$$),
    ($$SELECT ds_run_step('', 's', 'SELECT 1')$$),
    ($$SELECT ds_run_step('r', '', 'SELECT 1')$$),
    ($$SELECT ds_run_step(repeat('r', 256), 's', 'SELECT 1')$$),
    ($$SELECT ds_run_step('r', repeat('é', 256), 'SELECT 1')$$),
    -- the body
    ($$SELECT ds_run_step('r', 's', NULL)$$),
    ($$SELECT ds_run_step('r', 's', '')$$),
    ($$SELECT ds_run_step('r', 's', ' ; ')$$),
    -- policy
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', policy => '[]')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"max_attempts": 0}')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"max_atempts": 3}')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', policy => '{"initial_delay": "x"}')$$),
    ($$SELECT ds_run_step('bad', 'stored', 'SELECT 1', policy => '{"jitter": 2}')$$),
    -- timeout
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '0')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '-1 s')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '25 h')$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', timeout => '1 mon')$$),
    -- nowait, on_timeout
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', nowait => NULL)$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', on_timeout => NULL)$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', on_timeout => 'ignore')$$),
    -- classification overrides
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY['4000'])$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY['40p01'])$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', retry_on => ARRAY[NULL])$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', fail_on => ARRAY['ABCDEF'])$$),
    ($$SELECT ds_run_step('r', 's', 'SELECT 1', fail_on => ARRAY[['23', '40']])$$),
    -- re-arming
    ($$SELECT ds_retry_step(NULL, 's')$$),
    ($$SELECT ds_retry_step('r', '')$$),
    ($$SELECT ds_retry_step('bad', 'missing')$$),
    ($$SELECT ds_retry_step('bad', 'stored')$$),
    -- helpers
    ($$SELECT ds_non_retriable(NULL)$$),
    ($$SELECT ds_retry_after(NULL, '1 s')$$),
    ($$SELECT ds_retry_after('x', NULL)$$),
    ($$SELECT ds_retry_after('x', '-1 s')$$),
    ($$SELECT ds_retry_after('x', '25 h')$$),
    ($$SELECT ds_blocked('x', NULL)$$),
    ($$SELECT ds_blocked(NULL, 'fix it')$$),
    -- policies and schedules
    ($$SELECT ds_retry_policy(max_attempts => -1)$$),
    ($$SELECT ds_retry_policy(backoff => '')$$),
    ($$SELECT ds_backoff_delay('{"backoff": "random"}', 1)$$),
    ($$SELECT ds_backoff_delay(NULL, -3)$$),
    -- results
    ($$SELECT ds_unwrap(NULL)$$)
) AS t(q);

-- the helpers, called with good arguments, raise their own SQLSTATEs
SELECT q, try(q) FROM (VALUES
    ($$SELECT ds_non_retriable('stop')$$),
    ($$SELECT ds_retry_after('later', '5 s')$$),
    ($$SELECT ds_blocked('blocked', 'fix it')$$)
) AS t(q);

-- nothing changed, nothing lost
SELECT (SELECT count(*) FROM durable_steps.steps) = steps AS same_steps,
       (SELECT count(*) FROM durable_steps.attempts) = attempts AS same_attempts,
       (SELECT md5(string_agg(s::text, ',' ORDER BY run_id, step_id)) FROM durable_steps.steps s) = digest AS same_rows
  FROM before_counts;
