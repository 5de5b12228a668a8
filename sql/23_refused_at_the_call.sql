-- Arguments the call can judge are refused there, with their documented SQLSTATE, before
-- anything is locked, run or stored: a body that is a transaction statement (2D000), an interval
-- that would end past the last timestamp (22023), a schedule nobody could ever fire (22023,
-- 42501). And a held idempotency key's lease, renewed by its holder while its work goes on
-- (docs/idempotent-requests.md, "Application code"). Each refused call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE TABLE refused_rows (id serial PRIMARY KEY, note text);

-- a step's body, a hook and an idempotent handler run inside the caller's transaction: a
-- transaction statement can never run there
SELECT status FROM ds_run_step('refused', 'commit', 'COMMIT');
\echo :SQLSTATE
SELECT status FROM ds_run_step('refused', 'savepoint', 'SAVEPOINT s');
\echo :SQLSTATE
SELECT status FROM ds_run_step('refused', 'hook', 'SELECT 1', on_success => 'ROLLBACK');
\echo :SQLSTATE
SELECT status FROM ds_idempotent('refused', 'commit', '{}', 'COMMIT');
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_steps WHERE run_id = 'refused';
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE scope = 'refused';

-- an interval past the last timestamp is the caller's mistake, named, not a 22008 from inside;
-- the handler never runs
SELECT status FROM ds_idempotent('refused', 'ttl', '{}',
       $$INSERT INTO refused_rows (note) VALUES ('ran') RETURNING 201, '{}'::jsonb$$,
       ttl => '178000000 years');
\echo :SQLSTATE
SELECT count(*) AS handler_ran FROM refused_rows;
SELECT status FROM ds_idempotent('refused', 'wait', '{}', $$SELECT 200, '{}'::jsonb$$,
       wait => '178000000 years');
\echo :SQLSTATE
SELECT state FROM ds_idempotent_begin('refused', 'lease', '{}', lease => '178000000 years');
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_idempotency_keys WHERE scope = 'refused';

-- renewing a held key's lease: only its holder, only while it holds it
CREATE TEMP TABLE renew_tokens (name text, token uuid);
INSERT INTO renew_tokens SELECT 'first', token FROM ds_idempotent_begin('renew', 'r-1', '{}', lease => '1 s');
SELECT ds_idempotent_renew('renew', 'r-1', (SELECT token FROM renew_tokens WHERE name = 'first'), '1 hour')
       BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' AS renewed_for_an_hour;
SELECT lease_expires_at > now() + interval '59 minutes' AS lease_shown
  FROM ds_idempotency_keys WHERE scope = 'renew' AND key = 'r-1';
-- a repeat meanwhile is told the key is in progress, not begun again
SELECT state FROM ds_idempotent_begin('renew', 'r-1', '{}');
\echo :SQLSTATE
-- another token does not hold it
SELECT ds_idempotent_renew('renew', 'r-1', '00000000-0000-0000-0000-000000000000');
\echo :SQLSTATE
-- a finished key is held by nobody
SELECT ds_idempotent_finish('renew', 'r-1', (SELECT token FROM renew_tokens WHERE name = 'first'), 200, '{}');
SELECT ds_idempotent_renew('renew', 'r-1', (SELECT token FROM renew_tokens WHERE name = 'first'));
\echo :SQLSTATE
-- a key that does not exist; a missing token; a lease that is not positive or too long
SELECT ds_idempotent_renew('renew', 'nothing', '00000000-0000-0000-0000-000000000000');
\echo :SQLSTATE
SELECT ds_idempotent_renew('renew', 'r-1', NULL);
\echo :SQLSTATE
SELECT ds_idempotent_renew('renew', 'r-1', (SELECT token FROM renew_tokens WHERE name = 'first'), '0');
\echo :SQLSTATE
SELECT ds_idempotent_renew('renew', 'r-1', (SELECT token FROM renew_tokens WHERE name = 'first'), '178000000 years');
\echo :SQLSTATE
-- another role's key is another key: it is not there for this role
INSERT INTO renew_tokens SELECT 'second', token FROM ds_idempotent_begin('renew', 'r-2', '{}');
CREATE ROLE refused_mallory;
SET ROLE refused_mallory;
SELECT ds_idempotent_renew('renew', 'r-2', '00000000-0000-0000-0000-000000000000');
\echo :SQLSTATE
RESET ROLE;

-- a schedule whose backfill reaches before the first timestamp would fail at every firing
SELECT ds_schedule('refused-backfill', '* * * * *', sql => 'SELECT 1', backfill => '178000000 years');
\echo :SQLSTATE
-- pg_cron runs a schedule's job as the role that made it: one that cannot log in never runs
SET ROLE refused_mallory;
SELECT ds_schedule('refused-login', '* * * * *', sql => 'SELECT 1');
\echo :SQLSTATE
RESET ROLE;
SELECT ds_idempotent_abandon('renew', 'r-2', (SELECT token FROM renew_tokens WHERE name = 'second'));
DROP ROLE refused_mallory;
