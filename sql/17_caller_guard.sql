-- A hook run in another role's session leaves nothing there (docs/security.md): an
-- admin's ds_retry_step runs the owner's on_success hook in the admin's session. It does not run
-- while the admin has a cursor open (42501); a cursor left open or a temporary object of any
-- kind fails the hook (42501, rolled back with it); a session
-- advisory lock it took is let go at the end of the admin's transaction; its setseed() does not
-- choose the admin's random numbers. The owner's own session is the owner's business.
\set SHOW_CONTEXT never
CREATE ROLE guard_owner;
CREATE ROLE guard_admin IN ROLE durable_steps_admin;
CREATE TABLE guard_gate (open bool);
INSERT INTO guard_gate VALUES (false);
GRANT SELECT ON guard_gate TO guard_owner;
CREATE SCHEMA guard AUTHORIZATION guard_owner;
SET ROLE guard_owner;
-- each hook fails while the gate is closed (the step is blocked by it), then leaves something
CREATE FUNCTION guard.gate() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (SELECT open FROM public.guard_gate) THEN
        RAISE EXCEPTION 'gate closed';
    END IF;
END $$;
CREATE FUNCTION guard.leave_cursor() RETURNS int LANGUAGE plpgsql AS $$
DECLARE c refcursor := 'leaked';
BEGIN
    PERFORM guard.gate();
    OPEN c FOR SELECT current_user::text;
    RETURN 1;
END $$;
CREATE FUNCTION guard.leave_temp() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM guard.gate();
    CREATE FUNCTION pg_temp.planted() RETURNS text LANGUAGE sql AS 'SELECT current_user::text';
    RETURN 1;
END $$;
CREATE FUNCTION guard.leave_lock_and_seed() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM guard.gate();
    PERFORM pg_advisory_lock(4711);
    PERFORM setseed(0.5);
    RETURN 1;
END $$;
CREATE FUNCTION guard.leave_prepared() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM guard.gate();
    EXECUTE 'PREPARE planted AS SELECT current_user';
    RETURN 1;
END $$;
SELECT status FROM ds_run_step('guard', 'cursor', 'SELECT 1', on_success => 'SELECT guard.leave_cursor()');
SELECT status FROM ds_run_step('guard', 'prepared', 'SELECT 1', on_success => 'SELECT guard.leave_prepared()');
SELECT status FROM ds_run_step('guard', 'temp', 'SELECT 1', on_success => 'SELECT guard.leave_temp()');
SELECT status FROM ds_run_step('guard', 'lock', 'SELECT 1', on_success => 'SELECT guard.leave_lock_and_seed()');
RESET ROLE;
UPDATE guard_gate SET open = true;

SET ROLE guard_admin;
-- a cursor: the hook fails, and nothing is left to FETCH in the admin's transaction
BEGIN;
SELECT status, error_code, error_message FROM ds_retry_step('guard', 'cursor');
SELECT count(*) FROM pg_cursors;
COMMIT;
-- a prepared statement: PostgreSQL refuses PREPARE in the hook's security-restricted operation
SELECT status, error_code, error_message FROM ds_retry_step('guard', 'prepared');
SELECT count(*) FROM pg_prepared_statements;
-- a temporary function: the hook fails, and the admin's pg_temp has no planted() to call
SELECT status, error_code, error_message FROM ds_retry_step('guard', 'temp');
SELECT count(*) FROM pg_proc WHERE proname = 'planted';
-- a session advisory lock and a seed: the hook succeeds; the lock is gone once the admin's
-- transaction ends, and random() is not the seeded sequence
BEGIN;
SELECT status FROM ds_retry_step('guard', 'lock');
SELECT random() AS after_hook \gset
COMMIT;
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4711 AND pid = pg_backend_pid();
SELECT setseed(0.5);
SELECT random() = :after_hook AS chosen_by_the_hook;
RESET ROLE;

-- the admin's own session lock, taken before, is the admin's: it stays
UPDATE guard_gate SET open = false;
SET ROLE guard_owner;
SELECT status FROM ds_run_step('guard', 'lock2', 'SELECT 1', on_success => 'SELECT guard.leave_lock_and_seed()');
CREATE FUNCTION guard.fetch_theirs() RETURNS int LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    PERFORM guard.gate();
    FOR r IN EXECUTE 'FETCH ALL FROM mine' LOOP
        RAISE NOTICE 'the hook read %', r.v;
    END LOOP;
    RETURN 1;
END $$;
SELECT status FROM ds_run_step('guard', 'fetch', 'SELECT 1', on_success => 'SELECT guard.fetch_theirs()');
RESET ROLE;
CREATE TABLE guard_secret (v text);
INSERT INTO guard_secret VALUES ('the admin''s secret');
GRANT SELECT ON guard_secret TO guard_admin;
UPDATE guard_gate SET open = true;
SET ROLE guard_admin;
SELECT pg_advisory_lock(4712);
SELECT status FROM ds_retry_step('guard', 'lock2');
-- the hook does not run while the admin has a cursor open: it could FETCH the admin's rows
BEGIN;
DECLARE mine CURSOR FOR SELECT v FROM guard_secret;
SELECT status FROM ds_retry_step('guard', 'fetch');
ROLLBACK;
SELECT status FROM ds_steps WHERE run_id = 'guard' AND step_id = 'fetch';
SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() ORDER BY objid;
SELECT pg_advisory_unlock(4712);
RESET ROLE;
