# ds_http inside a run's workflow (docs/runs.md and "HTTP steps"): an HTTP charge between two
# SQL steps, retried by the HTTP worker once, charges once and the run goes on with its response;
# a refused request (400) blocks the run; an uncertain one blocks it until ds_resolve_step.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start(close => 1);
my $node = http_node('runs_http');
$node->safe_psql(
	'postgres', q{
CREATE TABLE ledger (run text, step text);
GRANT INSERT ON ledger TO app;
CREATE FUNCTION checkout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    charge jsonb;
BEGIN
    PERFORM ds_step('reserve', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    charge := ds_http('charge', jsonb_build_object('method', 'POST', 'url', input->>'url', 'expect', 'json',
                                                   'json', jsonb_build_object('amount', 42)));
    PERFORM ds_step('confirm', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    RETURN jsonb_build_object('charge', charge);
END $$;
CREATE FUNCTION caught(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_http('charge', jsonb_build_object('url', input->>'url'));
EXCEPTION WHEN SQLSTATE 'DS102' THEN
    RETURN to_jsonb(SQLERRM);
END $$;
CREATE FUNCTION unsure(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    -- a POST without an idempotency key: a timeout leaves it uncertain
    RETURN ds_http('charge', jsonb_build_object('method', 'POST', 'url', input->>'url'),
                   idempotency_header => NULL, timeout => '1 s');
END $$;
});

sub start_run
{
	my ($workflow, $key, $url) = @_;
	return $node->safe_psql('postgres',
		qq{SET ROLE app; SELECT run_id FROM ds_start_run('$workflow', '{"url": "$url"}', '$key',
		   '{"initial_delay": "100 ms", "backoff": "fixed", "max_attempts": 3}')});
}

sub run_field
{
	my ($run, $field) = @_;
	return $node->safe_psql('postgres', "SELECT $field FROM ds_runs WHERE run_id = '$run'");
}

sub ledger
{
	my ($run) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(step, ',' ORDER BY step) FROM ledger WHERE run = '$run'");
}

# --- a SQL step, an HTTP charge answered 503 once then 200, another SQL step
my $ok = start_run('checkout', 'ok', $p->url('ok', 'fault=503'));
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$ok'", 'succeeded'),
	'the run with an HTTP charge succeeded')
  or diag(run_field($ok, 'status || coalesce(wait_reason, \'\') || coalesce(error_message, \'\')'));
is($p->charges('ok'),  1, 'one charge at the provider');
is($p->requests('ok'), 2, 'two requests: the 503 and its retry');
is(ledger($ok), 'confirm,reserve', 'each SQL step took its effect once');
is(run_field($ok, "output->'charge'->>'status'"), '200', "the run's output holds the response");
is(run_field($ok, "output->'charge'->'body'->>'charged'"), 'ok',
	'with the body the provider answered');
is( $node->safe_psql(
		'postgres',
		"SELECT kind || '|' || status || '|' || attempt || '|' || owner FROM ds_steps WHERE run_id = '$ok' AND step_id = 'charge'"
	),
	'http|succeeded|2|app',
	"the charge is an HTTP step of the run, the run owner's, sent twice");

# --- the provider refuses the request (400): the step is blocked, and so is the run
my $bad = start_run('checkout', 'bad', $p->url('bad', 'fault=400'));
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$bad'", 'blocked'),
	'a refused HTTP request blocks the run');
is(run_field($bad, 'current_step'), 'charge', 'at the charge');
like(run_field($bad, 'wait_reason'), qr/HTTP step charge is blocked/, 'and says why');
is(ledger($bad), 'reserve', 'the step after the charge did not run');
is($p->charges('bad'), 0, 'nothing was charged');

is(run_field($bad, "wait_event IS NULL AND next_wake_at IS NULL"), 't', 'woken by nobody but a person');

# --- a step that fails for good (503 past its attempts) raises DS102, which the workflow catches
my $c = start_run('caught', 'caught', $p->url('caught', 'fault=503&times=9'));
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$c'", 'succeeded'),
	'the run whose workflow caught the failed HTTP step succeeded');
like(run_field($c, 'output #>> \'{}\''), qr/^step charge of run \Q$c\E failed \(exhausted\)/,
	'with the step-failed error as its output');
is($p->requests('caught'), 3, 'after the three attempts of the run policy');

# --- an uncertain step blocks the run until a person resolves it; the run then goes on
my $u = start_run('unsure', 'unsure', $p->url('unsure', 'fault=delay&secs=3'));
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$u'", 'blocked'),
	'an uncertain HTTP step blocks the run');
like(run_field($u, 'wait_reason'), qr/HTTP step charge is uncertain/, 'and says why');
$node->safe_psql('postgres',
	qq{SET ROLE app; SELECT ds_resolve_step('$u', 'charge', 'succeeded', '{"status": 200, "body": "found"}')});
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$u'", 'succeeded'),
	'resolved, the run succeeds');
is(run_field($u, "output->>'body'"), 'found', "with the operator's finding as the response");
is($p->charges('unsure'), 1, 'charged once, by the request that timed out');

done_testing();
