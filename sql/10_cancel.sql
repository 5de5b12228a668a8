-- ds_cancel_step (docs/steps.md, "Cancelling a step"): a step that has not finished becomes cancelled
-- and never runs again; a finished one cannot be cancelled. (pg_regress's database is not the
-- worker's: no attempt here is run by the worker.)
\set SHOW_CONTEXT never

-- a deferred (pending) step
SELECT status FROM ds_run_step('cancel', 'pending', 'SELECT 1', defer => true);
SELECT status, attempt, next_attempt_at IS NULL AS not_due, replayed
  FROM ds_cancel_step('cancel', 'pending');
-- cancelling again answers with the cancelled step
SELECT status FROM ds_cancel_step('cancel', 'pending');
-- a call of the same step answers with the stored outcome, and runs nothing
SELECT status, replayed FROM ds_run_step('cancel', 'pending', 'SELECT 1');

-- a retrying step keeps its last error; a blocked one too
SELECT status FROM ds_run_step('cancel', 'retrying', $$SELECT ds_retry_after('later', '1 hour')$$);
SELECT status, error_code, attempt FROM ds_cancel_step('cancel', 'retrying');
SELECT status FROM ds_run_step('cancel', 'blocked', $$SELECT ds_blocked('needs a person', 'Fix it.')$$);
SELECT status, error_code FROM ds_cancel_step('cancel', 'blocked');
-- a cancelled step may be re-armed by its owner: it is pending again (docs/steps.md)
SELECT status FROM ds_retry_step('cancel', 'blocked');

-- finished steps cannot be cancelled
SELECT status FROM ds_run_step('cancel', 'done', 'SELECT 1');
SELECT status FROM ds_cancel_step('cancel', 'done');
SELECT status FROM ds_run_step('cancel', 'failed', $$SELECT ds_non_retriable('no')$$);
SELECT status FROM ds_cancel_step('cancel', 'failed');

-- unknown steps, and other roles' steps, do not exist for the caller
SELECT status FROM ds_cancel_step('cancel', 'no-such-step');
CREATE ROLE cancel_other;
SET ROLE cancel_other;
SELECT status FROM ds_cancel_step('cancel', 'done');
RESET ROLE;
DROP ROLE cancel_other;

-- bad input changes nothing
SELECT status FROM ds_cancel_step(NULL, 'x');
SELECT status FROM ds_cancel_step('cancel', '');

SELECT step_id, status, error_class, finished_at IS NOT NULL AS finished
  FROM ds_steps WHERE run_id = 'cancel' ORDER BY step_id;
