# Property: a run and the steps under its run_id are one role's (docs/security.md). mallory
# (LOGIN, nothing else) can neither start a run under the run_id of alice's steps (not even in a
# race with their creation) nor put a step of any kind into alice's run; the one exception is a
# SECURITY DEFINER function that the run's own workflow calls, whose step is its definer's, in
# the run, and only during the run's turn.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Session;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_run_steps',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});
ok(executors_running($node, 1), 'an executor is running');

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
psql_as_ok($node, 'mallory', q{
CREATE FUNCTION mallory_wait(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('never', 'never');
END $$;
});

# A run key names a run of one role, but a run's steps are found by run_id alone: another role's
# plain steps under that run_id must stay out of the run -- neither replayed by its workflow nor
# cancelled with it.
my $t = 'a run over another role\'s steps';
psql_as_ok($node, 'alice', q{SELECT ds_run_step('nightly', 'report', 'SELECT 1', defer => true,
                                     run_at => now() + interval '1 day')});
my ($rc, $out, $err) = psql_as($node, 'mallory', q{SELECT * FROM ds_start_run('mallory_wait', '{}', 'nightly')});
like($err, qr/42501.*run nightly belongs to another role/,
	"$t: mallory cannot start a run under the run_id of alice's steps");
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.runs WHERE run_id = 'nightly'}), '0',
	"$t: no run was stored");
# the same in a race: mallory's start waits for alice's step to commit (the run_id's lock), then
# sees it (TAP 029 has both orders)
my $s = DurableSteps::Session->new($node);
my $m = DurableSteps::Session->new($node);
$s->query_ok(q{SET SESSION AUTHORIZATION alice; BEGIN;});
$s->query_ok(q{SELECT ds_run_step('nightly-2', 'report', 'SELECT 1', defer => true,
                                  run_at => now() + interval '1 day');});
$m->query_ok(q{SET SESSION AUTHORIZATION mallory;});
my $ticket = $m->send(q{SELECT created FROM ds_start_run('mallory_wait', '{}', 'nightly-2');});
my $mpid = $m->pid;
ok(poll_until($node, 'postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $mpid", 'Lock'),
	"$t: mallory's start under the run_id of alice's step being created waits for it");
$s->query_ok(q{COMMIT;});
my (undef, $merr) = $m->wait($ticket);
like($merr, qr/run nightly-2 belongs to another role/, "$t: and is then refused");
$s->quit;
$m->quit;
is($node->safe_psql('postgres',
		q{SELECT status FROM durable_steps.steps WHERE run_id = 'nightly-2' AND step_id = 'report'}),
	'pending', "$t: alice's step of that run_id is still pending");

# A step squatted in another role's run: the run's steps must stay its owner's.
$t = 'steps in another role\'s run';
is(psql_as_ok($node, 'alice', q{SELECT status FROM ds_start_run('alice_wf', '{"order": "o-1"}', 'checkout:o-1')}),
	'pending', "$t: alice starts a run");
ok(poll_row($node, 'postgres', q{SELECT status, wait_event FROM durable_steps.runs WHERE run_id = 'checkout:o-1'},
		{ status => 'waiting', wait_event => 'go:o-1' }), "$t: it waits for alice's event");
($rc, $out, $err) = psql_as($node, 'mallory', q{SELECT ds_run_step('checkout:o-1', 'charge', 'SELECT 1')});
like($err, qr/42501.*run checkout:o-1 belongs to another role/,
	"$t: mallory cannot create a step in alice's run");
($rc, $out, $err) =
  psql_as($node, 'mallory', q{SELECT ds_run_step('checkout:o-1', 'early', 'SELECT 1', defer => true)});
like($err, qr/42501.*run checkout:o-1 belongs to another role/, "$t: nor a deferred one");
$node->safe_psql('postgres', q{GRANT durable_steps_http TO mallory});
($rc, $out, $err) = psql_as($node, 'mallory',
	q{SELECT ds_http_step('checkout:o-1', 'charge', '{"url": "http://127.0.0.1:9/x"}')});
like($err, qr/42501.*run checkout:o-1 belongs to another role/, "$t: nor an HTTP one");
psql_as_ok($node, 'alice', q{SELECT ds_emit_event('go:o-1', '{"from": "alice"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'checkout:o-1'}, 'succeeded'),
	"$t: alice's run succeeds");
is_deeply(
	rows_of($node, 'postgres',
		q{SELECT step_id, owner::text AS owner FROM durable_steps.steps WHERE run_id = 'checkout:o-1' ORDER BY step_id}),
	[ { step_id => 'charge', owner => 'alice' }, { step_id => 'go', owner => 'alice' } ],
	"$t: its steps are alice's own");

# The exception: the run's own workflow may call a SECURITY DEFINER function whose step is then
# its definer's, in the run.
$t = 'a definer\'s step in a run';
$node->safe_psql('postgres', q{CREATE ROLE bob LOGIN; GRANT CREATE ON SCHEMA public TO bob});
psql_as_ok($node, 'bob', q{
CREATE FUNCTION bob_step(run_id text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER
    AS $$SELECT ds_step('bob', 'SELECT to_jsonb(current_user::text)')$$;
REVOKE ALL ON FUNCTION bob_step(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION bob_step(text) TO alice;
});
psql_as_ok($node, 'alice', q{
CREATE FUNCTION alice_def(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql
    AS $$SELECT bob_step(run_id)$$;
SELECT ds_start_run('alice_def', '{}', 'definer');
});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'definer'},
		'succeeded'), "$t: alice's run succeeds");
is($node->safe_psql('postgres', q{SELECT output FROM durable_steps.runs WHERE run_id = 'definer'}),
	'"bob"', "$t: with the step bob's function made, run as bob");
($rc, $out, $err) = psql_as($node, 'bob', q{SELECT ds_run_step('definer', 'other', 'SELECT 1')});
like($err, qr/42501.*run definer belongs to another role/, "$t: outside the run's turn bob cannot add a step");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
