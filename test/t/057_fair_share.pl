# No role's long work stalls another role's steps (docs/queues.md, "Fair share between roles"): while a
# role's slow attempts hold every executor, the launcher starts an extra executor that runs the
# other roles' steps, never the busy role's, and leaves once an executor is free; and a batch is
# one role's, so another role's step never waits in it behind a slow one. With no slot of
# max_worker_processes left for an extra executor, the log says so once.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('fair_share', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory;
CREATE ROLE alice;
});
ok(executors_running($node, 2), 'the two executors run');
my $offset = log_offset($node);
my $holder = DurableSteps::Session->new($node, 'postgres');
$holder->query_ok('SELECT pg_advisory_lock(5001);');

# 1. mallory's two slow steps, in two queues of her naming, take both executors.
$node->safe_psql('postgres', q{
SET ROLE mallory;
SELECT ds_run_step('m', 'slow-' || i, 'SELECT pg_advisory_xact_lock_shared(5001)', defer => true,
                   queue => 'm' || i, timeout => '1 h')
  FROM generate_series(1, 2) i;
});
ok(poll_until($node, 'postgres', q{
SELECT count(DISTINCT claimed_by) FROM durable_steps.steps WHERE run_id = 'm' AND status = 'running'},
		'2'),
	"mallory's two slow steps run, one in each executor");
ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps extra worker'", '1'),
	'once both have run one attempt for long, the launcher starts an extra executor');
is(poll_log($node, $offset, qr/extra worker \d+ started in database "postgres"/), 1,
	'... and says so in the log');

# 2. mallory's third slow step is due before alice's step: the extra executor runs alice's, and
#    never mallory's.
$node->safe_psql('postgres', q{
SET ROLE mallory;
SELECT ds_run_step('m', 'slow-3', 'SELECT pg_advisory_xact_lock_shared(5001)', defer => true,
                   queue => 'm3', timeout => '1 h');
});
$node->safe_psql('postgres', q{
SET ROLE alice;
SELECT ds_run_step('a', 'quick', 'SELECT 42', defer => true);
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'a' AND step_id = 'quick'},
		'succeeded'),
	"alice's step succeeds while mallory's hold both executors");
is($node->safe_psql('postgres', q{
SELECT p.backend_type FROM ds_attempts a JOIN pg_stat_activity p ON p.pid = a.backend_pid
 WHERE a.run_id = 'a' AND a.step_id = 'quick'}),
	'durable_steps extra worker', "the extra executor ran it");
is($node->safe_psql('postgres', q{
SELECT string_agg(step_id || ' ' || status, ', ' ORDER BY step_id) FROM ds_steps WHERE run_id = 'm'}),
	'slow-1 running, slow-2 running, slow-3 pending',
	"mallory's third step, due first, waits: the extra executor runs no step of a busy role");

# 3. mallory's steps end: her third runs, and the extra executor leaves.
$holder->query_ok('SELECT pg_advisory_unlock(5001);');
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND status = 'succeeded'}, '3'),
	"mallory's three steps succeed once let go");
ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps extra worker'", '0'),
	'the extra executor leaves once an executor is free');
is(poll_log($node, $offset, qr/extra worker \d+ leaves database "postgres"/), 1,
	'... and says so in the log');
ok(executors_running($node, 2), "the database's two executors still run");

# 4. A batch is one role's: mallory's slow step and alice's twenty, due at once in one queue,
#    mallory's first (the lower priority number): alice's run meanwhile in the other executor.
$holder->query_ok('SELECT pg_advisory_lock(5002);');
$node->safe_psql('postgres', q{
BEGIN;
SET LOCAL ROLE mallory;
SELECT ds_run_step('m', 'held', 'SELECT pg_advisory_xact_lock_shared(5002)', defer => true,
                   priority => 0, timeout => '1 h');
SET LOCAL ROLE alice;
SELECT ds_run_step('a', 'batch-' || i, 'SELECT ' || i, defer => true, priority => 5)
  FROM generate_series(1, 20) i;
COMMIT;
});
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'a' AND step_id LIKE 'batch-%' AND status = 'succeeded'},
		'20'),
	"alice's twenty steps succeed");
is($node->safe_psql('postgres', q{SELECT status FROM ds_steps WHERE run_id = 'm' AND step_id = 'held'}),
	'running', "... while mallory's step, claimed first, still runs");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM ds_attempts a JOIN durable_steps.steps m ON m.run_id = 'm' AND m.step_id = 'held'
 WHERE a.run_id = 'a' AND a.step_id LIKE 'batch-%' AND a.backend_pid = m.claimed_by}),
	'0', "none of alice's ran in the executor that runs mallory's");
$holder->query_ok('SELECT pg_advisory_unlock(5002);');
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'm' AND step_id = 'held'},
		'succeeded'),
	"mallory's step succeeds once let go");

# 5. Steps just under a second each, due in a row: a claim takes one of them at a time (a queue's
#    first claim takes one step, and a claim at their pace holds about 100 ms of work), so no
#    executor holds a row of them, and alice's step, due after mallory's twenty, runs between
#    them in one of the database's own executors, long before mallory's are done; no executor
#    is busy, and no extra executor starts.
$offset = log_offset($node);
$node->safe_psql('postgres', q{
SET ROLE mallory;
SELECT ds_run_step('m', 'short-' || q || '-' || i, 'SELECT pg_sleep(0.6)', defer => true,
                   queue => 'n' || q)
  FROM generate_series(1, 2) q, generate_series(1, 10) i;
});
ok(poll_until($node, 'postgres',
		q{SELECT count(*) > 0 FROM ds_steps WHERE run_id = 'm' AND step_id LIKE 'short-%' AND status = 'running'}),
	"mallory's short steps run");
$node->safe_psql('postgres', q{
SET ROLE alice;
SELECT ds_run_step('a', 'between', 'SELECT 1', defer => true);
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'a' AND step_id = 'between'},
		'succeeded'),
	"alice's step succeeds");
is($node->safe_psql('postgres', q{
SELECT (SELECT p.backend_type FROM ds_attempts a JOIN pg_stat_activity p ON p.pid = a.backend_pid
         WHERE a.run_id = 'a' AND a.step_id = 'between') || ' / ' ||
       (SELECT count(*) <= 14 FROM ds_attempts m, ds_attempts a
         WHERE m.run_id = 'm' AND m.step_id LIKE 'short-%' AND a.run_id = 'a' AND a.step_id = 'between'
           AND m.finished_at <= a.finished_at)}),
	'durable_steps worker / true',
	"... in one of the database's own executors, with at least six of mallory's short steps still to run");
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND step_id LIKE 'short-%' AND status = 'succeeded'},
		'20'),
	"mallory's short steps all succeed");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM ds_attempts a JOIN ds_attempts b
    ON b.run_id = 'm' AND b.step_id LIKE 'short-%' AND b.backend_pid = a.backend_pid
   AND b.step_id <> a.step_id AND b.claimed_at >= a.claimed_at AND b.claimed_at < a.finished_at
 WHERE a.run_id = 'm' AND a.step_id LIKE 'short-%'}),
	'0', 'no executor claimed one of them before the one it ran had finished');
is(count_matches(log_since($node, $offset), qr/extra worker \d+ started/), 0,
	'no extra executor started for them');

# 6. A limited queue's last slot: a queue of concurrency 2, paused while mallory's six slow steps
#    and then alice's step (due after them, at the same priority) are stored, then opened.
#    Mallory's first takes one slot, alice's step the second (mallory holds all the others), and
#    mallory's second takes it after.
$holder->query_ok('SELECT pg_advisory_lock(5004);');
$node->safe_psql('postgres', q{
SELECT ds_set_queue('shared', 0);
SET ROLE mallory;
SELECT ds_run_step('m', 'shared-' || i, 'SELECT pg_advisory_xact_lock_shared(5004)', defer => true,
                   queue => 'shared', timeout => '1 h')
  FROM generate_series(1, 6) i;
});
$node->safe_psql('postgres', q{
SET ROLE alice;
SELECT ds_run_step('a', 'shared', 'SELECT 1', defer => true, queue => 'shared');
});
$node->safe_psql('postgres', q{SELECT ds_set_queue('shared', 2)});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'a' AND step_id = 'shared'},
		'succeeded'),
	"limited queue: alice's step succeeds, behind five of mallory's due steps");
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND step_id LIKE 'shared-%' AND status = 'running'},
		'2'),
	"limited queue: then mallory's steps fill the queue's two slots");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM durable_steps.steps m
 WHERE m.run_id = 'm' AND m.step_id LIKE 'shared-%' AND m.status = 'running'
   AND m.updated_at > (SELECT started_at FROM ds_attempts WHERE run_id = 'a' AND step_id = 'shared')}),
	'1', "limited queue: one of mallory's running steps was claimed after alice's attempt began, one before");
$holder->query_ok('SELECT pg_advisory_unlock(5004);');
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND step_id LIKE 'shared-%' AND status = 'succeeded'},
		'6'),
	"limited queue: mallory's six succeed once let go");

# 7. While the worker is paused no extra executor starts, though every executor is busy: the one
#    that ran leaves, and none comes back until the pause ends.
$offset = log_offset($node);
$holder->query_ok('SELECT pg_advisory_lock(5005);');
$node->safe_psql('postgres', q{
SET ROLE mallory;
SELECT ds_run_step('m', 'paused-' || i, 'SELECT pg_advisory_xact_lock_shared(5005)', defer => true,
                   queue => 'p' || i, timeout => '1 h')
  FROM generate_series(1, 2) i;
});
is(poll_log($node, $offset, qr/extra worker \d+ started/), 1,
	'paused: both executors busy, an extra executor starts');
$node->safe_psql('postgres', "ALTER SYSTEM SET durable_steps.paused = on; SELECT pg_reload_conf()");
is(poll_log($node, $offset, qr/extra worker \d+ leaves/), 1,
	'paused: the extra executor leaves once the worker is paused');
my $paused_at = $node->safe_psql('postgres', 'SELECT now()');
# the launcher looks every second: three more looks
ok(poll_until($node, 'postgres', "SELECT now() > '$paused_at'::timestamptz + interval '3 s'"),
	'paused: three seconds later');
is(count_matches(log_since($node, $offset), qr/extra worker \d+ started/), 1,
	'paused: ... no extra executor started again, though both executors are still busy');
$node->safe_psql('postgres', "ALTER SYSTEM RESET durable_steps.paused; SELECT pg_reload_conf()");
is(poll_log($node, $offset, qr/extra worker \d+ started/, 2), 2,
	'paused: once the pause ends, an extra executor starts again');
$holder->query_ok('SELECT pg_advisory_unlock(5005);');
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND step_id LIKE 'paused-%' AND status = 'succeeded'},
		'2'),
	"paused: mallory's steps succeed once let go");

$holder->quit;
$node->stop;

# 8. No slot of max_worker_processes is left for an extra executor (the launcher, PostgreSQL's
#    logical replication launcher, two executors and the HTTP worker take all five): the log says
#    so once, not at every look.
my $tight = worker_node('no_slots', "durable_steps.database = 'postgres'\nmax_worker_processes = 5\n");
$tight->safe_psql('postgres', 'CREATE EXTENSION durable_steps; CREATE ROLE mallory;');
ok(executors_running($tight, 2), 'no slots: the two executors run');
$offset = log_offset($tight);
my $tight_holder = DurableSteps::Session->new($tight, 'postgres');
$tight_holder->query_ok('SELECT pg_advisory_lock(5003);');
$tight->safe_psql('postgres', q{
SET ROLE mallory;
SELECT ds_run_step('m', 'slow-' || i, 'SELECT pg_advisory_xact_lock_shared(5003)', defer => true,
                   queue => 'm' || i, timeout => '1 h')
  FROM generate_series(1, 2) i;
});
is(poll_log($tight, $offset, qr/could not start an extra executor for database "postgres"/), 1,
	'no slots: the launcher logs that it could not start an extra executor');
my $logged_at = $tight->safe_psql('postgres', 'SELECT now()');
# the launcher looks every second: three more looks
ok(poll_until($tight, 'postgres', "SELECT now() > '$logged_at'::timestamptz + interval '3 s'"),
	'no slots: three seconds later');
is(count_matches(log_since($tight, $offset), qr/could not start an extra executor/), 1,
	'no slots: ... the log still says it once');
is(count_matches(log_since($tight, $offset), qr/WARNING:  durable_steps: could not start an executor/), 0,
	"no slots: and no warning that the database's own executors could not start");
$tight_holder->query_ok('SELECT pg_advisory_unlock(5003);');
ok(poll_until($tight, 'postgres', q{SELECT count(*) FROM ds_steps WHERE run_id = 'm' AND status = 'succeeded'}, '2'),
	"no slots: mallory's steps succeed once let go");
$tight_holder->quit;
$tight->stop;
done_testing();
