-- Idempotent requests (docs/idempotent-requests.md): the server side of an Idempotency-Key
-- header. A key stands for one request: its first response is stored with the handler's writes
-- and replayed to every repeat. Each refused call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE TABLE idem_orders (id serial PRIMARY KEY, item text, amount int);

-- the first request runs its handler: its writes and its stored response commit together
SELECT status, body, replayed
  FROM ds_idempotent('checkout', 'k-1', '{"item": "book", "amount": 12}',
       $$INSERT INTO idem_orders (item, amount) SELECT $1->>'item', ($1->>'amount')::int
         RETURNING 201, jsonb_build_object('order', id, 'item', item)$$);
-- a repeat replays the stored response and runs nothing; the request is compared as jsonb, so
-- the order of its keys does not matter
SELECT status, body, replayed
  FROM ds_idempotent('checkout', 'k-1', '{"amount": 12, "item": "book"}',
       $$INSERT INTO idem_orders (item, amount) SELECT $1->>'item', ($1->>'amount')::int
         RETURNING 201, jsonb_build_object('order', id, 'item', item)$$);
SELECT count(*) AS orders FROM idem_orders;
-- another request under the same key is refused
SELECT status FROM ds_idempotent('checkout', 'k-1', '{"item": "pen", "amount": 2}', 'SELECT 201, NULL::jsonb');
\echo :SQLSTATE
-- the same key in another scope is another key
SELECT status, replayed FROM ds_idempotent('refund', 'k-1', '{"item": "pen"}', $$SELECT 200, '{}'::jsonb$$);

-- a status the handler returns is a response like any other: stored and replayed
SELECT status, body, replayed FROM ds_idempotent('checkout', 'declined', '{"card": "4000"}',
       $$SELECT 402, jsonb_build_object('error', 'card_declined')$$);
SELECT status, body, replayed FROM ds_idempotent('checkout', 'declined', '{"card": "4000"}',
       $$SELECT 402, jsonb_build_object('error', 'card_declined')$$);

-- a handler that raises stores nothing: its transaction's writes are gone, and a retry under the
-- same key runs the handler again
CREATE TABLE idem_stock (item text PRIMARY KEY, left_ int CHECK (left_ >= 0));
INSERT INTO idem_stock VALUES ('lamp', 0);
SELECT status FROM ds_idempotent('checkout', 'k-lamp', '{"item": "lamp"}',
       $$UPDATE idem_stock SET left_ = left_ - 1 WHERE item = $1->>'item'
         RETURNING 201, jsonb_build_object('left', left_)$$);
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE key = 'k-lamp';
UPDATE idem_stock SET left_ = 3;
SELECT status, body, replayed FROM ds_idempotent('checkout', 'k-lamp', '{"item": "lamp"}',
       $$UPDATE idem_stock SET left_ = left_ - 1 WHERE item = $1->>'item'
         RETURNING 201, jsonb_build_object('left', left_)$$);
-- ... also when the caller catches the error: the handler's writes and the key go together
DO $$
BEGIN
    PERFORM ds_idempotent('checkout', 'k-caught', '{}', $h$SELECT 1/0, '{}'::jsonb$h$);
EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'caught';
END $$;
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE key = 'k-caught';

-- a handler that calls ds_idempotent with its own key is refused
SELECT status FROM ds_idempotent('checkout', 'k-self', '{}',
       $$SELECT status, body FROM ds_idempotent('checkout', 'k-self', '{}', 'SELECT 200, NULL::jsonb')$$);
\echo :SQLSTATE

-- what a handler must return: one row (status integer, body jsonb), an HTTP status
SELECT status FROM ds_idempotent('shape', 'none', '{}', 'SELECT 200, NULL::jsonb WHERE false');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('shape', 'two', '{}', $$SELECT 200, '{}'::jsonb FROM generate_series(1, 2)$$);
\echo :SQLSTATE
SELECT status FROM ds_idempotent('shape', 'types', '{}', $$SELECT '200', '{}'$$);
\echo :SQLSTATE
SELECT status FROM ds_idempotent('shape', 'status', '{}', $$SELECT 700, '{}'::jsonb$$);
\echo :SQLSTATE
SELECT status FROM ds_idempotent('shape', 'null', '{}', $$SELECT NULL::int, '{}'::jsonb$$);
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE scope = 'shape';

-- malformed arguments: a clear error, nothing stored
SELECT status FROM ds_idempotent(NULL, 'k', '{}', 'SELECT 200, NULL::jsonb');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', '', '{}', 'SELECT 200, NULL::jsonb');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', repeat('k', 256), '{}', 'SELECT 200, NULL::jsonb');
\echo :SQLSTATE
-- (255 characters is the longest key: that one call is stored)
SELECT status, replayed FROM ds_idempotent('bad', repeat('k', 255), '{}', 'SELECT 200, NULL::jsonb');
SELECT status FROM ds_idempotent('bad', 'k', NULL, 'SELECT 200, NULL::jsonb');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', 'k', '{}', 'SELEC 200');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', 'k', '{}', 'SELECT 200, NULL::jsonb; SELECT 1');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', 'k', '{}', 'SELECT 200, NULL::jsonb', ttl => '0');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('bad', 'k', '{}', 'SELECT 200, NULL::jsonb', wait => '-1 s');
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE scope = 'bad';

-- an entry past its ttl counts as absent: the handler runs again
SELECT status, replayed FROM ds_idempotent('short', 'k', '{}', $$SELECT 200, '{"n": 1}'::jsonb$$, ttl => '10 ms');
SELECT pg_sleep(0.05);
SELECT status, body, replayed FROM ds_idempotent('short', 'k', '{"other": true}', $$SELECT 200, '{"n": 2}'::jsonb$$);

-- keys are per role: another role's identical key is its own, and neither sees the other's
CREATE ROLE idem_alice;
CREATE ROLE idem_bob;
SET ROLE idem_alice;
SELECT status, body, replayed FROM ds_idempotent('checkout', 'shared-key', '{}', $$SELECT 201, '"alice"'::jsonb$$);
RESET ROLE;
SET ROLE idem_bob;
SELECT status, body, replayed FROM ds_idempotent('checkout', 'shared-key', '{}', $$SELECT 201, '"bob"'::jsonb$$);
SELECT scope, key, state, body FROM ds_idempotency_keys ORDER BY scope, key;
SELECT count(*) FROM durable_steps.idempotency_keys;
\echo :SQLSTATE
RESET ROLE;

-- For application code: begin holds the key, finish stores the response, abandon frees it
CREATE TABLE idem_tokens (name text PRIMARY KEY, token uuid);
INSERT INTO idem_tokens SELECT 'first', token
  FROM ds_idempotent_begin('pay', 'p-1', '{"amount": 5}');
SELECT state, status, body, token IS NOT NULL AS has_token FROM ds_idempotent_begin('pay', 'p-2', '{}');
-- while it is held -- after its transaction committed too -- a repeat is in progress, and
-- another request under it a conflict
SELECT state FROM ds_idempotent_begin('pay', 'p-1', '{"amount": 5}');
\echo :SQLSTATE
SELECT state FROM ds_idempotent_begin('pay', 'p-1', '{"amount": 6}');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('pay', 'p-1', '{"amount": 5}', 'SELECT 200, NULL::jsonb');
\echo :SQLSTATE
SELECT state, status, body FROM ds_idempotency_keys WHERE scope = 'pay' AND key = 'p-1';
-- only its token finishes it
SELECT ds_idempotent_finish('pay', 'p-1', gen_random_uuid(), 200, '{}');
\echo :SQLSTATE
SELECT ds_idempotent_finish('pay', 'p-1', (SELECT token FROM idem_tokens WHERE name = 'first'), 999, '{}');
\echo :SQLSTATE
SELECT ds_idempotent_finish('pay', 'p-1', (SELECT token FROM idem_tokens WHERE name = 'first'),
                            201, '{"charge": "ch_1"}');
-- then a repeat replays the response, and the token has done its work
SELECT state, status, body, token FROM ds_idempotent_begin('pay', 'p-1', '{"amount": 5}');
SELECT status, body, replayed FROM ds_idempotent('pay', 'p-1', '{"amount": 5}', 'SELECT 500, NULL::jsonb');
SELECT ds_idempotent_finish('pay', 'p-1', (SELECT token FROM idem_tokens WHERE name = 'first'), 200, '{}');
\echo :SQLSTATE
-- abandon frees the key for the next request
INSERT INTO idem_tokens SELECT 'abandoned', token FROM ds_idempotent_begin('pay', 'p-3', '{}');
SELECT ds_idempotent_abandon('pay', 'p-3', (SELECT token FROM idem_tokens WHERE name = 'abandoned'));
SELECT state FROM ds_idempotent_begin('pay', 'p-3', '{"after": "abandon"}');
SELECT ds_idempotent_abandon('pay', 'nope', gen_random_uuid());
\echo :SQLSTATE
-- a holder that never finishes loses the key when its lease runs out; its token is then refused
INSERT INTO idem_tokens SELECT 'crashed', token FROM ds_idempotent_begin('pay', 'p-4', '{}', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state FROM ds_idempotency_keys WHERE scope = 'pay' AND key = 'p-4';
SELECT state FROM ds_idempotent_begin('pay', 'p-4', '{}');
SELECT ds_idempotent_finish('pay', 'p-4', (SELECT token FROM idem_tokens WHERE name = 'crashed'), 200, '{}');
\echo :SQLSTATE
-- a repeat may wait for the holder: until its lease runs out (then it holds the key itself), or
-- until its own wait has passed (DS409)
INSERT INTO idem_tokens SELECT 'slow', token FROM ds_idempotent_begin('pay', 'p-6', '{}', lease => '200 ms');
SELECT state, token <> (SELECT token FROM idem_tokens WHERE name = 'slow') AS its_own_token
  FROM ds_idempotent_begin('pay', 'p-6', '{}', wait => '1 min');
SELECT state FROM ds_idempotent_begin('pay', 'p-6', '{}', wait => '50 ms');
\echo :SQLSTATE
-- a key held by the waiting transaction itself is DS409 at once: it would wait for itself
BEGIN;
SET LOCAL statement_timeout = '10 s';
SELECT state FROM ds_idempotent_begin('pay', 'p-7', '{}');
SELECT state FROM ds_idempotent_begin('pay', 'p-7', '{}', wait => '1 min');
\echo :SQLSTATE
ROLLBACK;
-- begin's arguments are checked as ds_idempotent's
SELECT state FROM ds_idempotent_begin('pay', 'p-5', '{}', lease => '0');
\echo :SQLSTATE
SELECT state FROM ds_idempotent_begin('pay', 'p-5', '{}', wait => '-1 s');
\echo :SQLSTATE
SELECT ds_idempotent_finish('pay', 'p-2', NULL, 200, '{}');
\echo :SQLSTATE

-- dropping a role deletes its keys: a role created later with the same OID must not be answered
-- its responses
DROP ROLE idem_alice;
SELECT count(*) AS alices_keys FROM durable_steps.idempotency_keys k
 WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = k.owner::oid);
DROP ROLE idem_bob;
