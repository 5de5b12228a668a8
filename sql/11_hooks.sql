-- Outcome hooks (docs/steps.md, "Outcome hooks"): on_success and on_failure run as the step's owner in
-- the transaction that records the outcome. Here the caller's transaction runs the attempts
-- (pg_regress's database is not the worker's); test/t/018_outcome_hooks.pl covers the worker.
\set SHOW_CONTEXT never
CREATE ROLE hook_user;
CREATE ROLE hook_admin IN ROLE durable_steps_admin;
CREATE TABLE hook_answers (step_id text PRIMARY KEY, answer jsonb, written_by name);
CREATE TABLE hook_dead_letters (step_id text PRIMARY KEY, outcome jsonb);
CREATE TABLE hook_effects (step_id text);
CREATE TABLE hook_switch (broken boolean);
INSERT INTO hook_switch VALUES (true);
GRANT ALL ON hook_answers, hook_dead_letters, hook_effects, hook_switch TO hook_user;
SET ROLE hook_user;

-- on_success writes the worker's answer back: $1 is the outcome, result included
SELECT status, result, replayed FROM ds_run_step('hooks', 'answer', 'SELECT 42',
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user$$);
SELECT step_id, answer, written_by FROM hook_answers;
-- an object or array result goes in as it is
SELECT status FROM ds_run_step('hooks', 'object', $$SELECT 1 AS a, ARRAY['x', 'y'] AS b$$,
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1->'result', current_user$$);
SELECT answer, answer->'b'->>1 AS b1 FROM hook_answers WHERE step_id = 'object';
-- a replay runs no hook again
SELECT status, replayed FROM ds_run_step('hooks', 'answer', 'SELECT 42',
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user$$);
SELECT count(*) FROM hook_answers WHERE step_id = 'answer';
-- the same identity with other hooks, or without them, is another definition
SELECT status FROM ds_run_step('hooks', 'answer', 'SELECT 42',
    on_success => $$INSERT INTO hook_answers SELECT 'other', $1, current_user$$);
SELECT status FROM ds_run_step('hooks', 'answer', 'SELECT 42');
SELECT status FROM ds_run_step('hooks', 'answer', 'SELECT 42',
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user$$,
    on_failure => 'SELECT 1');

-- rolled back with the outcome: no step, no answer
BEGIN;
SELECT status FROM ds_run_step('hooks', 'rolled-back', 'SELECT 1',
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user$$);
ROLLBACK;
SELECT count(*) AS steps FROM ds_steps WHERE step_id = 'rolled-back';
SELECT count(*) AS answers FROM hook_answers WHERE step_id = 'rolled-back';

-- on_failure, the dead-letter path: on a permanent failure ...
SELECT status, error_class, error_code FROM ds_run_step('hooks', 'permanent',
    $$SELECT ds_non_retriable('card declined')$$,
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user$$,
    on_failure => $$INSERT INTO hook_dead_letters SELECT $1->>'step_id', $1$$);
-- ... and on exhaustion; not while attempts are left
SELECT status, error_class FROM ds_run_step('hooks', 'exhausted',
    $$SELECT ds_retry_after('try later', '1 ms')$$, policy => '{"max_attempts": 2}',
    on_failure => $$INSERT INTO hook_dead_letters SELECT $1->>'step_id', $1$$);
SELECT count(*) AS dead_letters FROM hook_dead_letters WHERE step_id = 'exhausted';
SELECT pg_sleep(0.01);
SELECT status, error_class, attempt FROM ds_run_step('hooks', 'exhausted',
    $$SELECT ds_retry_after('try later', '1 ms')$$, policy => '{"max_attempts": 2}',
    on_failure => $$INSERT INTO hook_dead_letters SELECT $1->>'step_id', $1$$);
-- a step that times out with on_timeout => 'fail'
SELECT status, error_class, error_code FROM ds_run_step('hooks', 'timed-out',
    'SELECT pg_sleep(5)', timeout => '50 ms', on_timeout => 'fail',
    on_failure => $$INSERT INTO hook_dead_letters SELECT $1->>'step_id', $1$$);
SELECT step_id, outcome - 'error_message' AS outcome, outcome->>'error_message' AS message
  FROM hook_dead_letters ORDER BY step_id;
SELECT count(*) AS answers_of_failures FROM hook_answers WHERE step_id IN ('permanent', 'exhausted', 'timed-out');
-- a blocked (correctable) step has not failed: no hook
SELECT status FROM ds_run_step('hooks', 'correctable',
    $$SELECT ds_blocked('needs a person', 'Fix it.')$$,
    on_failure => $$INSERT INTO hook_dead_letters SELECT $1->>'step_id', $1$$);
SELECT count(*) FROM hook_dead_letters WHERE step_id = 'correctable';

-- a failing on_success hook blocks the step: the outcome is kept (the body's effect, its result,
-- its attempt recorded as completed), the hook's own writes are rolled back
SELECT status, result, error_class, error_code, error_message, remediation
  FROM ds_run_step('hooks', 'hook-fails',
    $$INSERT INTO hook_effects VALUES ('hook-fails') RETURNING 7$$,
    on_success => $$WITH w AS (INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user)
                    SELECT 1 / (NOT broken)::int FROM hook_switch$$);
SELECT count(*) AS effects FROM hook_effects WHERE step_id = 'hook-fails';
SELECT count(*) AS answers FROM hook_answers WHERE step_id = 'hook-fails';
SELECT attempt, class, error_code FROM ds_attempts WHERE step_id = 'hook-fails';
-- a call of the same step answers with the blocked state, and runs nothing
SELECT status, result, replayed FROM ds_run_step('hooks', 'hook-fails',
    $$INSERT INTO hook_effects VALUES ('hook-fails') RETURNING 7$$,
    on_success => $$WITH w AS (INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user)
                    SELECT 1 / (NOT broken)::int FROM hook_switch$$);
-- ds_retry_step runs the hook again, not the step: still broken, still blocked ...
SELECT status, result, error_code FROM ds_retry_step('hooks', 'hook-fails');
-- ... it cannot take new input: the step has succeeded ...
SELECT status FROM ds_retry_step('hooks', 'hook-fails', '{"x": 1}');
-- ... and once the cause is fixed the step is succeeded, its body run once
UPDATE hook_switch SET broken = false;
SELECT status, result, attempt, error_code, remediation FROM ds_retry_step('hooks', 'hook-fails');
SELECT count(*) AS effects FROM hook_effects WHERE step_id = 'hook-fails';
SELECT answer->'result' AS answer FROM hook_answers WHERE step_id = 'hook-fails';
SELECT status, result, replayed FROM ds_run_step('hooks', 'hook-fails',
    $$INSERT INTO hook_effects VALUES ('hook-fails') RETURNING 7$$,
    on_success => $$WITH w AS (INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user)
                    SELECT 1 / (NOT broken)::int FROM hook_switch$$);
UPDATE hook_switch SET broken = true;

-- a failing on_failure hook blocks the failed step; ds_retry_step re-arms the step itself
SELECT status, result, error_class, error_code, error_message, remediation
  FROM ds_run_step('hooks', 'dead-letter-fails', $$SELECT ds_non_retriable('no')$$,
    on_failure => $$INSERT INTO hook_dead_letters
                    SELECT $1->>'step_id', $1 FROM hook_switch WHERE 1 / (NOT broken)::int = 1$$);
SELECT attempt, class, error_code FROM ds_attempts WHERE step_id = 'dead-letter-fails';
UPDATE hook_switch SET broken = false;
SELECT status, attempt FROM ds_retry_step('hooks', 'dead-letter-fails');
SELECT status, error_class, attempt FROM ds_run_step('hooks', 'dead-letter-fails',
    $$SELECT ds_non_retriable('no')$$,
    on_failure => $$INSERT INTO hook_dead_letters
                    SELECT $1->>'step_id', $1 FROM hook_switch WHERE 1 / (NOT broken)::int = 1$$);
SELECT outcome->>'attempt' AS attempt FROM hook_dead_letters WHERE step_id = 'dead-letter-fails';

-- a hook's error is stored cut to 8 kB, as an attempt's
SELECT status, error_code, length(error_message) AS length, right(error_message, 8) AS ending
  FROM ds_run_step('hooks', 'long-error', 'SELECT 1',
    on_success => $$SELECT ds_non_retriable(repeat('x', 20000))$$);

-- a hook runs as a security-restricted operation of its owner: nothing left behind, no role change
SELECT status, error_code, error_message FROM ds_run_step('hooks', 'with-hold', 'SELECT 1',
    on_success => 'DECLARE c CURSOR WITH HOLD FOR SELECT 1');
SELECT status, error_code, error_message FROM ds_run_step('hooks', 'temp-table', 'SELECT 1',
    on_success => 'CREATE TEMP TABLE hook_temp (x int)');
SELECT status, error_code, error_message FROM ds_run_step('hooks', 'set-role', 'SELECT 1',
    on_success => 'SET ROLE hook_user');
SELECT current_user;
-- a hook calling its own step is recursion
SELECT status, error_code FROM ds_run_step('hooks', 'recursive', 'SELECT 1',
    on_success => $$SELECT ds_run_step('hooks', 'recursive', 'SELECT 1')$$);

-- a deferred step stores its hooks and runs nothing now
SELECT status FROM ds_run_step('hooks', 'deferred', 'SELECT 1', defer => true,
    on_success => 'SELECT 1', on_failure => 'SELECT 2');
SELECT on_success, on_failure FROM ds_steps WHERE step_id = 'deferred';

-- an admin re-runs another role's hook as that role, and cannot bring hooks of its own
RESET ROLE;
UPDATE hook_switch SET broken = true;
SET ROLE hook_user;
SELECT status FROM ds_run_step('hooks', 'admin-rerun', 'SELECT 1',
    on_success => $$INSERT INTO hook_answers SELECT $1->>'step_id', $1, current_user
                    FROM hook_switch WHERE 1 / (NOT broken)::int = 1$$);
RESET ROLE;
UPDATE hook_switch SET broken = false;
SET ROLE hook_admin;
SELECT status FROM ds_run_step('hooks', 'admin-rerun', 'SELECT 1',
    on_success => 'SELECT 2');
-- (terse: the hint about the missing function is worded differently from PostgreSQL 19 on)
\set VERBOSITY terse
SELECT status FROM ds_retry_step('hooks', 'admin-rerun', on_success => 'SELECT 2');
\set VERBOSITY default
SELECT status, replayed FROM ds_retry_step('hooks', 'admin-rerun');
RESET ROLE;
SELECT written_by FROM hook_answers WHERE step_id = 'admin-rerun';

-- malformed hooks are errors whether the call would replay or run, and change nothing
SET ROLE hook_user;
SELECT status FROM ds_run_step('hooks', 'bad', 'SELECT 1', on_success => '');
SELECT status FROM ds_run_step('hooks', 'bad', 'SELECT 1', on_failure => ' ; ');
SELECT status FROM ds_run_step('hooks', 'bad', 'SELECT 1', on_success => 'SELEC 1');
SELECT status FROM ds_run_step('hooks', 'bad', 'SELECT 1', on_failure => 'SELECT 1; SELECT 2');
SELECT status FROM ds_run_step('hooks', 'answer', 'SELECT 42', on_success => 'INSERT INTO');
SELECT count(*) AS bad_steps FROM ds_steps WHERE step_id = 'bad';
RESET ROLE;

SELECT step_id, status, error_class, result IS NOT NULL AS has_result
  FROM ds_steps WHERE run_id = 'hooks' ORDER BY step_id;
DELETE FROM durable_steps.steps WHERE run_id = 'hooks';
DROP TABLE hook_answers, hook_dead_letters, hook_effects, hook_switch;
DROP ROLE hook_user;
DROP ROLE hook_admin;
