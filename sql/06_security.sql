-- Security (docs/security.md): roles see and act on their own steps; bodies run as the caller.
-- Where which error it is matters, the failing statement is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE ROLE sec_alice;
CREATE ROLE sec_bob;
CREATE ROLE sec_admin IN ROLE durable_steps_admin;
CREATE TABLE sec_alice_data (who text);
GRANT INSERT, SELECT ON sec_alice_data TO sec_alice;

-- a step runs as its caller: current_user inside the body is the calling role
SET ROLE sec_alice;
SELECT status, result
  FROM ds_run_step('sec', 'alice-step',
       $$INSERT INTO sec_alice_data VALUES (current_user) RETURNING who$$);
-- it cannot reach what the caller cannot: the extension's own tables are not the caller's
SELECT status, error_code, error_class
  FROM ds_run_step('sec', 'alice-peeks', 'SELECT count(*) FROM durable_steps.steps');
SELECT count(*) FROM durable_steps.steps;
-- a SET ROLE inside the body ends with the body, like every other SET of a step
SELECT status FROM ds_run_step('sec', 'alice-set-role', 'SET ROLE sec_bob');
SELECT current_user AS after_step;
-- she sees her own steps and attempts
SELECT run_id, step_id, status, owner FROM ds_steps ORDER BY step_id;
SELECT step_id, attempt, role FROM ds_attempts ORDER BY step_id;
RESET ROLE;

-- another role sees none of them, and may not act on them
SET ROLE sec_bob;
SELECT count(*) AS bob_sees FROM ds_steps WHERE run_id = 'sec';
SELECT count(*) AS bob_sees_attempts FROM ds_attempts WHERE run_id = 'sec';
SELECT * FROM ds_run_step('sec', 'alice-step',
       $$INSERT INTO sec_alice_data VALUES (current_user) RETURNING who$$);
-- re-arming a step of another role answers exactly as a step that does not exist
SELECT ds_retry_step('sec', 'alice-peeks');
\echo :SQLSTATE
SELECT ds_retry_step('sec', 'no-such-step');
\echo :SQLSTATE
RESET ROLE;

-- a member of durable_steps_admin sees every step, but is never answered with another role's
-- result as its own: its search_path and privileges are not the owner's
SET ROLE sec_admin;
SELECT count(*) AS admin_sees FROM ds_steps WHERE run_id = 'sec';
SELECT ds_run_step('sec', 'alice-step',
       'INSERT INTO sec_alice_data VALUES (current_user) RETURNING who');
\echo :SQLSTATE
RESET ROLE;
-- nor is a superuser
SELECT ds_run_step('sec', 'alice-step',
       'INSERT INTO sec_alice_data VALUES (current_user) RETURNING who');
\echo :SQLSTATE
-- the owner replays, and the answer is remembered in this backend; it is still not bob's
SET ROLE sec_alice;
SELECT status, result, replayed
  FROM ds_run_step('sec', 'alice-step',
       $$INSERT INTO sec_alice_data VALUES (current_user) RETURNING who$$);
RESET ROLE;
SET ROLE sec_bob;
SELECT * FROM ds_run_step('sec', 'alice-step',
       $$INSERT INTO sec_alice_data VALUES (current_user) RETURNING who$$);
RESET ROLE;
SELECT who FROM sec_alice_data;

-- a hostile search_path cannot take part in the extension's own statements
CREATE SCHEMA sec_evil;
CREATE FUNCTION sec_evil.texteq_evil(text, text) RETURNS boolean LANGUAGE sql
    AS $$SELECT true$$;
CREATE OPERATOR sec_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = sec_evil.texteq_evil);
SET search_path = sec_evil, public, pg_catalog;
SELECT status, result, replayed FROM ds_run_step('sec', 'evil-path', 'SELECT 1');
SELECT status, result, replayed FROM ds_run_step('sec', 'evil-path', 'SELECT 1');
RESET search_path;
SELECT count(*) AS evil_path_steps FROM ds_steps WHERE step_id = 'evil-path';

-- re-arming: an admin may run a step again as its owner defined it, but not give it new input
-- (which would then run with the owner's privileges), and not touch a superuser's step
SET ROLE sec_admin;
SELECT ds_retry_step('sec', 'alice-peeks', '{"x": 1}');
\echo :SQLSTATE
SELECT status FROM ds_retry_step('sec', 'alice-peeks');
RESET ROLE;
SELECT status, error_class FROM ds_run_step('sec', 'super-fails', $$SELECT ds_non_retriable('no')$$);
SET ROLE sec_admin;
SELECT ds_retry_step('sec', 'super-fails');
\echo :SQLSTATE
RESET ROLE;
SELECT step_id, status, input FROM ds_steps WHERE step_id IN ('alice-peeks', 'super-fails')
 ORDER BY step_id;

-- limits a body cannot lift: only superusers set durable_steps.max_result_size, and the limit
-- in force is the one read before the body ran
SET ROLE sec_alice;
SET durable_steps.max_result_size = '100MB';
\echo :SQLSTATE
RESET ROLE;
SET durable_steps.max_result_size = '1kB';
SELECT status, error_code, error_message
  FROM ds_run_step('sec', 'lifts-own-limit',
       $$SELECT set_config('durable_steps.max_result_size', '100MB', true), repeat('x', 5000)$$);
RESET durable_steps.max_result_size;
-- error texts are stored cut to 8 kB, on a character boundary
SELECT status, octet_length(error_message) AS message_bytes,
       right(error_message, 6) AS message_end, error_detail IS NULL AS no_detail
  FROM ds_run_step('sec', 'huge-error', $$SELECT ds_non_retriable(repeat('é', 100000))$$);
SELECT octet_length(error_message) AS attempt_message_bytes
  FROM ds_attempts WHERE step_id = 'huge-error';
