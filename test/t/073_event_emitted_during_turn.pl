# An event emitted while a run's turn begins to wait for it (docs/runs.md, "Events"): the emit's
# wake-up finds no waiting run (the turn has not committed its wait), and the executor's second
# look after the turn cannot see an emit that has not committed. The emit holds the event's lock
# to its commit; the second look does not wait for it but has the run look again later, so the
# run goes on once the emit commits. Without that, the run waited for ever.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('event_emitted_during_turn',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n"
	  . "durable_steps.poll_interval = '200ms'\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('go', 'go:1');
END $$;
});
ok(executors_running($node, 1), 'an executor is running');

# the emit runs first, and stays uncommitted while the run starts and its turn waits
my $emitter = DurableSteps::Session->new($node, 'emitter');
$emitter->query_ok(q{BEGIN; SELECT ds_emit_event('go:1', '{"n": 1}');});
$node->safe_psql('postgres', q{SELECT ds_start_run('wf', '{}', 'r1')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'r1'}, 'waiting'),
	'the run waits for the event, whose emit has not committed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
  AND objsubid = 17477 AND NOT granted}), '0', 'the executor does not wait for the open emit');

$emitter->query_ok('COMMIT;');
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || (output->>'n') FROM ds_runs WHERE run_id = 'r1'},
		'succeeded 1'),
	'once the emit commits, the run goes on with its payload');

$emitter->quit;
$node->stop;
done_testing();
