# Child runs (docs/runs.md, "Child runs"): a workflow starts children with its turn, once each
# (also across kill -9 of the executors), and joins them -- the child's output, or its failure
# raised at the join (caught, or failing the parent); cancelling the parent cancels its
# unfinished children; another role cannot start children of a run that is not its own.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('child_runs', "durable_steps.database = 'postgres'\nlog_statement = none\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA public TO alice, mallory;
-- each child's effect
CREATE TABLE effects (run_id text, n int);
GRANT ALL ON effects TO alice;
-- a child: sleeps input.nap ms, records its effect, fails for good when input.fail
CREATE FUNCTION kid(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM ds_sleep('nap', ((input->>'nap') || ' ms')::interval);
    PERFORM ds_step('effect', 'INSERT INTO effects VALUES ($1->>''run'', ($1->>''n'')::int)',
                    jsonb_build_object('run', run_id, 'n', input->'n'));
    IF coalesce((input->>'fail')::boolean, false) THEN
        PERFORM ds_step('boom', $$SELECT ds_non_retriable('the kid failed')$$);
    END IF;
    RETURN jsonb_build_object('kid', input->'n');
END
$f$;
-- a parent of two children; input.catch: catch the second one's failure
CREATE FUNCTION parent(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
DECLARE
    a jsonb;
    b jsonb;
    err text;
BEGIN
    PERFORM ds_start_child_run('a', 'kid', jsonb_build_object('n', 1, 'nap', input->'nap'));
    PERFORM ds_start_child_run('b', 'kid', jsonb_build_object('n', 2, 'nap', input->'nap', 'fail', input->'fail'));
    a := ds_join_child('a');
    IF coalesce((input->>'catch')::boolean, false) THEN
        BEGIN
            b := ds_join_child('b');
        EXCEPTION WHEN SQLSTATE 'DS102' THEN
            err := SQLERRM;
        END;
    ELSE
        b := ds_join_child('b');
    END IF;
    RETURN jsonb_build_object('a', a, 'b', b, 'err', err);
END
$f$;
GRANT EXECUTE ON FUNCTION kid(text, jsonb), parent(text, jsonb) TO alice;
});
ok(executors_running($node, 2), 'two executors are up');

# --- two children joined, under kill -9 of the executors ---
my @ok = map { start_run_as($node, 'alice', 'parent', '{"nap": 300}') } 1 .. 5;
ok(poll_until($node, 'postgres', 'SELECT count(*) >= 2 FROM ds_runs WHERE run_id LIKE \'%/%\''),
	'children started');
for (1 .. 2)
{
	my $pid = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' LIMIT 1");
	kill 'KILL', $pid if $pid;
	ok(executors_running($node, 2), 'the executors are back after a kill');
}
for my $run (@ok)
{
	is(settle_run($node, $run), 'succeeded', "parent $run succeeded");
	is($node->safe_psql('postgres', "SELECT output FROM ds_runs WHERE run_id = '$run'"),
		'{"a": {"kid": 1}, "b": {"kid": 2}, "err": null}', 'its output joins its children\'s');
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(run_id || '<' || parent_run_id || ':' || parent_step, ',' ORDER BY run_id)"
			  . " FROM durable_steps.runs WHERE parent_run_id = '$run'"),
		"$run/a<$run:a,$run/b<$run:b", 'each child started once, linked to its step');
	is($node->safe_psql('postgres', "SELECT count(*) FROM effects WHERE run_id LIKE '$run/%'"), '2',
		'each child\'s effect once');
}

# --- a child that fails: raised at the join, caught or failing the parent ---
my $caught = start_run_as($node, 'alice', 'parent', '{"nap": 10, "fail": true, "catch": true}');
is(settle_run($node, $caught), 'succeeded', 'caught: the parent succeeded');
like($node->safe_psql('postgres', "SELECT output->>'err' FROM ds_runs WHERE run_id = '$caught'"),
	qr/step b/, 'caught: the failure names the child\'s step');
my $uncaught = start_run_as($node, 'alice', 'parent', '{"nap": 10, "fail": true}');
is(settle_run($node, $uncaught), 'failed', 'uncaught: the parent failed');
is($node->safe_psql('postgres', "SELECT error_code FROM ds_runs WHERE run_id = '$uncaught'"), 'DS102',
	'uncaught: DS102');

# --- cancelling the parent cancels its unfinished children ---
my $long = start_run_as($node, 'alice', 'parent', '{"nap": 600000}');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 2 FROM ds_runs WHERE run_id LIKE '$long/%' AND status = 'waiting'"),
	'cancel: both children sleep');
psql_as($node, 'alice', "SELECT ds_cancel_run('$long')");
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(status, ',' ORDER BY run_id) FROM ds_runs WHERE run_id = '$long' OR run_id LIKE '$long/%'"),
	'cancelled,cancelled,cancelled', 'cancel: the parent and both children are cancelled');

# --- another role cannot start a child of alice's run, nor join one ---
my ($rc, $out, $err) = psql_as($node, 'mallory',
	qq{SELECT ds_start_child('$long', 'evil', 'kid', '{"n": 9, "nap": 1}')});
like($err, qr/42501/, 'mallory: starting a child of alice\'s run is refused (42501)');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_steps.runs WHERE run_id = '$long/evil'"), '0',
	'mallory: nothing started');
($rc, $out, $err) = psql_as($node, 'mallory', q{SELECT ds_join_child('a')});
like($err, qr/DS105/, 'ds_join_child outside a workflow is DS105');

unlike(slurp_file($node->logfile), qr/TRAP|PANIC|terminated by signal 11/, 'no server process crashed');
$node->stop;
done_testing();
