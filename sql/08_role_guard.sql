-- DROP ROLE warns about the unfinished steps the dropped roles own (src/role_guard.c)
\set SHOW_CONTEXT never

CREATE ROLE guard_dave;
CREATE ROLE guard_erin;
CREATE ROLE guard_done;
CREATE ROLE guard_idle;
-- may drop roles, may not read durable_steps.steps (from PostgreSQL 16 CREATEROLE drops only the
-- roles it holds ADMIN OPTION on)
CREATE ROLE guard_dba CREATEROLE;
GRANT guard_dave, guard_erin, guard_done, guard_idle TO guard_dba WITH ADMIN OPTION;

SET ROLE guard_dave;
SELECT status FROM ds_run_step('guard', 'dave-retrying', $$SELECT ds_retry_after('later', '1 h')$$);
SELECT status FROM ds_run_step('guard', 'dave-blocked', $$SELECT ds_blocked('needs a person', 'Fix it.')$$);
SELECT status FROM ds_run_step('guard', 'dave-succeeded', 'SELECT 1');
SELECT status FROM ds_run_step('guard', 'dave-failed', $$SELECT ds_non_retriable('no')$$);
RESET ROLE;
SET ROLE guard_erin;
SELECT status FROM ds_run_step('guard', 'erin-retrying', $$SELECT ds_retry_after('later', '1 h')$$);
RESET ROLE;
SET ROLE guard_done;
SELECT status FROM ds_run_step('guard', 'done-succeeded', 'SELECT 1');
RESET ROLE;

-- inside a transaction block the warning comes in time to roll back
BEGIN;
DROP ROLE guard_erin;
ROLLBACK;
SELECT count(*) AS erin_exists FROM pg_roles WHERE rolname = 'guard_erin';

-- a role that cannot read the steps table drops four roles: one warning per role that owns
-- unfinished steps, in the statement's order; none for the role whose steps all finished, or
-- for the role without steps
SET ROLE guard_dba;
SELECT count(*) FROM durable_steps.steps;
DROP ROLE guard_dave, guard_done, guard_idle, guard_erin;
RESET ROLE;
-- the steps stay; their owner is now a bare OID
SELECT step_id, status, owner::text ~ '^[0-9]+$' AS owner_is_a_number
  FROM ds_steps WHERE run_id = 'guard' ORDER BY step_id;

-- the count cannot be fooled by operators in the dropping session's search_path
CREATE ROLE guard_gina;
SET ROLE guard_gina;
SELECT status FROM ds_run_step('guard', 'gina-retrying', $$SELECT ds_retry_after('later', '1 h')$$);
RESET ROLE;
CREATE SCHEMA guard_evil;
CREATE FUNCTION guard_evil.never(oid, oid) RETURNS boolean LANGUAGE sql AS 'SELECT false';
CREATE FUNCTION guard_evil.never(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false';
CREATE OPERATOR guard_evil.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = guard_evil.never);
CREATE OPERATOR guard_evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = guard_evil.never);
SET search_path = guard_evil, pg_catalog, public;
DROP USER guard_gina;
RESET search_path;
DROP SCHEMA guard_evil CASCADE;

-- a DROP ROLE that fails warns about nothing
CREATE ROLE guard_frank;
SET ROLE guard_frank;
SELECT status FROM ds_run_step('guard', 'frank-retrying', $$SELECT ds_retry_after('later', '1 h')$$);
RESET ROLE;
CREATE TABLE guard_frank_table ();
ALTER TABLE guard_frank_table OWNER TO guard_frank;
DROP ROLE guard_frank;
-- IF EXISTS names a role that is not there: PostgreSQL's notice only
DROP ROLE IF EXISTS guard_nobody;

-- in a database without the extension DROP ROLE says nothing (and cannot see other databases)
CREATE DATABASE guard_no_extension;
\c guard_no_extension
SELECT count(*) AS extension_here FROM pg_extension WHERE extname = 'durable_steps';
\c contrib_regression
DROP TABLE guard_frank_table;
\c guard_no_extension
DROP ROLE guard_frank;
\c contrib_regression
DROP DATABASE guard_no_extension;
SELECT step_id, status, owner::text ~ '^[0-9]+$' AS owner_is_a_number
  FROM ds_steps WHERE run_id = 'guard' AND step_id LIKE 'frank-%';

DELETE FROM durable_steps.steps WHERE run_id = 'guard';
DROP ROLE guard_dba;
