# Property: a blocked run's step re-armed with corrected input (docs/runs.md) may be run by an
# executor as a plain step while the run's turn reaches its ds_step: the turn waits for that
# attempt and replays it. Both take the step's lock before its row's (store/direct_write.c): a
# turn that held the row while it waited for the step's lock would deadlock with the attempt's
# record, and the run would fail with 40P01 although its step succeeded. Advisory locks gate
# the two so that the turn always arrives while the attempt is in flight.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Session;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('rearmed_in_flight', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
-- the turn waits at gate 7 before its ds_step; the step's corrected body waits at gate 8
CREATE FUNCTION gate(k int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(k);
    RETURN k;
END $$;
CREATE FUNCTION blocker(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gate(7);
    RETURN ds_step('check', $q$SELECT CASE WHEN ($1->>'ok')::boolean THEN 'fine' || gate(8)
                                          ELSE ds_blocked('not ok', 'send ok')::text END$q$, input);
END $$;
});
ok(executors_running($node, 2), 'two executors');

$node->safe_psql('postgres', q{SELECT ds_start_run('blocker', '{"ok": false}', 'race')});
ok( poll_row($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'race'},
		{ status => 'blocked' }),
	'the run is blocked');

my $s = DurableSteps::Session->new($node);
$s->query_ok('SELECT pg_advisory_lock(7), pg_advisory_lock(8);');
$node->safe_psql('postgres', q{SELECT ds_retry_step('race', 'check', '{"ok": true}')});

# an executor claims the re-armed step as a plain step (committed running, waiting at gate 8),
# and the other one takes the run's turn (waiting at gate 7)
ok( poll_until($node, 'postgres',
		q{SELECT (SELECT status FROM ds_steps WHERE run_id = 'race') = 'running'
		     AND (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		           AND objid IN (7, 8) AND objsubid = 1) = 2}),
	'the step runs as a plain step, the turn waits before its ds_step');

# the turn reaches ds_step: the step's attempt is in flight, so it waits for the step's lock
# (an advisory lock of objsubid 0x4453: store/step_lock.c)
$s->query_ok('SELECT pg_advisory_unlock(7);');
ok( poll_until($node, 'postgres',
		q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		   AND objsubid = 17491}, '1'),
	"the turn waits for the step's lock");

# the attempt goes on and records its outcome
$s->query_ok('SELECT pg_advisory_unlock(8);');
$s->quit;

ok( poll_until($node, 'postgres',
		q{SELECT status IN ('succeeded', 'failed') FROM ds_runs WHERE run_id = 'race'}),
	'the run ends');
my $run = row_of($node, 'postgres',
	q{SELECT status, output::text AS output, error_code, error_message FROM ds_runs WHERE run_id = 'race'});
is_deeply(
	[ $run->{status}, $run->{output} ],
	[ 'succeeded', '"fine8"' ],
	'the run replays the step the executor ran, and succeeds');
is_deeply(
	rows_of($node, 'postgres', q{SELECT attempt, class FROM ds_attempts WHERE run_id = 'race' ORDER BY attempt}),
	[ { attempt => 1, class => 'correctable' }, { attempt => 2, class => 'completed' } ],
	"the step's attempts");

$node->stop;
done_testing();
