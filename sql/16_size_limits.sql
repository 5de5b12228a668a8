-- Size limits (docs/reference.md, "Settings"): what a role may store is bounded by superuser settings,
-- checked at the call before anything is stored (54000, naming the setting)
\set SHOW_CONTEXT never
CREATE ROLE limits_alice IN ROLE durable_steps_http;
CREATE FUNCTION limits_flow(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT input';
GRANT EXECUTE ON FUNCTION limits_flow(text, jsonb) TO limits_alice;

-- the defaults
SHOW durable_steps.max_sql_size;
SHOW durable_steps.max_input_size;
SHOW durable_steps.max_request_size;
SHOW durable_steps.max_event_payload_size;

SET durable_steps.max_sql_size = '1kB';
SET durable_steps.max_input_size = '1kB';
SET durable_steps.max_request_size = '1kB';
SET durable_steps.max_event_payload_size = '1kB';
SET ROLE limits_alice;
-- a role cannot raise them
SET durable_steps.max_input_size = '100MB';
-- each argument over its limit is refused
SELECT status FROM ds_run_step('limits', 'sql', 'SELECT ' || repeat('1+', 600) || '1');
SELECT status FROM ds_run_step('limits', 'input', 'SELECT 1', jsonb_build_object('pad', repeat('x', 2000)));
SELECT status FROM ds_run_step('limits', 'hook', 'SELECT 1',
                               on_success => 'SELECT ' || repeat('1+', 600) || '1');
SELECT status FROM ds_run_step('limits', 'defer', 'SELECT 1', jsonb_build_object('pad', repeat('x', 2000)),
                               defer => true);
SELECT status FROM ds_http_step('limits', 'request',
    jsonb_build_object('url', 'http://a.example/', 'json', jsonb_build_object('pad', repeat('x', 2000))));
SELECT created FROM ds_start_run('limits_flow', jsonb_build_object('pad', repeat('x', 2000)));
SELECT ds_emit_event('limits-event', jsonb_build_object('pad', repeat('x', 2000)));
-- a re-armed step's new input too
SELECT status FROM ds_run_step('limits', 'small', $$SELECT ds_blocked('needs a person', 'Fix it.')$$, '{}');
SELECT status FROM ds_retry_step('limits', 'small', jsonb_build_object('pad', repeat('x', 2000)));
-- within the limits all is as usual
SELECT status FROM ds_run_step('limits', 'fits', 'SELECT 1', jsonb_build_object('pad', repeat('x', 100)));
SELECT ds_emit_event('limits-event', jsonb_build_object('pad', repeat('x', 100)));
RESET ROLE;
-- nothing of the refused calls was stored
SELECT step_id, status FROM ds_steps WHERE run_id = 'limits' ORDER BY step_id;
SELECT count(*) AS runs FROM durable_steps.runs WHERE workflow LIKE '%limits_flow%';
SELECT name, length(payload->>'pad') AS pad FROM durable_steps.events WHERE name = 'limits-event';
RESET ALL;

DELETE FROM durable_steps.steps WHERE run_id = 'limits';
DELETE FROM durable_steps.events WHERE name = 'limits-event';
DROP FUNCTION limits_flow(text, jsonb);
DROP ROLE limits_alice;
