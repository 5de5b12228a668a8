-- Application workflows (docs/app-workflows.md): what ds_claim_task, ds_define_workflow and
-- ds_app_workflow check, the fence (a holder whose lease is gone starts no step, and its
-- transaction keeps nothing), the identity rules (another role's steps cannot be claimed), and
-- one namespace for SQL and application workflows. No background worker runs here: the segments
-- are claimed by hand, as the client libraries claim them.
-- Each refused call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE ROLE wf_alice;
CREATE ROLE wf_bob;
CREATE SCHEMA wf_alice AUTHORIZATION wf_alice;
CREATE SCHEMA wf_bob AUTHORIZATION wf_bob;

SET ROLE wf_alice;
SET search_path = wf_alice, public;

-- declaring: bad names and policies are refused, nothing is created
SELECT ds_define_workflow(NULL);
\echo :SQLSTATE
SELECT ds_define_workflow('');
\echo :SQLSTATE
SELECT ds_define_workflow(repeat('w', 64));
\echo :SQLSTATE
SELECT ds_define_workflow('checkout', '[1]');
\echo :SQLSTATE
SELECT count(*) FROM pg_proc WHERE proname = 'checkout';

-- a declared workflow is a function of the current schema; declaring it again replaces it
SELECT ds_define_workflow('checkout', '{"max_attempts": 3}');
SELECT ds_define_workflow('checkout', '{"max_attempts": 4}');
SELECT prosrc FROM pg_proc WHERE proname = 'checkout';
-- a quote in a name stays a name
SELECT ds_define_workflow('it''s "odd"');
SELECT count(*) FROM pg_proc WHERE proname = 'it''s "odd"';

-- a SQL workflow's name is not taken over: one namespace
CREATE FUNCTION refund(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT $2';
SELECT ds_define_workflow('refund');
\echo :SQLSTATE
SELECT prosrc FROM pg_proc WHERE proname = 'refund';

-- started by ds_start_run like any workflow: the same key and input answer the run
SELECT run_id, status, created FROM ds_start_run('checkout', '{"order": 1}', run_key => 'wf-1');
SELECT run_id, created FROM ds_start_run('checkout', '{"order": 1}', run_key => 'wf-1');
SELECT ds_start_run('checkout', '{"order": 2}', run_key => 'wf-1');
\echo :SQLSTATE
SELECT workflow FROM ds_runs WHERE run_id = 'wf-1';

-- a segment and its steps, as a worker makes them: tasks of one run
SELECT status FROM ds_task_step('wf-run', 'ds.segment:1', 'ds.workflow:checkout', '{}');
SELECT status FROM ds_task_step('wf-run', 'charge', 'ds.step:checkout', '{"seq": 1}',
                                ds_retry_policy(max_attempts => 2, initial_delay => '1 hour', max_delay => '1 hour'));
SELECT token AS holder FROM ds_claim_tasks(ARRAY['ds.workflow:checkout'], 1, '1 hour') \gset

-- malformed arguments: 22004 for a NULL, 22023 otherwise
SELECT * FROM ds_claim_task(NULL, 'charge');
\echo :SQLSTATE
SELECT * FROM ds_claim_task('not a token', 'charge');
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', NULL);
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', '');
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', 'ds.segment:1');
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', 'charge', '0 s');
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', 'charge', worker => '');
\echo :SQLSTATE
SELECT * FROM ds_claim_task(:'holder', 'no-such-step');
\echo :SQLSTATE
-- only a step of an application workflow, for its segment: a task that workers claim by name is
-- theirs, and a plain task is no holder
SELECT status FROM ds_task_step('wf-run', 'mail', 'mail', '{}');
SELECT * FROM ds_claim_task(:'holder', 'mail');
\echo :SQLSTATE
-- a claim commits before its attempt runs: never inside a transaction block
BEGIN;
SELECT * FROM ds_claim_task(:'holder', 'charge');
\echo :SQLSTATE
ROLLBACK;
SELECT status, attempt FROM ds_steps WHERE step_id = 'charge';

-- claimed by the holder: counted, leased, keyed
SELECT status, attempt, max_attempts, idempotency_key, attempt_key, token IS NOT NULL AS has_token,
       lease_expires_at > clock_timestamp() AS leased, next_attempt_at
  FROM ds_claim_task(:'holder', 'charge', '1 hour') \gset c_
\echo :c_status :c_attempt :c_max_attempts :c_idempotency_key :c_attempt_key :c_has_token :c_leased
-- the running step answers as it is, with no token, while its lease holds
SELECT status, attempt, token IS NULL AS no_token, lease_expires_at IS NOT NULL AS leased
  FROM ds_claim_task(:'holder', 'charge');
SELECT status, worker FROM ds_steps WHERE step_id = 'charge';

RESET ROLE;
UPDATE durable_steps.steps SET lease_expires_at = clock_timestamp() - interval '1 s'
 WHERE run_id = 'wf-run' AND step_id = 'charge';
SET ROLE wf_alice;
-- a lease that ran out is recorded lost by the claim itself, and the retry waits its delay
SELECT status, attempt, token IS NULL AS no_token, next_attempt_at > clock_timestamp() AS later,
       error_code FROM ds_claim_task(:'holder', 'charge');
SELECT attempt, class, error_code FROM ds_attempts WHERE step_id = 'charge' ORDER BY attempt;
-- due now: the next attempt is numbered after the lost one
RESET ROLE;
UPDATE durable_steps.steps SET next_attempt_at = clock_timestamp() - interval '1 s'
 WHERE run_id = 'wf-run' AND step_id = 'charge';
SET ROLE wf_alice;
SELECT token AS step_token FROM ds_claim_task(:'holder', 'charge', '1 hour') \gset
SELECT status, attempt FROM ds_steps WHERE step_id = 'charge';
SELECT status, result FROM ds_complete_task(:'step_token', '{"charged": true}');
-- succeeded: answered with its result, never claimed again
SELECT status, result, attempt, token IS NULL AS no_token FROM ds_claim_task(:'holder', 'charge');

-- a step that failed for good answers with its error
SELECT status FROM ds_task_step('wf-run', 'doomed', 'ds.step:checkout', '{"seq": 2}');
SELECT token AS step_token FROM ds_claim_task(:'holder', 'doomed') \gset
SELECT status FROM ds_fail_task(:'step_token', 'declined', 'card declined', class => 'permanent');
SELECT status, error_code, error_message, token IS NULL AS no_token FROM ds_claim_task(:'holder', 'doomed');

-- the fence: a holder whose lease is gone starts no step, and its transaction keeps nothing
SELECT status FROM ds_task_step('wf-run', 'late', 'ds.step:checkout', '{"seq": 3}');
RESET ROLE;
UPDATE durable_steps.steps SET lease_expires_at = clock_timestamp() - interval '1 s'
 WHERE run_id = 'wf-run' AND step_id = 'ds.segment:1';
SET ROLE wf_alice;
SELECT * FROM ds_claim_task(:'holder', 'late');
\echo :SQLSTATE
SELECT status, attempt FROM ds_steps WHERE step_id = 'late';
-- a cancelled segment too
SELECT status FROM ds_task_step('wf-run2', 'ds.segment:1', 'ds.workflow:checkout', '{}');
SELECT status FROM ds_task_step('wf-run2', 'next', 'ds.step:checkout', '{"seq": 1}');
SELECT token AS holder2 FROM ds_claim_tasks(ARRAY['ds.workflow:checkout'], 1, '1 hour') \gset
SELECT status FROM ds_cancel_step('wf-run2', 'ds.segment:1');
SELECT * FROM ds_claim_task(:'holder2', 'next');
\echo :SQLSTATE
SELECT status, attempt FROM ds_steps WHERE run_id = 'wf-run2' AND step_id = 'next';

-- another role: cannot claim alice's steps with a token of its own, nor use alice's token
SELECT status FROM ds_task_step('wf-run3', 'ds.segment:1', 'ds.workflow:checkout', '{}');
SELECT status FROM ds_task_step('wf-run3', 'secret', 'ds.step:checkout', '{"seq": 1}');
SELECT token AS alice_holder FROM ds_claim_tasks(ARRAY['ds.workflow:checkout'], 1, '1 hour') \gset
SET ROLE wf_bob;
SET search_path = wf_bob, public;
SELECT * FROM ds_claim_task(:'alice_holder', 'secret');
\echo :SQLSTATE
SELECT status FROM ds_task_step('wf-bob', 'ds.segment:1', 'ds.workflow:checkout', '{}');
SELECT token AS bob_holder FROM ds_claim_tasks(ARRAY['ds.workflow:checkout'], 1, '1 hour') \gset
SELECT run_id FROM ds_steps WHERE run_id LIKE 'wf-run%';
-- bob's holder names bob's run: alice's step of another run is not a step of it
SELECT * FROM ds_claim_task(:'bob_holder', 'secret');
\echo :SQLSTATE
-- bob cannot start alice's workflow: a declared workflow is executable by its owner alone
SET ROLE wf_alice;
GRANT USAGE ON SCHEMA wf_alice TO wf_bob;
SET ROLE wf_bob;
SELECT ds_start_run('wf_alice.checkout', '{}');
\echo :SQLSTATE
SET ROLE wf_alice;
SET search_path = wf_alice, public;
GRANT EXECUTE ON FUNCTION checkout(text, jsonb) TO wf_bob;
-- granted, and kept when the workflow is declared again
SELECT ds_define_workflow('checkout', '{"max_attempts": 4}');
SET ROLE wf_bob;
SELECT status, created FROM ds_start_run('wf_alice.checkout', '{}', run_key => 'wf-by-bob');
SET ROLE wf_alice;
SELECT status, attempt FROM ds_steps WHERE run_id = 'wf-run3' AND step_id = 'secret';

-- the workflow's body runs in a run's turn only
SELECT ds_app_workflow('checkout', '{}');
\echo :SQLSTATE
RESET ROLE;
RESET search_path;
DROP SCHEMA wf_alice CASCADE;
DROP SCHEMA wf_bob CASCADE;
SELECT ds_cancel_run(run_id) FROM ds_runs WHERE run_id IN ('wf-1', 'wf-by-bob') ORDER BY run_id;
DELETE FROM durable_steps.steps WHERE run_id LIKE 'wf-%';
DELETE FROM durable_steps.attempts WHERE run_id LIKE 'wf-%';
DELETE FROM durable_steps.runs WHERE run_id LIKE 'wf-%';
DROP ROLE wf_alice;
DROP ROLE wf_bob;
