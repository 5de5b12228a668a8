-- Runs (docs/runs.md): bad arguments of ds_start_run and of the run controls get a clear error
-- with a documented SQLSTATE and change nothing; the in-workflow calls refuse to run outside a
-- workflow. (pg_regress runs no worker: whether runs run is for the TAP tests, 025-028. What is
-- started here is rolled back all the same.) Each refused call is followed by its SQLSTATE; inside
-- a transaction block, a savepoint before it keeps the transaction going.
\set SHOW_CONTEXT never

CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT input $$;
CREATE PROCEDURE wf_proc(run_id text, input jsonb) LANGUAGE sql AS $$ SELECT 1 $$;
CREATE FUNCTION wf_other(a int, b jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT b $$;
CREATE FUNCTION wf_set(run_id text, input jsonb) RETURNS SETOF jsonb LANGUAGE sql AS $$ SELECT input $$;
CREATE FUNCTION wf_private(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT input $$;
REVOKE EXECUTE ON FUNCTION wf_private(text, jsonb) FROM PUBLIC;
CREATE ROLE runs_other;

-- ds_start_run: the workflow
SELECT ds_start_run(NULL, '{}');
\echo :SQLSTATE
SELECT ds_start_run('', '{}');
\echo :SQLSTATE
SELECT ds_start_run('no_such_workflow', '{}');
\echo :SQLSTATE
SELECT ds_start_run('wf(int)', '{}');
\echo :SQLSTATE
SELECT ds_start_run('wf_other(int, jsonb)', '{}');
\echo :SQLSTATE
SELECT ds_start_run('wf_set', '{}');
\echo :SQLSTATE
SELECT ds_start_run('count(*)', '{}');
\echo :SQLSTATE
SET ROLE runs_other;
SELECT ds_start_run('wf_private', '{}');
\echo :SQLSTATE
RESET ROLE;
-- input, run key, policy
SELECT ds_start_run('wf', NULL);
\echo :SQLSTATE
SELECT ds_start_run('wf', '{}', '');
\echo :SQLSTATE
SELECT ds_start_run('wf', '{}', repeat('k', 256));
\echo :SQLSTATE
SELECT ds_start_run('wf', '{}', 'k', '{"max_attempts": 0}');
\echo :SQLSTATE
SELECT ds_start_run('wf', '{}', 'k', '{"colour": "red"}');
\echo :SQLSTATE
-- nothing was stored
SELECT count(*) FROM ds_runs;

-- a good start, by name or by signature, function or procedure; rolled back before the worker sees it
BEGIN;
SELECT run_id, status, created FROM ds_start_run('wf', '{"a": 1}', 'order-1');
SELECT run_id, status, created FROM ds_start_run('public.wf(text, jsonb)', '{"a": 1}', 'order-1');
SAVEPOINT refused;
SELECT ds_start_run('wf', '{"a": 2}', 'order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
SAVEPOINT refused;
SELECT ds_start_run('wf_proc', '{"a": 1}', 'order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
SELECT created FROM ds_start_run('wf_proc', '{}', 'proc-1');
SELECT run_id, workflow, status, input, run_key, policy, owner, turns, output, next_wake_at IS NOT NULL AS due
  FROM ds_runs ORDER BY run_id;
-- another role may not take a run key over, nor see or steer the run
SET ROLE runs_other;
SAVEPOINT refused;
SELECT ds_start_run('wf', '{"a": 1}', 'order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
SELECT count(*) FROM ds_runs;
SAVEPOINT refused;
SELECT ds_cancel_run('order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
SAVEPOINT refused;
SELECT ds_resume_run('order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
RESET ROLE;
-- a pending run is cancelled; then it can be neither cancelled again (answered) nor resumed
SELECT ds_cancel_run('order-1');
SELECT ds_cancel_run('order-1');
SAVEPOINT refused;
SELECT ds_resume_run('order-1');
\echo :SQLSTATE
ROLLBACK TO refused;
SELECT status, finished_at IS NOT NULL AS finished FROM ds_runs WHERE run_id = 'order-1';
-- resuming a pending run changes nothing
SELECT ds_resume_run('proc-1');
ROLLBACK;

-- the controls' arguments
SELECT ds_cancel_run(NULL);
\echo :SQLSTATE
SELECT ds_cancel_run('');
\echo :SQLSTATE
SELECT ds_cancel_run('no-such-run');
\echo :SQLSTATE
SELECT ds_resume_run('no-such-run');
\echo :SQLSTATE

-- the calls of a workflow, outside one
SELECT ds_step('s', 'SELECT 1');
\echo :SQLSTATE
SELECT ds_http('s', '{"url": "http://127.0.0.1/"}');
\echo :SQLSTATE
SELECT ds_sleep('s', '1 s');
\echo :SQLSTATE
SELECT ds_await_event('s', 'e');
\echo :SQLSTATE

-- events: the first emit wins; arguments
BEGIN;
SELECT ds_emit_event('shipped:1', '{"by": "first"}');
SELECT ds_emit_event('shipped:1', '{"by": "second"}');
SELECT payload FROM durable_steps.events WHERE name = 'shipped:1';
ROLLBACK;
SELECT ds_emit_event(NULL);
\echo :SQLSTATE
SELECT ds_emit_event('');
\echo :SQLSTATE

DROP FUNCTION wf(text, jsonb), wf_other(int, jsonb), wf_set(text, jsonb), wf_private(text, jsonb);
DROP PROCEDURE wf_proc(text, jsonb);
DROP ROLE runs_other;
