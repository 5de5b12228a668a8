-- Re-arming with a corrected definition (docs/steps.md, "Stuck work: find, cancel, re-arm"): the
-- owner gives a failed, blocked or cancelled step a corrected SQL (or input); attempt numbers go
-- on, the old attempts stay, and a succeeded step is never redefined. Each refused call is
-- followed by its SQLSTATE.
\set SHOW_CONTEXT never

-- a step whose SQL names a column that does not exist fails for good
SELECT status, error_code FROM ds_run_step('fix', 'wrong', 'SELECT missing_column FROM pg_class LIMIT 1');
-- re-armed with corrected SQL, it runs it (the next call with that SQL, or the worker)
SELECT status, attempt FROM ds_retry_step('fix', 'wrong', sql => 'SELECT 42');
SELECT status, result, attempt, replayed FROM ds_run_step('fix', 'wrong', 'SELECT 42');
-- the old attempt stays in the history
SELECT attempt, class, error_code FROM ds_attempts WHERE run_id = 'fix' ORDER BY attempt;
-- the old SQL is now another definition
SELECT status FROM ds_run_step('fix', 'wrong', 'SELECT missing_column FROM pg_class LIMIT 1');
\echo :SQLSTATE
-- a succeeded step is never redefined
SELECT status FROM ds_retry_step('fix', 'wrong', sql => 'SELECT 43');
\echo :SQLSTATE
-- a corrected SQL is checked as a new step's: a typo changes nothing
SELECT status, error_code FROM ds_run_step('fix', 'typo-fix', 'SELECT 1/0');
SELECT status FROM ds_retry_step('fix', 'typo-fix', sql => 'SELEC 1');
\echo :SQLSTATE
SELECT status, sql FROM ds_steps WHERE run_id = 'fix' AND step_id = 'typo-fix';
-- a cancelled step can be re-armed too, with its definition or a corrected one
SELECT status FROM ds_run_step('fix', 'cancelled', 'SELECT 7', defer => true);
SELECT status FROM ds_cancel_step('fix', 'cancelled');
SELECT status, attempt FROM ds_retry_step('fix', 'cancelled', sql => 'SELECT 8');
SELECT status, result FROM ds_run_step('fix', 'cancelled', 'SELECT 8');
-- only the owner redefines a step
CREATE ROLE rearm_other;
SELECT status, error_code FROM ds_run_step('fix', 'owned', 'SELECT 1/0');
SET ROLE rearm_other;
SELECT status FROM ds_retry_step('fix', 'owned', sql => 'SELECT 1');
\echo :SQLSTATE
RESET ROLE;
DROP ROLE rearm_other;
