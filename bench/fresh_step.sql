-- A fresh step whose body is one INSERT, in its own transaction (autocommit). Every call has a
-- new identity: run 'fresh-<client>' and step_id = nextval('bench_seq'), unique across clients
-- and runs, so each call claims, executes and records a new step. Compare with fresh_bare.sql.
SELECT ds_unwrap(ds_run_step('fresh-' || :client_id::int, s.n::text,
                             'INSERT INTO events (payload) VALUES ($1) RETURNING id',
                             jsonb_build_object('client', :client_id::int, 'n', s.n)))
  FROM (SELECT nextval('bench_seq') AS n) s;
