# Property: a wait that is its whole statement -- SELECT ... FROM ds_wait_step(...) or
# ds_wait_run(...), in READ COMMITTED -- does not hold back VACUUM while it sleeps: its backend
# publishes no xmin, rows deleted during the wait are removed, and the wait still answers the
# outcome that another session records later (docs/steps.md, "Waiting for a step"). A wait inside
# a larger statement, a function, a REPEATABLE READ transaction or next to an open cursor keeps
# its snapshot, and what its statement reads after the wait is what that snapshot saw.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# no worker: the steps and runs waited for stop only when a session of the test stops them
my $node = worker_node('wait_vacuum_horizon', "durable_steps.max_workers = 0\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE churn (id int) WITH (autovacuum_enabled = off);
CREATE FUNCTION idle_flow(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('never', 'SELECT 1');
END $$;
CREATE FUNCTION wait_in_function() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT status FROM ds_wait_step('h', 'held', '5 s'));
END $$;
SELECT status FROM ds_run_step('h', 'later', 'SELECT 42', defer => true);
SELECT status FROM ds_run_step('h', 'held', 'SELECT 1', defer => true);
});

my $waiter = DurableSteps::Session->new($node, 'waiter');
my $wpid = $waiter->pid;

# Once the waiter sleeps in its wait: 't' when its backend publishes no xmin, 'f' when it does.
sub xmin_released_while_asleep
{
	my $poll = DurableSteps::Session->new($node, 'poll');
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my $out = '';
	while (time() < $deadline)
	{
		$out = $poll->query_ok(
			qq{SELECT backend_xmin IS NULL FROM pg_stat_activity WHERE pid = $wpid AND wait_event_type = 'Extension';}
		);
		last if $out ne '';
		usleep(50_000);
	}
	$poll->quit;
	return $out;
}

# Deletes the 1000 rows of churn and vacuums it; returns VACUUM VERBOSE's report.
sub delete_and_vacuum
{
	$node->safe_psql('postgres', 'DELETE FROM churn');
	my ($rc, $out, $err) = $node->psql('postgres', 'VACUUM (VERBOSE) churn');
	return $err;
}

sub dead_rows
{
	return $node->safe_psql('postgres',
		q{SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'churn'});
}

# ---- a wait of 10 s and more on a step, during which VACUUM removes 1000 deleted rows ----

$node->safe_psql('postgres', 'INSERT INTO churn SELECT generate_series(1, 1000)');
my $ticket = $waiter->send(
	q{SELECT status || ' ' || result::text FROM ds_wait_step('h', 'later', '120 s');});
is(xmin_released_while_asleep(), 't', 'the waiter sleeps without publishing an xmin');
my $report = delete_and_vacuum();
like($report, qr/tuples: 1000 removed/, 'VACUUM during the wait removes the 1000 deleted rows');
is(dead_rows(), '0', 'no dead row is left in churn');
ok(!$waiter->finished($ticket), 'the wait goes on');
ok( poll_until($node, 'postgres',
		qq{SELECT clock_timestamp() - query_start >= '10 s' FROM pg_stat_activity WHERE pid = $wpid AND wait_event_type = 'Extension'}
	),
	'the waiter has slept for 10 s');
is($node->safe_psql('postgres', q{SELECT status FROM ds_run_step('h', 'later', 'SELECT 42')}),
	'succeeded', 'another session runs the step');
my ($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'succeeded 42|', 'the wait answers the outcome that session recorded');

# ---- the same for a run, the form without FROM, and a READ COMMITTED transaction block ----

$node->safe_psql('postgres', q{INSERT INTO churn SELECT generate_series(1, 1000);
	SELECT ds_start_run('idle_flow', '{}', 'hr')});
$ticket = $waiter->send(q{SELECT status FROM ds_wait_run('hr', '120 s');});
is(xmin_released_while_asleep(), 't', 'a waiter on a run sleeps without publishing an xmin');
like(delete_and_vacuum(), qr/tuples: 1000 removed/, 'VACUUM during its wait removes the rows');
$node->safe_psql('postgres', q{SELECT ds_cancel_run('hr')});
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'cancelled|', 'ds_cancel_run in another session ends the wait with the run');

$ticket = $waiter->send(q{SELECT (ds_wait_step('h', 'held', '5 s')).status;});
is(xmin_released_while_asleep(), 't', 'SELECT ds_wait_step(...) without FROM releases it too');
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'pending|', 'and answers the step as it is at the timeout');

$ticket = $waiter->send(
	q{BEGIN; SELECT status FROM ds_wait_step('h', 'held', '5 s'); COMMIT;});
is(xmin_released_while_asleep(), 't',
	'so does the first statement of a READ COMMITTED transaction block');
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'pending|', 'which answers the same');

# ---- waits that keep their snapshot, as any statement does ----

# the statement reads churn after the wait: it must see the rows its snapshot saw
$node->safe_psql('postgres', 'INSERT INTO churn SELECT generate_series(1, 1000)');
$ticket = $waiter->send(
	q{SELECT w.status || ' ' || (SELECT count(*) FROM churn) FROM ds_wait_step('h', 'held', '5 s') w;});
is(xmin_released_while_asleep(), 'f', 'a wait inside a larger statement keeps its xmin');
like(delete_and_vacuum(), qr/1000 are dead but not yet removable/,
	'VACUUM during that wait keeps the deleted rows');
($out, $err) = $waiter->wait($ticket);
is("$out|$err", 'pending 1000|', 'which the rest of the statement reads after the wait');
$node->safe_psql('postgres', 'VACUUM churn');

my %kept = (
	'in REPEATABLE READ' =>
	  q{BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT status FROM ds_wait_step('h', 'held', '5 s'); COMMIT;},
	'in a function' => q{SELECT wait_in_function();},
	'next to a table in the query' =>
	  q{SELECT c.id || ' ' || (ds_wait_step('h', 'held', '5 s')).status FROM churn c;},
	'next to a stable function' =>
	  q{SELECT status || ' ' || (now() > '2000-01-01') FROM ds_wait_step('h', 'held', '5 s');},
	'with a cursor open' =>
	  q{BEGIN; DECLARE c CURSOR FOR SELECT 1 FROM pg_class; FETCH 1 FROM c; SELECT status FROM ds_wait_step('h', 'held', '5 s'); COMMIT;},
);
$node->safe_psql('postgres', 'INSERT INTO churn VALUES (7)');
for my $case (sort keys %kept)
{
	$ticket = $waiter->send($kept{$case});
	is(xmin_released_while_asleep(), 'f', "a wait $case keeps its xmin");
	($out, $err) = $waiter->wait($ticket);
	is($err, '', "and ends without an error ($case)");
}

$waiter->quit;
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
