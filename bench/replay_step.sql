-- Replay of a completed step: ds_run_step on step bench/s<n>, which succeeded before the run
-- with the same SQL and input, so the call answers from durable_steps.steps (replayed = true)
-- without running the body. Compare with replay_bare.sql.
-- Run by bench/run_step_bench.sh with -D nrows=<rows>.
-- The step_id is built with text || text (textcat, a C function). Written as 's' || :id::int it
-- would use text || anynonarray, which is an SQL-language function that the planner inlines on
-- every execution: about a tenth of this script's CPU in a profile, none of it ds_run_step's.
\set id random(1, :nrows)
SELECT ds_unwrap(ds_run_step('bench', 's' || :id::text, 'SELECT $1',
                             jsonb_build_object('id', :id::int)));
