-- durable_steps 0.1.0: durable, classified, retried steps inside PostgreSQL.
\echo Use "CREATE EXTENSION durable_steps" to load this file. \quit

-- Roles are cluster-wide: a second database installing the extension finds them already there.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'durable_steps_admin') THEN
        CREATE ROLE durable_steps_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'durable_steps_http') THEN
        CREATE ROLE durable_steps_http NOLOGIN;
    END IF;
END
$roles$;

-- State lives in its own schema. Nobody but the extension owner may touch the tables: callers act
-- on them only through the ds_* functions (which check ownership) and read them through the views.
CREATE SCHEMA durable_steps;

-- Identities are compared byte for byte (COLLATE "C"): they are keys, not words, and the
-- primary-key probe of every replay should not pay for locale-aware comparisons.
--
-- Owning roles are regrole, not oid: the same four bytes, but a dump writes the role's name and a
-- restore into another cluster resolves it to that cluster's OID for the role. pg_upgrade keeps
-- regrole columns (it preserves role OIDs).
--
-- A run groups steps under one run_id, carries their default retry policy, and is driven by the
-- worker through its workflow, one turn at a time (docs/runs.md).
CREATE TABLE durable_steps.runs (
    run_id          text COLLATE "C" PRIMARY KEY,
    -- the workflow's qualified signature, e.g. public.checkout(text,jsonb)
    workflow        text,
    input           jsonb NOT NULL DEFAULT '{}',
    run_key         text COLLATE "C" UNIQUE,
    policy          jsonb,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'running', 'waiting', 'blocked',
                                      'succeeded', 'failed', 'cancelled')),
    owner           pg_catalog.regrole NOT NULL,
    -- the search_path ds_start_run was called under: the workflow's turns run under it
    search_path     text NOT NULL DEFAULT '',
    -- the workflow's return value, once it succeeded
    output          jsonb,
    -- when a pending or waiting run's next turn is due; NULL = when something wakes it
    next_wake_at    timestamptz,
    -- what a waiting or blocked run waits for, the step it stopped at, and the event it awaits
    wait_reason     text,
    current_step    text COLLATE "C",
    wait_event      text COLLATE "C",
    -- turns started (each claim counts one), and turns lost in a row to a vanished executor
    turns           integer NOT NULL DEFAULT 0,
    lost_turns      integer NOT NULL DEFAULT 0,
    -- attempts that lost or interrupted turns may have run of the step they reached, whose
    -- records rolled back with them: their SQLSTATEs (DS007 lost, 57014 interrupted), recorded
    -- on that step by the next turn that reaches it (docs/runs.md); NULL when none
    unrecorded_attempts text[],
    -- the executor running the current turn (status 'running'), and until when its lease runs
    claimed_by      integer,
    lease_expires_at timestamptz,
    error_code      text,
    error_message   text,
    error_detail    text,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    finished_at     timestamptz
-- room on each page for the row versions of a run's turns: an executor that goes on with a run
-- updates only columns no index covers, which then stays on the page (HOT), without index entries
) WITH (fillfactor = 50);
-- The worker's query for due turns.
CREATE INDEX runs_due_idx ON durable_steps.runs (next_wake_at)
    WHERE status IN ('pending', 'waiting');
-- Turns whose executor may be gone, and runs waiting for an event.
CREATE INDEX runs_running_idx ON durable_steps.runs (run_id) WHERE status = 'running';
CREATE INDEX runs_event_idx ON durable_steps.runs (wait_event) WHERE status = 'waiting';

-- Events for runs (docs/runs.md, "Events"): one row per (emitting role, name); the first emit wins.
CREATE TABLE durable_steps.events (
    owner           pg_catalog.regrole NOT NULL,
    name            text COLLATE "C" NOT NULL,
    payload         jsonb,
    emitted_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    PRIMARY KEY (owner, name)
);

-- The value sets of the text state columns below are written only by the extension's C code
-- (step_attempt.c holds the rules) and are not CHECK constraints: PostgreSQL rebuilds a table's
-- CHECK expressions for every statement that writes it, which measurably slowed every step.
--
-- One row per step identity. The row holds the step's whole definition (what the worker needs to
-- run it later: SQL, input, resolved policy, timeout, classification overrides, owning role and
-- the search_path it was created under) and its current state.
CREATE TABLE durable_steps.steps (
    -- what the step is: written once (a re-arm may replace input and fingerprint)
    run_id          text COLLATE "C" NOT NULL,
    step_id         text COLLATE "C" NOT NULL,
    kind            text NOT NULL DEFAULT 'sql',            -- 'sql' | 'http' | 'sleep' | 'event' | 'patch'
    sql             text,
    input           jsonb,
    request         jsonb,
    -- HTTP steps: the header that carries the step's idempotency key; NULL sends none
    idempotency_header text,
    fingerprint     text NOT NULL,
    -- the resolved retry policy (docs/steps.md, "Retry policy"): typed columns rather than its jsonb,
    -- which took half of a row's bytes, and so of the WAL of every claim and outcome; the ds_steps
    -- view shows it as jsonb. Delays in microseconds.
    max_attempts    integer NOT NULL,
    retry_initial_delay bigint NOT NULL,
    retry_max_delay bigint NOT NULL,
    retry_multiplier double precision NOT NULL,
    retry_jitter    double precision NOT NULL,
    retry_exponential boolean NOT NULL,
    timeout         interval,
    on_timeout      text NOT NULL DEFAULT 'retry',          -- 'retry' | 'fail'
    retry_on        text[],
    fail_on         text[],
    owner           pg_catalog.regrole NOT NULL,
    search_path     text NOT NULL,
    -- channel NOTIFYed when the step stops: succeeded, failed, blocked or cancelled
    notify          text,
    -- outcome hooks (docs/steps.md, "Outcome hooks"): SQL run as the owner, $1 the outcome as jsonb, in
    -- the transaction that records a success (on_success) or a final failure (on_failure)
    on_success      text,
    on_failure      text,
    -- the worker serves each queue within its concurrency (durable_steps.queues), lower
    -- priority numbers first (docs/queues.md)
    queue           text COLLATE "C" NOT NULL DEFAULT 'default',
    priority        integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL,
    -- where it stands: written by every claim and outcome. Last in the row, so that an update
    -- on the same page logs these bytes only (PostgreSQL logs the changed middle of a row).
    -- attempts used before the last manual re-arm, and worker attempts a cancelling call stopped
    -- (a call that rolled back leaves the step going on): the attempt budget counts from here,
    -- while attempt numbers keep growing so that an attempt key is never issued twice
    attempt_base    integer NOT NULL DEFAULT 0,
    attempts        integer NOT NULL DEFAULT 0,
    -- pending | running | retrying | succeeded | failed | blocked | uncertain | cancelled
    status          text NOT NULL,
    next_attempt_at timestamptz,
    lease_expires_at timestamptz,
    -- the executor process that claimed the attempt now running (status 'running'); with
    -- updated_at (the claim's time) and attempts it is the running attempt's record. Kept when
    -- that attempt succeeds: see attempt_started_at.
    claimed_by      integer,
    -- A worker's attempt that succeeded is recorded here, not in durable_steps.attempts: when it
    -- was committed as started (the claim) and when its body began; with attempts (its number),
    -- claimed_by (its backend), owner and finished_at, this is its record, and the ds_attempts
    -- view shows it with the others. An attempt row and its index entry were a fifth of a drained
    -- step's WAL and a tenth of an executor's CPU (README, "Benchmarks"). NULL for every other
    -- step: a succeeded step never changes state again, so nothing moves the record later.
    attempt_claimed_at timestamptz,
    attempt_started_at timestamptz,
    -- the queue of a running step claimed from a queue with a concurrency limit, counted against
    -- it (steps_limited_running_idx); NULL otherwise. A claim from a queue without a limit leaves
    -- it alone, as it leaves every indexed column, so that it is a HOT update (docs/queues.md).
    running_queue   text COLLATE "C",
    -- An HTTP attempt's outcome, kept by the HTTP worker for an executor to record together with
    -- the step's outcome hook (docs/steps.md, "Outcome hooks"): no user code runs in the process that
    -- holds other roles' requests in flight. The step stays 'running' until it is recorded.
    kept_outcome    jsonb,
    updated_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    result          jsonb,
    error_class     text,                                   -- retryable | correctable | permanent | exhausted
    error_code      text,
    error_message   text,
    error_detail    text,
    remediation     text,
    PRIMARY KEY (run_id, step_id)
)
-- A third of each page for the rows inserted there: a step's claim and its outcome each write a
-- new version of its row, and on the row's own page that update logs only the changed bytes
-- (about 120), where an update that must move to another page logs the whole row, a lock record
-- and a second page (about 300): measured at 1,125 WAL bytes per drained step with
-- fillfactor 60, 972 with 33 (README, "Benchmarks"). The price is space: the table holds about
-- three times its rows' size, the attempts table (most of the history) does not.
WITH (fillfactor = 33);

-- The worker's hot path: the due steps of one queue, by priority and then due time. Each
-- (queue, priority) group is a range of this index, due steps first, so a claim reads the due
-- steps of a group and stops at its first step not yet due; the queues and priorities with
-- waiting steps are found by skipping from group to group (src/step_claims.c).
-- It holds the steps that wait (pending, retrying) and those running: a claim changes no column
-- of any index, not even of a predicate, and so is a HOT update, which writes no index entry.
-- That was a sixth of an executor's CPU (README, "Benchmarks"). A claim keeps next_attempt_at;
-- every other state sets it NULL. Statements on waiting steps name both conditions.
CREATE INDEX steps_due_idx ON durable_steps.steps (queue, priority, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
-- Running steps of queues with a limit, counted against it (src/step_claims.c). A running step
-- of a queue without a limit is in no index of its own: lost attempts are looked for when a
-- worker process ends (src/worker.c).
CREATE INDEX steps_limited_running_idx ON durable_steps.steps (running_queue)
    WHERE running_queue IS NOT NULL;
-- The HTTP outcomes kept for an executor (kept_outcome): few at any time.
CREATE INDEX steps_kept_outcome_idx ON durable_steps.steps (run_id, step_id)
    WHERE kept_outcome IS NOT NULL;
-- Retention purges finished steps by age (src/retention.c): those finished before the cutoff,
-- which were created before it too. BRIN, because every succeeded step would otherwise pay for one
-- more btree entry on the hot path; creation times follow the table's order closely. On
-- created_at, which is written once, rather than finished_at: every outcome would otherwise widen
-- its page range's summary, one more WAL record per step. autosummarize keeps new pages
-- summarized so a purge does not read every page written since the last VACUUM.
CREATE INDEX steps_created_idx ON durable_steps.steps USING brin (created_at)
    WITH (autosummarize = on);

-- Backends remember the answers of succeeded steps (src/replay_cache.c); any SQL DELETE, UPDATE
-- or TRUNCATE of steps makes every backend forget them. ENABLE ALWAYS: also under
-- session_replication_role = replica.
CREATE FUNCTION durable_steps.ds_forget_replays() RETURNS trigger
    AS 'MODULE_PATHNAME', 'ds_forget_replays' LANGUAGE C;
REVOKE ALL ON FUNCTION durable_steps.ds_forget_replays() FROM PUBLIC;
CREATE TRIGGER steps_forget_replays AFTER DELETE OR UPDATE OR TRUNCATE ON durable_steps.steps
    FOR EACH STATEMENT EXECUTE FUNCTION durable_steps.ds_forget_replays();
ALTER TABLE durable_steps.steps ENABLE ALWAYS TRIGGER steps_forget_replays;

-- One row per finished attempt, written once with its outcome and never updated. Two attempts
-- live in their step's row instead: the one a worker has claimed and not finished (status
-- 'running'), and a worker's attempt that succeeded (steps.attempt_started_at); the
-- ds_attempts view shows all three. The attempt key and the idempotency key are derived from
-- (run_id, step_id, attempt) and shown by the ds_attempts view.
CREATE TABLE durable_steps.attempts (
    run_id          text COLLATE "C" NOT NULL,
    step_id         text COLLATE "C" NOT NULL,
    attempt         integer NOT NULL,
    class           text NOT NULL,  -- completed | retryable | correctable | permanent | cancelled | uncertain
    error_code      text,
    error_message   text,
    error_detail    text,
    executor        text NOT NULL,  -- caller | worker | operator (ds_resolve_step)
    backend_pid     integer NOT NULL,
    role            pg_catalog.regrole NOT NULL,
    -- when the attempt was committed as started (the worker's claim) and when its body began
    claimed_at      timestamptz NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_id, attempt)
);

-- Queues with a concurrency limit (docs/queues.md), set with ds_set_queue. A queue without a
-- row, or with concurrency NULL, has no limit; 0 pauses it. Steps name their queue freely: a
-- step may be created before its queue is configured.
CREATE TABLE durable_steps.queues (
    name            text COLLATE "C" PRIMARY KEY,
    concurrency     integer CHECK (concurrency >= 0),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

-- The tables hold data, not configuration: pg_dump skips an extension's tables unless they are
-- marked, and would then restore every step as never having run. Marked with an empty filter,
-- all their rows are dumped (pg_dump, pg_dumpall, pg_dump -t) and loaded after CREATE EXTENSION.
SELECT pg_catalog.pg_extension_config_dump('durable_steps.runs', '');
SELECT pg_catalog.pg_extension_config_dump('durable_steps.steps', '');
SELECT pg_catalog.pg_extension_config_dump('durable_steps.attempts', '');
SELECT pg_catalog.pg_extension_config_dump('durable_steps.queues', '');
SELECT pg_catalog.pg_extension_config_dump('durable_steps.events', '');

-- A step's attempts go with it. A step row deleted without its attempts (by hand) would leave
-- their rows behind, and the next call on that identity would collide with them on attempts_pkey
-- when it records its attempt 1. Not a foreign key: that adds a row trigger and a check to every
-- attempt insert, on the hot path; statement triggers cost nothing there. They run as the
-- tables' owner, as a foreign key's ON DELETE CASCADE would (whoever may delete a step deletes
-- its history), with a pinned search_path and every name qualified. enable_seqscan is off while
-- the DELETE is planned, for the reason the C code's statements are (step_store.c): its plan is
-- kept, and one made while attempts is small would scan the whole table once it is large.
-- ENABLE ALWAYS: also under session_replication_role = replica.
CREATE FUNCTION durable_steps.ds_delete_step_attempts() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $$
BEGIN
    DELETE FROM durable_steps.attempts a
     USING deleted_steps d
     WHERE a.run_id OPERATOR(pg_catalog.=) d.run_id
       AND a.step_id OPERATOR(pg_catalog.=) d.step_id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION durable_steps.ds_delete_step_attempts() FROM PUBLIC;
CREATE TRIGGER steps_delete_attempts AFTER DELETE ON durable_steps.steps
    REFERENCING OLD TABLE AS deleted_steps
    FOR EACH STATEMENT EXECUTE FUNCTION durable_steps.ds_delete_step_attempts();
ALTER TABLE durable_steps.steps ENABLE ALWAYS TRIGGER steps_delete_attempts;

-- TRUNCATE steps, attempts truncates both before this trigger runs, and keeps attempts open
-- while it does: a second TRUNCATE of attempts would fail as "in use". It is empty then.
CREATE FUNCTION durable_steps.ds_truncate_attempts() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM FROM durable_steps.attempts LIMIT 1;
    IF FOUND THEN
        TRUNCATE durable_steps.attempts;
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION durable_steps.ds_truncate_attempts() FROM PUBLIC;
CREATE TRIGGER steps_truncate_attempts AFTER TRUNCATE ON durable_steps.steps
    FOR EACH STATEMENT EXECUTE FUNCTION durable_steps.ds_truncate_attempts();
ALTER TABLE durable_steps.steps ENABLE ALWAYS TRIGGER steps_truncate_attempts;

CREATE TYPE @extschema@.ds_step_result AS (
    run_id          text,
    step_id         text,
    status          text,
    result          jsonb,
    attempt         integer,
    max_attempts    integer,
    next_attempt_at timestamptz,
    error_class     text,
    error_code      text,
    error_message   text,
    error_detail    text,
    remediation     text,
    replayed        boolean
);

-- Keys and attempt context (docs/steps.md, "Keys")
CREATE FUNCTION @extschema@.ds_key(VARIADIC "any") RETURNS text
    AS 'MODULE_PATHNAME', 'ds_key' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION @extschema@.ds_idempotency_key() RETURNS text
    AS 'MODULE_PATHNAME', 'ds_idempotency_key' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_attempt_key() RETURNS text
    AS 'MODULE_PATHNAME', 'ds_attempt_key' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_attempt_number() RETURNS integer
    AS 'MODULE_PATHNAME', 'ds_attempt_number' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_max_attempts() RETURNS integer
    AS 'MODULE_PATHNAME', 'ds_max_attempts' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_run_id() RETURNS text
    AS 'MODULE_PATHNAME', 'ds_run_id' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_step_id() RETURNS text
    AS 'MODULE_PATHNAME', 'ds_step_id' LANGUAGE C VOLATILE;

-- Retry policy (docs/steps.md, "Retry policy")
CREATE FUNCTION @extschema@.ds_retry_policy(
        max_attempts integer DEFAULT NULL,
        initial_delay interval DEFAULT NULL,
        max_delay interval DEFAULT NULL,
        backoff text DEFAULT NULL,
        multiplier double precision DEFAULT NULL,
        jitter double precision DEFAULT NULL)
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_retry_policy' LANGUAGE C IMMUTABLE;
CREATE FUNCTION @extschema@.ds_backoff_delay(policy jsonb, attempt integer) RETURNS interval
    AS 'MODULE_PATHNAME', 'ds_backoff_delay' LANGUAGE C VOLATILE;

-- Classification helpers (docs/steps.md, "Outcome classes"): each raises an error of the extension's own class DS.
CREATE FUNCTION @extschema@.ds_non_retriable(message text) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_non_retriable' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_retry_after(message text, delay interval) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_retry_after' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_blocked(message text, remediation text) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_blocked' LANGUAGE C VOLATILE;

-- The synchronous durable step (docs/steps.md, "How a step behaves")
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
        priority integer DEFAULT 0)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_run_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_retry_step(run_id text, step_id text, input jsonb DEFAULT NULL,
        sql text DEFAULT NULL, request jsonb DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_retry_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_cancel_step(run_id text, step_id text)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_cancel_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_set_queue(name text, concurrency integer)
    RETURNS void
    AS 'MODULE_PATHNAME', 'ds_set_queue' LANGUAGE C VOLATILE;
-- HTTP steps (docs/http.md): stored with the caller's transaction, sent by the HTTP worker
CREATE FUNCTION @extschema@.ds_http_step(
        run_id text,
        step_id text,
        request jsonb,
        policy jsonb DEFAULT NULL,
        idempotency_header text DEFAULT 'Idempotency-Key',
        on_success text DEFAULT NULL,
        timeout interval DEFAULT '30 s',
        nowait boolean DEFAULT false,
        run_at timestamptz DEFAULT NULL,
        notify text DEFAULT NULL,
        on_failure text DEFAULT NULL,
        retry_on_status text[] DEFAULT NULL,
        fail_on_status text[] DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_http_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_resolve_step(run_id text, step_id text, status text,
        result jsonb DEFAULT NULL)
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_resolve_step' LANGUAGE C VOLATILE;
-- The header-safe key of a step, as ds_idempotency_key() hands it and HTTP steps send it.
CREATE FUNCTION durable_steps.ds_step_key(run_id text, step_id text) RETURNS text
    AS 'MODULE_PATHNAME', 'ds_step_key' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- The request with the values of secret headers masked, as the views show it to other roles.
CREATE FUNCTION durable_steps.ds_http_mask_request(request jsonb) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_http_mask_request' LANGUAGE C STABLE STRICT;

CREATE FUNCTION @extschema@.ds_unwrap(step @extschema@.ds_step_result) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_unwrap' LANGUAGE C IMMUTABLE;

-- Observability (docs/reference.md, "Views", "Security model"). The views run with their owner's rights so that they can read the
-- private tables, and show a role only the rows of roles it has the privileges of, unless it is
-- a member of durable_steps_admin.
CREATE VIEW @extschema@.ds_runs WITH (security_barrier) AS
    SELECT r.run_id, r.workflow, r.status, r.input, r.output, r.run_key, r.policy,
           r.current_step, r.wait_reason, r.wait_event, r.next_wake_at, r.turns,
           r.owner, r.error_code, r.error_message, r.error_detail,
           r.created_at, r.updated_at, r.finished_at
      FROM durable_steps.runs r
     WHERE pg_catalog.pg_has_role(r.owner::pg_catalog.oid, 'USAGE')
        OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE');

CREATE VIEW @extschema@.ds_steps WITH (security_barrier) AS
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
           s.created_at, s.updated_at, s.finished_at
      FROM durable_steps.steps s
     WHERE pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE')
        OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE');

CREATE VIEW @extschema@.ds_attempts WITH (security_barrier) AS
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

-- Every configured queue and every queue with steps waiting or running: its limit, and the
-- steps of it the caller may see (all of them for durable_steps_admin) by state. The queues and
-- their limits are shown to everybody: they are the worker's configuration, not a role's data.
CREATE VIEW @extschema@.ds_queues WITH (security_barrier) AS
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
                    AND s.next_attempt_at IS NOT NULL
                    AND (pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE')
                         OR pg_catalog.pg_has_role('durable_steps_admin', 'USAGE'))
                  GROUP BY s.queue) c
        ON c.queue OPERATOR(pg_catalog.=) q.name;

GRANT SELECT ON @extschema@.ds_runs, @extschema@.ds_steps, @extschema@.ds_attempts,
                @extschema@.ds_queues TO PUBLIC;

-- Runs (docs/runs.md): durable workflows. ds_start_run and the controls act on runs; ds_step,
-- ds_http, ds_sleep and ds_await_event act on the current run, inside its workflow.
CREATE FUNCTION @extschema@.ds_start_run(
        workflow text,
        input jsonb DEFAULT '{}',
        run_key text DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        OUT run_id text, OUT status text, OUT created boolean)
    RETURNS record
    AS 'MODULE_PATHNAME', 'ds_start_run' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_cancel_run(run_id text) RETURNS text
    AS 'MODULE_PATHNAME', 'ds_cancel_run' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_resume_run(run_id text) RETURNS text
    AS 'MODULE_PATHNAME', 'ds_resume_run' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_step(
        step_id text,
        sql text,
        input jsonb DEFAULT NULL,
        policy jsonb DEFAULT NULL,
        timeout interval DEFAULT NULL,
        retry_on text[] DEFAULT NULL,
        fail_on text[] DEFAULT NULL,
        on_timeout text DEFAULT 'retry')
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_http(
        step_id text,
        request jsonb,
        policy jsonb DEFAULT NULL,
        idempotency_header text DEFAULT 'Idempotency-Key',
        timeout interval DEFAULT '30 s')
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_http' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_sleep(step_id text, duration interval) RETURNS void
    AS 'MODULE_PATHNAME', 'ds_sleep' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_await_event(step_id text, name text, timeout interval DEFAULT NULL)
    RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_await_event' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_emit_event(name text, payload jsonb DEFAULT NULL) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_emit_event' LANGUAGE C VOLATILE;
-- Changing a workflow while runs are in flight (docs/runs.md, "Changing a workflow")
CREATE FUNCTION @extschema@.ds_patched(change_id text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_patched' LANGUAGE C VOLATILE;

-- Waiting without polling (docs/steps.md, "Waiting for a step"): one statement each, woken by
-- the commit that stops the step or the run.
CREATE FUNCTION @extschema@.ds_wait_step(run_id text, step_id text, timeout interval DEFAULT '30 seconds')
    RETURNS @extschema@.ds_step_result
    AS 'MODULE_PATHNAME', 'ds_wait_step' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_wait_run(run_id text, timeout interval DEFAULT '30 seconds',
        OUT status text, OUT output jsonb, OUT error_code text, OUT error_message text)
    AS 'MODULE_PATHNAME', 'ds_wait_run' LANGUAGE C VOLATILE;

-- Idempotent requests (docs/idempotent-requests.md): the server side of an Idempotency-Key
-- header. One entry per (owning role, scope, key): the request it was first used with, and the
-- response stored for it (state done), or the token of the application that holds it while it
-- works (state held, until lease_expires_at). An entry past expires_at, or held past its lease,
-- counts as absent; the worker purges those.
CREATE TABLE durable_steps.idempotency_keys (
    owner            regrole NOT NULL,
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    request          jsonb NOT NULL,
    state            text NOT NULL CHECK (state IN ('held', 'done')),
    status           integer CHECK (status BETWEEN 100 AND 599),
    body             jsonb,
    token            uuid,
    lease_expires_at timestamptz,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    PRIMARY KEY (owner, scope, key),
    CHECK ((state = 'done') = (status IS NOT NULL)),
    CHECK ((state = 'held') = (token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX idempotency_keys_expiry ON durable_steps.idempotency_keys (expires_at);
SELECT pg_catalog.pg_extension_config_dump('durable_steps.idempotency_keys', '');

CREATE FUNCTION @extschema@.ds_idempotent(
        scope text,
        key text,
        request jsonb,
        handler text,
        ttl interval DEFAULT '24 hours',
        wait interval DEFAULT NULL,
        OUT status integer, OUT body jsonb, OUT replayed boolean)
    AS 'MODULE_PATHNAME', 'ds_idempotent' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_idempotent_begin(
        scope text,
        key text,
        request jsonb,
        ttl interval DEFAULT '24 hours',
        lease interval DEFAULT '5 minutes',
        OUT state text, OUT status integer, OUT body jsonb, OUT token uuid)
    AS 'MODULE_PATHNAME', 'ds_idempotent_begin' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_idempotent_finish(
        scope text, key text, token uuid, status integer, body jsonb)
    RETURNS void
    AS 'MODULE_PATHNAME', 'ds_idempotent_finish' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_idempotent_abandon(scope text, key text, token uuid)
    RETURNS void
    AS 'MODULE_PATHNAME', 'ds_idempotent_abandon' LANGUAGE C VOLATILE;

-- A role sees its own keys (and those of the roles it is a member of); the token of a held key
-- is its holder's secret: it is not shown.
CREATE VIEW @extschema@.ds_idempotency_keys WITH (security_barrier) AS
    SELECT i.scope, i.key,
           CASE WHEN i.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
                  OR (i.state OPERATOR(pg_catalog.=) 'held'
                      AND i.lease_expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
                THEN 'expired' ELSE i.state END AS state,
           i.request, i.status, i.body, i.owner, i.created_at, i.finished_at,
           i.lease_expires_at, i.expires_at
      FROM durable_steps.idempotency_keys i
     WHERE pg_catalog.pg_has_role(i.owner::pg_catalog.oid, 'USAGE');
GRANT SELECT ON @extschema@.ds_idempotency_keys TO PUBLIC;

-- Schedules (docs/schedules.md): pg_cron's schedule syntax, evaluated in UTC as pg_cron 1.4 does.
-- The slots of a schedule in [from, to], earliest first.
CREATE FUNCTION @extschema@.ds_cron_slots(schedule text, "from" timestamptz, "to" timestamptz)
    RETURNS SETOF timestamptz
    AS 'MODULE_PATHNAME', 'ds_cron_slots' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE ROWS 100;

-- A schedule of a role: a pg_cron job (jobid, named job_name, run as the owner) whose every
-- firing starts, for each slot of the schedule it is for, a run of the workflow or a deferred step
-- of the SQL, keyed by ds_key('schedule', job_name, slot). Job names are unique in the database:
-- the slots' keys are made of them.
CREATE TABLE durable_steps.schedules (
    job_name      text COLLATE "C" PRIMARY KEY,
    owner         regrole NOT NULL,
    schedule      text NOT NULL,
    -- the workflow's qualified signature, or the SQL of the step: exactly one
    workflow      text,
    sql           text,
    input         jsonb NOT NULL,
    backfill      interval NOT NULL,
    jobid         bigint NOT NULL,
    -- no slot before it is started; scheduling the name again sets it anew
    created_at    timestamptz NOT NULL,
    -- the latest slot a firing was for, and when it fired
    last_slot     timestamptz,
    last_fired_at timestamptz,
    CHECK ((workflow IS NULL) <> (sql IS NULL))
);
SELECT pg_catalog.pg_extension_config_dump('durable_steps.schedules', '');

CREATE FUNCTION @extschema@.ds_schedule(
        job_name text,
        schedule text,
        workflow text DEFAULT NULL,
        input jsonb DEFAULT '{}',
        sql text DEFAULT NULL,
        backfill interval DEFAULT '0')
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'ds_schedule' LANGUAGE C VOLATILE;
CREATE FUNCTION @extschema@.ds_unschedule(job_name text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_unschedule' LANGUAGE C VOLATILE;
-- The command of a schedule's pg_cron job; its owner may also call it (fired_at: not after now).
CREATE FUNCTION @extschema@.ds_schedule_fire(job_name text, fired_at timestamptz DEFAULT NULL)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'ds_schedule_fire' LANGUAGE C VOLATILE;

-- A role sees its own schedules (and those of the roles it is a member of), nobody else's.
CREATE VIEW @extschema@.ds_schedules WITH (security_barrier) AS
    SELECT s.job_name, s.schedule, s.workflow, s.sql, s.input, s.backfill, s.owner, s.jobid,
           s.created_at, s.last_slot, s.last_fired_at,
           (SELECT @extschema@.ds_cron_slots(s.schedule,
                       GREATEST(s.created_at, pg_catalog.clock_timestamp()),
                       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) interval '10 years')
             LIMIT 1) AS next_slot
      FROM durable_steps.schedules s
     WHERE pg_catalog.pg_has_role(s.owner::pg_catalog.oid, 'USAGE');
GRANT SELECT ON @extschema@.ds_schedules TO PUBLIC;

-- The background worker serves every database in which the extension is installed (docs/worker.md): this tells the launcher, once the CREATE EXTENSION commits, to start this
-- database's executors. Without the library preloaded it does nothing.
CREATE FUNCTION durable_steps.ds_serve_this_database() RETURNS void
    AS 'MODULE_PATHNAME', 'ds_serve_this_database' LANGUAGE C;
REVOKE ALL ON FUNCTION durable_steps.ds_serve_this_database() FROM PUBLIC;
SELECT durable_steps.ds_serve_this_database();

-- Numbers for operators (docs/operations.md, "Numbers for operators"). The counters since the
-- server started live in shared memory (ds_step_counters, a glance at them); the steps and runs
-- in flight are counted through the indexes that hold exactly them (steps_due_idx: pending,
-- retrying and running steps; runs_due_idx and runs_running_idx), never through the history.
-- Queue names and counts of every role: for pg_monitor and durable_steps_admin. SECURITY
-- DEFINER to read the tables, with a pinned search_path; enable_seqscan off so that a plan
-- made before the table was analyzed still reads the partial indexes.
CREATE FUNCTION durable_steps.ds_step_counters() RETURNS jsonb
    AS 'MODULE_PATHNAME', 'ds_step_counters' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION durable_steps.ds_step_counters() FROM PUBLIC;

CREATE FUNCTION @extschema@.ds_stats(
        OUT metric text, OUT queue text, OUT kind text, OUT label text, OUT value double precision)
    RETURNS SETOF record
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $$
WITH c AS (SELECT durable_steps.ds_step_counters() AS j),
live AS (
    SELECT s.queue, s.kind, s.status, pg_catalog.count(*) AS n,
           pg_catalog.count(*) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
               AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS due,
           pg_catalog.min(s.next_attempt_at) FILTER (WHERE s.status OPERATOR(pg_catalog.<>) 'running'
               AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS oldest_due
      FROM durable_steps.steps s
     WHERE s.next_attempt_at IS NOT NULL
     GROUP BY s.queue, s.kind, s.status),
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
REVOKE ALL ON FUNCTION @extschema@.ds_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.ds_stats() TO pg_monitor, durable_steps_admin;

-- ==== Citus (docs/citus.md) ==========================================================================
-- A step's context is the same for every row of every statement of its body: STABLE says so, and
-- Citus evaluates a STABLE function of a modification (INSERT ... VALUES, INSERT ... SELECT,
-- UPDATE, DELETE) on the node where the statement runs, the step's, before it sends the
-- statement to a shard's node -- where no step runs. A VOLATILE function of an INSERT ... SELECT,
-- an UPDATE or a DELETE of a distributed table Citus sends to the shards' nodes or refuses.
ALTER FUNCTION @extschema@.ds_idempotency_key() STABLE;
ALTER FUNCTION @extschema@.ds_attempt_key() STABLE;
ALTER FUNCTION @extschema@.ds_attempt_number() STABLE;
ALTER FUNCTION @extschema@.ds_max_attempts() STABLE;
ALTER FUNCTION @extschema@.ds_run_id() STABLE;
ALTER FUNCTION @extschema@.ds_step_id() STABLE;
-- ==== end of Citus ===================================================================================

-- ---------------------------------------------------------------------------------------------
-- Partitions (docs/partitions.md): runs spread over independent servers by
-- hashtext(run_id) & (durable_steps.partition_count - 1), as a PL/Proxy router computes it for
-- RUN ON hashtext(run_id). A server owns the partitions of durable_steps.partitions; calls naming
-- a run of another one raise DS201 and the worker takes none of its work. A partition moves
-- from one server to another with ds_partition_export and ds_partition_import.
-- ---------------------------------------------------------------------------------------------

-- The partition of a run; NULL when this server is not partitioned (partition_count 0).
CREATE FUNCTION @extschema@.ds_partition_of(run_id text) RETURNS integer
    AS 'MODULE_PATHNAME', 'ds_partition_of' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- The worker's filter: does this server own the run's partition?
CREATE FUNCTION durable_steps.ds_partition_owned(run_id text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_partition_owned' LANGUAGE C STABLE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION durable_steps.ds_partition_owned(text) FROM PUBLIC;

-- Is no attempt of a running step (step_id '': a turn of the run) in flight? For an export.
CREATE FUNCTION durable_steps.ds_partition_step_idle(run_id text, step_id text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'ds_partition_step_idle' LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION durable_steps.ds_partition_step_idle(text, text) FROM PUBLIC;

-- The worker processes of this database that have not taken this session's partitions yet (a
-- reload reaches each between its claims). For an export.
CREATE FUNCTION durable_steps.ds_partition_workers_behind() RETURNS integer[]
    AS 'MODULE_PATHNAME', 'ds_partition_workers_behind' LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION durable_steps.ds_partition_workers_behind() FROM PUBLIC;

-- Export, import and drop are a superuser's alone (docs/partitions.md, "Who may move a
-- partition"): an export holds every role's unmasked requests, secret headers included, and an
-- import writes steps that the worker then runs as the roles they name. Not SECURITY DEFINER: a
-- superuser needs no other rights, and each checks that its caller is one, even if granted EXECUTE.

-- The rows of partition p of the runs, steps, attempts and idempotency keys (a key's partition is
-- hashtext(key)'s), and every event, as JSON
-- lines in the order ds_partition_import takes them: n = 0 is the header, the last the trailer
-- with the counts an import checks. One statement: one snapshot of a partition that, fenced
-- and with nothing in flight, no longer changes.
CREATE FUNCTION @extschema@.ds_partition_export(p integer, OUT n bigint, OUT line jsonb)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_count integer := pg_catalog.current_setting('durable_steps.partition_count')::integer;
    v_busy text;
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
    -- a transaction open since before the fence may still store a step of the partition
    SELECT pg_catalog.string_agg(a.pid::text, ', ') INTO v_busy
      FROM pg_catalog.pg_stat_activity a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND a.xact_start OPERATOR(pg_catalog.<) pg_catalog.pg_conf_load_time();
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
REVOKE ALL ON FUNCTION @extschema@.ds_partition_export(integer) FROM PUBLIC;

-- One line of an export, taken in order of n in one transaction:
--     SELECT ds_partition_import(line) FROM (SELECT line FROM staging ORDER BY n) l;
-- The header replaces whatever this server holds of the partition (a repeated import gives the
-- same rows); the trailer checks the counts and answers 'complete'. Only into a server that has
-- the same partition_count and does not own the partition yet.
CREATE FUNCTION @extschema@.ds_partition_import(line jsonb) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_count integer := pg_catalog.current_setting('durable_steps.partition_count')::integer;
    v_p integer := NULLIF(pg_catalog.current_setting('ds_partition_import.partition', true), '')::integer;
    v_row jsonb := line OPERATOR(pg_catalog.->) 'row';
    v_got jsonb;
    v_owner text;
    v_id text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION 'permission denied for ds_partition_import' USING ERRCODE = '42501',
            DETAIL = 'Moving a partition reads and writes every role''s steps: only a superuser may.';
    END IF;
    IF line ? 'ds_partition_export' THEN
        IF (line OPERATOR(pg_catalog.->>) 'ds_partition_export')::integer OPERATOR(pg_catalog.<>) 1 THEN
            RAISE EXCEPTION 'unknown export format %', line OPERATOR(pg_catalog.->>) 'ds_partition_export'
                USING ERRCODE = '22023';
        END IF;
        v_p := (line OPERATOR(pg_catalog.->>) 'partition')::integer;
        IF (line OPERATOR(pg_catalog.->>) 'partition_count')::integer OPERATOR(pg_catalog.<>) v_count THEN
            RAISE EXCEPTION 'the export is of % partitions, this server has %',
                line OPERATOR(pg_catalog.->>) 'partition_count', v_count
                USING ERRCODE = '55000', HINT = 'Both servers need the same durable_steps.partition_count.';
        END IF;
        IF v_p OPERATOR(pg_catalog.=) ANY (pg_catalog.string_to_array(
                pg_catalog.replace(pg_catalog.current_setting('durable_steps.partitions'), ' ', ''), ',')::integer[]) THEN
            RAISE EXCEPTION 'this server already owns partition %', v_p
                USING ERRCODE = '55000',
                      HINT = 'Import before adding the partition to durable_steps.partitions.';
        END IF;
        PERFORM pg_catalog.set_config('ds_partition_import.partition', v_p::text, true);
        -- a repeated import replaces the rows of the last one (the trigger takes the attempts along)
        DELETE FROM durable_steps.steps s
         WHERE (pg_catalog.hashtext(s.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p;
        DELETE FROM durable_steps.attempts a
         WHERE (pg_catalog.hashtext(a.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p;
        DELETE FROM durable_steps.runs r
         WHERE (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p;
        DELETE FROM durable_steps.idempotency_keys k
         WHERE (pg_catalog.hashtext(k.key) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p;
        RETURN 'header';
    END IF;
    IF v_p IS NULL THEN
        RAISE EXCEPTION 'an export''s lines go in order, header first, in one transaction'
            USING ERRCODE = '55000',
                  HINT = 'SELECT ds_partition_import(line) FROM (SELECT line FROM staging ORDER BY n) l';
    END IF;
    IF line ? 'ds_partition_end' THEN
        SELECT pg_catalog.jsonb_build_object(
                   'runs', (SELECT pg_catalog.count(*) FROM durable_steps.runs r
                             WHERE (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p),
                   'steps', (SELECT pg_catalog.count(*) FROM durable_steps.steps s
                              WHERE (pg_catalog.hashtext(s.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p),
                   'attempts', (SELECT pg_catalog.count(*) FROM durable_steps.attempts a
                                 WHERE (pg_catalog.hashtext(a.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p),
                   'idempotency_keys', (SELECT pg_catalog.count(*) FROM durable_steps.idempotency_keys k
                                         WHERE (pg_catalog.hashtext(k.key) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p))
          INTO v_got;
        IF v_got OPERATOR(pg_catalog.<>) ((line OPERATOR(pg_catalog.->) 'counts') OPERATOR(pg_catalog.-) 'events') THEN
            RAISE EXCEPTION 'the import of partition % is incomplete', v_p
                USING ERRCODE = '55000',
                      DETAIL = pg_catalog.format('Exported %s, imported %s.', line OPERATOR(pg_catalog.->) 'counts', v_got);
        END IF;
        -- an event emitted here while the partition was on its way found none of its runs:
        -- the runs that wait for an event this server has are woken
        UPDATE durable_steps.runs r SET next_wake_at = pg_catalog.clock_timestamp()
         WHERE (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) v_p
           AND r.status OPERATOR(pg_catalog.=) 'waiting' AND r.wait_event IS NOT NULL
           AND EXISTS (SELECT FROM durable_steps.events e
                        WHERE e.owner OPERATOR(pg_catalog.=) r.owner AND e.name OPERATOR(pg_catalog.=) r.wait_event);
        PERFORM pg_catalog.set_config('ds_partition_import.partition', '', true);
        RETURN 'complete';
    END IF;
    IF v_row IS NULL OR NOT (line OPERATOR(pg_catalog.->>) 'table') OPERATOR(pg_catalog.=) ANY ('{runs,steps,attempts,events,idempotency_keys}') THEN
        RAISE EXCEPTION 'not a line of a partition export: %', pg_catalog.left(line::text, 200)
            USING ERRCODE = '22023';
    END IF;
    -- a row of a run is of its run's partition, an idempotency key of its key's
    v_id := CASE WHEN line OPERATOR(pg_catalog.->>) 'table' OPERATOR(pg_catalog.=) 'idempotency_keys'
                 THEN 'idempotency key ' OPERATOR(pg_catalog.||) (v_row OPERATOR(pg_catalog.->>) 'key')
                 ELSE 'run ' OPERATOR(pg_catalog.||) (v_row OPERATOR(pg_catalog.->>) 'run_id') END;
    IF line OPERATOR(pg_catalog.->>) 'table' OPERATOR(pg_catalog.<>) 'events'
       AND (pg_catalog.hashtext(v_row OPERATOR(pg_catalog.->>)
                                (CASE WHEN line OPERATOR(pg_catalog.->>) 'table' OPERATOR(pg_catalog.=) 'idempotency_keys'
                                      THEN 'key' ELSE 'run_id' END))
            OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.<>) v_p THEN
        RAISE EXCEPTION '% is not of partition %', v_id, v_p
            USING ERRCODE = '22023';
    END IF;
    -- A role is taken by its name, as a dump takes it: an owner exported as a number was a role
    -- dropped on the source (its steps fail closed there), and a number here may name another
    -- role; a name that is no role here fails the import rather than leave steps of nobody.
    v_owner := v_row OPERATOR(pg_catalog.->>) (CASE WHEN line OPERATOR(pg_catalog.->>) 'table' OPERATOR(pg_catalog.=) 'attempts'
                                                  THEN 'role' ELSE 'owner' END);
    IF v_owner IS NULL OR v_owner OPERATOR(pg_catalog.~) '^[0-9]+$' OR pg_catalog.to_regrole(v_owner) IS NULL
       OR pg_catalog.to_regrole(v_owner)::pg_catalog.oid OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'role % of % of % is not a role of this server', v_owner,
            line OPERATOR(pg_catalog.->>) 'table', v_id
            USING ERRCODE = '42704',
                  DETAIL = 'A role the export names by a number was dropped on the source server.',
                  HINT = 'Create the role here (or drop its steps on the source) and export again.';
    END IF;
    CASE line OPERATOR(pg_catalog.->>) 'table'
    WHEN 'runs' THEN
        -- a backend of the source server is no process here: its turn, if any, is lost
        INSERT INTO durable_steps.runs SELECT * FROM pg_catalog.jsonb_populate_record(NULL::durable_steps.runs,
            v_row OPERATOR(pg_catalog.||) '{"claimed_by": null}');
    WHEN 'steps' THEN
        -- nor is it an executor whose end says whether an attempt started: a running step's
        -- attempt is taken to have run
        INSERT INTO durable_steps.steps SELECT * FROM pg_catalog.jsonb_populate_record(NULL::durable_steps.steps,
            v_row OPERATOR(pg_catalog.||) '{"claimed_by": null}');
    WHEN 'attempts' THEN
        INSERT INTO durable_steps.attempts SELECT * FROM pg_catalog.jsonb_populate_record(NULL::durable_steps.attempts, v_row);
    WHEN 'idempotency_keys' THEN
        -- a key held by an application keeps its token and lease: it finishes it here
        INSERT INTO durable_steps.idempotency_keys
            SELECT * FROM pg_catalog.jsonb_populate_record(NULL::durable_steps.idempotency_keys, v_row);
    ELSE
        -- events are every server's (an event of no run is emitted to each): the first emit wins
        INSERT INTO durable_steps.events SELECT * FROM pg_catalog.jsonb_populate_record(NULL::durable_steps.events, v_row)
            ON CONFLICT DO NOTHING;
    END CASE;
    RETURN line OPERATOR(pg_catalog.->>) 'table';
END
$$;
REVOKE ALL ON FUNCTION @extschema@.ds_partition_import(jsonb) FROM PUBLIC;

-- After a move, the old server's copy of the partition: deleted, so that it can never be opened
-- there again by mistake with a history that went on elsewhere. Only of a partition not owned.
CREATE FUNCTION @extschema@.ds_partition_drop(p integer) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_count integer := pg_catalog.current_setting('durable_steps.partition_count')::integer;
    v_steps bigint;
    v_runs bigint;
    v_keys bigint;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION 'permission denied for ds_partition_drop' USING ERRCODE = '42501',
            DETAIL = 'Moving a partition reads and writes every role''s steps: only a superuser may.';
    END IF;
    IF v_count OPERATOR(pg_catalog.=) 0 OR p IS NULL OR p OPERATOR(pg_catalog.<) 0 OR p OPERATOR(pg_catalog.>=) v_count THEN
        RAISE EXCEPTION 'partition % does not exist', p USING ERRCODE = '22023';
    END IF;
    IF p OPERATOR(pg_catalog.=) ANY (pg_catalog.string_to_array(
            pg_catalog.replace(pg_catalog.current_setting('durable_steps.partitions'), ' ', ''), ',')::integer[]) THEN
        RAISE EXCEPTION 'partition % is owned by this server', p USING ERRCODE = '55000';
    END IF;
    DELETE FROM durable_steps.steps s
     WHERE (pg_catalog.hashtext(s.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p;
    GET DIAGNOSTICS v_steps = ROW_COUNT;
    DELETE FROM durable_steps.attempts a
     WHERE (pg_catalog.hashtext(a.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p;
    DELETE FROM durable_steps.runs r
     WHERE (pg_catalog.hashtext(r.run_id) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p;
    GET DIAGNOSTICS v_runs = ROW_COUNT;
    DELETE FROM durable_steps.idempotency_keys k
     WHERE (pg_catalog.hashtext(k.key) OPERATOR(pg_catalog.&) (v_count OPERATOR(pg_catalog.-) 1)) OPERATOR(pg_catalog.=) p;
    GET DIAGNOSTICS v_keys = ROW_COUNT;
    RETURN v_steps OPERATOR(pg_catalog.+) v_runs OPERATOR(pg_catalog.+) v_keys;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.ds_partition_drop(integer) FROM PUBLIC;
