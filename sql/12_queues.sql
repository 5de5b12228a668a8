-- Queues and priorities (docs/queues.md): the arguments, ds_set_queue and its permissions, and
-- the ds_queues view. No step here is run by a worker, whether or not one serves this database:
-- the deferred steps are due in an hour or wait in a paused queue. (test/t/019_queues.pl checks
-- how the worker serves queues.) The view is shown without queue default, which the other
-- tests' steps are in.
\set SHOW_CONTEXT never

-- a step names its queue and priority; they are stored with it
SELECT status FROM ds_run_step('queues', 'a', 'SELECT 1', run_at => now() + interval '1 hour',
                               queue => 'mail', priority => -5);
SELECT status FROM ds_run_step('queues', 'b', 'SELECT 2', run_at => now() + interval '1 hour');
SELECT step_id, queue, priority FROM ds_steps WHERE run_id = 'queues' ORDER BY step_id;
-- a repeat in another queue or with another priority answers with the stored step: neither is
-- part of the fingerprint, and the stored queue and priority stay
SELECT status, replayed FROM ds_run_step('queues', 'a', 'SELECT 1', defer => true, queue => 'other',
                                         priority => 7);
SELECT queue, priority FROM ds_steps WHERE run_id = 'queues' AND step_id = 'a';
-- a step whose first attempt runs in the caller is in its queue too
SELECT status FROM ds_run_step('queues', 'c', 'SELECT 3', queue => 'mail');
SELECT queue, priority FROM ds_steps WHERE run_id = 'queues' AND step_id = 'c';

-- malformed arguments are refused and change nothing
SELECT status FROM ds_run_step('queues', 'bad1', 'SELECT 1', queue => NULL);
SELECT status FROM ds_run_step('queues', 'bad2', 'SELECT 1', queue => '');
SELECT status FROM ds_run_step('queues', 'bad3', 'SELECT 1', queue => repeat('q', 64));
SELECT status FROM ds_run_step('queues', 'bad4', 'SELECT 1', priority => NULL);
SELECT count(*) FROM ds_steps WHERE run_id = 'queues' AND step_id LIKE 'bad%';
-- 63 bytes is the longest queue name
SELECT status FROM ds_run_step('queues', 'long', 'SELECT 1', run_at => now() + interval '1 hour',
                               queue => repeat('q', 63));
SELECT length(queue) FROM ds_steps WHERE run_id = 'queues' AND step_id = 'long';
DELETE FROM durable_steps.steps WHERE run_id = 'queues' AND step_id = 'long';

-- ds_set_queue: steps may name a queue before it is configured; configuring it sets its limit
SELECT ds_set_queue('mail', 2);
SELECT ds_set_queue('mail', 3);   -- set again: the new limit replaces the old
SELECT ds_set_queue('paused', 0);
SELECT ds_set_queue('unlimited', NULL);
SELECT name, concurrency FROM durable_steps.queues ORDER BY name;
-- malformed arguments
SELECT ds_set_queue(NULL, 1);
SELECT ds_set_queue('', 1);
SELECT ds_set_queue(repeat('q', 64), 1);
SELECT ds_set_queue('mail', -1);
SELECT name, concurrency FROM durable_steps.queues ORDER BY name;

-- ds_queues: every configured queue, and every queue with steps waiting or running
SELECT queue, concurrency, running, due, scheduled FROM ds_queues WHERE queue <> 'default' ORDER BY queue;
-- a step due now in the paused queue stays due; an unconfigured queue shows with its steps
SELECT status FROM ds_run_step('queues', 'p1', 'SELECT 1', defer => true, queue => 'paused');
SELECT status FROM ds_run_step('queues', 'later', 'SELECT 1', run_at => now() + interval '1 hour', queue => 'new');
SELECT queue, concurrency, running, due, scheduled FROM ds_queues WHERE queue <> 'default' ORDER BY queue;

-- only superusers and members of durable_steps_admin configure queues
CREATE ROLE queue_user;
CREATE ROLE queue_admin IN ROLE durable_steps_admin;
SET ROLE queue_user;
SELECT ds_set_queue('mail', 100);
-- the configuration is visible to everybody, another role's steps are not counted
SELECT queue, concurrency, running, due, scheduled FROM ds_queues WHERE queue <> 'default' ORDER BY queue;
SELECT status FROM ds_run_step('queues-user', 'x', 'SELECT 1', defer => true, queue => 'paused');
SELECT queue, concurrency, running, due, scheduled FROM ds_queues WHERE queue <> 'default' ORDER BY queue;
-- the tables stay private
SELECT count(*) FROM durable_steps.queues;
-- a priority below 0 goes before every role's steps: only for administrators (0 and more are
-- anybody's); nothing is stored
SELECT status FROM ds_run_step('queues-user', 'urgent', 'SELECT 1', defer => true, priority => -1);
SELECT status FROM ds_run_step('queues-user', 'late', 'SELECT 1', run_at => now() + interval '1 hour', priority => 10);
SET ROLE queue_admin;
SELECT ds_set_queue('mail', 1);
SELECT status FROM ds_run_step('queues-admin', 'urgent', 'SELECT 1', run_at => now() + interval '1 hour', priority => -1);
RESET ROLE;
SELECT run_id, step_id, priority FROM ds_steps WHERE run_id LIKE 'queues-%' AND step_id IN ('urgent', 'late') ORDER BY 1, 2;
SET ROLE queue_admin;
-- an admin sees every role's steps counted
SELECT queue, concurrency, running, due, scheduled FROM ds_queues WHERE queue <> 'default' ORDER BY queue;
RESET ROLE;
SELECT name, concurrency FROM durable_steps.queues WHERE name = 'mail';

-- in a read-only transaction ds_set_queue changes nothing
BEGIN READ ONLY;
SELECT ds_set_queue('mail', 5);
ROLLBACK;

-- the queue configuration is dumped with the data (marked as a configuration table)
SELECT c.relname FROM pg_extension e, unnest(e.extconfig) AS t(oid), pg_class c
 WHERE e.extname = 'durable_steps' AND c.oid = t.oid ORDER BY 1;

DELETE FROM durable_steps.steps WHERE run_id LIKE 'queues%';
DELETE FROM durable_steps.queues;
DROP ROLE queue_user;
DROP ROLE queue_admin;
