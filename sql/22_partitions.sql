-- Partitions (docs/partitions.md): the settings and their refusals, ds_partition_of agreeing
-- with hashtext(run_id) & (partition_count - 1) as a PL/Proxy router computes it, every call
-- naming a run or an idempotency key of a partition this server does not own refused with DS201
-- and changing nothing, idempotency keys moving with their partition,
-- and who may export and import a partition. (No worker serves pg_regress's databases: TAP 084
-- runs the worker.) In a database of its own, so that the other tests' steps are not in the
-- partitions it exports.
\set SHOW_CONTEXT never
\set regress_db :DBNAME
CREATE DATABASE regress_partitions;
\c regress_partitions
SET client_min_messages = warning;
CREATE EXTENSION durable_steps;
RESET client_min_messages;

-- not partitioned by default: nothing changes, ds_partition_of answers NULL
SHOW durable_steps.partition_count;
SHOW durable_steps.partitions;
SELECT ds_partition_of('run-1') AS not_partitioned;
-- steps of runs run-1 and run-3 stored while not partitioned
SELECT status FROM ds_run_step('run-1', 'one', 'SELECT 1 AS n');
SELECT status FROM ds_run_step('run-1', 'def', 'SELECT 1 AS n', defer => true);
SELECT status FROM ds_run_step('run-3', 'later', 'SELECT 1', run_at => '2100-01-01');
-- an idempotency key is partitioned by the key: 'run-3' stored while not partitioned
SELECT status, body, replayed FROM ds_idempotent('pay', 'run-3', '{"amount": 3}', $$SELECT 201, '{"id": 3}'::jsonb$$);
-- what they are, as one checksum of their rows
CREATE VIEW part_state AS
    SELECT md5(coalesce(string_agg(t, ',' ORDER BY t), '')) AS sum FROM (
        SELECT to_jsonb(s)::text AS t FROM durable_steps.steps s WHERE run_id IN ('run-1', 'run-3')
        UNION ALL SELECT to_jsonb(a)::text FROM durable_steps.attempts a WHERE run_id IN ('run-1', 'run-3')
        UNION ALL SELECT to_jsonb(r)::text FROM durable_steps.runs r WHERE run_id IN ('run-1', 'run-3')
        UNION ALL SELECT to_jsonb(k)::text FROM durable_steps.idempotency_keys k WHERE key IN ('run-1', 'run-3')) x;
CREATE TABLE before_refusals AS SELECT sum FROM part_state;

-- reloadable settings: not for a session, refused with the reason when malformed
SET durable_steps.partition_count = 4;
\echo :SQLSTATE
ALTER SYSTEM SET durable_steps.partition_count = 3;
\echo :SQLSTATE
ALTER SYSTEM SET durable_steps.partition_count = 2048;
ALTER SYSTEM SET durable_steps.partition_count = -1;
ALTER SYSTEM SET durable_steps.partitions = 'one';
\echo :SQLSTATE
ALTER SYSTEM SET durable_steps.partitions = '0,0';
ALTER SYSTEM SET durable_steps.partitions = '1024';
ALTER SYSTEM SET durable_steps.partitions = '-1';
ALTER SYSTEM SET durable_steps.partitions = '1,,2';

-- four partitions, this server owns 0 and 2. A reload reaches this backend between two
-- statements: wait_reload is repeated until it has (each waits 50 ms while it has not), and
-- the SHOWs below say whether it did.
ALTER SYSTEM SET durable_steps.partition_count = 4;
ALTER SYSTEM SET durable_steps.partitions = '0,2';
SELECT pg_reload_conf();
\set wait_reload 'SELECT pg_sleep(0.05) WHERE current_setting(''durable_steps.partitions'') <> ''0,2'';'
\o /dev/null
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
\o
SHOW durable_steps.partition_count;
SHOW durable_steps.partitions;

-- ds_partition_of is hashtext(run_id) & (partition_count - 1), for every run id, and all four
-- partitions are reached
SELECT count(*) FILTER (WHERE ds_partition_of(id) = hashtext(id) & 3) AS agree,
       count(*) AS ids, count(DISTINCT ds_partition_of(id)) AS partitions
  FROM (SELECT 'run-' || i AS id FROM generate_series(1, 10000) i
        UNION ALL SELECT md5(i::text) FROM generate_series(1, 10000) i
        UNION ALL SELECT 'é' || i FROM generate_series(1, 1000) i) ids;
-- run-7 is in partition 2 (owned), run-1 in 1 and run-3 in 3 (not owned)
SELECT id, ds_partition_of(id), hashtext(id) & 3 AS router FROM unnest(ARRAY['run-7', 'run-1', 'run-3']) id;

-- an owned partition: steps as ever
SELECT status, result, replayed FROM ds_run_step('run-7', 'one', 'SELECT 1 AS n');
SELECT status, replayed FROM ds_run_step('run-7', 'one', 'SELECT 1 AS n');

-- a run of a partition not owned here: DS201, with where it belongs
SELECT * FROM ds_run_step('run-1', 'one', 'SELECT 1 AS n');
\echo :SQLSTATE
-- every call naming a run: DS201 each, before anything else is looked at
SELECT * FROM ds_run_step('run-1', 'one', 'SELECT 1 AS n', defer => true);
\echo :SQLSTATE
SELECT * FROM ds_run_step('run-3', 'later', 'SELECT 1', run_at => now() + interval '1 hour');
\echo :SQLSTATE
SELECT * FROM ds_http_step('run-1', 'call', '{"method": "GET", "url": "http://127.0.0.1:9/"}');
\echo :SQLSTATE
SELECT * FROM ds_retry_step('run-1', 'one');
\echo :SQLSTATE
SELECT * FROM ds_cancel_step('run-1', 'one');
\echo :SQLSTATE
SELECT * FROM ds_resolve_step('run-1', 'one', 'succeeded');
\echo :SQLSTATE
SELECT * FROM ds_wait_step('run-1', 'one', '0');
\echo :SQLSTATE
SELECT * FROM ds_wait_run('run-1', '0');
\echo :SQLSTATE
SELECT ds_cancel_run('run-1');
\echo :SQLSTATE
SELECT ds_resume_run('run-1');
\echo :SQLSTATE
-- an idempotency key of a partition not owned here (the key's partition, whatever the scope):
-- DS201 from each of the four calls, before the key's entry is read or written
SELECT * FROM ds_idempotent('pay', 'run-1', '{"amount": 1}', $$SELECT 201, '{}'::jsonb$$);
\echo :SQLSTATE
SELECT * FROM ds_idempotent('pay', 'run-3', '{"amount": 3}', $$SELECT 201, '{}'::jsonb$$);
\echo :SQLSTATE
SELECT * FROM ds_idempotent_begin('other-scope', 'run-3', '{"amount": 3}');
\echo :SQLSTATE
SELECT ds_idempotent_finish('pay', 'run-3', gen_random_uuid(), 200, '{}');
\echo :SQLSTATE
SELECT ds_idempotent_abandon('pay', 'run-3', gen_random_uuid());
\echo :SQLSTATE
-- a key of an owned partition: as ever
SELECT status, body, replayed FROM ds_idempotent('pay', 'run-7', '{"amount": 7}', $$SELECT 201, '{"id": 7}'::jsonb$$);
SELECT status, body, replayed FROM ds_idempotent('pay', 'run-7', '{"amount": 7}', $$SELECT 500, '{}'::jsonb$$);

CREATE FUNCTION part_flow(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT input $$;
-- a run key names the run: the same refusal
SELECT * FROM ds_start_run('part_flow', '{}', run_key => 'run-1');
\echo :SQLSTATE
-- and nothing of them changed: the same rows, and no run
SELECT (SELECT sum FROM part_state) = (SELECT sum FROM before_refusals) AS unchanged,
       (SELECT count(*) FROM durable_steps.steps WHERE run_id IN ('run-1', 'run-3')) AS steps;
SELECT count(*) AS runs FROM ds_runs WHERE run_id IN ('run-1', 'run-3');
SELECT key, state, status FROM ds_idempotency_keys WHERE key IN ('run-1', 'run-3');
-- in a transaction, the refusal aborts it like any error
BEGIN;
SELECT status FROM ds_run_step('run-7', 'two', 'SELECT 2 AS n', defer => true);
SELECT status FROM ds_run_step('run-1', 'two', 'SELECT 2 AS n', defer => true);
ROLLBACK;
SELECT count(*) AS two FROM ds_steps WHERE step_id = 'two';

-- a run key of an owned partition, and runs without a key: their ids are of owned partitions
SELECT run_id, status, created FROM ds_start_run('part_flow', '{}', run_key => 'run-7');
SELECT count(*) AS runs, count(*) FILTER (WHERE ds_partition_of(r.run_id) IN (0, 2)) AS owned
  FROM generate_series(1, 50) i, ds_start_run('part_flow', jsonb_build_object('i', i)) r;

-- events belong to no run: accepted on every partition's server
SELECT ds_emit_event('part-event', '{"to": "everyone"}');

-- moving a partition is a superuser's: no other role, not even durable_steps_admin
CREATE ROLE part_admin IN ROLE durable_steps_admin;
CREATE ROLE part_alice;
SET ROLE part_admin;
SELECT * FROM ds_partition_export(1);
\echo :SQLSTATE
SELECT ds_partition_import('{"ds_partition_export": 1, "partition": 1, "partition_count": 4}');
\echo :SQLSTATE
SELECT ds_partition_drop(1);
\echo :SQLSTATE
RESET ROLE;
-- granted EXECUTE, still refused
GRANT EXECUTE ON FUNCTION ds_partition_export(integer) TO part_alice;
GRANT EXECUTE ON FUNCTION ds_partition_import(jsonb) TO part_alice;
SET ROLE part_alice;
SELECT * FROM ds_partition_export(1);
\echo :SQLSTATE
SELECT ds_partition_import('{"ds_partition_export": 1, "partition": 1, "partition_count": 4}');
\echo :SQLSTATE
RESET ROLE;
REVOKE EXECUTE ON FUNCTION ds_partition_export(integer) FROM part_alice;
REVOKE EXECUTE ON FUNCTION ds_partition_import(jsonb) FROM part_alice;

-- a partition this server owns cannot be exported (fence it first), nor imported into
SELECT * FROM ds_partition_export(2);
\echo :SQLSTATE
SELECT * FROM ds_partition_export(4);
\echo :SQLSTATE
SELECT ds_partition_import('{"ds_partition_export": 1, "partition": 2, "partition_count": 4}');
\echo :SQLSTATE
-- another partition count, lines without their header
SELECT ds_partition_import('{"ds_partition_export": 1, "partition": 1, "partition_count": 8}');
\echo :SQLSTATE
SELECT ds_partition_import('{"table": "runs", "row": {}}');
\echo :SQLSTATE

-- a fenced partition's export: header, its rows, trailer with their counts
SELECT n, line ? 'ds_partition_export' AS header, line ? 'ds_partition_end' AS trailer,
       (line -> 'counts') - 'events'::text AS counts
  FROM ds_partition_export(1) WHERE line ? 'ds_partition_export' OR line ? 'ds_partition_end';
-- an HTTP outcome kept for an executor to record with its hook (as the HTTP worker leaves it):
-- in flight, the export refuses
UPDATE durable_steps.steps SET status = 'running', kept_outcome = '{}' WHERE run_id = 'run-3';
SELECT count(*) FROM ds_partition_export(3);
\echo :SQLSTATE
-- running, and nobody holds its lock (its executor is gone): exported, for the new owner to
-- record its attempt as lost
UPDATE durable_steps.steps SET kept_outcome = NULL WHERE run_id = 'run-3';
SELECT count(*) AS lines FROM ds_partition_export(3);
UPDATE durable_steps.steps SET status = 'pending' WHERE run_id = 'run-3';
-- a key of a role that no longer exists (dropped while connected to another database; its OID
-- here) can never be answered: the export leaves it behind, for ds_partition_drop
INSERT INTO durable_steps.idempotency_keys (owner, scope, key, request, state, status, body, expires_at, created_at)
    VALUES ('999999', 'pay', 'run-3', '{}', 'done', 200, '{}', now() + interval '1 day', now());
-- an import of a partition's rows: a row of another partition is refused, the header and
-- trailer check the counts, and a repeated import gives the same rows
CREATE TEMP TABLE part_export AS SELECT * FROM ds_partition_export(3);
SELECT line #>> '{row,owner}' = current_user AS owner_is_me, line #>> '{row,key}' AS key
  FROM part_export WHERE line ->> 'table' = 'idempotency_keys';
BEGIN;
SELECT ds_partition_import(line) FROM (SELECT line FROM part_export ORDER BY n) l;
SELECT step_id, status FROM durable_steps.steps WHERE run_id = 'run-3';
SELECT ds_partition_import(line) FROM (SELECT line FROM part_export ORDER BY n) l;
SELECT step_id, status FROM durable_steps.steps WHERE run_id = 'run-3';
-- the key 'run-3' of partition 3 came with it, its stored response kept
SELECT scope, key, state, status, body FROM durable_steps.idempotency_keys WHERE key = 'run-3';
SELECT ds_partition_import(line)
  FROM (VALUES (0, (SELECT line FROM part_export WHERE n = 0)),
               (1, '{"table": "runs", "row": {"run_id": "run-7"}}')) v(n, line) ORDER BY n;
ROLLBACK;
-- a key of another partition in the lines is refused like a run of another one
SELECT ds_partition_import(line)
  FROM (VALUES (0, (SELECT line FROM part_export WHERE n = 0)),
               (1, '{"table": "idempotency_keys", "row": {"key": "run-7"}}')) v(n, line) ORDER BY n;
\echo :SQLSTATE
-- dropped after a move: its steps, runs and keys
BEGIN;
SELECT ds_partition_drop(3);
SELECT (SELECT count(*) FROM durable_steps.steps WHERE run_id = 'run-3') AS steps,
       (SELECT count(*) FROM durable_steps.idempotency_keys WHERE key = 'run-3') AS keys,
       (SELECT count(*) FROM durable_steps.idempotency_keys WHERE key = 'run-7') AS owned_keys;
ROLLBACK;
-- a trailer whose counts do not match: the import fails
SELECT ds_partition_import(line) FROM (
    SELECT CASE WHEN line ? 'ds_partition_end'
                THEN jsonb_set(line, '{counts,runs}', '1') ELSE line END AS line
      FROM part_export ORDER BY n) l;
\echo :SQLSTATE
-- a role named by a number (as an export names a role dropped on its server) is refused: the
-- number may be another role here (10: the bootstrap superuser)
SELECT ds_partition_import(line) FROM (
    SELECT CASE WHEN line ->> 'table' = 'steps'
                THEN jsonb_set(line, '{row,owner}', '"10"') ELSE line END AS line
      FROM part_export ORDER BY n) l;
\echo :SQLSTATE
-- nor is '-', which regrole reads as no role at all
SELECT ds_partition_import(line) FROM (
    SELECT CASE WHEN line ->> 'table' = 'idempotency_keys'
                THEN jsonb_set(line, '{row,owner}', '"-"') ELSE line END AS line
      FROM part_export ORDER BY n) l;
\echo :SQLSTATE

-- partitions listed without a count (a count refused at startup leaves 0): nothing is served
ALTER SYSTEM RESET durable_steps.partition_count;
SELECT pg_reload_conf();
\set wait_reload 'SELECT pg_sleep(0.05) WHERE current_setting(''durable_steps.partition_count'') <> ''0'';'
\o /dev/null
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
\o
SHOW durable_steps.partition_count;
SHOW durable_steps.partitions;
SELECT status FROM ds_run_step('run-7', 'one', 'SELECT 1 AS n');
\echo :SQLSTATE
SELECT count(*) AS owned FROM generate_series(1, 100) i WHERE durable_steps.ds_partition_owned('r' || i);

-- back to not partitioned
ALTER SYSTEM RESET durable_steps.partitions;
SELECT pg_reload_conf();
\set wait_reload 'SELECT pg_sleep(0.05) WHERE current_setting(''durable_steps.partitions'') <> '''';'
\o /dev/null
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
:wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload :wait_reload
\o
SHOW durable_steps.partition_count;
SELECT status, replayed FROM ds_run_step('run-1', 'one', 'SELECT 1 AS n');
\c :regress_db
DROP DATABASE regress_partitions;
DROP ROLE part_admin;
DROP ROLE part_alice;
