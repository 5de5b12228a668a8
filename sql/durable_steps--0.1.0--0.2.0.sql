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

-- ds_stats() labels steps by queue only for the queues an administrator configured
-- (ds_set_queue) and 'default': any role names a queue when it stores a step, and a label per
-- name would let any role make the metrics' label sets as many as it likes. Every other queue's
-- steps are counted under the queue '(unconfigured)' (docs/operations.md, "Numbers for operators").
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
     WHERE s.next_attempt_at IS NOT NULL
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
$$;
