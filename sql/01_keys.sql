-- ds_key: canonical keys from typed parts (docs/steps.md, "Keys")
\set SHOW_CONTEXT never
SET timezone = 'America/New_York';
SET datestyle = 'SQL, DMY';

-- the contract's own example
SELECT ds_key('order', 42);

-- one canonical rendering per value, whatever the type it was written in
SELECT ds_key(42::smallint) AS int2, ds_key(42::int) AS int4, ds_key(42::bigint) AS int8,
       ds_key(42::numeric) AS num, ds_key(42.000::numeric) AS num_scaled,
       ds_key(-0.0::numeric) AS neg_zero, ds_key(0.10::numeric) AS tenth,
       ds_key(-12.50::numeric) AS negative;
SELECT ds_key('NaN'::numeric) AS nan, ds_key(1e20::numeric) AS big;
SELECT ds_key('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid) AS uuid;
SELECT ds_key(true) AS t, ds_key(false) AS f;
-- dates and timestamps ignore DateStyle and TimeZone: ISO 8601, timestamptz in UTC
SELECT ds_key('2024-03-01'::date) AS d, ds_key('infinity'::date) AS d_inf;
SELECT ds_key('2024-03-01 12:00:00-05'::timestamptz) AS ts,
       ds_key('2024-03-01 17:00:00.250+00'::timestamptz) AS ts_frac,
       ds_key('2024-03-01 17:00:00+00'::timestamptz)
         = ds_key('2024-03-01 12:00:00-05'::timestamptz) AS same_instant;
-- text-like types; char(n) drops the padding it ignores in comparisons
SELECT ds_key('abc'::varchar) AS varchar, ds_key('ab '::char(5)) AS bpchar,
       ds_key('abc'::name) AS name, ds_key('x'::text, 'y') AS two;
-- domains over supported types are accepted
CREATE DOMAIN order_no AS bigint;
SELECT ds_key('order', 7::order_no);
-- an explicit VARIADIC array
SELECT ds_key(VARIADIC ARRAY['a', 'b', 'c']);

-- the separator and the escape character are escaped inside parts
SELECT ds_key('a:b') AS one_part, ds_key('a', 'b') AS two_parts;
SELECT ds_key('a\', 'b') AS backslash_then_part, ds_key('a\:b') AS escaped_colon;
SELECT ds_key('a\\', ':b') AS k1, ds_key('a\', '\:b') AS k2;

-- collision resistance: distinct part lists never give the same key
WITH parts(list) AS (
    VALUES (ARRAY['a', 'b', 'c']), (ARRAY['a:b', 'c']), (ARRAY['a', 'b:c']), (ARRAY['a:b:c']),
           (ARRAY['a\', 'b', 'c']), (ARRAY['a\:b', 'c']), (ARRAY['a', '\b', 'c']),
           (ARRAY['a\\', 'b:c']), (ARRAY['a', 'b\', ':c']), (ARRAY[':', ':']), (ARRAY['::']),
           (ARRAY['\', ':']), (ARRAY['\:']), (ARRAY['\\:']), (ARRAY[':\', '\'])
), keys AS (
    SELECT list, ds_key(VARIADIC list) AS k FROM parts
)
SELECT count(*) AS lists, count(DISTINCT k) AS distinct_keys FROM keys;
-- and a larger random sample of short lists over an alphabet rich in ':' and '\'
WITH RECURSIVE lists AS (
    SELECT ARRAY(SELECT substr('ab:\', 1 + ((g * 7 + i * 13) % 4), 1 + (g + i) % 3)
                  FROM generate_series(1, 1 + g % 4) AS i) AS list
      FROM generate_series(1, 2000) AS g
)
SELECT count(DISTINCT list) = count(DISTINCT ds_key(VARIADIC list)) AS injective FROM lists;

-- bad input: NULL parts, no parts, empty parts, unsupported types
SELECT ds_key(NULL::text);
SELECT ds_key('order', NULL::int);
SELECT ds_key(VARIADIC ARRAY[]::text[]);
SELECT ds_key(VARIADIC NULL::text[]);
SELECT ds_key('');
SELECT ds_key('order', 1.5::float8);
SELECT ds_key('2024-01-01'::timestamp);

-- the attempt context exists only inside a step
SELECT ds_idempotency_key();
SELECT ds_attempt_key();
SELECT ds_attempt_number();
SELECT ds_max_attempts();
SELECT ds_run_id();
SELECT ds_step_id();

-- inside a step it names the step and the attempt
SELECT result FROM ds_run_step('keys-1', 'context',
    $$SELECT ds_run_id() AS run_id, ds_step_id() AS step_id, ds_idempotency_key() AS idem,
             ds_attempt_key() AS attempt_key, ds_attempt_number() AS attempt,
             ds_max_attempts() AS max_attempts$$);
-- a key built with ds_key works as an identity and reads back unchanged
SELECT run_id, step_id, result
  FROM ds_run_step(ds_key('order', 42), ds_key('charge', 'card:1'),
                   $$SELECT ds_idempotency_key()$$);
-- identities that join to the same text still get distinct idempotency and attempt keys
SELECT run_id, step_id, result
  FROM ds_run_step('a:b', 'c', $$SELECT ds_idempotency_key() || ' ' || ds_attempt_key()$$);
SELECT run_id, step_id, result
  FROM ds_run_step('a', 'b:c', $$SELECT ds_idempotency_key() || ' ' || ds_attempt_key()$$);
SELECT run_id, step_id, idempotency_key, attempt_key FROM ds_attempts
 WHERE run_id IN ('a:b', 'a') ORDER BY run_id;
-- keys are header-safe: a byte that is not a visible ASCII character, and '%', is written %XX,
-- so no CR or LF reaches a header, and identities that a receiver would trim or fold to one
-- (a trailing space, a control byte) keep distinct keys; ds_attempts shows the same keys
SELECT result FROM ds_run_step(E'order-7\r\nX-Evil', ' injected-value', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step(E'order-8\r\nA', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step(E'order-8\r\nB', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step('order-8 ', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step('order-8', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step('100%', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step('100%25', 'x', $$SELECT ds_idempotency_key()$$);
SELECT result FROM ds_run_step(E'caf\u00e9\t', 'x', $$SELECT ds_attempt_key()$$);
SELECT idempotency_key, attempt_key FROM ds_attempts
 WHERE run_id LIKE 'order-%' OR run_id LIKE '100%' OR run_id LIKE 'caf%'
 ORDER BY idempotency_key COLLATE "C";
RESET timezone;
RESET datestyle;
