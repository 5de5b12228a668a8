# ds_cancel_step on a step the worker is running (docs/steps.md, "Cancelling a step"): the attempt is
# stopped within a moment, recorded as cancelled, never retried, and the executor goes on; a call
# that rolls back cancels nothing.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# one executor: the test checks that the executor running the cancelled attempt survives
my $node = worker_node('cancel', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
CREATE TABLE cancel_effects (n int);
GRANT INSERT ON cancel_effects TO app;
SET ROLE app;
SELECT status FROM ds_run_step('c', 'hangs',
  'INSERT INTO cancel_effects SELECT 1 FROM pg_sleep(600)', defer => true);
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND query LIKE '%c/hangs attempt 1' AND wait_event = 'PgSleep'"),
	'the worker is running the hanging attempt');
my $executor = executor_pid($node);

# another role: the step does not exist for it, at once (no wait for the running attempt's lock)
$node->safe_psql('postgres', 'CREATE ROLE other');
$node->psql('postgres', q{SET ROLE other; SET statement_timeout = '5s';
SELECT ds_cancel_step('c', 'hangs')}, stderr => \my $other_err);
like($other_err, qr/step c\/hangs does not exist/, 'another role: DS404 at once, not a wait');
is($node->safe_psql('postgres', "SELECT status FROM ds_steps WHERE step_id = 'hangs'"), 'running',
	'another role: the attempt runs on');

my $started = time();
is($node->safe_psql('postgres', q{SET ROLE app;
SELECT status || '|' || attempt || '|' || error_code FROM ds_cancel_step('c', 'hangs')}),
	'cancelled|1|57014', 'ds_cancel_step returns the cancelled step');
cmp_ok(time() - $started, '<', 30, 'it returned within moments, not after the 600 s body');
is($node->safe_psql('postgres',
		"SELECT class || '|' || executor || '|' || error_message FROM ds_attempts WHERE step_id = 'hangs'"),
	'cancelled|worker|cancelled by ds_cancel_step()', 'the attempt is recorded as cancelled');
is($node->safe_psql('postgres', 'SELECT count(*) FROM cancel_effects'), '0',
	'its effect rolled back');

# the executor goes on, and the cancelled step is never attempted again
$node->safe_psql('postgres', q{SET ROLE app;
SELECT status FROM ds_run_step('c', 'next', 'SELECT 1', defer => true)});
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE step_id = 'next'", 'succeeded'),
	'the next step runs');
is(executor_pid($node), $executor, 'in the same executor');
is($node->safe_psql('postgres',
		"SELECT status || '|' || attempt FROM ds_steps WHERE step_id = 'hangs'"),
	'cancelled|1', 'the cancelled step stays cancelled at attempt 1');

# a step nested in the cancelled attempt's body goes with it: it is not cancelled on its own
$node->safe_psql('postgres', q{SET ROLE app;
SELECT status FROM ds_run_step('c', 'outer',
  $o$SELECT (ds_run_step('c', 'inner', 'SELECT pg_sleep(600)')).status$o$, defer => true)});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND wait_event = 'PgSleep'"),
	'nested: the worker is in the inner step\'s body');
is($node->safe_psql('postgres', q{SET ROLE app;
SELECT status FROM ds_cancel_step('c', 'outer')}), 'cancelled', 'nested: the outer step is cancelled');
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE step_id = 'inner'"), '0',
	'nested: the inner step rolled back with the outer attempt');

# a ds_cancel_step that rolls back leaves the step going on: the executor stops the attempt, but
# the step is cancelled by the call's own transaction; the stopped attempt uses no attempt budget
$node->safe_psql('postgres', q{SET ROLE app;
SELECT status FROM ds_run_step('c', 'kept',
  $k$SELECT CASE WHEN ds_attempt_number() = 1 THEN pg_sleep(600)::text ELSE 'done' END$k$,
  defer => true, policy => '{"max_attempts": 1}')});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND query LIKE '%c/kept attempt 1' AND wait_event = 'PgSleep'"),
	'rolled back: the worker is running the hanging attempt');
is($node->safe_psql('postgres', q{SET ROLE app; BEGIN;
SELECT status || '|' || attempt FROM ds_cancel_step('c', 'kept');
ROLLBACK}), 'cancelled|1', 'rolled back: ds_cancel_step said cancelled inside its transaction');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE step_id = 'kept'", 'succeeded'),
	'rolled back: the step went on, and succeeded');
is($node->safe_psql('postgres', q{SELECT string_agg(attempt || ':' || class, ',' ORDER BY attempt)
FROM ds_attempts WHERE step_id = 'kept'}), '1:cancelled,2:completed',
	'rolled back: the stopped attempt, then one more within max_attempts 1');

$node->stop;
done_testing();
