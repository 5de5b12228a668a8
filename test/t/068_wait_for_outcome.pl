# Property: ds_wait_step and ds_wait_run return as soon as the step or the run has stopped,
# woken by the commit that records it, not by polling (docs/steps.md, "Waiting for a step"): the
# waiter sleeps on its condition variable (wait event type Extension) while the worker runs the
# step. A wait whose timeout passes answers the current state; a cancelled wait changes
# nothing; nobody waits on another role's step.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('wait_for_outcome', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE waiter_alice LOGIN;
CREATE ROLE waiter_bob LOGIN;
CREATE FUNCTION gate(k int) RETURNS int LANGUAGE sql AS 'SELECT k FROM (SELECT pg_advisory_xact_lock_shared(k)) s';
CREATE FUNCTION shipped(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('ship', 'SELECT gate(5)::text');
END $$;
});

# the worker's attempt waits at gate 1 until the test opens it
my $holder = DurableSteps::Session->new($node, 'holder');
$holder->query_ok('SELECT pg_advisory_lock(1);');
$node->safe_psql('postgres', q{SELECT status FROM ds_run_step('w', 'gated', 'SELECT gate(1)', defer => true)});

my $waiter = DurableSteps::Session->new($node, 'waiter');
my $ticket = $waiter->send(
	q{SELECT status || ' ' || result::text FROM ds_wait_step('w', 'gated', '60 s');});
ok( poll_until($node, 'postgres',
		qq{SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = ${\ $waiter->pid }},
		'Extension:Extension'),
	'the waiter sleeps on its condition variable while the worker runs the step');
$holder->query_ok('SELECT pg_advisory_unlock(1);');
my ($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'succeeded 1|', 'the commit of the outcome wakes the waiter with the step');
my $lag = $waiter->query_ok(
	q{SELECT extract(epoch FROM clock_timestamp() - finished_at) < 5 FROM ds_steps WHERE run_id = 'w' AND step_id = 'gated';});
is($lag, 't', 'it returned right after the outcome committed (well within its 60 s)');

# a timeout answers the state as it is, and took the time asked for
$holder->query_ok('SELECT pg_advisory_lock(2);');
$node->safe_psql('postgres', q{SELECT status FROM ds_run_step('w', 'slow', 'SELECT gate(2)', defer => true)});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'slow'}, 'running'),
	'a step the worker is running');
is( $waiter->query_ok(
		q{SELECT (ds_wait_step('w', 'slow', '300 ms')).status || ' ' || (clock_timestamp() - statement_timestamp() >= '300 ms');}),
	'running true', 'a wait whose timeout passes answers the current state, after the timeout');

# a cancelled wait is an error and changes nothing
$ticket = $waiter->send(q{SELECT status FROM ds_wait_step('w', 'slow', '60 s');});
ok( poll_until($node, 'postgres',
		qq{SELECT wait_event_type FROM pg_stat_activity WHERE pid = ${\ $waiter->pid }}, 'Extension'),
	'a second wait sleeps');
$node->safe_psql('postgres', "SELECT pg_cancel_backend(${\ $waiter->pid })");
($out, $err) = $waiter->wait($ticket);
like($err, qr/57014|canceling statement/, 'cancelled, the wait ends with 57014');
is($node->safe_psql('postgres', q{SELECT status FROM ds_steps WHERE step_id = 'slow'}),
	'running', 'the step it waited for is untouched');
$holder->query_ok('SELECT pg_advisory_unlock(2);');

# runs: the run's end wakes its waiter; so does its cancellation
$holder->query_ok('SELECT pg_advisory_lock(5);');
$node->safe_psql('postgres', q{SELECT ds_start_run('shipped', '{}', 'ship-1')});
$ticket = $waiter->send(q{SELECT status || ' ' || output::text FROM ds_wait_run('ship-1', '60 s');});
ok( poll_until($node, 'postgres',
		qq{SELECT wait_event_type FROM pg_stat_activity WHERE pid = ${\ $waiter->pid }}, 'Extension'),
	'a waiter on a run sleeps');
$holder->query_ok('SELECT pg_advisory_unlock(5);');
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'succeeded "5"|', 'the run succeeded: its waiter has its output');

$holder->query_ok('SELECT pg_advisory_lock(5);');
$node->safe_psql('postgres', q{SELECT ds_start_run('shipped', '{}', 'ship-2')});
$ticket = $waiter->send(q{SELECT status FROM ds_wait_run('ship-2', '60 s');});
ok( poll_until($node, 'postgres',
		qq{SELECT wait_event_type FROM pg_stat_activity WHERE pid = ${\ $waiter->pid }}, 'Extension'),
	'a waiter on the second run sleeps');
$node->safe_psql('postgres', q{SELECT ds_cancel_run('ship-2')});
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'cancelled|', 'ds_cancel_run wakes the waiter with the run cancelled');
$holder->query_ok('SELECT pg_advisory_unlock(5);');

# roles: a step or a run of another role does not exist for the waiter
$node->safe_psql('postgres',
	q{SET ROLE waiter_alice; SELECT status FROM ds_run_step('alice', 'mine', 'SELECT 1'); RESET ROLE;});
my ($rc, $o, $e) = psql_as($node, 'waiter_bob', q{SELECT status FROM ds_wait_step('alice', 'mine', '1 s')});
like($e, qr/DS404/, "another role's step: DS404");
($rc, $o, $e) = psql_as($node, 'waiter_alice', q{SELECT status FROM ds_wait_step('alice', 'mine', '1 s')});
is($o, 'succeeded', 'its owner waits on it');
($rc, $o, $e) = psql_as($node, 'waiter_bob', q{SELECT status FROM ds_wait_run('ship-1', '1 s')});
like($e, qr/DS404/, "another role's run: DS404");

# bad arguments
($rc, $o, $e) = psql_as($node, 'waiter_alice', q{SELECT status FROM ds_wait_step('alice', 'mine', '-1 s')});
like($e, qr/22023/, 'a negative timeout: 22023');
($rc, $o, $e) = psql_as($node, 'waiter_alice', q{SELECT status FROM ds_wait_step('alice', 'mine', '2 days')});
like($e, qr/22023/, 'a timeout over a day: 22023');
($rc, $o, $e) = psql_as($node, 'waiter_alice', q{SELECT status FROM ds_wait_step('alice', NULL)});
like($e, qr/22004/, 'a NULL step_id: 22004');
($rc, $o, $e) = psql_as($node, 'waiter_alice', q{SELECT status FROM ds_wait_step('alice', 'nope', '1 s')});
like($e, qr/DS404/, 'a step that does not exist: DS404');

$waiter->quit;
$holder->quit;
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
