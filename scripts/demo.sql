-- scripts/demo.sql -- a guided tour of durable_steps, run by scripts/demo against a private cluster
-- (psql echoes each query before its result). Read it top to bottom: every section says what to
-- look for in the output.

\set VERBOSITY default

\echo
\echo '=== 0. Setup: the extension, and an application table "orders" ==='
\echo '    (the server was started with shared_preload_libraries = durable_steps)'
CREATE EXTENSION durable_steps;
CREATE TABLE orders (
    id       int PRIMARY KEY,
    customer text NOT NULL,
    amount   numeric NOT NULL,
    status   text NOT NULL DEFAULT 'new'
);
\echo '    A helper for this demo only: wait (at most 30 s) until a step has made n attempts and is not'
\echo '    running one. The background worker runs due attempts by itself; the demo waits for it.'
CREATE FUNCTION demo_wait(p_run_id text, p_step_id text, n int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '30 seconds';
BEGIN
    LOOP
        IF EXISTS (SELECT FROM ds_steps
                    WHERE run_id = p_run_id AND step_id = p_step_id
                      AND attempt >= n AND status <> 'running') THEN
            RETURN format('attempt %s of %s/%s has run', n, p_run_id, p_step_id);
        END IF;
        IF clock_timestamp() > deadline THEN
            RETURN 'no attempt after 30 s: is the background worker running?';
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;

\echo
\echo '=== (a) A step that succeeds, then the same call again: the stored result is replayed ==='
\echo '    A step is identified by (run_id, step_id). Its body is ONE SQL statement; $1 is the input.'
\echo '    First call: the INSERT runs, status succeeded, replayed = f.'
SELECT status, attempt, replayed, result
  FROM ds_run_step('order:42', 'create-order',
                   $$INSERT INTO orders (id, customer, amount)
                     SELECT ($1->>'id')::int, $1->>'customer', ($1->>'amount')::numeric
                     RETURNING id, status$$,
                   input => '{"id": 42, "customer": "Ada", "amount": 99.50}');
\echo '    Same call again (a client retry, a redelivered message ...): the body does NOT run again,'
\echo '    the stored result comes back with replayed = t.'
SELECT status, attempt, replayed, result
  FROM ds_run_step('order:42', 'create-order',
                   $$INSERT INTO orders (id, customer, amount)
                     SELECT ($1->>'id')::int, $1->>'customer', ($1->>'amount')::numeric
                     RETURNING id, status$$,
                   input => '{"id": 42, "customer": "Ada", "amount": 99.50}');
\echo '    Proof: exactly one row in orders.'
SELECT * FROM orders;

\echo
\echo '=== (b) A step that fails with a transient error is retried by its policy ==='
\echo '    Step fraud-check asks the payment gateway to approve the order. call_gateway() stands for'
\echo '    that flaky dependency: while the gateway is down it does RAISE EXCEPTION (SQLSTATE P0001),'
\echo '    which is classified as retryable.'
CREATE TABLE gateway (up boolean NOT NULL);
INSERT INTO gateway VALUES (false);
CREATE FUNCTION call_gateway(order_id int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (SELECT up FROM gateway) THEN
        RAISE EXCEPTION 'payment gateway unavailable';
    END IF;
    RETURN 'order ' || order_id || ' approved';
END
$$;
\echo '    The policy: at most 3 attempts, first retry after 2 s, exponential backoff (x2).'
SELECT ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds') AS policy;
SELECT n AS after_failed_attempt,
       ds_backoff_delay(ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds'), n) AS delay
  FROM generate_series(1, 2) AS n;
\echo '    Attempt 1 fails: status retrying, next_attempt_at = now + 2 s. The failure does NOT'
\echo '    abort the caller: it is recorded and returned (and would commit with the caller).'
SELECT status, attempt, max_attempts, error_class, error_code, error_message,
       next_attempt_at::timestamptz(0) AS next_attempt_at,
       (next_attempt_at - now())::interval(0) AS due_in
  FROM ds_run_step('order:42', 'fraud-check', 'SELECT call_gateway(($1->>''id'')::int)',
                   input => '{"id": 42}',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds'));
\echo '    Calling again before it is due runs nothing: the pending state comes back (replayed = t).'
SELECT status, attempt, replayed, next_attempt_at::timestamptz(0) AS next_attempt_at
  FROM ds_run_step('order:42', 'fraud-check', 'SELECT call_gateway(($1->>''id'')::int)',
                   input => '{"id": 42}',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds'));
\echo '    Nobody has to call again: when the attempt is due, the background worker runs it. The gateway'
\echo '    is still down, so attempt 2 fails too and the next delay is 4 s. Asking again afterwards'
\echo '    answers from the store (replayed = t). (Had no worker run it, this call would run it itself.)'
SELECT demo_wait('order:42', 'fraud-check', 2);
SELECT status, attempt, replayed, error_message, (next_attempt_at - now())::interval(0) AS due_in
  FROM ds_run_step('order:42', 'fraud-check', 'SELECT call_gateway(($1->>''id'')::int)',
                   input => '{"id": 42}',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds'));
\echo '    The gateway comes back; attempt 3, again run by the worker, succeeds.'
UPDATE gateway SET up = true;
SELECT demo_wait('order:42', 'fraud-check', 3);
SELECT status, attempt, replayed, result
  FROM ds_run_step('order:42', 'fraud-check', 'SELECT call_gateway(($1->>''id'')::int)',
                   input => '{"id": 42}',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '2 seconds'));
\echo '    When the attempts run out the step is failed, error_class exhausted (here: 1 attempt allowed).'
UPDATE gateway SET up = false;
SELECT status, attempt, max_attempts, error_class, error_code, error_message
  FROM ds_run_step('order:43', 'fraud-check', 'SELECT call_gateway(43)',
                   policy => ds_retry_policy(max_attempts => 1));

\echo
\echo '=== (c) A step that cannot succeed as it is: blocked, with a remediation ==='
\echo '    charge_card() calls ds_blocked(message, remediation) when the card has expired. Such'
\echo '    an error is correctable: retrying the same input is pointless, so it is never retried.'
CREATE FUNCTION charge_card(card jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF (card->>'expires')::date < current_date THEN
        PERFORM ds_blocked('card expired', 'Ask the customer for a new card');
    END IF;
    UPDATE orders SET status = 'paid' WHERE id = (card->>'order_id')::int;
    RETURN jsonb_build_object('charged_card', card->>'last4');
END
$$;
SELECT status, attempt, error_class, error_code, error_message, remediation
  FROM ds_run_step('order:42', 'charge-card', 'SELECT charge_card($1)',
                   input => '{"order_id": 42, "last4": "4242", "expires": "2020-01-31"}');
\echo '    Calling it again with the same input runs nothing: the stored blocked state comes back.'
SELECT status, attempt, replayed, remediation
  FROM ds_run_step('order:42', 'charge-card', 'SELECT charge_card($1)',
                   input => '{"order_id": 42, "last4": "4242", "expires": "2020-01-31"}');
\echo '    The customer gives a new card. ds_retry_step re-arms the step with the corrected input'
\echo '    (status pending, due now). Attempt numbers keep growing, so an attempt key is never reused,'
\echo '    and the budget starts afresh: max_attempts = 1 attempt used + 5 new ones.'
SELECT status, attempt, max_attempts, next_attempt_at <= clock_timestamp() AS due_now
  FROM ds_retry_step('order:42', 'charge-card',
                     input => '{"order_id": 42, "last4": "1881", "expires": "2099-12-31"}');
\echo '    ... so the worker runs it at once with the new card: attempt 2 succeeds. A call with the'
\echo '    corrected input returns that result (or, had nothing run it yet, runs it).'
SELECT demo_wait('order:42', 'charge-card', 2);
SELECT status, attempt, replayed, result
  FROM ds_run_step('order:42', 'charge-card', 'SELECT charge_card($1)',
                   input => '{"order_id": 42, "last4": "1881", "expires": "2099-12-31"}');
SELECT * FROM orders;

\echo
\echo '=== (d) Same identity, different definition: a key conflict (SQLSTATE DS422, like HTTP 422) ==='
\echo '    order:42/create-order succeeded with amount 99.50; a call claiming the same identity with'
\echo '    another amount (or other SQL) is refused and runs nothing. Caught here so the demo goes on.'
DO $$
DECLARE
    v_state text; v_message text; v_detail text; v_hint text;
BEGIN
    PERFORM ds_run_step('order:42', 'create-order',
                        $q$INSERT INTO orders (id, customer, amount)
                           SELECT ($1->>'id')::int, $1->>'customer', ($1->>'amount')::numeric
                           RETURNING id, status$q$,
                        input => '{"id": 42, "customer": "Ada", "amount": 5.00}');
    RAISE NOTICE 'no error?!';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'SQLSTATE %: %', v_state, v_message;
    RAISE NOTICE 'detail: %', v_detail;
    RAISE NOTICE 'hint: %', v_hint;
END
$$;
\echo '    orders is unchanged (amount still 99.50):'
SELECT * FROM orders;

\echo
\echo '=== (e) Canonical keys: ds_key builds run_ids from typed parts ==='
\echo '    ds_key(''order'', 42) is exactly the run_id used above. A ":" inside a part is escaped,'
\echo '    so different part lists never give the same key; values get one canonical form.'
SELECT ds_key('order', 42) AS order_key,
       ds_key('order', 42) = 'order:42' AS same_as_above,
       ds_key('tenant:acme', 'order', 42) AS escaped,
       ds_key('invoice', 1.50, '2024-05-01 12:00+02'::timestamptz) AS typed_parts;
\echo '    Inside a step body, ds_idempotency_key() is the same on every attempt (hand it to an'
\echo '    external API) and ds_attempt_key() is unique per attempt.'
SELECT status, result
  FROM ds_run_step(ds_key('order', 42), 'show-keys',
                   'SELECT ds_idempotency_key() AS idempotency_key,
                           ds_attempt_key() AS attempt_key,
                           ds_attempt_number() AS attempt_number');

\echo
\echo '=== (f) The history: every attempt, and the current state of every step ==='
\echo '    executor: caller = ran inside the ds_run_step call, worker = ran by the background worker.'
SELECT run_id, step_id, attempt, class, error_code, error_message, attempt_key, executor,
       started_at::time(3) AS started, duration
  FROM ds_attempts
 ORDER BY started_at, attempt;
SELECT run_id, step_id, status, attempt, max_attempts,
       next_attempt_at::timestamptz(0) AS next_attempt_at, error_class, remediation
  FROM ds_steps
 ORDER BY created_at;

\echo
\echo '=== (g) An HTTP step: a transactional outbox with a stable idempotency key ==='
\echo '    ds_http_step stores the request with the caller''s transaction; nothing is sent until it'
\echo '    commits. The HTTP worker then sends it with "Idempotency-Key: order\\:42:ship" on every'
\echo '    attempt. The local fake provider answers 503 once (fault=503): the attempt is retryable,'
\echo '    and the next one succeeds; the response is the step''s result.'
BEGIN;
SELECT status, attempt, replayed
  FROM ds_http_step('order:42', 'ship',
                    jsonb_build_object('method', 'POST', 'expect', 'json',
                                       'url', :'provider' || '/charge/ship-42?fault=503',
                                       'json', jsonb_build_object('order', 42, 'carrier', 'DHL')),
                    policy => '{"initial_delay": "200 ms"}');
\echo '    Still pending: the transaction has not committed, so nothing has been sent.'
COMMIT;
SELECT demo_wait('order:42', 'ship', 2);
SELECT attempt, class, error_code, error_message, idempotency_key, executor
  FROM ds_attempts WHERE run_id = 'order:42' AND step_id = 'ship' ORDER BY attempt;
SELECT status, result->'status' AS http_status, result->'body' AS body
  FROM ds_steps WHERE run_id = 'order:42' AND step_id = 'ship';
\echo '    The same call again (a redelivered message): replayed from the store, nothing sent.'
SELECT status, replayed, result->'body'->'charge' AS charge
  FROM ds_http_step('order:42', 'ship',
                    jsonb_build_object('method', 'POST', 'expect', 'json',
                                       'url', :'provider' || '/charge/ship-42?fault=503',
                                       'json', jsonb_build_object('order', 42, 'carrier', 'DHL')),
                    policy => '{"initial_delay": "200 ms"}');
\echo '    The provider''s own count, read with one more HTTP step (a GET): ship-42 was charged once,'
\echo '    and requested twice (the 503, then the charge).'
SELECT status FROM ds_http_step('demo', 'provider-counts',
                                jsonb_build_object('url', :'provider' || '/counts', 'expect', 'json'));
SELECT demo_wait('demo', 'provider-counts', 1);
SELECT result->'body'->'charges'->'ship-42' AS charges, result->'body'->'requests'->'ship-42' AS requests
  FROM ds_steps WHERE run_id = 'demo' AND step_id = 'provider-counts';
\echo
\echo '=== (h) A run: an order checkout as a durable workflow, through a crash ==='
\echo '    checkout() is a workflow: reserve stock, charge over HTTP (the fake provider), record the'
\echo '    payment, wait for the shipping webhook, confirm. The background worker runs it in turns;'
\echo '    each step commits on its own the moment it completes, and completed steps replay.'
CREATE TABLE stock (sku text PRIMARY KEY, available int CHECK (available >= 0));
INSERT INTO stock VALUES ('book', 5);
CREATE TABLE payments (order_id text PRIMARY KEY, amount int, charge_id text);
CREATE TABLE outbox (order_id text, message text);
CREATE FUNCTION checkout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    charge jsonb;
    shipment jsonb;
BEGIN
    PERFORM ds_step('reserve',
        'UPDATE stock SET available = available - ($1->>''qty'')::int WHERE sku = $1->>''sku'' RETURNING available',
        input);
    -- the provider charges, then takes 60 s to answer the first request (fault=delay): long
    -- enough to kill the HTTP worker while the charge is in flight
    charge := ds_http('charge', jsonb_build_object('method', 'POST', 'expect', 'json',
        'url', input->>'provider' || '/charge/' || (input->>'order') || '?fault=delay&secs=60',
        'json', jsonb_build_object('order', input->>'order', 'amount', input->'amount')),
        policy => '{"initial_delay": "200 ms"}');
    PERFORM ds_step('record-payment',
        'INSERT INTO payments VALUES ($1->>''order'', ($1->>''amount'')::int, $1->''charge''->''body''->>''charge'')',
        input || jsonb_build_object('charge', charge));
    shipment := ds_await_event('shipped', 'shipped:' || (input->>'order'), '7 days');
    PERFORM ds_step('confirm',
        'INSERT INTO outbox VALUES ($1->>''order'', ''shipped with '' || ($1->>''carrier''))',
        input || shipment);
    RETURN jsonb_build_object('charge', charge->'body', 'shipment', shipment);
END $$;
CREATE FUNCTION demo_wait_run(id text, what text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
    FOR i IN 1 .. 300 LOOP
        SELECT status || coalesce(':' || current_step, '') INTO s FROM ds_runs WHERE run_id = id;
        EXIT WHEN s = what;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN s;
END $$;
\echo '    Start it (idempotent by its run key: starting it again returns the same run).'
SELECT * FROM ds_start_run('checkout',
                           jsonb_build_object('order', 'o-42', 'sku', 'book', 'qty', 1,
                                              'amount', 1999, 'provider', :'provider'),
                           run_key => 'checkout:o-42');
SELECT * FROM ds_start_run('checkout',
                           jsonb_build_object('order', 'o-42', 'sku', 'book', 'qty', 1,
                                              'amount', 1999, 'provider', :'provider'),
                           run_key => 'checkout:o-42');
\echo '    The run waits for the HTTP worker; the stock is already reserved (committed):'
SELECT demo_wait_run('checkout:o-42', 'waiting:charge') AS run;
SELECT run_id, status, current_step, wait_reason FROM ds_runs;
SELECT available FROM stock;
\echo '    The provider has charged o-42 and is slow to answer (its own count, read over HTTP):'
\! python3 -c "import json,os,time,urllib.request as u;[time.sleep(0.1) for _ in range(300) if json.load(u.urlopen(os.environ['DEMO_PROVIDER']+'/counts'))['charges'].get('o-42',0)<1];print('    charges of o-42 at the provider:',json.load(u.urlopen(os.environ['DEMO_PROVIDER']+'/counts'))['charges'].get('o-42',0))"
\echo '    Now the HTTP worker dies with the request in flight (pg_terminate_backend here; kill -9'
\echo '    and crashes behave the same). Its replacement records the attempt as lost and sends the'
\echo '    request again with the same Idempotency-Key: the provider answers with the charge it'
\echo '    made, and charges nothing more. The run goes on and waits for the shipment.'
SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
 WHERE backend_type = 'durable_steps http';
SELECT demo_wait_run('checkout:o-42', 'waiting:shipped') AS run;
SELECT step_id, attempt, class, error_code, error_message, idempotency_key, executor
  FROM ds_attempts WHERE run_id = 'checkout:o-42' AND step_id = 'charge' ORDER BY attempt;
\echo '    The shipping webhook arrives: ds_emit_event wakes the run at commit.'
SELECT ds_emit_event('shipped:o-42', '{"carrier": "DHL"}');
SELECT demo_wait_run('checkout:o-42', 'succeeded') AS run;
SELECT run_id, status, output, turns FROM ds_runs;
\echo '    Each effect exactly once: one unit reserved, one charge at the provider, one payment'
\echo '    recorded, one confirmation.'
\! python3 -c "import json,os,urllib.request as u;c=json.load(u.urlopen(os.environ['DEMO_PROVIDER']+'/counts'));print('    provider: charges of o-42',c['charges'].get('o-42',0),'requests',c['requests'].get('o-42',0))"
SELECT (SELECT available FROM stock) AS available, (SELECT count(*) FROM payments) AS payments,
       (SELECT count(*) FROM outbox) AS confirmations;
SELECT step_id, attempt, class, executor FROM ds_attempts WHERE run_id = 'checkout:o-42'
 ORDER BY started_at;

\echo
\echo 'End of the demo.'
