# Deferred steps (docs/steps.md, "Deferred steps"): the worker runs attempt 1 of a deferred step after
# the caller's transaction commits, as the role that created it, and not before its run_at; a
# rolled-back caller leaves nothing to run.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('deferred', "durable_steps.database = 'postgres'\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
CREATE TABLE deferred_effects (step text, who text, at timestamptz DEFAULT clock_timestamp());
GRANT INSERT, SELECT ON deferred_effects TO app;
});

# at once: run by the worker after the commit, attempt 1, as app
$node->safe_psql('postgres', q{
SET ROLE app;
BEGIN;
SELECT status FROM ds_run_step('def', 'now',
  'INSERT INTO deferred_effects(step, who) VALUES (''now'', current_user) RETURNING who',
  defer => true);
SELECT pg_sleep(0.3);   -- the transaction is still open: the worker must not see the step yet
COMMIT;
});
ok(poll_until($node, 'postgres',
		"SELECT status NOT IN ('pending', 'running') FROM ds_steps WHERE step_id = 'now'"),
	'now: the worker ran the deferred step');
is($node->safe_psql('postgres', "SELECT status || ' ' || result FROM ds_steps WHERE step_id = 'now'"),
	'succeeded "app"', 'now: it succeeded');
is($node->safe_psql('postgres',
		"SELECT attempt || '|' || executor || '|' || role FROM ds_attempts WHERE step_id = 'now'"),
	'1|worker|app', 'now: attempt 1, in the worker, as app');
is($node->safe_psql('postgres', "SELECT string_agg(who, ',') FROM deferred_effects WHERE step = 'now'"),
	'app', 'now: one effect, written as app');
is($node->safe_psql('postgres',
		"SELECT (SELECT min(at) FROM deferred_effects WHERE step = 'now') >= "
		  . "(SELECT created_at + interval '300 ms' FROM ds_steps WHERE step_id = 'now')"),
	't', 'now: it ran only after the caller committed');

# run_at: not before it
my $run_at = $node->safe_psql('postgres', "SELECT clock_timestamp() + interval '1.5 s'");
$node->safe_psql('postgres', qq{
SET ROLE app;
SELECT status FROM ds_run_step('def', 'at',
  'INSERT INTO deferred_effects(step, who) VALUES (''at'', current_user)',
  run_at => '$run_at');
});
ok(poll_until($node, 'postgres',
		"SELECT status NOT IN ('pending', 'running') FROM ds_steps WHERE step_id = 'at'"),
	'at: the worker ran the step');
is($node->safe_psql('postgres',
		"SELECT started_at >= '$run_at' FROM ds_attempts WHERE step_id = 'at'"),
	't', 'at: attempt 1 started no earlier than its run_at');

# rolled back: nothing to run, nothing ran
$node->safe_psql('postgres', q{
SET ROLE app;
BEGIN;
SELECT status FROM ds_run_step('def', 'gone', 'INSERT INTO deferred_effects(step) VALUES (''gone'')',
  defer => true);
ROLLBACK;
SELECT status FROM ds_run_step('def', 'marker', 'SELECT 1', defer => true);
});
ok(poll_until($node, 'postgres',
		"SELECT status NOT IN ('pending', 'running') FROM ds_steps WHERE step_id = 'marker'"),
	'gone: a later deferred step ran');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM deferred_effects WHERE step = 'gone'"), '0',
	'gone: the rolled-back deferred step never ran');

# notify: the step's channel hears when the worker has recorded that it stopped
my $listener = DurableSteps::Session->new($node, 'listener');
$listener->query_ok('LISTEN ds_done;');
$node->safe_psql('postgres', q{
SET ROLE app;
SELECT status FROM ds_run_step('def', 'notified', 'SELECT 1', defer => true, notify => 'ds_done');
});
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE step_id = 'notified'", 'succeeded'),
	'notify: the worker ran the step');
my ($heard) = $listener->query('SELECT 1;');
like($heard,
	qr/Asynchronous notification "ds_done" with payload "\{"run_id": "def", "step_id": "notified", "status": "succeeded", "attempt": 1\}" received/,
	'notify: the listener got the identity and the status');
$listener->quit;

$node->stop;
done_testing();
