-- Deferred steps (docs/steps.md, "Deferred steps"): stored with the caller's transaction, nothing runs
-- now; the background worker runs attempt 1 when it is due. (pg_regress's database is not the
-- worker's, so nothing here is ever run by the worker.)
\set SHOW_CONTEXT never

CREATE TABLE deferred_effects (n int);

-- defer => true: a pending step, due at once, attempt 0, no attempt row, no effect
SELECT status, result, attempt, next_attempt_at IS NOT NULL AS due_set, replayed
  FROM ds_run_step('def', 'now', 'INSERT INTO deferred_effects VALUES (1)', defer => true);
SELECT count(*) AS effects FROM deferred_effects;
SELECT count(*) AS attempts FROM ds_attempts WHERE run_id = 'def';

-- the same definition again: the stored state; the caller never runs it, due or not
SELECT status, attempt, replayed
  FROM ds_run_step('def', 'now', 'INSERT INTO deferred_effects VALUES (1)', defer => true);
SELECT count(*) AS effects FROM deferred_effects;

-- another definition: a conflict, as for any step
SELECT status FROM ds_run_step('def', 'now', 'INSERT INTO deferred_effects VALUES (2)', defer => true);

-- run_at: deferred until then (defer is implied)
SELECT status, next_attempt_at = '2100-01-01 00:00:00+00' AS at_run_at, replayed
  FROM ds_run_step('def', 'later', 'SELECT 1', run_at => '2100-01-01 00:00:00+00');
-- a plain call before it is due answers with the stored state too
SELECT status, attempt, replayed FROM ds_run_step('def', 'later', 'SELECT 1');
SELECT run_id, step_id, status, attempt, max_attempts, error_code
  FROM ds_steps WHERE run_id = 'def' ORDER BY step_id;

-- a plain call of a due deferred step runs attempt 1 itself, as for any due pending step
SELECT status, result, attempt, replayed FROM ds_run_step('def', 'now', 'INSERT INTO deferred_effects VALUES (1)');
SELECT count(*) AS effects FROM deferred_effects;
SELECT attempt, class, executor FROM ds_attempts WHERE run_id = 'def' ORDER BY step_id, attempt;

-- a rolled-back deferred call leaves nothing
BEGIN;
SELECT status FROM ds_run_step('def', 'rolled-back', 'SELECT 1', defer => true);
ROLLBACK;
SELECT count(*) AS rolled_back_steps FROM ds_steps WHERE step_id = 'rolled-back';

-- bad input: a NULL defer, an infinite run_at; nothing is stored
SELECT status FROM ds_run_step('def', 'bad1', 'SELECT 1', defer => NULL);
SELECT status FROM ds_run_step('def', 'bad2', 'SELECT 1', run_at => 'infinity');
SELECT status FROM ds_run_step('def', 'bad3', 'SELECT 1', notify => '');
SELECT status FROM ds_run_step('def', 'bad4', 'SELECT 1', notify => repeat('x', 64));
SELECT count(*) AS bad_steps FROM ds_steps WHERE step_id LIKE 'bad%';

-- not in a read-only transaction
BEGIN READ ONLY;
SELECT status FROM ds_run_step('def', 'read-only', 'SELECT 1', defer => true);
ROLLBACK;

-- from a trigger: the webhook-outbox pattern, the step commits or rolls back with the row
CREATE TABLE deferred_orders (id int PRIMARY KEY);
CREATE FUNCTION deferred_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_run_step('order:' || NEW.id, 'notify', 'SELECT $1', to_jsonb(NEW), defer => true);
    RETURN NEW;
END $$;
CREATE TRIGGER deferred_enqueue AFTER INSERT ON deferred_orders
    FOR EACH ROW EXECUTE FUNCTION deferred_enqueue();
INSERT INTO deferred_orders VALUES (1), (2);
BEGIN;
INSERT INTO deferred_orders VALUES (3);
ROLLBACK;
SELECT run_id, status, input FROM ds_steps WHERE step_id = 'notify' ORDER BY run_id;
