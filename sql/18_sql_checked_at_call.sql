-- SQL checked at the call (docs/steps.md, "How a step behaves"): a step's body that does not parse
-- is an error at the call (42601), and nothing is stored: the identity is not used up by a typo,
-- and the corrected SQL runs under it. Only the syntax is checked, as PostgreSQL's parser reads
-- it: a body may name a table that is created later. Each bad call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

-- a typo: an error at the call, nothing stored
SELECT status FROM ds_run_step('syn', 'typo', 'SELEC 1');
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_steps WHERE run_id = 'syn';
-- the corrected SQL then runs under the same identity
SELECT status, result, attempt FROM ds_run_step('syn', 'typo', 'SELECT 1');

-- what an ORM's placeholder rewriting leaves (jsonb's ? operator turned into $1) is caught too
SELECT status FROM ds_run_step('syn', 'orm', $$SELECT '{"a": 1}'::jsonb $1 'a'$$);
\echo :SQLSTATE

-- deferred steps are checked the same way, before anything is stored
SELECT status FROM ds_run_step('syn', 'deferred', 'SELECT FROM WHERE', defer => true);
\echo :SQLSTATE
SELECT count(*) AS stored FROM ds_steps WHERE run_id = 'syn' AND step_id = 'deferred';

-- a body is one statement
SELECT status FROM ds_run_step('syn', 'two', 'SELECT 1; SELECT 2');
\echo :SQLSTATE

-- a table that does not exist yet is no error at the call: the body is only parsed
SELECT status FROM ds_run_step('syn', 'later', 'SELECT count(*) FROM made_later', defer => true);

-- a step already stored answers as before: the check is for new steps
SELECT status, replayed FROM ds_run_step('syn', 'typo', 'SELECT 1');

SELECT step_id, status, attempt FROM ds_steps WHERE run_id = 'syn' ORDER BY step_id;
