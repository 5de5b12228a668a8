-- Baseline for fresh_step.sql: the bare INSERT in its own transaction (autocommit), with the
-- same payload, the same nextval and the same RETURNING as the step's body.
INSERT INTO events (payload)
    VALUES (jsonb_build_object('client', :client_id::int, 'n', nextval('bench_seq')))
    RETURNING id;
