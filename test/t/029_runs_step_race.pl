# A run and a step created under its run_id at the same time meet as they would one after the
# other (docs/runs.md): another role can neither start a run over a step being created nor
# create a step in a run being started (42501), and the owner's step created while its run is
# being started takes the run's policy. The run_id's lock serializes the two, in either order:
# the second waits for the first to commit or roll back, then sees it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Session;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('runs_step_race', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 0\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('only', 'SELECT 1');
END $$;
});

sub count_of
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM $sql");
}

# Session $s as $role runs $first in an open transaction; then $role2 calls $second in another
# session, which must wait for the first one's lock; $end (COMMIT or ROLLBACK) ends the first.
# Returns what the second call answered: its output, or "SQLSTATE: message".
sub race
{
	my ($role, $first, $role2, $second, $end) = @_;
	my $s1 = DurableSteps::Session->new($node);
	my $s2 = DurableSteps::Session->new($node);
	$s1->query_ok("SET ROLE $role; BEGIN;");
	$s1->query_ok($first);
	$s2->query_ok("\\set VERBOSITY verbose\nSET ROLE $role2;");
	my $ticket = $s2->send($second);
	my $pid = $s2->pid;
	ok(poll_until($node, 'postgres',
			"SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = $pid",
			'Lock:advisory'),
		"$role2\'s call waits for $role\'s open transaction");
	$s1->query_ok("$end;");
	my ($o, $e) = $s2->wait($ticket);
	$s1->quit;
	$s2->quit;
	return $e =~ /ERROR:\s+(\w{5}: [^\n]*)/ ? $1 : $o;
}

my $t = 'a step first';
is(race('alice', q{SELECT ds_run_step('ra', 'plain', 'SELECT 1', defer => true);},
		'mallory', q{SELECT created FROM ds_start_run('wf', '{}', 'ra');}, 'COMMIT'),
	'42501: run ra belongs to another role', "$t: another role's start, once the step committed, is refused");
is(count_of(q{durable_steps.runs WHERE run_id = 'ra'}), '0', "$t: no run was stored");
is(race('alice', q{SELECT ds_run_step('rr', 'plain', 'SELECT 1');},
		'mallory', q{SELECT created FROM ds_start_run('wf', '{}', 'rr');}, 'ROLLBACK'),
	't', "$t: the step rolled back, the start creates the run");
is(race('alice', q{SELECT ds_run_step('ro', 'plain', 'SELECT 1');},
		'alice', q{SELECT created FROM ds_start_run('wf', '{}', 'ro');}, 'COMMIT'),
	't', "$t: the owner's own start over its step creates the run, as in sequence");

$t = 'a run first';
is(race('alice', q{SELECT created FROM ds_start_run('wf', '{}', 'rb', '{"max_attempts": 7}');},
		'mallory', q{SELECT status FROM ds_run_step('rb', 'plain', 'SELECT 1', defer => true);}, 'COMMIT'),
	'42501: run rb belongs to another role', "$t: another role's step, once the run committed, is refused");
is(count_of(q{durable_steps.steps WHERE run_id = 'rb'}), '0', "$t: no step was stored");
is(race('alice', q{SELECT created FROM ds_start_run('wf', '{}', 'rx', '{"max_attempts": 7}');},
		'mallory', q{SELECT status FROM ds_run_step('rx', 'plain', 'SELECT 1', defer => true);}, 'ROLLBACK'),
	'pending', "$t: the start rolled back, the step is created");
is(race('alice', q{SELECT created FROM ds_start_run('wf', '{}', 'rp', '{"max_attempts": 7}');},
		'alice', q{SELECT max_attempts FROM ds_run_step('rp', 'plain', 'SELECT 1', defer => true);}, 'COMMIT'),
	'7', "$t: the owner's step, once the run committed, takes the run's policy, as in sequence");
is(count_of(q{durable_steps.runs WHERE run_id IN ('rb', 'rx', 'rp', 'rr', 'ro')}), '4',
	'the committed runs only');

done_testing();
