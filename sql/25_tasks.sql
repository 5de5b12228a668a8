-- Tasks (docs/tasks.md): what ds_task_step, ds_claim_tasks, ds_heartbeat, ds_complete_task,
-- ds_complete_tasks, ds_fail_task, ds_release_task and ds_wait_for_tasks check, the identity
-- rules, and the fence: a token that no longer holds its lease is refused, and the transaction
-- that tried keeps nothing. No background worker runs here: leases run out only where a test
-- makes them.
-- Each refused call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE ROLE task_alice;
CREATE ROLE task_bob;
CREATE ROLE task_admin IN ROLE durable_steps_admin;
CREATE ROLE task_alice_worker IN ROLE task_alice;
CREATE TABLE task_effects (k text PRIMARY KEY);
GRANT ALL ON task_effects TO PUBLIC;

SET ROLE task_alice;
-- malformed arguments: 22004 for a NULL, 22023 otherwise; nothing stored
SELECT ds_task_step('t', 'bad', NULL);
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', '');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', repeat('x', 201));
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', on_lost => 'maybe');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', on_lost => NULL);
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', timeout => '0 s');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', timeout => '25 hours');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', run_at => 'infinity');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', policy => '{"max_attempts": 0}');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', queue => '');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', notify => '');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', on_success => 'SELECT 1; SELECT 2');
\echo :SQLSTATE
SELECT ds_task_step('t', 'bad', 'mail', nowait => NULL);
\echo :SQLSTATE
SELECT ds_task_step('', 'bad', 'mail');
\echo :SQLSTATE
SELECT count(*) FROM ds_steps WHERE step_id = 'bad';

-- stored with the caller's transaction: a rollback leaves nothing to claim
BEGIN;
SELECT status, attempt, max_attempts FROM ds_task_step('t', 'rolled-back', 'mail');
ROLLBACK;
SELECT count(*) FROM ds_steps WHERE step_id = 'rolled-back';

-- the identity rules: the same definition replays, another is DS422
SELECT status, replayed FROM ds_task_step('t', 'receipt', 'mail', '{"to": "a@example.com"}',
                                          policy => ds_retry_policy(max_attempts => 3));
SELECT status, replayed FROM ds_task_step('t', 'receipt', 'mail', '{"to": "a@example.com"}');
SELECT ds_task_step('t', 'receipt', 'mail', '{"to": "b@example.com"}');
\echo :SQLSTATE
SELECT ds_task_step('t', 'receipt', 'sms', '{"to": "a@example.com"}');
\echo :SQLSTATE
SELECT kind, task, status, queue, on_lost, worker FROM ds_steps WHERE step_id = 'receipt';

-- claims: bad arguments first
SELECT * FROM ds_claim_tasks(NULL);
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks('{}');
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY[NULL]::text[]);
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY['mail'], 0);
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY['mail'], 1001);
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY['mail'], 1, '0 s');
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY['mail'], 1, '30 s', '');
\echo :SQLSTATE
SELECT * FROM ds_claim_tasks(ARRAY['mail'], queues => '{}');
\echo :SQLSTATE
-- a claim is the start of its attempts: never inside a transaction block (25001)
BEGIN;
SELECT * FROM ds_claim_tasks(ARRAY['mail']);
\echo :SQLSTATE
ROLLBACK;

-- another role sees nothing to claim, and a member of the owner does
SET ROLE task_bob;
SELECT count(*) FROM ds_claim_tasks(ARRAY['mail'], 10);
SELECT count(*) FROM ds_steps WHERE run_id = 't';
SET ROLE task_alice_worker;
SELECT run_id, step_id, task, input, attempt, max_attempts, idempotency_key, attempt_key, token,
       lease_expires_at > clock_timestamp() AS leased, deadline
  FROM ds_claim_tasks(ARRAY['mail', 'sms'], 10, '1 hour', 'worker-1') \gset c_
SELECT :'c_run_id' AS run_id, :'c_step_id' AS step_id, :'c_task' AS task, :'c_input' AS input,
       :c_attempt AS attempt, :c_max_attempts AS max_attempts,
       :'c_idempotency_key' AS idempotency_key, :'c_attempt_key' AS attempt_key,
       :'c_leased' AS leased, :{?c_deadline} AS has_deadline;
\set token :c_token
-- the claim committed the attempt as started
SELECT status, attempt, worker FROM ds_steps WHERE step_id = 'receipt';
SELECT count(*) FROM ds_claim_tasks(ARRAY['mail'], 10);

-- a hostile role can neither keep, nor complete, nor fail, nor give back another role's task:
-- DS404, as for a step that does not exist
SET ROLE task_bob;
SELECT * FROM ds_heartbeat(:'token');
\echo :SQLSTATE
SELECT ds_complete_task(:'token', '{"stolen": true}');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', 'x', 'y', class => 'permanent');
\echo :SQLSTATE
SELECT ds_release_task(:'token');
\echo :SQLSTATE
-- an administrator sees it, and may not act as its owner (42501)
SET ROLE task_admin;
SELECT ds_complete_task(:'token', '{"stolen": true}');
\echo :SQLSTATE

-- malformed tokens: 22023, 22004 for NULL
SET ROLE task_alice;
SELECT * FROM ds_heartbeat('nonsense');
\echo :SQLSTATE
SELECT * FROM ds_heartbeat('1.2.300.x');
\echo :SQLSTATE
SELECT * FROM ds_heartbeat('0.2.1.tx');
\echo :SQLSTATE
SELECT * FROM ds_heartbeat(NULL);
\echo :SQLSTATE
SELECT * FROM ds_heartbeat(:'token', '0 s');
\echo :SQLSTATE
-- a token of an attempt that never was: refused by the fence, not found
SELECT ds_complete_task('7.1.1.treceipt', '{}');
\echo :SQLSTATE
-- bad outcomes
SELECT ds_fail_task(:'token', NULL, 'm');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', '', 'm');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', repeat('c', 65), 'm');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', 'c', 'm', class => 'fatal');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', 'c', 'm', class => 'permanent', retry_after => '1 s');
\echo :SQLSTATE
SELECT ds_fail_task(:'token', 'c', 'm', class => 'retryable', remediation => 'fix it');
\echo :SQLSTATE
RESET ROLE;
SET durable_steps.max_result_size = 1024;
SET ROLE task_alice;
SELECT ds_complete_task(:'token', jsonb_build_object('big', repeat('x', 2000)));
\echo :SQLSTATE
RESET ROLE;
RESET durable_steps.max_result_size;
SET ROLE task_alice;
SELECT status, attempt FROM ds_steps WHERE step_id = 'receipt';

-- a heartbeat keeps the lease
SELECT held, cancelled, lease_expires_at > clock_timestamp() + interval '50 minutes' AS extended
  FROM ds_heartbeat(:'token', '55 minutes');

-- the outcome commits with the handler's own writes
BEGIN;
INSERT INTO task_effects VALUES ('receipt sent');
SELECT status, result, attempt FROM ds_complete_task(:'token', '{"sent": true}');
COMMIT;
SELECT * FROM task_effects;
SELECT status, result, error_code FROM ds_steps WHERE step_id = 'receipt';
SELECT attempt, class, executor, idempotency_key, attempt_key FROM ds_attempts WHERE step_id = 'receipt';

-- the fence: the token is spent, and the transaction that tries it again keeps nothing
BEGIN;
INSERT INTO task_effects VALUES ('sent twice');
SELECT ds_complete_task(:'token', '{"sent": "again"}');
\echo :SQLSTATE
COMMIT;
SELECT * FROM task_effects;
SELECT held, cancelled, lease_expires_at FROM ds_heartbeat(:'token');
SELECT ds_release_task(:'token');

-- a handler's failures: retryable with its own delay, correctable (blocked, re-armed with
-- corrected input), permanent
SELECT status FROM ds_task_step('t', 'charge', 'charge', '{"card": "expired"}',
                                policy => ds_retry_policy(max_attempts => 5));
SELECT token AS token FROM ds_claim_tasks(ARRAY['charge']) \gset
SELECT status, attempt, error_class, error_code, error_message, next_attempt_at > clock_timestamp() + interval '50 minutes' AS later
  FROM ds_fail_task(:'token', 'gateway_busy', 'the gateway said 503', retry_after => '1 hour');
SELECT count(*) FROM ds_claim_tasks(ARRAY['charge']);
-- only a failed, blocked, uncertain or cancelled step is re-armed (DS103)
SELECT ds_retry_step('t', 'charge');
\echo :SQLSTATE
-- an operator brings the retry forward
RESET ROLE;
UPDATE durable_steps.steps SET next_attempt_at = clock_timestamp() WHERE step_id = 'charge';
SET ROLE task_alice;
SELECT attempt, token AS token FROM ds_claim_tasks(ARRAY['charge']) \gset
SELECT :attempt AS attempt;
SELECT status, error_class, error_code, remediation
  FROM ds_fail_task(:'token', 'card_expired', 'the card expired', 'card 4242', 'correctable',
                    remediation => 'Ask the customer for another card, then re-arm with it.');
SELECT status, replayed FROM ds_retry_step('t', 'charge', '{"card": "valid"}');
SELECT input FROM ds_steps WHERE step_id = 'charge';
SELECT attempt, token AS token FROM ds_claim_tasks(ARRAY['charge']) \gset
SELECT status, error_class, error_code, error_message, error_detail
  FROM ds_fail_task(:'token', 'fraud', 'refused as fraud', 'rule 7', 'permanent');
SELECT attempt, class, error_code, error_message FROM ds_attempts WHERE step_id = 'charge' ORDER BY attempt;

-- a released claim is not counted, and its token is spent
SELECT status FROM ds_task_step('t', 'release', 'mail', '{}');
SELECT attempt, token AS token FROM ds_claim_tasks(ARRAY['mail']) \gset
SELECT ds_release_task(:'token');
SELECT status, attempt FROM ds_steps WHERE step_id = 'release';
SELECT ds_complete_task(:'token', '{}');
\echo :SQLSTATE
SELECT attempt FROM ds_claim_tasks(ARRAY['mail']);

-- a lease that ran out is refused before anybody records it lost
SELECT status FROM ds_task_step('t', 'short', 'short', '{}');
SELECT token AS token FROM ds_claim_tasks(ARRAY['short'], 1, '1 ms') \gset
SELECT pg_sleep(0.01);
SELECT held, cancelled FROM ds_heartbeat(:'token');
BEGIN;
INSERT INTO task_effects VALUES ('after the lease');
SELECT ds_complete_task(:'token', '{}');
\echo :SQLSTATE
ROLLBACK;
SELECT count(*) FROM task_effects WHERE k = 'after the lease';

-- a cancelled task: the heartbeat says so, the outcome is refused
SELECT status FROM ds_task_step('t', 'cancel-me', 'cancellable', '{}');
SELECT token AS token FROM ds_claim_tasks(ARRAY['cancellable'], 1, '1 hour') \gset
SELECT status FROM ds_cancel_step('t', 'cancel-me');
SELECT held, cancelled FROM ds_heartbeat(:'token');
SELECT ds_fail_task(:'token', 'x', 'y');
\echo :SQLSTATE
SELECT attempt, class FROM ds_attempts WHERE step_id = 'cancel-me';

-- queues: a paused queue keeps its tasks, the queues argument picks them
RESET ROLE;
SELECT ds_set_queue('mail-paused', 0);
SET ROLE task_alice;
SELECT status FROM ds_task_step('t', 'queued', 'queued', '{}', queue => 'mail-paused');
SELECT count(*) FROM ds_claim_tasks(ARRAY['queued']);
SELECT count(*) FROM ds_claim_tasks(ARRAY['queued'], queues => ARRAY['elsewhere']);
RESET ROLE;
SELECT ds_set_queue('mail-paused', 1);
SET ROLE task_alice;
SELECT step_id FROM ds_claim_tasks(ARRAY['queued'], queues => ARRAY['mail-paused']);

-- waiting: due at once, or not within the timeout; another role's task is not waited for
SELECT status FROM ds_task_step('t', 'wait-for-me', 'waited', '{}');
CALL ds_wait_for_tasks(ARRAY['waited'], '10 s');
CALL ds_wait_for_tasks(ARRAY['nothing', 'waited'], '10 s', ARRAY['default']);
CALL ds_wait_for_tasks(ARRAY['waited'], '10 ms', ARRAY['elsewhere']);
SET ROLE task_bob;
CALL ds_wait_for_tasks(ARRAY['waited'], '10 ms');
SET ROLE task_alice;
CALL ds_wait_for_tasks(NULL, '1 s');
\echo :SQLSTATE
CALL ds_wait_for_tasks(ARRAY['mail'], NULL);
\echo :SQLSTATE

-- ds_complete_tasks: bad input refuses the whole batch (22004, 22023, DS005), nothing recorded
SELECT status FROM ds_task_step('t', 'batch-1', 'batch', '{}');
SELECT status FROM ds_task_step('t', 'batch-2', 'batch', '{}',
    on_success => $$INSERT INTO task_effects SELECT 'hook of ' || ($1->>'step_id')$$);
SELECT status FROM ds_task_step('t', 'batch-3', 'batch', '{}');
SELECT status FROM ds_task_step('t', 'batch-4', 'batch', '{}');
SELECT token AS b1 FROM ds_claim_tasks(ARRAY['batch'], 1, '1 hour') \gset
SELECT token AS b2 FROM ds_claim_tasks(ARRAY['batch'], 1, '1 hour') \gset
SELECT token AS b3 FROM ds_claim_tasks(ARRAY['batch'], 1, '1 hour') \gset
SELECT token AS b4 FROM ds_claim_tasks(ARRAY['batch'], 1, '1 ms') \gset
SELECT * FROM ds_complete_tasks(NULL, '{}');
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(ARRAY[:'b1'], NULL);
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(ARRAY[:'b1', NULL], ARRAY[NULL, NULL]::jsonb[]);
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(ARRAY[:'b1', :'b2'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(ARRAY[[:'b1'], [:'b2']], ARRAY[['{}'], ['{}']]::jsonb[]);
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(array_fill(:'b1'::text, ARRAY[1001]), array_fill(NULL::jsonb, ARRAY[1001]));
\echo :SQLSTATE
SELECT * FROM ds_complete_tasks(ARRAY[:'b1', 'nonsense'], ARRAY[NULL, NULL]::jsonb[]);
\echo :SQLSTATE
RESET ROLE;
SET durable_steps.max_result_size = 1024;
SET ROLE task_alice;
SELECT * FROM ds_complete_tasks(ARRAY[:'b1', :'b2'],
                                ARRAY['{}', jsonb_build_object('big', repeat('x', 2000))]);
\echo :SQLSTATE
RESET ROLE;
RESET durable_steps.max_result_size;
SELECT * FROM ds_complete_tasks('{}', '{}');
-- a token of another role's task is refused, not answered as stale: the batch keeps nothing
SET ROLE task_bob;
SELECT * FROM ds_complete_tasks(ARRAY[:'b1'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SET ROLE task_admin;
SELECT * FROM ds_complete_tasks(ARRAY[:'b1'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SET ROLE task_alice;
SELECT step_id, status FROM ds_steps WHERE step_id LIKE 'batch-%' ORDER BY step_id;

-- a mixed batch: the held tokens succeed (hooks included) with the caller's writes; a token of
-- a cancelled step, a spent token, a lease that ran out and a token given twice answer
-- held = false, and nothing is raised
SELECT status FROM ds_complete_task(:'b3', '{"alone": true}');
SELECT pg_sleep(0.01);
BEGIN;
INSERT INTO task_effects VALUES ('batch written');
SELECT token = :'b1' AS b1, token = :'b2' AS b2, token = :'b3' AS b3, token = :'b4' AS b4,
       status, held
  FROM ds_complete_tasks(ARRAY[:'b2', :'token', :'b1', :'b3', :'b4', :'b1'],
                         ARRAY['{"n": 2}', '{}', NULL, '{}', '{}', '{"again": true}']::jsonb[]);
COMMIT;
SELECT * FROM task_effects WHERE k LIKE '%batch%' ORDER BY k;
SELECT step_id, status, result FROM ds_steps WHERE step_id LIKE 'batch-%' ORDER BY step_id;
SELECT step_id, attempt, class FROM ds_attempts WHERE step_id LIKE 'batch-%' ORDER BY step_id;
-- a batch of spent tokens answers without raising, and records nothing
SELECT token = :'b1' AS b1, status, held FROM ds_complete_tasks(ARRAY[:'b1'], ARRAY['{}']::jsonb[]);

RESET ROLE;
DROP TABLE task_effects;
DELETE FROM durable_steps.steps WHERE run_id = 't';
DROP ROLE task_alice_worker, task_alice, task_bob, task_admin;
