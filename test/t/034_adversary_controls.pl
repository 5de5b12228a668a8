# Property: mallory (LOGIN, nothing else) can neither see nor steer other roles' work
# (docs/security.md). For her, alice's run and its steps do not exist: every control answers
# DS404 and the views show none of them; taking over alice's run key is 42501 and tells nothing
# about the run; the launcher's ds_serve_this_database and the queue configuration are not hers.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_controls',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});
ok(executors_running($node, 1), 'an executor is running');

# alice's run, finished: its steps are go (the event) and charge
psql_as_ok($node, 'alice', q{
CREATE TABLE alice_log (what text, v text);
CREATE FUNCTION alice_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    ev jsonb;
BEGIN
    ev := ds_await_event('go', 'go:' || (input->>'order'));
    RETURN ds_step('charge', 'INSERT INTO alice_log VALUES (''charge'', $1::text) RETURNING $1', ev);
END $$;
SELECT ds_start_run('alice_wf', '{"order": "o-2"}', 'checkout:o-2');
SELECT ds_emit_event('go:o-2', '{"from": "alice"}');
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'checkout:o-2'}, 'succeeded'),
	"alice's run succeeded");

# The controls and the views: another role's run does not exist for mallory.
my $t = 'controls on another role\'s run';
my ($rc, $out, $err);
for my $call (q{ds_cancel_run('checkout:o-2')}, q{ds_resume_run('checkout:o-2')},
	q{ds_retry_step('checkout:o-2', 'charge')}, q{ds_cancel_step('checkout:o-2', 'go')})
{
	($rc, $out, $err) = psql_as($node, 'mallory', "SELECT $call");
	like($err, qr/DS404/, "$t: $call is DS404 for mallory");
}
is(psql_as_ok($node, 'mallory', q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'checkout:%'}), '0',
	"$t: ds_runs shows mallory none of alice's runs");
is( psql_as_ok($node, 'mallory',
		q{SELECT count(*) FROM ds_steps WHERE run_id LIKE 'checkout:%' AND owner <> 'mallory'::regrole}),
	'0', "$t: nor ds_steps their steps");
($rc, $out, $err) =
  psql_as($node, 'mallory', q{SELECT * FROM ds_start_run('alice_wf', '{"order": "o-2"}', 'checkout:o-2')});
like($err, qr/42501.*belongs to another role/, "$t: alice's run key is 42501 for mallory");
unlike($err, qr/alice_wf|o-2"|succeeded/, "$t: and tells nothing about the run");
($rc, $out, $err) = psql_as($node, 'mallory', q{SELECT durable_steps.ds_serve_this_database()});
like($err, qr/42501/, "$t: the launcher's ds_serve_this_database is not for mallory");

# Queues are the worker's configuration: mallory cannot pause or limit anybody's queue.
$t = 'queues';
($rc, $out, $err) = psql_as($node, 'mallory', q{SELECT ds_set_queue('default', 0)});
like($err, qr/42501.*permission denied to set queue/, "$t: ds_set_queue is 42501 for mallory");
($rc, $out, $err) = psql_as($node, 'mallory', q{INSERT INTO durable_steps.queues VALUES ('default', 0)});
like($err, qr/42501/, "$t: the queues table is not hers to write");
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.queues}), '0',
	"$t: no queue configured");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
