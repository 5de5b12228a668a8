-- Data safety: what a dump keeps, owners by name, a step's attempts go with it
\set SHOW_CONTEXT never

-- pg_dump writes the rows of these three tables (pg_extension_config_dump, every row)
SELECT c::regclass AS dumped_table, coalesce(f, '') AS row_filter
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS t(c, f)
 WHERE e.extname = 'durable_steps'
 ORDER BY c::regclass::text;

-- owners are regrole: a dump (COPY) writes the role's name, not its OID
SELECT attrelid::regclass AS table_name, attname, atttypid::regtype AS type
  FROM pg_attribute
 WHERE attrelid IN ('durable_steps.steps'::regclass, 'durable_steps.attempts'::regclass,
                    'durable_steps.runs'::regclass)
   AND attname IN ('owner', 'role')
 ORDER BY attrelid::regclass::text;
CREATE ROLE safe_carol;
SET ROLE safe_carol;
SELECT status FROM ds_run_step('safe', 'by-carol', 'SELECT 1');
RESET ROLE;
COPY (SELECT s.owner, a.role FROM durable_steps.steps s
        JOIN durable_steps.attempts a USING (run_id, step_id)
       WHERE run_id = 'safe') TO STDOUT;
-- the views still show the owner, and only to roles with its privileges
SET ROLE safe_carol;
SELECT step_id, owner FROM ds_steps WHERE run_id = 'safe';
SELECT step_id, attempt, role FROM ds_attempts WHERE run_id = 'safe';
RESET ROLE;

-- A step row deleted by hand takes its attempts with it: the next call on that identity starts
-- afresh at attempt 1 instead of colliding with the old attempt rows.
CREATE TABLE safe_ledger (n serial, step text);
SELECT status, attempt, replayed
  FROM ds_run_step('safe', 'deleted', $$INSERT INTO safe_ledger(step) VALUES ('deleted')$$);
-- a failing step with a few attempts, then both deleted by hand in one statement
SELECT status, attempt FROM ds_run_step('safe', 'retried', $$SELECT ds_retry_after('busy', '0')$$);
SELECT status, attempt FROM ds_run_step('safe', 'retried', $$SELECT ds_retry_after('busy', '0')$$);
SELECT step_id, count(*) AS attempt_rows FROM durable_steps.attempts
 WHERE run_id = 'safe' GROUP BY step_id ORDER BY step_id;
DELETE FROM durable_steps.steps WHERE run_id = 'safe' AND step_id IN ('deleted', 'retried');
SELECT step_id, count(*) AS attempt_rows FROM durable_steps.attempts
 WHERE run_id = 'safe' GROUP BY step_id ORDER BY step_id;
SELECT status, attempt, replayed
  FROM ds_run_step('safe', 'deleted', $$INSERT INTO safe_ledger(step) VALUES ('deleted')$$);
SELECT status, attempt, error_code, replayed
  FROM ds_run_step('safe', 'retried', $$SELECT ds_retry_after('busy', '0')$$);
SELECT step, count(*) AS executions FROM safe_ledger GROUP BY step;
-- a deletion rolled back keeps the attempts too
BEGIN;
DELETE FROM durable_steps.steps WHERE run_id = 'safe' AND step_id = 'deleted';
SELECT count(*) AS attempt_rows_inside FROM durable_steps.attempts
 WHERE run_id = 'safe' AND step_id = 'deleted';
ROLLBACK;
SELECT count(*) AS attempt_rows_after_rollback FROM durable_steps.attempts
 WHERE run_id = 'safe' AND step_id = 'deleted';
SELECT status, attempt, replayed
  FROM ds_run_step('safe', 'deleted', $$INSERT INTO safe_ledger(step) VALUES ('deleted')$$);
-- also under session_replication_role = replica (ENABLE ALWAYS)
SELECT count(*) AS attempt_rows_before FROM durable_steps.attempts
 WHERE run_id = 'safe' AND step_id = 'retried';
SET session_replication_role = replica;
DELETE FROM durable_steps.steps WHERE run_id = 'safe' AND step_id = 'retried';
RESET session_replication_role;
SELECT count(*) AS attempt_rows FROM durable_steps.attempts
 WHERE run_id = 'safe' AND step_id = 'retried';

-- TRUNCATE of the steps truncates their attempts
TRUNCATE durable_steps.steps;
SELECT count(*) AS attempt_rows FROM durable_steps.attempts;
SELECT status, attempt, replayed
  FROM ds_run_step('safe', 'deleted', $$INSERT INTO safe_ledger(step) VALUES ('deleted')$$);
SELECT step, count(*) AS executions FROM safe_ledger GROUP BY step;
-- both tables in one TRUNCATE, in either order
TRUNCATE durable_steps.steps, durable_steps.attempts;
SELECT status, attempt, replayed
  FROM ds_run_step('safe', 'deleted', $$INSERT INTO safe_ledger(step) VALUES ('deleted')$$);
TRUNCATE durable_steps.attempts, durable_steps.steps, durable_steps.runs;
SELECT (SELECT count(*) FROM durable_steps.steps) AS steps,
       (SELECT count(*) FROM durable_steps.attempts) AS attempts;

-- the triggers' functions are not for anybody's use
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proconfig,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'durable_steps'::regnamespace AND p.prorettype = 'trigger'::regtype
 ORDER BY p.proname;
-- statement triggers (tgtype 8: AFTER DELETE, 20: AFTER INSERT OR UPDATE, 32: AFTER TRUNCATE), also under
-- session_replication_role = replica (A)
SELECT tgname, tgtype, tgenabled, tgoldtable, tgfoid::regproc AS function FROM pg_trigger
 WHERE tgrelid = 'durable_steps.steps'::regclass
   AND tgname IN ('steps_delete_attempts', 'steps_truncate_attempts', 'steps_note_writes')
 ORDER BY tgname;

DROP TABLE safe_ledger;
DROP ROLE safe_carol;

-- the extension's tables take no row trigger: its direct writes would not fire one, so a write
-- refuses the table instead of skipping the trigger
CREATE FUNCTION safety_noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER sneaky BEFORE INSERT ON durable_steps.steps
    FOR EACH ROW EXECUTE FUNCTION safety_noop();
SELECT status FROM ds_run_step('safety', 'row-trigger', 'SELECT 1');
DROP TRIGGER sneaky ON durable_steps.steps;
SELECT status FROM ds_run_step('safety', 'row-trigger', 'SELECT 1');
