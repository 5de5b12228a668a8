-- Baseline for replay_step.sql: a bare primary-key SELECT of a comparable row.
-- kv(id int primary key, payload jsonb) holds payload {"id": n} for n in 1..:nrows, the same
-- value that step bench/s<n> has stored as its result.
-- Run by bench/run_step_bench.sh with -D nrows=<rows>.
\set id random(1, :nrows)
SELECT payload FROM kv WHERE id = :id::int;
