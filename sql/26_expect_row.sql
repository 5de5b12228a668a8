-- expect => 'row' (docs/steps.md, "Expecting a row"): a body that returns no row fails with
-- DS008, correctable (the step is blocked, with a remediation), rather than succeeding with NULL.
-- The expectation is part of the step's definition.
\set SHOW_CONTEXT never
CREATE TABLE expect_products (sku text PRIMARY KEY, qty int NOT NULL);
INSERT INTO expect_products VALUES ('A-1', 5);

-- a sku that does not exist: without expect the step succeeds with NULL, with it it is blocked
SELECT status, result
  FROM ds_run_step('expect:1', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "ZZZ"}');
SELECT status, result, error_class, error_code, error_message, remediation
  FROM ds_run_step('expect:2', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "ZZZ"}',
                   expect => 'row');
SELECT attempt, class, error_code, error_detail FROM ds_attempts WHERE run_id = 'expect:2';
SELECT status, expect FROM ds_steps WHERE run_id = 'expect:2';

-- a row: it succeeds as any step, and a replay answers the stored row
SELECT status, result, replayed
  FROM ds_run_step('expect:3', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "A-1"}',
                   expect => 'row');
SELECT status, result, replayed
  FROM ds_run_step('expect:3', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "A-1"}',
                   expect => 'row');
SELECT qty FROM expect_products;

-- the expectation is part of the definition: the same SQL without it is another step
SELECT status FROM ds_run_step('expect:3', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "A-1"}');
\echo :SQLSTATE
SELECT status FROM ds_run_step('expect:1', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "ZZZ"}',
                   expect => 'row');
\echo :SQLSTATE

-- re-armed with corrected input, it keeps its expectation: a row this time
SELECT status FROM ds_retry_step('expect:2', 'take', '{"sku": "A-1"}');
UPDATE durable_steps.steps SET next_attempt_at = now() - interval '1 s' WHERE run_id = 'expect:2';
SELECT status, result, attempt, replayed
  FROM ds_run_step('expect:2', 'take', $$UPDATE expect_products SET qty = qty - 1
                                         WHERE sku = $1->>'sku' RETURNING qty$$, '{"sku": "A-1"}',
                   expect => 'row');

-- deferred: the expectation is stored with the step
SELECT status FROM ds_run_step('expect:4', 'take', 'SELECT 1 WHERE false', expect => 'row',
                               defer => true);
SELECT expect FROM ds_steps WHERE run_id = 'expect:4';

-- bad input: a clear error, nothing stored
SELECT ds_run_step('expect:5', 'take', 'SELECT 1', expect => 'rows');
\echo :SQLSTATE
SELECT ds_run_step('expect:5', 'take', 'SELECT 1', expect => '');
\echo :SQLSTATE
SELECT count(*) FROM ds_steps WHERE run_id = 'expect:5';

-- a task stored with expect => 'row': a handler that completes it with no result blocks it
SELECT status FROM ds_task_step('expect:task', 'none', 'expecting', expect => 'row');
SELECT status FROM ds_task_step('expect:task', 'some', 'expecting', expect => 'row', priority => 1);
SELECT r.step_id, r.status, r.error_code
  FROM ds_claim_tasks(ARRAY['expecting'], 1) c, LATERAL ds_complete_task(c.token) r;
SELECT r.step_id, r.status, r.result
  FROM ds_claim_tasks(ARRAY['expecting'], 1) c, LATERAL ds_complete_task(c.token, '{"sent": true}') r;
SELECT step_id, status, result, error_code, error_message, remediation, expect
  FROM ds_steps WHERE run_id = 'expect:task' ORDER BY step_id;
-- part of its definition too
SELECT status FROM ds_task_step('expect:task', 'some', 'expecting', priority => 1);
\echo :SQLSTATE
SELECT ds_task_step('expect:task', 'bad', 'expecting', expect => 'rows');
\echo :SQLSTATE
