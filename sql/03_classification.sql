-- Outcome classification (docs/steps.md, "Outcome classes"): every attempt ends in exactly one class
\set SHOW_CONTEXT never

-- a body that raises whatever SQLSTATE it is given, through a real RAISE
CREATE FUNCTION fail_with(code text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'failing with %', code USING ERRCODE = code;
END
$$;
CREATE TABLE class_items (id int PRIMARY KEY, qty int CHECK (qty > 0));
INSERT INTO class_items VALUES (1, 1);
CREATE ROLE class_nobody;
CREATE TABLE class_secret (x int);
REVOKE ALL ON class_secret FROM PUBLIC;

-- one step per case; the answer shows the class, the status it leads to and the SQLSTATE
CREATE FUNCTION classify_case(step text, body text) RETURNS TABLE (
    step_id text, status text, error_class text, error_code text, attempt_class text)
LANGUAGE plpgsql AS $$
DECLARE
    r ds_step_result;
BEGIN
    r := ds_run_step('classify', step, body);
    RETURN QUERY
        SELECT r.step_id, r.status, r.error_class, r.error_code, a.class
          FROM ds_attempts a
         WHERE a.run_id = r.run_id AND a.step_id = r.step_id AND a.attempt = r.attempt;
END
$$;

-- retryable: transient failures are scheduled again (status retrying)
SELECT * FROM classify_case('serialization', $$SELECT fail_with('40001')$$);
SELECT * FROM classify_case('deadlock', $$SELECT fail_with('40P01')$$);
SELECT * FROM classify_case('lock-nowait', $$SELECT fail_with('55P03')$$);
SELECT * FROM classify_case('object-in-use', $$SELECT fail_with('55006')$$);
SELECT * FROM classify_case('connection', $$SELECT fail_with('08006')$$);
SELECT * FROM classify_case('resources', $$SELECT fail_with('53100')$$);
SELECT * FROM classify_case('system', $$SELECT fail_with('58030')$$);
SELECT * FROM classify_case('plain-raise', $q$DO $b$ BEGIN RAISE EXCEPTION 'gateway down'; END $b$$q$);
SELECT * FROM classify_case('helper-retry-after', $$SELECT ds_retry_after('rate limited', '90 s')$$);
-- (a real lock_timeout and deadlock need a second session: see test/t)

-- correctable: invalid input or missing authority; the step is blocked with a remediation
SELECT * FROM classify_case('division', $$SELECT 1/0$$);
SELECT * FROM classify_case('bad-number', $$SELECT 'abc'::int$$);
SELECT * FROM classify_case('unique', $$INSERT INTO class_items VALUES (1, 5)$$);
SELECT * FROM classify_case('check', $$UPDATE class_items SET qty = 0 WHERE id = 1$$);
SELECT * FROM classify_case('blocked-helper', $$SELECT ds_blocked('card expired', 'Ask the customer for a new card.')$$);
SET ROLE class_nobody;
SELECT step_id, status, error_class, error_code, error_message
  FROM ds_run_step('classify-nobody', 'privilege', 'SELECT * FROM class_secret');
RESET ROLE;

-- permanent: programming or integrity failures fail the step at once
SELECT * FROM classify_case('undefined-table', $$SELECT * FROM no_such_table$$);
-- (a body that does not parse never gets here: it is refused at the call, 18_sql_checked_at_call;
-- a syntax error still happens at run time in SQL the body builds)
SELECT * FROM classify_case('syntax', $q$DO $b$ BEGIN EXECUTE 'SELEC 1'; END $b$$q$);
SELECT * FROM classify_case('internal', $$SELECT fail_with('XX000')$$);
SELECT * FROM classify_case('non-retriable', $$SELECT ds_non_retriable('order was cancelled')$$);
SELECT * FROM classify_case('too-many-rows', $$SELECT generate_series(1, 2)$$);
SELECT * FROM classify_case('no-data-found', $$SELECT fail_with('P0002')$$);

-- what the failed attempts recorded
SELECT step_id, attempt, class, error_code, error_message, error_detail
  FROM ds_attempts WHERE run_id = 'classify' ORDER BY step_id;
-- blocked steps carry their remediation; the helper's is its own
SELECT step_id, remediation FROM ds_steps WHERE run_id = 'classify' AND status = 'blocked'
 ORDER BY step_id;

-- ds_retry_after replaces the backoff once, with exactly its delay
SELECT s.next_attempt_at - a.finished_at AS delay
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'classify' AND step_id = 'helper-retry-after';
-- other retryable failures wait for the policy's backoff (built-in: 1 s after attempt 1)
SELECT s.next_attempt_at - a.finished_at AS delay
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'classify' AND step_id = 'plain-raise';

-- retry_on / fail_on override the defaults, by SQLSTATE or by two-character class;
-- the most specific rule wins and fail_on wins a tie
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'retry-unique',
    $$INSERT INTO class_items VALUES (1, 5)$$, retry_on => ARRAY['23505']);
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'fail-plain-raise',
    $$SELECT fail_with('P0001')$$, fail_on => ARRAY['P0']);
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'exact-beats-class',
    $$SELECT fail_with('23505')$$, retry_on => ARRAY['23505'], fail_on => ARRAY['23']);
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'fail-wins-tie',
    $$SELECT fail_with('40001')$$, retry_on => ARRAY['40'], fail_on => ARRAY['40']);
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'unrelated-list',
    $$SELECT fail_with('40001')$$, fail_on => ARRAY['23505']);
-- the explicit helpers mean what they say whatever the lists say
SELECT step_id, status, error_class, error_code FROM ds_run_step('classify-override', 'helper-wins',
    $$SELECT ds_non_retriable('no')$$, retry_on => ARRAY['DS001', 'DS']);

-- step timeouts: the body is cancelled, its writes roll back, and it is retryable by default
CREATE TABLE class_timeout_effects (x int);
SELECT step_id, status, error_class, error_code, error_message
  FROM ds_run_step('classify-timeout', 'retry',
       $$WITH w AS (INSERT INTO class_timeout_effects VALUES (1) RETURNING x) SELECT pg_sleep(5) FROM w$$,
       timeout => '200 ms');
SELECT count(*) AS effects_after_timeout FROM class_timeout_effects;
-- on_timeout => 'fail' makes it fail closed
SELECT step_id, status, error_class, error_code
  FROM ds_run_step('classify-timeout', 'fail', 'SELECT pg_sleep(5)', timeout => '200 ms',
                   on_timeout => 'fail');
-- a step that finishes in time is unaffected by its timeout, and the timer does not outlive it
SELECT step_id, status, result
  FROM ds_run_step('classify-timeout', 'in-time', 'SELECT 7', timeout => '200 ms');
SELECT pg_sleep(0.3);
SELECT 'caller not cancelled afterwards' AS ok;
-- the caller's own statement_timeout is not the step's: it cancels the caller and records nothing
SET statement_timeout = '200 ms';
SELECT * FROM ds_run_step('classify-timeout', 'caller-cancelled', 'SELECT pg_sleep(5)');
RESET statement_timeout;
SELECT count(*) FROM ds_steps WHERE run_id = 'classify-timeout' AND step_id = 'caller-cancelled';
-- nested steps: an inner timeout is the inner step's; the outer step carries on
SELECT step_id, status, result->>'status' AS inner_status, result->>'error_code' AS inner_code
  FROM ds_run_step('classify-timeout', 'outer',
       $$SELECT to_jsonb(i) FROM ds_run_step('classify-timeout', 'inner', 'SELECT pg_sleep(5)',
                                             timeout => '100 ms') AS i$$,
       timeout => '10 s');
