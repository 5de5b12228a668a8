-- Diagnostic (BENCH_DIAG=1), not a target: the three rows a fresh step leaves behind (the body's
-- events row, its durable_steps.steps row and its durable_steps.attempts row) written by plain
-- SQL in one statement and one commit, as the table owner, with the values ds_run_step stores.
-- Nothing else: no lookup, no lock, no subtransaction, no per-call parse of the body. About the
-- best a fresh step can do with this storage layout; compare with fresh_bare.sql and
-- fresh_step.sql. (Lists the tables' columns: update it when the schema changes.)
WITH n AS (SELECT nextval('bench_seq') AS n),
e AS (INSERT INTO events (payload)
      SELECT jsonb_build_object('client', :client_id::int, 'n', n.n) FROM n RETURNING id),
s AS (INSERT INTO durable_steps.steps (run_id, step_id, kind, sql, input, fingerprint,
          max_attempts, retry_initial_delay, retry_max_delay, retry_multiplier, retry_jitter,
          retry_exponential, attempts, on_timeout, owner, search_path, status, result, created_at,
          updated_at, finished_at)
      SELECT 'floor-' || :client_id::int, n.n::text, 'sql',
             'INSERT INTO events (payload) VALUES ($1) RETURNING id',
             jsonb_build_object('client', :client_id::int, 'n', n.n),
             '42857e6110ab2e0536b0f7233e414c73',
             5, 1000000, 600000000, 2, 0, true, 1, 'retry', 'bench'::regrole, '"$user", public', 'succeeded', to_jsonb(e.id),
             now(), now(), now()
        FROM n, e),
a AS (INSERT INTO durable_steps.attempts (run_id, step_id, attempt, class, executor,
          backend_pid, role, claimed_at, started_at, finished_at)
      SELECT 'floor-' || :client_id::int, n.n::text, 1, 'completed', 'caller', pg_backend_pid(),
             'bench'::regrole, now(), now(), now()
        FROM n)
SELECT id FROM e;
