-- durable_steps 0.1.0 to 0.2.0: the changes of 0.2.0 to an installed extension, in place.
\echo Use "ALTER EXTENSION durable_steps UPDATE" to load this file. \quit

-- Released scripts (sql/RELEASES) are never edited: every change to the schema of 0.2.0 goes
-- into this file, and a fresh CREATE EXTENSION runs durable_steps--0.1.0.sql and then this one,
-- so that a fresh install and an upgraded one are the same (docs/operations.md, "Upgrades").
--
-- The library of 0.2.0 reads and writes nothing of an extension still installed at 0.1.0 (DS426)
-- and its background worker waits: this script is what lets them carry on. It runs in the
-- transaction of the ALTER EXTENSION, so a failure leaves 0.1.0 as it was.

-- A holder of an idempotency key renews its lease while its work goes on
-- (docs/idempotent-requests.md, "Application code").
CREATE FUNCTION @extschema@.ds_idempotent_renew(
        scope text, key text, token uuid, lease interval DEFAULT '5 minutes')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'ds_idempotent_renew' LANGUAGE C VOLATILE;

-- ds_idempotent_begin gains `wait`: a repeat under a held key waits for its holder's finish,
-- abandon or lapsed lease (woken by the commit, not polling) rather than answering DS409 at once
-- (docs/idempotent-requests.md, "Application code"). Calls without it resolve as before.
DROP FUNCTION @extschema@.ds_idempotent_begin(text, text, jsonb, interval, interval);
CREATE FUNCTION @extschema@.ds_idempotent_begin(
        scope text,
        key text,
        request jsonb,
        ttl interval DEFAULT '24 hours',
        lease interval DEFAULT '5 minutes',
        wait interval DEFAULT NULL,
        OUT state text, OUT status integer, OUT body jsonb, OUT token uuid)
    AS 'MODULE_PATHNAME', 'ds_idempotent_begin' LANGUAGE C VOLATILE;

-- ds_stats() labels steps by queue only for the queues an administrator configured
-- (ds_set_queue) and 'default': any role names a queue when it stores a step, and a label per
-- name would let any role make the metrics' label sets as many as it likes. Every other queue's
-- steps are counted under the queue '(unconfigured)' (docs/operations.md, "Numbers for operators").
-- Runs waiting for a task (ds_task) are counted under the reason 'task'.
CREATE OR REPLACE FUNCTION @extschema@.ds_stats(
        OUT metric text, OUT queue text, OUT kind text, OUT label text, OUT value double precision)
    RETURNS SETOF record
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $$
WITH c AS (SELECT durable_steps.ds_step_counters() AS j),
live_by_queue AS (
    SELECT s.queue, s.kind, s.status, pg_catalog.count(*) AS n,
           pg_catalog.count(*) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
               AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS due,
           pg_catalog.min(s.next_attempt_at) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
               AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS oldest_due
      FROM durable_steps.steps s
     -- waiting and running steps, through the two indexes that hold them (steps_due_idx and
     -- steps_task_due_idx)
     WHERE s.next_attempt_at IS NOT NULL AND (s.task IS NULL OR s.task IS NOT NULL)
     GROUP BY s.queue, s.kind, s.status),
live AS (
    SELECT CASE WHEN l.queue OPERATOR(pg_catalog.=) 'default'
                  OR EXISTS (SELECT FROM durable_steps.queues q WHERE q.name OPERATOR(pg_catalog.=) l.queue)
                THEN l.queue ELSE '(unconfigured)' END AS queue,
           l.kind, l.status, pg_catalog.sum(l.n) AS n, pg_catalog.sum(l.due) AS due,
           pg_catalog.min(l.oldest_due) AS oldest_due
      FROM live_by_queue l
     GROUP BY 1, l.kind, l.status),
live_runs AS (
    SELECT r.status,
           CASE WHEN r.status OPERATOR(pg_catalog.<>) 'waiting' THEN NULL
                WHEN r.wait_event IS NOT NULL OR r.wait_reason LIKE 'event %' THEN 'event'
                WHEN r.wait_reason LIKE 'sleep %' THEN 'sleep'
                WHEN r.wait_reason LIKE 'http: %' THEN 'http step'
                WHEN r.wait_reason LIKE 'task: %' THEN 'task'
                WHEN r.wait_reason LIKE 'retry of step %' THEN 'step retry'
                WHEN r.wait_reason LIKE 'step % is blocked: %' THEN 'blocked step'
                WHEN r.wait_reason LIKE 'step %' OR r.wait_reason LIKE 'running step %' THEN 'step'
                WHEN r.wait_reason LIKE 'queue % is paused' THEN 'paused queue'
                WHEN r.wait_reason LIKE 'turn %' THEN 'lost turn'
                ELSE 'other' END AS reason
      FROM durable_steps.runs r
     WHERE r.status OPERATOR(pg_catalog.=) ANY ('{pending,waiting}'::text[])
    UNION ALL
    SELECT r.status, NULL FROM durable_steps.runs r WHERE r.status OPERATOR(pg_catalog.=) 'running')
SELECT 'steps', l.queue, l.kind, l.status, l.n::double precision FROM live l
UNION ALL
SELECT 'steps_due', l.queue, l.kind, NULL, pg_catalog.sum(l.due)::double precision
  FROM live l WHERE l.status OPERATOR(pg_catalog.<>) 'running' GROUP BY l.queue, l.kind
UNION ALL
SELECT 'oldest_due_seconds', l.queue, l.kind, NULL,
       coalesce(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()
                OPERATOR(pg_catalog.-) pg_catalog.min(l.oldest_due)), 0)
  FROM live l WHERE l.status OPERATOR(pg_catalog.<>) 'running' GROUP BY l.queue, l.kind
UNION ALL
SELECT 'runs', NULL, NULL, r.status, pg_catalog.count(*)::double precision
  FROM live_runs r GROUP BY r.status
UNION ALL
SELECT 'runs_waiting', NULL, NULL, r.reason, pg_catalog.count(*)::double precision
  FROM live_runs r WHERE r.status OPERATOR(pg_catalog.=) 'waiting' GROUP BY r.reason
UNION ALL
SELECT m.metric, NULL, k.key, v.key, v.value::text::double precision
  FROM c, (VALUES ('attempts_total', 'attempts'), ('attempts_last_minute', 'recent'),
                  ('attempt_outcomes_total', 'outcomes')) m(metric, field),
       pg_catalog.jsonb_each(c.j OPERATOR(pg_catalog.->) m.field) k,
       pg_catalog.jsonb_each(k.value) v
UNION ALL
SELECT 'lost_attempts_total', NULL, k.key, NULL, k.value::text::double precision
  FROM c, pg_catalog.jsonb_each(c.j OPERATOR(pg_catalog.->) 'lost') k
UNION ALL
SELECT 'http_responses_total', NULL, 'http', h.key, h.value::text::double precision
  FROM c, pg_catalog.jsonb_each(c.j OPERATOR(pg_catalog.->) 'http') h
UNION ALL
SELECT w.metric, NULL, NULL, NULL, (c.j OPERATOR(pg_catalog.->>) w.field)::double precision
  FROM c, (VALUES ('executors', 'executors'), ('executors_busy', 'executors_busy'),
                  ('http_workers', 'http_workers'), ('counters_since', 'since')) w(metric, field)
 WHERE c.j IS NOT NULL
UNION ALL
-- the steps waiting for a person, through steps_attention_idx: every status, 0 included, so
-- that an alert sees the count fall back
SELECT 'steps_needing_person', NULL, NULL, st.status,
       (SELECT pg_catalog.count(*) FROM durable_steps.steps s
         WHERE s.error_class OPERATOR(pg_catalog.=) ANY ('{correctable,uncertain,exhausted,permanent,timeout}'::text[])
           AND s.status OPERATOR(pg_catalog.=) st.status)::double precision
  FROM pg_catalog.unnest('{blocked,uncertain,failed}'::text[]) st(status)
UNION ALL
-- which database these figures are of: every other row is this database's, but the counters of
-- the shared memory (attempts_*, attempt_outcomes_total, lost_attempts_total,
-- http_responses_total, counters_since) are the whole server's
SELECT 'database', NULL, NULL, pg_catalog.current_database()::text, 1
$$;

-- The steps that need a person -- blocked, uncertain, failed -- by the class their last failure
-- left (a re-armed step keeps it until its next outcome: its status tells). The operator's
-- console reads its inbox here and ds_stats() counts them, never the history. Its key and its
-- predicate name error_class alone, which no claim changes: a claim stays a HOT update (a claim
-- writes updated_at, so an index on it would make every claim write an entry in every index).
CREATE INDEX steps_attention_idx ON durable_steps.steps (error_class)
    WHERE error_class IN ('correctable', 'uncertain', 'exhausted', 'permanent', 'timeout');

-- The attempts of each minute of the last hour, by class, from the counters of the shared
-- memory (since the server started): what the operator's console draws (docs/console.md). The
-- whole server's, as ds_stats()'s counters are: for pg_monitor and durable_steps_admin.
CREATE FUNCTION @extschema@.ds_attempt_minutes(OUT minute timestamptz, OUT class text, OUT attempts bigint)
    RETURNS SETOF record
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
SELECT pg_catalog.to_timestamp(m.key::double precision), c.key, c.value::text::bigint
  FROM pg_catalog.jsonb_each(durable_steps.ds_step_counters() OPERATOR(pg_catalog.->) 'minutes') m,
       pg_catalog.jsonb_each(m.value) c
 WHERE c.value::text::bigint OPERATOR(pg_catalog.>) 0
 ORDER BY 1, 2
$$;
REVOKE ALL ON FUNCTION @extschema@.ds_attempt_minutes() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.ds_attempt_minutes() TO pg_monitor, durable_steps_admin;

-- The partitions in force for every process: a backend reads the configuration file only
-- between client statements, so a procedure that commits in a loop kept writing a partition
-- fenced meanwhile. Each process now publishes the partitions of the reload it took in shared
-- memory, and every check of a run's or a key's partition asks it too; an export publishes its
-- own first, and then waits only for the transactions open since (docs/partitions.md).
CREATE FUNCTION durable_steps.ds_partitions_in_force_publish() RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'ds_partitions_in_force_publish_now' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION durable_steps.ds_partitions_in_force_publish() FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.ds_partition_export(p integer, OUT n bigint, OUT line jsonb)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_count integer := pg_catalog.current_setting('durable_steps.partition_count')::integer;
    v_busy text;
    v_fenced_at timestamptz;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION 'permission denied for ds_partition_export' USING ERRCODE = '42501',
            DETAIL = 'Moving a partition reads and writes every role''s steps: only a superuser may.';
    END IF;
    IF v_count OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'this server is not partitioned'
            USING ERRCODE = '55000', HINT = 'Set durable_steps.partition_count and durable_steps.partitions first.';
    END IF;
    IF p IS NULL OR p OPERATOR(pg_catalog.<) 0 OR p OPERATOR(pg_catalog.>=) v_count THEN
        RAISE EXCEPTION 'partition % does not exist', p
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('durable_steps.partition_count is %s.', v_count);
    END IF;
    IF p OPERATOR(pg_catalog.=) ANY (pg_catalog.string_to_array(
            pg_catalog.replace(pg_catalog.current_setting('durable_steps.partitions'), ' ', ''), ',')::integer[]) THEN
        RAISE EXCEPTION 'partition % is not fenced: this server still owns it', p
            USING ERRCODE = '55000',
                  HINT = 'Remove it from durable_steps.partitions (ALTER SYSTEM, pg_reload_conf()) first.';
    END IF;
    -- The fence in force for every process from now on: a transaction that begins after this
    -- is refused the partition (DS201) whatever settings its session began with -- a procedure
    -- that commits in a loop included. One open since before may still store a step of it.
    -- the backends' transactions are seen through pg_stat_activity: not without it
    IF NOT pg_catalog.current_setting('track_activities')::boolean THEN
        RAISE EXCEPTION 'ds_partition_export needs track_activities'
            USING ERRCODE = '55000',
                  DETAIL = 'Without it no backend shows when its transaction began, and one that may still write the partition would go unseen.',
                  HINT = 'Turn track_activities on (the default) and reload.';
    END IF;
    v_fenced_at := durable_steps.ds_partitions_in_force_publish();
    SELECT pg_catalog.string_agg(a.pid::text, ', ') INTO v_busy
      FROM pg_catalog.pg_stat_activity a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND a.xact_start OPERATOR(pg_catalog.<) v_fenced_at;
    IF v_busy IS NOT NULL THEN
        RAISE EXCEPTION 'transactions open since before the fence may still write partition %', p
            USING ERRCODE = 'DS409', DETAIL = pg_catalog.format('Backends %s.', v_busy),
                  HINT = 'Let them end (or end them), then export again.';
    END IF;
    -- a prepared transaction keeps what it wrote until it is committed, whenever that is: it
    -- may hold a step or an idempotency key of the partition (pg_stat_activity does not list it)
    SELECT pg_catalog.string_agg(pg_catalog.quote_literal(x.gid), ', ') INTO v_busy
      FROM pg_catalog.pg_prepared_xacts x
     WHERE x.database OPERATOR(pg_catalog.=) pg_catalog.current_database();
    IF v_busy IS NOT NULL THEN
        RAISE EXCEPTION 'prepared transactions may still write partition %', p
            USING ERRCODE = 'DS409', DETAIL = pg_catalog.format('Prepared transactions %s.', v_busy),
                  HINT = 'COMMIT PREPARED or ROLLBACK PREPARED them (Citus resolves its own), then export again.';
    END IF;
    -- a worker that has not taken the fence yet may still claim a step of the partition
    SELECT pg_catalog.array_to_string(durable_steps.ds_partition_workers_behind(), ', ') INTO v_busy;
    IF v_busy OPERATOR(pg_catalog.<>) '' THEN
        RAISE EXCEPTION 'worker processes have not taken the fence of partition % yet', p
            USING ERRCODE = 'DS409', DETAIL = pg_catalog.format('Processes %s serve the partitions of the settings before the reload.', v_busy),
                  HINT = 'Each takes a reload between its claims: export again in a moment.';
    END IF;
    -- attempts and turns in flight finish here first: their locks are held until their outcomes
    -- commit (the running rows are read first, OFFSET 0, so that only their locks are tried); an
    -- HTTP outcome kept for an executor is recorded here first too, with its hook
    SELECT pg_catalog.string_agg(b.id, ', ') INTO v_busy
      FROM (SELECT s.run_id, s.step_id,
                   s.run_id OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) s.step_id AS id,
                   s.kept_outcome IS NOT NULL AS kept
              FROM durable_steps.steps s
             WHERE s.status OPERATOR(pg_catalog.=) 'running' AND s.next_attempt_at IS NOT NULL
               AND (s.task IS NULL OR s.task IS NOT NULL)
               AND (pg_catalog.hashtext(s.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p
            UNION ALL
            SELECT r.run_id, '', 'run ' OPERATOR(pg_catalog.||) r.run_id, false
              FROM durable_steps.runs r
             WHERE r.status OPERATOR(pg_catalog.=) 'running'
               AND (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p
            OFFSET 0) b
     WHERE b.kept OR NOT durable_steps.ds_partition_step_idle(b.run_id, b.step_id);
    IF v_busy IS NOT NULL THEN
        RAISE EXCEPTION 'partition % has attempts in flight', p
            USING ERRCODE = 'DS409', DETAIL = pg_catalog.format('In flight: %s.', v_busy),
                  HINT = 'They finish within their timeouts; export again then.';
    END IF;
    RETURN QUERY
    WITH r AS (SELECT r FROM durable_steps.runs r
                WHERE (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p),
         s AS (SELECT s FROM durable_steps.steps s
                WHERE (pg_catalog.hashtext(s.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p),
         a AS (SELECT a FROM durable_steps.attempts a
                WHERE (pg_catalog.hashtext(a.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p),
         e AS (SELECT e FROM durable_steps.events e),
         -- a key of a role dropped while connected to another database can never be answered
         -- again (a role is answered only its own keys): left behind, for ds_partition_drop
         k AS (SELECT k FROM durable_steps.idempotency_keys k
                WHERE (pg_catalog.hashtext(k.key) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p
                  AND EXISTS (SELECT FROM pg_catalog.pg_roles o WHERE o.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid)),
         body AS (SELECT 'runs' AS t, pg_catalog.to_jsonb(r.r) AS j FROM r
                  UNION ALL SELECT 'steps', pg_catalog.to_jsonb(s.s) FROM s
                  UNION ALL SELECT 'attempts', pg_catalog.to_jsonb(a.a) FROM a
                  UNION ALL SELECT 'events', pg_catalog.to_jsonb(e.e) FROM e
                  UNION ALL SELECT 'idempotency_keys', pg_catalog.to_jsonb(k.k) FROM k),
         counts AS (SELECT pg_catalog.jsonb_build_object(
                               'runs', (SELECT pg_catalog.count(*) FROM r),
                               'steps', (SELECT pg_catalog.count(*) FROM s),
                               'attempts', (SELECT pg_catalog.count(*) FROM a),
                               'events', (SELECT pg_catalog.count(*) FROM e),
                               'idempotency_keys', (SELECT pg_catalog.count(*) FROM k)) AS c)
    SELECT 0::bigint, pg_catalog.jsonb_build_object('ds_partition_export', 1, 'partition', p,
               'partition_count', v_count, 'exported_at', pg_catalog.clock_timestamp(),
               'counts', counts.c)
      FROM counts
    UNION ALL
    SELECT pg_catalog.row_number() OVER (), pg_catalog.jsonb_build_object('table', body.t, 'row', body.j)
      FROM body
    UNION ALL
    SELECT (SELECT pg_catalog.count(*) FROM body) OPERATOR(pg_catalog.+) 1,
           pg_catalog.jsonb_build_object('ds_partition_end', p, 'counts', counts.c)
      FROM counts;
END
$$;

-- Claims read each (queue, priority) group of steps, and the runs' turns, from a floor kept in
-- shared memory, past the entries of finished steps and turns that an old snapshot keeps
-- (docs/internals.md, "Claims under a held horizon"). The extension's own writes note the steps
-- and runs they make wait; any other SQL that writes them (a restore, ds_partition_import, an
-- operator's UPDATE) may have made any wait, and sends every floor of its database back to its
-- start when it ends. ENABLE ALWAYS: also under session_replication_role = replica.
CREATE FUNCTION durable_steps.ds_note_step_writes() RETURNS trigger
    AS 'MODULE_PATHNAME', 'ds_note_step_writes' LANGUAGE C;
REVOKE ALL ON FUNCTION durable_steps.ds_note_step_writes() FROM PUBLIC;
CREATE TRIGGER steps_note_writes AFTER INSERT OR UPDATE ON durable_steps.steps
    FOR EACH STATEMENT EXECUTE FUNCTION durable_steps.ds_note_step_writes();
ALTER TABLE durable_steps.steps ENABLE ALWAYS TRIGGER steps_note_writes;
-- The same for the runs' turns, claimed from runs_due_idx.
CREATE TRIGGER runs_note_writes AFTER INSERT OR UPDATE ON durable_steps.runs
    FOR EACH STATEMENT EXECUTE FUNCTION durable_steps.ds_note_step_writes();
ALTER TABLE durable_steps.runs ENABLE ALWAYS TRIGGER runs_note_writes;

-- Retention's BRIN index on created_at: new page ranges are summarized by VACUUM, which the steps
-- table gets often, rather than by autosummarize, whose requests overflow autovacuum's queue at
-- thousands of steps a second and log "request for BRIN range summarization ... was not
-- recorded" each time. A purge reads the few ranges not yet summarized whole, as it would.
ALTER INDEX durable_steps.steps_created_idx SET (autosummarize = off);

-- Tasks (docs/tasks.md): steps whose body is application code, claimed by workers outside the
-- database. `task` names the handler (NULL for every other kind of step); `on_lost` says what a
-- lease that ran out means ('uncertain': a person decides; NULL: a lost attempt, retried);
-- `worker` names the worker that claimed the attempt now running.
ALTER TABLE durable_steps.steps
    ADD COLUMN task text COLLATE "C",
    ADD COLUMN on_lost text,
    ADD COLUMN worker text;

-- A SQL step called with expect => 'row' (true): a body that returns no row fails (DS008,
-- correctable) rather than succeeding with NULL (docs/steps.md, "Expecting a row"). NULL for
-- every other step, so that it takes no byte of their rows.
ALTER TABLE durable_steps.steps ADD COLUMN expect_row boolean;

-- Waiting tasks are claimed by name (ds_claim_tasks), from an index of their own: the
-- executors' index holds no task, so that a backlog of tasks waiting for application workers is
-- never read by a claim of SQL steps, nor SQL steps by a claim of tasks. Neither predicate
-- names a column a claim changes: a claim of a SQL step stays a HOT update.
DROP INDEX durable_steps.steps_due_idx;
CREATE INDEX steps_due_idx ON durable_steps.steps (queue, priority, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND task IS NULL;
-- By owner within a name: a claim reads the ranges of the roles it may run tasks of, and one
-- role's backlog is never read by another role's claims.
CREATE INDEX steps_task_due_idx ON durable_steps.steps (task, owner, priority, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND task IS NOT NULL;

-- The limit that admits a step's attempts, and its key: see "Limits" below.
ALTER TABLE durable_steps.steps
    ADD COLUMN limit_name text COLLATE "C",
    ADD COLUMN limit_key text COLLATE "C",
    ADD COLUMN limit_not_before timestamptz,
    ADD COLUMN limit_admitted integer,
    -- an item of a map (ds_map): the map's step id in the same run; NULL for every other step
    ADD COLUMN map_step text COLLATE "C";
-- The held steps of each key, by role, in the order they may be admitted (the roles take turns:
-- one role's backlog is never read past for another's); and the admitted ones (due or
-- running), counted against the key's concurrency. Neither names a column that a step of no
-- limit ever changes: the claims of other steps stay HOT updates.
CREATE INDEX steps_limit_held_idx ON durable_steps.steps (limit_name, limit_key, owner, limit_not_before)
    WHERE limit_not_before IS NOT NULL;
CREATE INDEX steps_limit_admitted_idx ON durable_steps.steps (limit_name, limit_key)
    WHERE limit_admitted IS NOT NULL;
-- The items of each map that have not settled: waiting, running or held. A map whose items are
-- all out of it is joined (src/runs/run_map.c). A claim changes none of its columns.
CREATE INDEX steps_map_open_idx ON durable_steps.steps (run_id, map_step)
    WHERE map_step IS NOT NULL AND (next_attempt_at IS NOT NULL OR limit_not_before IS NOT NULL);

-- The views read waiting and running steps through both indexes, and show the tasks' columns.
CREATE OR REPLACE VIEW @extschema@.ds_steps WITH (security_barrier) AS
    SELECT s.run_id, s.step_id, s.kind, s.status, s.result,
           s.attempts AS attempt, s.attempt_base OPERATOR(pg_catalog.+) s.max_attempts AS max_attempts,
           s.next_attempt_at, s.error_class, s.error_code, s.error_message, s.error_detail,
           s.remediation, s.sql, s.input,
           -- secret header values are the owner's alone (docs/http.md)
           CASE WHEN pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE') THEN s.request
                ELSE durable_steps.ds_http_mask_request(s.request) END AS request,
           s.idempotency_header,
           @extschema@.ds_retry_policy(s.max_attempts,
               s.retry_initial_delay OPERATOR(pg_catalog.*) interval '1 microsecond',
               s.retry_max_delay OPERATOR(pg_catalog.*) interval '1 microsecond',
               CASE WHEN s.retry_exponential THEN 'exponential' ELSE 'fixed' END,
               s.retry_multiplier, s.retry_jitter) AS policy,
           s.timeout, s.on_timeout,
           s.retry_on, s.fail_on, s.notify, s.on_success, s.on_failure, s.queue, s.priority,
           -- a hash of the whole definition, masked secrets included: the owner's alone, or an
           -- admin could confirm a guessed secret by hashing a definition of its own
           CASE WHEN pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE') THEN s.fingerprint END
               AS fingerprint,
           s.owner,
           s.created_at, s.updated_at, s.finished_at,
           -- tasks (docs/tasks.md): the handler's name, what a lost lease means, and the
           -- worker that claimed the attempt now running
           s.task, coalesce(s.on_lost, CASE WHEN s.task IS NOT NULL THEN 'retry' END) AS on_lost,
           s.worker,
           -- 'row': a body that returns no row fails (docs/steps.md, "Expecting a row")
           CASE WHEN s.expect_row THEN 'row' END AS expect,
           -- a running task's lease: until when its worker's last heartbeat holds it
           CASE WHEN s.task IS NOT NULL AND s.status OPERATOR(pg_catalog.=) 'running'
                THEN s.lease_expires_at END AS lease_expires_at,
           -- the limit that admits its attempts and its key (docs/limits.md); while it waits
           -- for its admission, from when it may be admitted
           s.limit_name AS "limit", s.limit_key, s.limit_not_before AS held_from
      FROM durable_steps.steps s
     WHERE pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE')
        OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE');

CREATE OR REPLACE VIEW @extschema@.ds_attempts WITH (security_barrier) AS
    SELECT a.run_id, a.step_id, a.attempt, a.class, a.error_code, a.error_message,
           a.error_detail, a.claimed_at, a.started_at, a.finished_at,
           a.finished_at OPERATOR(pg_catalog.-) a.started_at AS duration,
           -- NULL where no key was sent: an HTTP step without an idempotency header
           CASE WHEN k.keyless THEN NULL ELSE k.step_key END AS idempotency_key,
           k.step_key OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) a.attempt::text AS attempt_key,
           a.executor, a.backend_pid, a.role
      FROM (SELECT run_id, step_id, attempt, class, error_code, error_message, error_detail,
                   claimed_at, started_at, finished_at, executor, backend_pid, role
              FROM durable_steps.attempts
            UNION ALL
            -- the attempt a worker has claimed and is running: its step's row records it
            SELECT run_id, step_id, attempts, NULL, NULL, NULL, NULL, updated_at, updated_at,
                   NULL, 'worker', claimed_by, owner
              FROM durable_steps.steps
             WHERE status OPERATOR(pg_catalog.=) 'running' AND next_attempt_at IS NOT NULL
               AND (task IS NULL OR task IS NOT NULL)
            UNION ALL
            -- a worker's attempt that succeeded: its step's row records it too
            SELECT run_id, step_id, attempts, 'completed', NULL, NULL, NULL, attempt_claimed_at,
                   attempt_started_at, finished_at, 'worker', claimed_by, owner
              FROM durable_steps.steps
             WHERE attempt_started_at IS NOT NULL) a,
           -- the keys ds_idempotency_key() and ds_attempt_key() handed to the attempt, and the
           -- one its HTTP request carried (docs/steps.md, "Keys")
           LATERAL (SELECT durable_steps.ds_step_key(a.run_id, a.step_id) AS step_key,
                           EXISTS (SELECT FROM durable_steps.steps ks
                                    WHERE ks.run_id OPERATOR(pg_catalog.=) a.run_id
                                      AND ks.step_id OPERATOR(pg_catalog.=) a.step_id
                                      AND ks.kind OPERATOR(pg_catalog.=) 'http'
                                      AND ks.idempotency_header IS NULL) AS keyless) k
     WHERE pg_catalog.pg_has_role(a.role::pg_catalog.oid, 'USAGE')
        OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE');

CREATE OR REPLACE VIEW @extschema@.ds_queues WITH (security_barrier) AS
    SELECT coalesce(q.name, c.queue) AS queue, q.concurrency,
           coalesce(c.running, 0) AS running, coalesce(c.due, 0) AS due,
           coalesce(c.scheduled, 0) AS scheduled, q.updated_at
      FROM durable_steps.queues q
      FULL JOIN (SELECT s.queue,
                        pg_catalog.count(*) FILTER (WHERE s.status OPERATOR(pg_catalog.=) 'running') AS running,
                        pg_catalog.count(*) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
                            AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS due,
                        pg_catalog.count(*) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
                            AND s.next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS scheduled
                   FROM durable_steps.steps s
                  WHERE s.status OPERATOR(pg_catalog.=) ANY ('{pending,retrying,running}'::text[])
                    AND s.next_attempt_at IS NOT NULL AND (s.task IS NULL OR s.task IS NOT NULL)
                    AND (pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE')
                         OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE'))
                  GROUP BY s.queue) c
        ON c.queue OPERATOR(pg_catalog.=) q.name;

-- Tasks (docs/tasks.md). A task is stored with the caller's transaction; an application worker
-- claims it by name, outside any transaction block, and records its outcome in a transaction
-- of its own, with the handler's writes. Every call after the claim names the attempt by the
-- token the claim returned, and acts only while that attempt holds an unexpired lease (DS410).
CREATE FUNCTION @extschema@.ds_task_step(
        run_id text,
        step_id text,
        task text,
        input jsonb DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        queue text DEFAULT 'default',
        priority integer DEFAULT 0,
        run_at timestamptz DEFAULT NULL,
        timeout interval DEFAULT NULL,
        notify text DEFAULT NULL,
        on_success text DEFAULT NULL,
        on_failure text DEFAULT NULL,
        on_lost text DEFAULT 'retry',
        nowait boolean DEFAULT false,
        expect text DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_task_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_claim_tasks(
        tasks text[],
        max integer DEFAULT 1,
        lease interval DEFAULT '30 s',
        worker text DEFAULT NULL,
        queues text[] DEFAULT NULL)
    RETURNS TABLE (run_id text, step_id text, task text, input jsonb, attempt integer,
                   max_attempts integer, idempotency_key text, attempt_key text, token text,
                   lease_expires_at timestamptz, deadline timestamptz)
    AS 'MODULE_PATHNAME', 'ds_claim_tasks' LANGUAGE C VOLATILE ROWS 10;
-- A procedure: outside a transaction block it commits before it sleeps, and holds no snapshot.
CREATE PROCEDURE @extschema@.ds_wait_for_tasks(
        tasks text[],
        timeout interval,
        queues text[] DEFAULT NULL,
        INOUT due boolean DEFAULT NULL)
    AS 'MODULE_PATHNAME', 'ds_wait_for_tasks' LANGUAGE C;
CREATE FUNCTION @extschema@.ds_heartbeat(token text, extend interval DEFAULT NULL,
        OUT held boolean, OUT cancelled boolean, OUT lease_expires_at timestamptz)
    AS 'MODULE_PATHNAME', 'ds_heartbeat' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_complete_task(token text, result jsonb DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_complete_task' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_fail_task(
        token text,
        error_code text,
        message text,
        detail text DEFAULT NULL,
        class text DEFAULT 'retryable',
        retry_after interval DEFAULT NULL,
        remediation text DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_fail_task' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_release_task(token text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_release_task' LANGUAGE C VOLATILE;

-- Tasks in SQL workflows (docs/tasks.md, "In SQL workflows"): ds_task acts on the current run,
-- inside its workflow, as ds_http does. The run waits for an application worker ('task: ...').
CREATE FUNCTION @extschema@.ds_task(
        step_id text,
        task text,
        input jsonb DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        queue text DEFAULT 'default',
        priority integer DEFAULT 0,
        timeout interval DEFAULT NULL,
        on_lost text DEFAULT 'retry')
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_task' LANGUAGE C VOLATILE;

-- Tasks: the successes of many attempts recorded in one statement, in the caller's transaction
-- (docs/tasks.md, "The lifecycle"); a token no longer holding its lease answers held = false.
CREATE FUNCTION @extschema@.ds_complete_tasks(tokens text[], results jsonb[])
    RETURNS TABLE (token text, status text, held boolean)
    AS 'MODULE_PATHNAME', 'ds_complete_tasks' LANGUAGE C VOLATILE;

-- ds_schedule_fire gains `now`: a trial firing that starts one run at once (docs/schedules.md,
-- "Trying a schedule"). The pg_cron jobs' commands name the function alone, and still resolve.
DROP FUNCTION @extschema@.ds_schedule_fire(text, timestamptz);
CREATE FUNCTION @extschema@.ds_schedule_fire(job_name text, fired_at timestamptz DEFAULT NULL,
    now boolean DEFAULT false) RETURNS integer
    AS 'MODULE_PATHNAME', 'ds_schedule_fire' LANGUAGE C VOLATILE;

-- ds_run_step and ds_step gain `expect`: 'row' makes a body that returns no row fail with DS008,
-- correctable, rather than succeed with NULL (docs/steps.md, "Expecting a row"). Calls that name
-- their arguments, or pass fewer, resolve as before.
DROP FUNCTION @extschema@.ds_run_step(text, text, text, jsonb, jsonb, interval, boolean, text[],
    text[], text, boolean, timestamptz, text, text, text, text, integer);
CREATE FUNCTION @extschema@.ds_run_step(
        run_id text,
        step_id text,
        sql text,
        input jsonb DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        timeout interval DEFAULT NULL,
        nowait boolean DEFAULT false,
        retry_on text[] DEFAULT NULL,
        fail_on text[] DEFAULT NULL,
        on_timeout text DEFAULT 'retry',
        defer boolean DEFAULT false,
        run_at timestamptz DEFAULT NULL,
        notify text DEFAULT NULL,
        on_success text DEFAULT NULL,
        on_failure text DEFAULT NULL,
        queue text DEFAULT 'default',
        priority integer DEFAULT 0,
        expect text DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_run_step' LANGUAGE C VOLATILE;
DROP FUNCTION @extschema@.ds_step(text, text, jsonb, jsonb, interval, text[], text[], text);
CREATE FUNCTION @extschema@.ds_step(
        step_id text,
        sql text,
        input jsonb DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        timeout interval DEFAULT NULL,
        retry_on text[] DEFAULT NULL,
        fail_on text[] DEFAULT NULL,
        on_timeout text DEFAULT 'retry',
        expect text DEFAULT NULL)
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_step' LANGUAGE C VOLATILE;

-- Application workflows (docs/app-workflows.md). A segment of a workflow written in Node or Python
-- is a task of its run, and the steps it runs are tasks of the same run that no worker claims by
-- name: the segment's holder claims each one's attempts itself, under its own lease.
CREATE FUNCTION @extschema@.ds_claim_task(holder text, step_id text, lease interval DEFAULT '30 s',
        worker text DEFAULT NULL,
        OUT status text, OUT result jsonb, OUT attempt integer, OUT max_attempts integer,
        OUT idempotency_key text, OUT attempt_key text, OUT token text,
        OUT lease_expires_at timestamptz, OUT deadline timestamptz, OUT next_attempt_at timestamptz,
        OUT error_code text, OUT error_message text)
    AS 'MODULE_PATHNAME', 'ds_claim_task' LANGUAGE C VOLATILE;

-- The SQL workflow that stands for an application workflow: each segment is a task
-- 'ds.workflow:<name>' that the application's worker runs, until one answers with the workflow's
-- output. A segment that must sleep, wait for an event, or wait for an HTTP step or a task that
-- the extension's workers run answers so, and the run sleeps or waits here, as a SQL workflow
-- does, between that segment and the next.
CREATE FUNCTION @extschema@.ds_app_workflow(workflow text, input jsonb, policy jsonb DEFAULT NULL)
    RETURNS jsonb LANGUAGE plpgsql AS $body$
DECLARE
    segment integer := 0;
    answer jsonb;
BEGIN
    LOOP
        segment := segment OPERATOR(pg_catalog.+) 1;
        answer := @extschema@.ds_task('ds.segment:' OPERATOR(pg_catalog.||) segment,
                                      'ds.workflow:' OPERATOR(pg_catalog.||) workflow, input, policy);
        CASE answer OPERATOR(pg_catalog.->>) 'then'
        WHEN 'return' THEN
            RETURN answer OPERATOR(pg_catalog.->) 'output';
        WHEN 'sleep' THEN
            PERFORM @extschema@.ds_sleep(answer OPERATOR(pg_catalog.->>) 'step',
                pg_catalog.make_interval(secs => (answer OPERATOR(pg_catalog.->>) 'ms')::float8
                                                 OPERATOR(pg_catalog./) 1000));
        WHEN 'event' THEN
            BEGIN
                PERFORM @extschema@.ds_await_event(answer OPERATOR(pg_catalog.->>) 'step',
                    answer OPERATOR(pg_catalog.->>) 'event',
                    pg_catalog.make_interval(secs => (answer OPERATOR(pg_catalog.->>) 'timeout_ms')::float8
                                                     OPERATOR(pg_catalog./) 1000));
            EXCEPTION WHEN SQLSTATE 'DS408' THEN
                -- timed out: the next segment reads it from the event's step and throws there
                NULL;
            END;
        WHEN 'http' THEN
            -- an HTTP step the HTTP worker sends: the run waits for its outcome here
            BEGIN
                PERFORM @extschema@.ds_http(answer OPERATOR(pg_catalog.->>) 'step',
                    answer OPERATOR(pg_catalog.->) 'request',
                    NULLIF(answer OPERATOR(pg_catalog.->) 'policy', 'null'::jsonb),
                    coalesce(answer OPERATOR(pg_catalog.->>) 'idempotency_header', 'Idempotency-Key'),
                    coalesce(pg_catalog.make_interval(secs => (answer OPERATOR(pg_catalog.->>) 'timeout_ms')::float8
                                                      OPERATOR(pg_catalog./) 1000), '30 s'));
            EXCEPTION WHEN SQLSTATE 'DS102' THEN
                -- failed for good: the next segment reads it from the step and throws there
                NULL;
            END;
        WHEN 'task' THEN
            -- a task another worker runs: the run waits for its outcome here
            BEGIN
                PERFORM @extschema@.ds_task(answer OPERATOR(pg_catalog.->>) 'step',
                    answer OPERATOR(pg_catalog.->>) 'task', answer OPERATOR(pg_catalog.->) 'input',
                    NULLIF(answer OPERATOR(pg_catalog.->) 'policy', 'null'::jsonb),
                    coalesce(answer OPERATOR(pg_catalog.->>) 'queue', 'default'),
                    coalesce((answer OPERATOR(pg_catalog.->>) 'priority')::integer, 0),
                    pg_catalog.make_interval(secs => (answer OPERATOR(pg_catalog.->>) 'timeout_ms')::float8
                                             OPERATOR(pg_catalog./) 1000));
            EXCEPTION WHEN SQLSTATE 'DS102' THEN
                NULL;
            END;
        ELSE
            RAISE EXCEPTION 'segment % of application workflow % answered %', segment, workflow, answer
                USING ERRCODE = '22023',
                      HINT = 'A segment answers {"then": "return" | "sleep" | "event" | "http" | "task", ...}: run it with the durable_steps client library.';
        END CASE;
    END LOOP;
END $body$;

-- Declares application workflow `name`: a function name(run_id text, input jsonb) in the current
-- schema that ds_start_run resolves like any SQL workflow, so that SQL and application workflows
-- share one namespace. It replaces only a function it made itself. A new one is executable by
-- its owner alone: starting its runs is granted (GRANT EXECUTE), as for any function.
CREATE FUNCTION @extschema@.ds_define_workflow(name text, policy jsonb DEFAULT NULL)
    RETURNS regprocedure LANGUAGE plpgsql AS $body$
DECLARE
    body text;
    existing regprocedure;
BEGIN
    IF name IS NULL OR pg_catalog.octet_length(name) NOT BETWEEN 1 AND 63 THEN
        RAISE EXCEPTION 'a workflow name must be 1 to 63 bytes' USING ERRCODE = '22023';
    END IF;
    IF policy IS NOT NULL AND pg_catalog.jsonb_typeof(policy) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'policy must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.current_schema() IS NULL THEN
        RAISE EXCEPTION 'no schema to create workflow % in', name USING ERRCODE = '3F000',
            HINT = 'Set search_path to the schema the workflows belong in.';
    END IF;
    body := pg_catalog.format('SELECT %s.ds_app_workflow(%L, input, %L::jsonb)',
                              '@extschema@', name, policy::text);
    existing := pg_catalog.to_regprocedure(pg_catalog.format('%I.%I(text, jsonb)',
                                           pg_catalog.current_schema(), name));
    IF existing IS NOT NULL AND NOT EXISTS (
            SELECT FROM pg_catalog.pg_proc p
             WHERE p.oid OPERATOR(pg_catalog.=) existing
               AND p.prosrc OPERATOR(pg_catalog.~~) ('SELECT ' OPERATOR(pg_catalog.||) '%.ds_app_workflow(%')) THEN
        RAISE EXCEPTION 'function %(text, jsonb) exists and is not an application workflow', name
            USING ERRCODE = '42723',
                  HINT = 'A SQL workflow and an application workflow share one namespace: choose another name.';
    END IF;
    EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %I.%I(run_id text, input jsonb) RETURNS jsonb'
                              ' LANGUAGE sql AS %L', pg_catalog.current_schema(), name, body);
    -- who may start its runs is granted, as for any function; not everybody by default
    IF existing IS NULL THEN
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %I.%I(text, jsonb) FROM PUBLIC',
                                  pg_catalog.current_schema(), name);
    END IF;
    RETURN pg_catalog.to_regprocedure(pg_catalog.format('%I.%I(text, jsonb)',
                                      pg_catalog.current_schema(), name));
END $body$;

-- Limits (docs/limits.md): a rate (so many per interval, with a burst) and a concurrency, each
-- held per key of the limit. A step names its limit and key in its policy; while it waits it is
-- held (limit_not_before: when it may be admitted; next_attempt_at NULL, so that no claim of
-- any claimer sees it), and the executors' admission makes it due when its key has a token and
-- a free slot (src/steps/limits.c). Set by members of durable_steps_admin, as queues are: a
-- limit holds back every role's steps that name it.
CREATE TABLE durable_steps.limits (
    name            text COLLATE "C" PRIMARY KEY CHECK (pg_catalog.octet_length(name) BETWEEN 1 AND 63),
    rate            integer CHECK (rate > 0),
    per             interval CHECK (per > interval '0'),
    burst           integer NOT NULL DEFAULT 0 CHECK (burst >= 0),
    concurrency     integer CHECK (concurrency >= 0),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CHECK ((rate IS NULL) = (per IS NULL))
);
-- A key's bucket: the tokens it had at refilled_at, until when a 429 paused it, and the role
-- whose step it admitted last (the roles take turns). A key without a row has a full bucket;
-- the admission writes one when it takes a token.
CREATE TABLE durable_steps.limit_keys (
    limit_name      text COLLATE "C" NOT NULL REFERENCES durable_steps.limits ON DELETE CASCADE,
    key             text COLLATE "C" NOT NULL,
    tokens          double precision NOT NULL,
    refilled_at     timestamptz NOT NULL,
    paused_until    timestamptz,
    last_owner      oid,
    PRIMARY KEY (limit_name, key)
);
SELECT pg_catalog.pg_extension_config_dump('durable_steps.limits', '');
SELECT pg_catalog.pg_extension_config_dump('durable_steps.limit_keys', '');

CREATE FUNCTION @extschema@.ds_set_rate_limit(name text, "limit" integer, per interval,
        burst integer DEFAULT 0) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_set_rate_limit' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_set_concurrency_limit(name text, concurrency integer) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_set_concurrency_limit' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_drop_limit(name text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_drop_limit' LANGUAGE C VOLATILE;

-- Each limit, and each of its keys that holds or runs steps (with its pause, if any): the steps
-- the caller may see (all of them for durable_steps_admin) held, admitted and running.
CREATE VIEW @extschema@.ds_limits WITH (security_barrier) AS
    SELECT l.name AS "limit", k.key, l.rate, l.per, l.burst, l.concurrency,
           coalesce(k.held, 0) AS held, coalesce(k.admitted, 0) AS admitted,
           coalesce(k.running, 0) AS running, b.paused_until, l.updated_at
      FROM durable_steps.limits l
      LEFT JOIN (SELECT s.limit_name, s.limit_key AS key,
                        pg_catalog.count(*) FILTER (WHERE s.limit_not_before IS NOT NULL) AS held,
                        pg_catalog.count(*) FILTER (WHERE s.limit_admitted IS NOT NULL
                            AND s.status OPERATOR(pg_catalog.<>) 'running') AS admitted,
                        pg_catalog.count(*) FILTER (WHERE s.limit_admitted IS NOT NULL
                            AND s.status OPERATOR(pg_catalog.=) 'running') AS running
                   FROM durable_steps.steps s
                  WHERE (s.limit_not_before IS NOT NULL OR s.limit_admitted IS NOT NULL)
                    AND (pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE')
                         OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE'))
                  GROUP BY 1, 2) k ON k.limit_name OPERATOR(pg_catalog.=) l.name
      LEFT JOIN durable_steps.limit_keys b
        ON b.limit_name OPERATOR(pg_catalog.=) l.name AND b.key OPERATOR(pg_catalog.=) k.key;
GRANT SELECT ON @extschema@.ds_limits TO PUBLIC;

-- Maps (docs/runs.md, "Fan-out and join: ds_map"): a workflow's step that runs one SQL step (or
-- task, or HTTP step) per input, at most `concurrency` at once, and joins them. The row says the map was made (its items
-- are steps of the run, map_step naming it) and what it was made of; `open` while some item may
-- still settle: the executors then look, after the commits that settle items, for maps whose
-- items have all settled, and wake their runs.
CREATE TABLE durable_steps.maps (
    run_id          text COLLATE "C" NOT NULL,
    step_id         text COLLATE "C" NOT NULL,
    owner           regrole NOT NULL,
    items           integer NOT NULL,
    concurrency     integer,
    fingerprint     text NOT NULL,
    open            boolean NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    PRIMARY KEY (run_id, step_id)
);
CREATE INDEX maps_open_idx ON durable_steps.maps (run_id, step_id) WHERE open;
SELECT pg_catalog.pg_extension_config_dump('durable_steps.maps', '');

CREATE FUNCTION @extschema@.ds_map(step_id text, sql text, inputs jsonb,
        concurrency integer DEFAULT NULL, policy jsonb DEFAULT NULL, timeout interval DEFAULT NULL,
        outcomes boolean DEFAULT false, task text DEFAULT NULL, http boolean DEFAULT false) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_map' LANGUAGE C VOLATILE;
-- What a turn that reached a new ds_map calls, as the workflow's role: the map's row and its
-- items, stored with the run's wait. Callable directly: it stores only steps the caller could
-- store with ds_run_step(defer => true).
CREATE FUNCTION @extschema@.ds_start_map(run_id text, step_id text, sql text, inputs jsonb,
        concurrency integer DEFAULT NULL, policy jsonb DEFAULT NULL, timeout interval DEFAULT NULL,
        task text DEFAULT NULL, http boolean DEFAULT false)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_start_map' LANGUAGE C VOLATILE;

-- Child runs (docs/runs.md, "Child runs"): a workflow starts a run of its own, atomically with
-- its turn and idempotently by its step id (the child's run id is "<parent>/<step_id>"), and
-- joins it; the child's end wakes the parent waiting at that step; cancelling the parent
-- cancels its unfinished children.
ALTER TABLE durable_steps.runs
    ADD COLUMN parent_run_id text COLLATE "C",
    ADD COLUMN parent_step text COLLATE "C";
CREATE INDEX runs_parent_idx ON durable_steps.runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE FUNCTION @extschema@.ds_start_child_run(step_id text, workflow text,
        input jsonb DEFAULT '{}', policy jsonb DEFAULT NULL) RETURNS text
    AS 'MODULE_PATHNAME', 'ds_start_child_run' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_join_child(step_id text) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_join_child' LANGUAGE C VOLATILE;
-- What a turn that reached a new ds_start_child_run calls, as the workflow's role: the child run,
-- started with ds_start_run under the run key "<parent_run_id>/<step_id>", linked to its parent.
CREATE FUNCTION @extschema@.ds_start_child(parent_run_id text, step_id text, workflow text,
        input jsonb DEFAULT '{}', policy jsonb DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_start_child' LANGUAGE C VOLATILE;
