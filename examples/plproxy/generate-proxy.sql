-- generate-proxy.sql -- the proxy database's durable_steps functions, read from the catalog of a
-- partition server (examples/plproxy/README.md).
--
--     psql -X -At -v ON_ERROR_STOP=1 -f generate-proxy.sql 'host=ds-a dbname=app' > proxy.sql
--     psql -X -v ON_ERROR_STOP=1 -f proxy.sql 'host=proxy dbname=app'
--
-- Every function and view of the extension's schema that belongs to the extension (pg_depend,
-- deptype 'e') gets a proxy of the same name, arguments, defaults and result, in a schema of the
-- same name on the proxy, so that an application calls the proxy exactly as it calls a server.
-- The route of each is decided below by name (routes); a function of the extension that has no
-- route stops the generation: a new function is routed by a decision, never by accident.
--
-- What it writes (one transaction, run again after an upgrade of the extension):
--   * the extension's composite types (ds_step_result), so that proxies return them;
--   * schema ds_proxy: route_key(text), the hash of a run key or a random one, and one RUN ON
--     ALL function per broadcast function and per view;
--   * the proxies, in the extension's schema; the views over ds_proxy's functions.
-- The cluster they run on is 'durable_steps' (cluster-config.sh writes it).
\set QUIET on
SET search_path = pg_catalog;

-- Routes, by function name:
--   run_id     RUN ON hashtext(run_id): the server owning the run's partition
--   run_key    RUN ON ds_proxy.route_key(run_key): a key's partition, or any partition for none
--   key        RUN ON hashtext(key): the server owning the idempotency key's partition
--   any        RUN ON ANY: a pure function, the same answer everywhere
--   all        RUN ON ALL: a broadcast; the proxy answers with the answers combined (combine)
--   all_rows   RUN ON ALL: every server's rows
--   local      not forwarded: meaningful only inside a step or workflow on a server
--   worker     not forwarded: a task worker connects to each partition server itself
--   admin      not forwarded: run on each server directly, as a superuser
CREATE TEMP TABLE routes (name text PRIMARY KEY, route text NOT NULL, combine text) ON COMMIT PRESERVE ROWS;
INSERT INTO routes VALUES
    ('ds_run_step', 'run_id', NULL), ('ds_retry_step', 'run_id', NULL),
    ('ds_cancel_step', 'run_id', NULL), ('ds_http_step', 'run_id', NULL),
    ('ds_task_step', 'run_id', NULL), ('ds_start_map', 'run_id', NULL),
    ('ds_resolve_step', 'run_id', NULL), ('ds_cancel_run', 'run_id', NULL),
    ('ds_resume_run', 'run_id', NULL), ('ds_wait_step', 'run_id', NULL),
    ('ds_wait_run', 'run_id', NULL), ('ds_partition_of', 'run_id', NULL),
    ('ds_start_run', 'run_key', NULL),
    ('ds_idempotent', 'key', NULL), ('ds_idempotent_begin', 'key', NULL),
    ('ds_idempotent_finish', 'key', NULL), ('ds_idempotent_abandon', 'key', NULL),
    ('ds_idempotent_renew', 'key', NULL),
    ('ds_retry_policy', 'any', NULL), ('ds_backoff_delay', 'any', NULL),
    ('ds_cron_slots', 'any', NULL), ('ds_unwrap', 'any', NULL),
    -- an event is every server's: each records it, the first emit wins on each (true: this call
    -- recorded it on at least one server, which a repeated broadcast after a failure needs)
    ('ds_emit_event', 'all', 'bool_or(r)'),
    -- a queue's concurrency is each server's
    ('ds_set_queue', 'all', 'NULL::void'),
    -- and so is a limit: each server admits its own steps by it (docs/limits.md)
    ('ds_set_rate_limit', 'all', 'NULL::void'), ('ds_set_concurrency_limit', 'all', 'NULL::void'),
    ('ds_drop_limit', 'all', 'bool_or(r)'),
    ('ds_stats', 'all_rows', NULL), ('ds_attempt_minutes', 'all_rows', NULL),
    -- inside a step body or a workflow, which runs on the server
    ('ds_key', 'local', NULL), ('ds_idempotency_key', 'local', NULL),
    ('ds_attempt_key', 'local', NULL), ('ds_attempt_number', 'local', NULL),
    ('ds_max_attempts', 'local', NULL), ('ds_run_id', 'local', NULL),
    ('ds_step_id', 'local', NULL), ('ds_non_retriable', 'local', NULL),
    ('ds_retry_after', 'local', NULL), ('ds_blocked', 'local', NULL),
    ('ds_step', 'local', NULL), ('ds_http', 'local', NULL), ('ds_sleep', 'local', NULL),
    ('ds_await_event', 'local', NULL), ('ds_patched', 'local', NULL), ('ds_task', 'local', NULL),
    ('ds_map', 'local', NULL), ('ds_start_child_run', 'local', NULL), ('ds_join_child', 'local', NULL),
    ('ds_start_child', 'local', NULL),
    ('ds_app_workflow', 'local', NULL),
    -- a task worker serves the tasks of one server, connected to it: its claims, waits and
    -- outcomes commit there, the outcome with the handler's own writes (docs/tasks.md)
    ('ds_claim_tasks', 'worker', NULL), ('ds_wait_for_tasks', 'worker', NULL),
    ('ds_heartbeat', 'worker', NULL), ('ds_complete_task', 'worker', NULL),
    ('ds_complete_tasks', 'worker', NULL), ('ds_fail_task', 'worker', NULL),
    ('ds_release_task', 'worker', NULL),
    -- an application workflow's worker claims its steps, and declares its workflows, on the
    -- server it serves (docs/app-workflows.md)
    ('ds_claim_task', 'worker', NULL), ('ds_define_workflow', 'worker', NULL),
    -- a schedule is a pg_cron job of one server; moving partitions is a superuser's, per server
    ('ds_schedule', 'admin', NULL), ('ds_unschedule', 'admin', NULL),
    ('ds_schedule_fire', 'admin', NULL), ('ds_partition_export', 'admin', NULL),
    ('ds_partition_import', 'admin', NULL), ('ds_partition_drop', 'admin', NULL);

CREATE TEMP VIEW ext_functions AS
SELECT p.oid, p.proname AS name, n.nspname AS schema, p.proretset AS retset,
       p.prorettype::regtype::text AS rettype,
       pg_get_function_arguments(p.oid) AS args,
       pg_get_function_result(p.oid) AS result,
       r.route, r.combine
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'durable_steps'
  JOIN pg_proc p ON p.oid = d.objid
  JOIN pg_namespace n ON n.oid = p.pronamespace AND n.oid = e.extnamespace
  LEFT JOIN routes r ON r.name = p.proname
 WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e';

DO $$
DECLARE
    missing text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'durable_steps') THEN
        RAISE EXCEPTION 'durable_steps is not installed in this database';
    END IF;
    SELECT string_agg(oid::regprocedure::text, ', ') INTO missing FROM ext_functions WHERE route IS NULL;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'functions of durable_steps without a route: %', missing
            USING HINT = 'Decide their route in the routes table of generate-proxy.sql.';
    END IF;
END
$$;

-- The extension's relations a proxy shows: its composite types and its views, with their columns.
-- A role is a name on the proxy (regrole is an OID of the server's catalog): regrole columns are text.
CREATE TEMP VIEW ext_relations AS
SELECT c.oid, c.relname AS name, c.relkind AS kind, n.nspname AS schema,
       string_agg(format('%I %s', a.attname,
                         CASE WHEN a.atttypid = 'regrole'::regtype THEN 'text'
                              ELSE format_type(a.atttypid, a.atttypmod) END), ', ' ORDER BY a.attnum) AS columns,
       string_agg(CASE WHEN a.atttypid = 'regrole'::regtype THEN format('v.%1$I::text AS %1$I', a.attname)
                       ELSE format('v.%I', a.attname) END, ', ' ORDER BY a.attnum) AS select_list
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'durable_steps'
  JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid AND t.typtype = 'c'
  JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.oid = e.extnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
 GROUP BY c.oid, c.relname, c.relkind, n.nspname
UNION ALL
SELECT c.oid, c.relname, c.relkind, n.nspname,
       string_agg(format('%I %s', a.attname,
                         CASE WHEN a.atttypid = 'regrole'::regtype THEN 'text'
                              ELSE format_type(a.atttypid, a.atttypmod) END), ', ' ORDER BY a.attnum),
       string_agg(CASE WHEN a.atttypid = 'regrole'::regtype THEN format('v.%1$I::text AS %1$I', a.attname)
                       ELSE format('v.%I', a.attname) END, ', ' ORDER BY a.attnum)
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'durable_steps'
  JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid AND c.relkind = 'v'
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.oid = e.extnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
 GROUP BY c.oid, c.relname, c.relkind, n.nspname;

\pset format unaligned
\pset tuples_only on
SELECT format('-- durable_steps %s proxies, generated by examples/plproxy/generate-proxy.sql from %s',
              (SELECT extversion FROM pg_extension WHERE extname = 'durable_steps'), current_database());
SELECT 'BEGIN;';
SELECT 'CREATE EXTENSION IF NOT EXISTS plproxy;';
SELECT format('CREATE SCHEMA IF NOT EXISTS %I;', nspname)
  FROM pg_namespace WHERE oid = (SELECT extnamespace FROM pg_extension WHERE extname = 'durable_steps');
SELECT 'CREATE SCHEMA IF NOT EXISTS ds_proxy;';
-- a run started without a key lands on any partition: the server owning it draws an id of its own
SELECT $q$CREATE OR REPLACE FUNCTION ds_proxy.route_key(run_key text) RETURNS integer
    LANGUAGE sql VOLATILE
    RETURN coalesce(pg_catalog.hashtext(run_key), (pg_catalog.random() * 2147483647)::integer);$q$;

-- a run again replaces what the last one made: views first (they depend on the functions)
SELECT format('DROP VIEW IF EXISTS %I.%I;', schema, name) FROM ext_relations WHERE kind = 'v' ORDER BY name;
-- every function of each routed name, whatever its arguments: a release that gives a function
-- another signature leaves none of the old proxy's behind (two would make its calls ambiguous)
SELECT format($d$DO $$DECLARE f pg_catalog.regprocedure; BEGIN FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p WHERE p.pronamespace = %L::pg_catalog.regnamespace AND p.proname = %L LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP; END$$;$d$,
              schema, name)
  FROM (SELECT DISTINCT schema, name FROM ext_functions WHERE route NOT IN ('local', 'admin', 'worker')) f
 ORDER BY name;
SELECT format('DROP TYPE IF EXISTS %I.%I;', schema, name) FROM ext_relations WHERE kind = 'c' ORDER BY name;
SELECT format('CREATE TYPE %I.%I AS (%s);', schema, name, columns) FROM ext_relations WHERE kind = 'c' ORDER BY name;

-- forwarded as they are
SELECT format(E'CREATE FUNCTION %I.%I(%s)\n    RETURNS %s\n    LANGUAGE plproxy AS $p$\n    CLUSTER %L;\n    RUN ON %s;\n$p$;',
              schema, name, args, result, 'durable_steps',
              CASE route WHEN 'run_id' THEN 'hashtext(run_id)'
                         WHEN 'run_key' THEN 'ds_proxy.route_key(run_key)'
                         WHEN 'key' THEN 'hashtext(key)'
                         WHEN 'any' THEN 'ANY'
                         WHEN 'all_rows' THEN 'ALL' END)
  FROM ext_functions WHERE route IN ('run_id', 'run_key', 'key', 'any', 'all_rows') ORDER BY name;

-- broadcasts: every server's answer through ds_proxy, combined by the proxy of the same name
SELECT format(E'CREATE OR REPLACE FUNCTION ds_proxy.%1$I(%2$s)\n    RETURNS SETOF %3$s\n    LANGUAGE plproxy AS $p$\n    CLUSTER %4$L;\n    RUN ON ALL;\n    TARGET %5$I.%1$I;\n$p$;\n'
              'CREATE FUNCTION %5$I.%1$I(%2$s)\n    RETURNS %6$s\n    LANGUAGE sql VOLATILE\n'
              '    BEGIN ATOMIC SELECT %7$s FROM ds_proxy.%1$I(%8$s) r; END;',
              name, args, CASE WHEN rettype = 'void' THEN 'text' ELSE rettype END, 'durable_steps', schema,
              result, combine,
              (SELECT string_agg(format('%I', a), ', ')
                 FROM unnest((SELECT proargnames FROM pg_proc WHERE pg_proc.oid = f.oid)) a))
  FROM ext_functions f WHERE route = 'all' ORDER BY name;

-- views: every server's rows (each holds its own partitions' runs, steps and attempts)
SELECT format(E'CREATE OR REPLACE FUNCTION ds_proxy.%1$I()\n    RETURNS TABLE (%2$s)\n    LANGUAGE plproxy AS $p$\n    CLUSTER %3$L;\n    RUN ON ALL;\n    SELECT %4$s FROM %5$I.%1$I v;\n$p$;\n'
              'CREATE VIEW %5$I.%1$I AS SELECT * FROM ds_proxy.%1$I();',
              name, columns, 'durable_steps', select_list, schema)
  FROM ext_relations WHERE kind = 'v' ORDER BY name;
SELECT format('GRANT SELECT ON %I.%I TO PUBLIC;', schema, name) FROM ext_relations WHERE kind = 'v' ORDER BY name;
SELECT 'GRANT USAGE ON SCHEMA ds_proxy TO PUBLIC;';
SELECT 'COMMIT;';
