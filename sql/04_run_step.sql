-- ds_run_step: every row of the table in docs/steps.md, "How a step behaves", results, re-arming and the caller's transaction
\set SHOW_CONTEXT never

CREATE OR REPLACE FUNCTION fail_with(code text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'failing with %', code USING ERRCODE = code;
END
$$;
CREATE TABLE rs_orders (id int PRIMARY KEY, note text);
CREATE TABLE rs_calls (n serial, step text);   -- counts how often succeeding bodies ran
-- a sequence is not rolled back with a failed attempt: it counts how often a failing body ran
CREATE SEQUENCE rs_flaky_runs;
CREATE FUNCTION rs_count(step text) RETURNS bigint LANGUAGE sql AS
    $$SELECT count(*) FROM rs_calls WHERE rs_calls.step = $1$$;

-- new key: claimed, executed and persisted with the caller's transaction
SELECT run_id, step_id, status, result, attempt, max_attempts, next_attempt_at, error_class,
       error_code, error_message, remediation, replayed
  FROM ds_run_step('order:1', 'insert',
       $$WITH c AS (INSERT INTO rs_calls(step) VALUES ('insert'))
         INSERT INTO rs_orders VALUES (1, $1->>'note') RETURNING id, note$$,
       '{"note": "first"}');
-- completed, same fingerprint: the stored result, replayed; the body does not run
SELECT status, result, attempt, replayed
  FROM ds_run_step('order:1', 'insert',
       $$WITH c AS (INSERT INTO rs_calls(step) VALUES ('insert'))
         INSERT INTO rs_orders VALUES (1, $1->>'note') RETURNING id, note$$,
       '{"note": "first"}');
SELECT rs_count('insert') AS body_runs, (SELECT count(*) FROM rs_orders) AS orders;
-- the policy and timeout are not part of the definition: a replay may pass others
SELECT status, replayed
  FROM ds_run_step('order:1', 'insert',
       $$WITH c AS (INSERT INTO rs_calls(step) VALUES ('insert'))
         INSERT INTO rs_orders VALUES (1, $1->>'note') RETURNING id, note$$,
       '{"note": "first"}', policy => '{"max_attempts": 1}', timeout => '1 s');
-- completed, different fingerprint (other input, other SQL): conflict, DS422; nothing runs
SELECT ds_run_step('order:1', 'insert',
       $$WITH c AS (INSERT INTO rs_calls(step) VALUES ('insert'))
         INSERT INTO rs_orders VALUES (1, $1->>'note') RETURNING id, note$$,
       '{"note": "second"}');
\echo :SQLSTATE
SELECT ds_run_step('order:1', 'insert', 'SELECT 1');
\echo :SQLSTATE
SELECT rs_count('insert') AS body_runs;

-- failed, same fingerprint: the stored failure; the body does not run again
SELECT status, error_class, error_code, replayed
  FROM ds_run_step('order:2', 'fail', $$SELECT ds_non_retriable('order was cancelled')$$);
SELECT status, error_class, error_code, error_message, replayed
  FROM ds_run_step('order:2', 'fail', $$SELECT ds_non_retriable('order was cancelled')$$);
SELECT count(*) AS attempts FROM ds_attempts WHERE run_id = 'order:2';
-- blocked, same fingerprint: the stored state with its remediation
SELECT status, remediation, replayed
  FROM ds_run_step('order:3', 'validate', $$SELECT CASE WHEN ($1->>'qty')::int > 0 THEN 'ok'
       ELSE ds_blocked('quantity must be positive', 'Correct the quantity.')::text END$$,
       '{"qty": 0}');
SELECT status, remediation, replayed
  FROM ds_run_step('order:3', 'validate', $$SELECT CASE WHEN ($1->>'qty')::int > 0 THEN 'ok'
       ELSE ds_blocked('quantity must be positive', 'Correct the quantity.')::text END$$,
       '{"qty": 0}');
-- stopped (here blocked: a division by zero), different SQL: the hint names the re-arm that takes it
SELECT status, error_code FROM ds_run_step('order:fix', 'charge', 'SELECT 1/0');
SELECT * FROM ds_run_step('order:fix', 'charge', 'SELECT 1');
SELECT status FROM ds_retry_step('order:fix', 'charge', sql => 'SELECT 1');
SELECT status, result FROM ds_run_step('order:fix', 'charge', 'SELECT 1');
-- blocked, different fingerprint: conflict; changed input goes through ds_retry_step
SELECT * FROM ds_run_step('order:3', 'validate', $$SELECT CASE WHEN ($1->>'qty')::int > 0 THEN 'ok'
       ELSE ds_blocked('quantity must be positive', 'Correct the quantity.')::text END$$,
       '{"qty": 2}');
SELECT status, attempt, max_attempts, next_attempt_at IS NOT NULL AS due_set, error_code, replayed
  FROM ds_retry_step('order:3', 'validate', '{"qty": 2}');
-- the re-armed step runs with its corrected input on the next call; attempt numbers go on
SELECT status, result, attempt, max_attempts, replayed
  FROM ds_run_step('order:3', 'validate', $$SELECT CASE WHEN ($1->>'qty')::int > 0 THEN 'ok'
       ELSE ds_blocked('quantity must be positive', 'Correct the quantity.')::text END$$,
       '{"qty": 2}');
SELECT attempt, class, attempt_key FROM ds_attempts WHERE run_id = 'order:3' ORDER BY attempt;

-- retrying, not yet due: the pending state; the body does not run early
SELECT status, attempt, error_code, next_attempt_at > now() AS later, replayed
  FROM ds_run_step('order:4', 'flaky',
       $$SELECT ds_retry_after('busy', '1 h') FROM (SELECT nextval('rs_flaky_runs')) AS run$$);
SELECT status, attempt, replayed
  FROM ds_run_step('order:4', 'flaky',
       $$SELECT ds_retry_after('busy', '1 h') FROM (SELECT nextval('rs_flaky_runs')) AS run$$);
SELECT last_value AS body_runs FROM rs_flaky_runs;
-- what the worker needs to run it later is stored: SQL, input, policy, timeout, role, search_path
SELECT kind, sql IS NOT NULL AS has_sql, policy, timeout, on_timeout, owner = current_user::regrole AS owner_is_caller
  FROM ds_steps WHERE run_id = 'order:4';
SELECT search_path FROM durable_steps.steps WHERE run_id = 'order:4';
-- once due, a call runs the next attempt (here made due by hand, as the clock would)
UPDATE durable_steps.steps SET next_attempt_at = now() - interval '1 s' WHERE run_id = 'order:4';
SELECT status, attempt, replayed
  FROM ds_run_step('order:4', 'flaky',
       $$SELECT ds_retry_after('busy', '1 h') FROM (SELECT nextval('rs_flaky_runs')) AS run$$);
SELECT last_value AS body_runs FROM rs_flaky_runs;

-- exhaustion: the last allowed attempt fails retryably -> failed, error_class exhausted
SELECT status, attempt, max_attempts, error_class
  FROM ds_run_step('order:5', 'once', $$SELECT fail_with('40001')$$, policy => '{"max_attempts": 1}');
-- ds_retry_step re-arms an exhausted step with a fresh budget; numbers keep growing
SELECT status, attempt, max_attempts FROM ds_retry_step('order:5', 'once');
SELECT status, attempt, max_attempts, error_class
  FROM ds_run_step('order:5', 'once', $$SELECT fail_with('40001')$$, policy => '{"max_attempts": 1}');
SELECT attempt, class, attempt_key FROM ds_attempts WHERE run_id = 'order:5' ORDER BY attempt;
-- re-arming is only for failed, blocked and uncertain steps
SELECT * FROM ds_retry_step('order:1', 'insert');
SELECT * FROM ds_retry_step('order:4', 'flaky');
SELECT * FROM ds_retry_step('order:404', 'nothing');

-- results: 0 rows, 1 column, several columns, NULLs, more than one row, oversize
SELECT step_id, status, result FROM ds_run_step('results', 'no-row', 'SELECT 1 WHERE false');
SELECT step_id, status, result FROM ds_run_step('results', 'no-returning', 'INSERT INTO rs_calls(step) VALUES (''x'')');
SELECT step_id, status, result FROM ds_run_step('results', 'utility', 'CREATE TABLE rs_made_by_step (x int)');
SELECT step_id, status, result FROM ds_run_step('results', 'one-int', 'SELECT 42');
SELECT step_id, status, result FROM ds_run_step('results', 'one-text', $$SELECT 'a "quoted" text'$$);
SELECT step_id, status, result FROM ds_run_step('results', 'one-json', $$SELECT '{"a": [1, 2]}'::jsonb$$);
SELECT step_id, status, result FROM ds_run_step('results', 'one-null', 'SELECT NULL::int');
SELECT step_id, status, result FROM ds_run_step('results', 'one-array', 'SELECT ARRAY[1, 2, 3]');
SELECT step_id, status, result FROM ds_run_step('results', 'several',
       $$SELECT 1 AS id, 'x' AS name, NULL::date AS due, true AS ok, 2.50 AS price$$);
SELECT step_id, status, result FROM ds_run_step('results', 'composite', $$SELECT ROW(1, 'a') AS r$$);
SELECT step_id, status, result FROM ds_run_step('results', 'input-echo', 'SELECT $1', '{"k": [true, null]}');
SELECT step_id, status, result FROM ds_run_step('results', 'input-null', 'SELECT $1 IS NULL');
SELECT step_id, status, error_class, error_code FROM ds_run_step('results', 'two-rows',
       'SELECT * FROM (VALUES (1), (2)) v');
-- more than one row from DML: the whole statement rolls back with the attempt
SELECT step_id, status, error_code FROM ds_run_step('results', 'two-rows-dml',
       $$INSERT INTO rs_orders VALUES (10, 'a'), (11, 'b') RETURNING id$$);
SELECT count(*) AS rolled_back FROM rs_orders WHERE id IN (10, 11);
SET durable_steps.max_result_size = '1kB';
SELECT step_id, status, error_class, error_code, error_message, error_detail
  FROM ds_run_step('results', 'oversize', $$SELECT repeat('x', 2000)$$);
SELECT step_id, status, length(result #>> '{}') FROM ds_run_step('results', 'fits', $$SELECT repeat('x', 900)$$);
RESET durable_steps.max_result_size;

-- ds_unwrap: the result of a succeeded step, an error otherwise
SELECT ds_unwrap(ds_run_step('results', 'one-json', $$SELECT '{"a": [1, 2]}'::jsonb$$));
SELECT ds_unwrap(ds_run_step('order:2', 'fail', $$SELECT ds_non_retriable('order was cancelled')$$));
SELECT ds_unwrap(NULL);

-- a step failure never aborts the caller's transaction; a rollback removes step and effects
BEGIN;
SELECT status FROM ds_run_step('txn', 'fails', 'SELECT 1/0');
SELECT 'still usable' AS caller;
SELECT status FROM ds_run_step('txn', 'works', $$INSERT INTO rs_orders VALUES (20, 'txn') RETURNING id$$);
ROLLBACK;
SELECT count(*) AS steps FROM ds_steps WHERE run_id = 'txn';
SELECT count(*) AS attempts FROM ds_attempts WHERE run_id = 'txn';
SELECT count(*) AS effects FROM rs_orders WHERE id = 20;
-- a failed attempt's own writes roll back with it, the caller's earlier writes stay
BEGIN;
INSERT INTO rs_orders VALUES (21, 'caller');
SELECT status FROM ds_run_step('txn2', 'partial',
       $$WITH i AS (INSERT INTO rs_orders VALUES (22, 'step') RETURNING id) SELECT 1/0 FROM i$$);
COMMIT;
SELECT id FROM rs_orders WHERE id IN (21, 22) ORDER BY id;

-- a step's SETs end with the step; it runs as the caller, with the caller's search_path
SET work_mem = '4MB';
SELECT result FROM ds_run_step('settings', 'set-inside',
       $$SELECT set_config('work_mem', '64MB', false)$$);
SHOW work_mem;
RESET work_mem;

-- nested steps: a body may run steps of its own; each sees its own context
SELECT result FROM ds_run_step('nest', 'outer',
       $$SELECT jsonb_build_object('outer_key', ds_attempt_key(),
                 'inner', (SELECT result FROM ds_run_step('nest', 'inner', 'SELECT ds_attempt_key()')),
                 'after_inner', ds_attempt_key())$$);
-- a body that runs its own step again is refused (it would never finish)
SELECT status, error_code, error_message FROM ds_run_step('nest', 'self',
       $$SELECT (ds_run_step('nest', 'self', 'SELECT 1')).status$$);

-- steps in triggers commit or roll back with the triggering statement
CREATE TABLE rs_payments (id int PRIMARY KEY, amount int);
CREATE TABLE rs_ledger (payment_id int, amount int);
CREATE FUNCTION rs_payment_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_run_step(ds_key('payment', NEW.id), 'ledger',
                        'INSERT INTO rs_ledger SELECT ($1->>''id'')::int, ($1->>''amount'')::int',
                        to_jsonb(NEW));
    RETURN NEW;
END
$$;
CREATE TRIGGER rs_payment_after AFTER INSERT ON rs_payments
    FOR EACH ROW EXECUTE FUNCTION rs_payment_step();
INSERT INTO rs_payments VALUES (1, 100);
BEGIN;
INSERT INTO rs_payments VALUES (2, 200);
ROLLBACK;
SELECT * FROM rs_ledger;
SELECT run_id, step_id, status FROM ds_steps WHERE run_id LIKE 'payment:%' ORDER BY run_id;

-- a read-only transaction may replay a stored step but not create one
BEGIN READ ONLY;
SELECT status, replayed FROM ds_run_step('results', 'one-int', 'SELECT 42');
SELECT * FROM ds_run_step('read-only', 'new', 'SELECT 1');
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM ds_retry_step('order:2', 'fail');
ROLLBACK;

-- Replays of succeeded steps are remembered per backend (src/replay_cache.c). A remembered answer
-- must never outlive its row, outlast a rollback, hide a conflict or skip the owner check.
CREATE SEQUENCE rs_cache_runs;
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
-- read from the row, then remembered; both replay
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
-- another definition under the same identity is still a conflict
SELECT * FROM ds_run_step('cache', 'a', 'SELECT 2');
-- a deleted step (as retention deletes it) takes its remembered answer with it: the body runs
-- again
DELETE FROM durable_steps.attempts WHERE run_id = 'cache' AND step_id = 'a';
DELETE FROM durable_steps.steps WHERE run_id = 'cache' AND step_id = 'a';
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
-- so does an UPDATE by SQL (not something to do to a succeeded step, but never ignored)
UPDATE durable_steps.steps SET result = '"changed"' WHERE run_id = 'cache' AND step_id = 'a';
SELECT status, result, replayed
  FROM ds_run_step('cache', 'a', 'SELECT nextval(''rs_cache_runs'')');
-- the statement trigger that makes every backend forget, on DELETE, UPDATE and TRUNCATE, also
-- under session_replication_role = replica (another backend forgetting is tested in
-- test/t/059_replay_cache_forgets.pl)
SELECT tgname, tgtype, tgenabled
  FROM pg_trigger WHERE tgrelid = 'durable_steps.steps'::regclass
   AND tgfoid = 'durable_steps.ds_forget_replays'::regproc;
-- a step that succeeded in a transaction that rolled back was never remembered
BEGIN;
SELECT status, result, replayed
  FROM ds_run_step('cache', 'b', 'SELECT nextval(''rs_cache_runs'')');
SELECT status, result, replayed
  FROM ds_run_step('cache', 'b', 'SELECT nextval(''rs_cache_runs'')');
ROLLBACK;
SELECT status, result, replayed
  FROM ds_run_step('cache', 'b', 'SELECT nextval(''rs_cache_runs'')');
-- nor was one rolled back to a savepoint
BEGIN;
SAVEPOINT s;
SELECT status, result, replayed
  FROM ds_run_step('cache', 'c', 'SELECT nextval(''rs_cache_runs'')');
SELECT status, result, replayed
  FROM ds_run_step('cache', 'c', 'SELECT nextval(''rs_cache_runs'')');
ROLLBACK TO SAVEPOINT s;
SELECT status, result, replayed
  FROM ds_run_step('cache', 'c', 'SELECT nextval(''rs_cache_runs'')');
COMMIT;
SELECT step_id, attempt, class FROM ds_attempts WHERE run_id = 'cache' ORDER BY step_id, attempt;
