-- Fan-out and join (docs/runs.md, "Fan-out and join: ds_map"): ds_map's and ds_start_map's
-- arguments, what ds_start_map stores, its replay and conflicts, and who may store a map. Every
-- store is looked at inside its transaction and rolled back, whether or not a worker serves this
-- database (test/t/102_map.pl runs maps in workflows).
\set SHOW_CONTEXT never

-- ds_map belongs in a workflow
SELECT ds_map('m', 'SELECT 1', '[1, 2]');

-- malformed arguments are refused and store nothing
SELECT status FROM ds_start_map('maps', 'm', NULL, '[1]');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1; SELECT 2', '[1]');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', NULL);
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '{"a": 1}');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '7');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[1]', concurrency => 0);
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[1]', concurrency => -3);
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[1]', policy => '{"limit": "x"}');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[1]', policy => '{"max_attempts": 0}');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[1]', timeout => interval '-1 second');
SELECT status FROM ds_start_map('maps', NULL, 'SELECT 1', '[1]');
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1',
                                (SELECT jsonb_agg(i) FROM generate_series(1, 100001) i));
SELECT count(*) FROM durable_steps.maps;
SELECT count(*) FROM ds_steps WHERE run_id = 'maps';

-- a map: one deferred SQL step per input, "<step_id>/<n>", each with its input; with a
-- concurrency, the map's own limit admits them
BEGIN;
SELECT status, attempt, replayed FROM ds_start_map('maps', 'm', 'SELECT ($1->>''n'')::int * 2',
                                                   '[{"n": 1}, {"n": 2}, {"n": 3}]', concurrency => 2);
SELECT step_id, kind, input, "limit" LIKE 'ds_map:%' AS own_limit, limit_key FROM ds_steps
 WHERE run_id = 'maps' ORDER BY step_id;
SELECT step_id, owner, items, concurrency, open FROM durable_steps.maps;
SELECT name LIKE 'ds_map:%' AS own_limit, rate, concurrency FROM durable_steps.limits;
-- the same call again replays: nothing more is stored
SELECT status, replayed FROM ds_start_map('maps', 'm', 'SELECT ($1->>''n'')::int * 2',
                                          '[{"n": 1}, {"n": 2}, {"n": 3}]', concurrency => 2);
SELECT count(*) FROM ds_steps WHERE run_id = 'maps';
-- another definition under the same step id is DS422
SAVEPOINT s;
SELECT status FROM ds_start_map('maps', 'm', 'SELECT 1', '[{"n": 1}]');
ROLLBACK TO s;
-- no step may name a map's own limit
SELECT status FROM ds_run_step('maps', 'thief', 'SELECT 1', defer => true,
                               policy => jsonb_build_object('limit', (SELECT name FROM durable_steps.limits)));
ROLLBACK;

-- a map of HTTP steps: its inputs are the requests, checked as ds_http_step checks one
SELECT status FROM ds_start_map('maps', 'h', 'SELECT 1', '[]', http => true);
SELECT status FROM ds_start_map('maps', 'h', NULL, '[]', task => 't', http => true);
SELECT status FROM ds_start_map('maps', 'h', NULL, '[]', http => NULL);
SELECT status FROM ds_start_map('maps', 'h', NULL, '[{"method": "GET"}]', http => true);
BEGIN;
SELECT status FROM ds_start_map('maps', 'h', NULL,
    '[{"method": "GET", "url": "https://api.example.com/a"}, {"method": "POST", "url": "https://api.example.com/b"}]',
    http => true);
SELECT step_id, kind, request->>'url' AS url, idempotency_header FROM ds_steps WHERE run_id = 'maps' ORDER BY step_id;
ROLLBACK;
CREATE ROLE map_no_http;
BEGIN;
SET LOCAL ROLE map_no_http;
SELECT status FROM ds_start_map('maps-nohttp', 'h', NULL, '[{"method": "GET", "url": "https://api.example.com/a"}]', http => true);
ROLLBACK;
DROP ROLE map_no_http;

-- an empty map has no items (ds_map answers [] at once, storing nothing)
BEGIN;
SELECT status FROM ds_start_map('maps', 'none', 'SELECT 1', '[]');
SELECT items FROM durable_steps.maps WHERE step_id = 'none';
SELECT count(*) FROM ds_steps WHERE run_id = 'maps';
ROLLBACK;

-- a role stores maps only under run ids it may store steps under, and sees only its own
CREATE ROLE map_user;
CREATE ROLE map_other;
BEGIN;
SET LOCAL ROLE map_user;
SELECT status FROM ds_start_map('maps-user', 'm', 'SELECT 1', '[1, 2]');
SELECT count(*) FROM ds_steps WHERE run_id = 'maps-user';
SET LOCAL ROLE map_other;
SELECT count(*) FROM ds_steps WHERE run_id = 'maps-user';
SELECT status FROM ds_start_map('maps-user', 'm', 'SELECT 1', '[1, 2]');
ROLLBACK;
DROP ROLE map_user;
DROP ROLE map_other;

-- Child runs (docs/runs.md, "Child runs"): ds_start_child_run and ds_join_child belong in a
-- workflow; ds_start_child's arguments and who may start a child of a run
SELECT ds_start_child_run('c', 'kid');
SELECT ds_join_child('c');
SELECT status FROM ds_start_child('no-such-run', 'c', 'kid', '{}');
SELECT status FROM ds_start_child(NULL, 'c', 'kid', '{}');
SELECT status FROM ds_start_child('r', NULL, 'kid', '{}');
SELECT status FROM ds_start_child('r', 'c', NULL, '{}');
SELECT status FROM ds_start_child('r', 'c', 'kid', NULL);
CREATE FUNCTION child_parent(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE ROLE child_other;
BEGIN;
SELECT status FROM ds_start_run('child_parent', '{}', run_key => 'child-parent');
SET LOCAL ROLE child_other;
SELECT status FROM ds_start_child('child-parent', 'c', 'child_parent', '{}');
ROLLBACK;
BEGIN;
SELECT status FROM ds_start_run('child_parent', '{}', run_key => 'child-parent');
SELECT status, result FROM ds_start_child('child-parent', 'c', 'child_parent', '{"n": 1}');
SELECT run_id, parent_run_id, parent_step FROM durable_steps.runs WHERE run_id LIKE 'child-parent%' ORDER BY run_id;
-- again: the same child
SELECT status, result FROM ds_start_child('child-parent', 'c', 'child_parent', '{"n": 1}');
-- another input for the same child is the run key's conflict
SAVEPOINT s;
SELECT status FROM ds_start_child('child-parent', 'c', 'child_parent', '{"n": 2}');
ROLLBACK TO s;
ROLLBACK;
DROP ROLE child_other;
DROP FUNCTION child_parent(text, jsonb);

-- A role takes neither another role's map nor another role's child run id before its run gets
-- there; two maps never share their own limit
CREATE FUNCTION map_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE ROLE map_owner;
CREATE ROLE map_thief;
BEGIN;
SET LOCAL ROLE map_owner;
SELECT status FROM ds_start_run('map_wf', '{}', run_key => 'owned-run');
SET LOCAL ROLE map_thief;
SAVEPOINT s;
SELECT status FROM ds_start_map('owned-run', 'm', 'SELECT 1', '[]');
ROLLBACK TO s;
SELECT status FROM ds_start_run('map_wf', '{}', run_key => 'owned-run/c');
ROLLBACK TO s;
SELECT status FROM ds_start_run('map_wf', '{}', run_key => 'owned-run/c/d');
ROLLBACK TO s;
RESET ROLE;
SELECT count(*) FROM durable_steps.maps WHERE run_id = 'owned-run';
-- run "r3/a" with map "b" and run "r3" with map "a/b": two limits
SELECT status FROM ds_start_map('r3/a', 'b', 'SELECT 1', '[1]', concurrency => 1);
SELECT status FROM ds_start_map('r3', 'a/b', 'SELECT 1', '[1]', concurrency => 2);
SELECT count(DISTINCT name), string_agg(concurrency::text, ',' ORDER BY concurrency) FROM durable_steps.limits;
ROLLBACK;
DROP ROLE map_owner;
DROP ROLE map_thief;
DROP FUNCTION map_wf(text, jsonb);
