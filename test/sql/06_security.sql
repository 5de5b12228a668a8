-- Security (SPEC §11): roles see and act on their own steps; bodies run as the caller

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
SELECT * FROM ds_retry_step('sec', 'alice-peeks');
RESET ROLE;

-- a member of durable_steps_admin sees and acts on every step
SET ROLE sec_admin;
SELECT count(*) AS admin_sees FROM ds_steps WHERE run_id = 'sec';
SELECT status, result, replayed
  FROM ds_run_step('sec', 'alice-step',
       $$INSERT INTO sec_alice_data VALUES (current_user) RETURNING who$$);
RESET ROLE;
-- the admin's replay left the answer remembered in this backend; it is still not bob's
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
