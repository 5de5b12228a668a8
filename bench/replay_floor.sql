-- Diagnostic (BENCH_DIAG=1), not a target: the answer to a replay of step bench/s<n> (its status
-- and stored result) read by plain SQL through the primary key (run_id, step_id) of
-- durable_steps.steps, as the table owner. This is one executor query of the step's own row,
-- with nothing around it: about the best a replay can do while it looks the row up with a query.
-- Compare with replay_bare.sql (int key, other table) and replay_step.sql.
\set id random(1, :nrows)
SELECT status, result FROM durable_steps.steps WHERE run_id = 'bench' AND step_id = 's' || :id::text;
