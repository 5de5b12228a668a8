# Property: events are per role (docs/security.md, docs/runs.md "Events"). mallory's emit of the
# event alice's run waits for is mallory's own event: it neither wakes alice's run nor feeds it;
# alice's own emit does both.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: the test watches it go round its loop
my $node = worker_node('adversary_events',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});
ok(executors_running($node, 1), 'an executor is running');
my $pid = executor_pid($node);

psql_as_ok($node, 'alice', q{
CREATE TABLE alice_log (what text, v text);
-- waits for alice's event, then charges
CREATE FUNCTION alice_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    ev jsonb;
BEGIN
    ev := ds_await_event('go', 'go:' || (input->>'order'));
    RETURN ds_step('charge', 'INSERT INTO alice_log VALUES (''charge'', $1::text) RETURNING $1', ev);
END $$;
});

my $t = 'events of another role';
psql_as_ok($node, 'alice', q{SELECT ds_start_run('alice_wf', '{"order": "o-2"}', 'checkout:o-2')});
ok(poll_row($node, 'postgres', q{SELECT status, wait_event FROM durable_steps.runs WHERE run_id = 'checkout:o-2'},
		{ status => 'waiting', wait_event => 'go:o-2' }), "$t: alice's run waits for its event");
my $turns = $node->safe_psql('postgres', q{SELECT turns FROM durable_steps.runs WHERE run_id = 'checkout:o-2'});
is(psql_as_ok($node, 'mallory', q{SELECT ds_emit_event('go:o-2', '{"from": "mallory"}')}), 't',
	"$t: mallory records an event of the same name (her own)");
ok(wait_executor_loops($node, 'postgres', $pid, 300), "$t: the executor went round its loop");
is_deeply(
	row_of($node, 'postgres', q{SELECT status, turns FROM durable_steps.runs WHERE run_id = 'checkout:o-2'}),
	{ status => 'waiting', turns => $turns },
	"$t: alice's run still waits, not woken (no turn taken)");
psql_as_ok($node, 'alice', q{SELECT ds_emit_event('go:o-2', '{"from": "alice"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'checkout:o-2'}, 'succeeded'),
	"$t: alice's own emit finishes the run");
is(psql_as_ok($node, 'alice', q{SELECT output FROM ds_runs WHERE run_id = 'checkout:o-2'}), '{"from": "alice"}',
	"$t: with alice's payload");

is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}),
	$pid, 'the same executor ran everything');
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
