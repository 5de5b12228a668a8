# ds_cancel_run leaves none of the run's steps able to act after it commits (docs/runs.md):
# an uncertain HTTP step is cancelled (no ds_resolve_step or ds_retry_step revives it); an HTTP
# request in flight is waited for and its step then cancelled, not retried; an attempt of the
# run's SQL step that an executor claimed as a plain step is stopped and its step cancelled. The
# fault trials (scripts/faults) found the last one: such an attempt ran, and took its effect,
# after the cancellation. And a ds_cancel_run that rolls back cancels nothing: a turn it stopped
# lets the run go on.

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
my $node = http_node('cancel_run_steps', "durable_steps.poll_interval = '100ms'\n");
$node->safe_psql(
	'postgres', q{
CREATE TABLE ledger (run text, step text, attempt int);
GRANT INSERT ON ledger TO app;
CREATE FUNCTION charge(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_http('charge', jsonb_build_object('method', 'POST', 'url', input->>'url'),
                   idempotency_header => input->>'header',
                   timeout => coalesce((input->>'timeout')::interval, '1 s'),
                   policy => '{"max_attempts": 5, "initial_delay": "100 ms", "backoff": "fixed"}');
END $$;
-- attempt 1 fails, and its retry is due only in an hour; attempt 2 takes 60 s
CREATE FUNCTION slow_body() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('not yet', '1 hour');
    END IF;
    PERFORM pg_sleep(60);
    RETURN ds_attempt_number();
END $$;
CREATE FUNCTION slow_step(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('work', 'SELECT slow_body()', policy => '{"max_attempts": 5}');
END $$;
});

sub start_run
{
	my ($workflow, $key, $input) = @_;
	return $node->safe_psql('postgres',
		qq{SET ROLE app; SELECT run_id FROM ds_start_run('$workflow', '$input', '$key')});
}

sub sql_as_app
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE app; $sql");
	return $rc == 0 ? $out : ($err =~ /ERROR:\s+(.*)/ ? $1 : $err);
}

# --- an uncertain HTTP step: cancelled with its run, it can be neither resolved nor re-armed
my $u = start_run('charge', 'unsure', '{"url": "' . $p->url('unsure', 'fault=delay&secs=3') . '"}');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$u'", 'blocked'),
	'a POST without a key that timed out leaves its step uncertain and the run blocked');
is(step_field($node, $u, 'charge', 'status'), 'uncertain', 'the step is uncertain');
is(sql_as_app("SELECT ds_cancel_run('$u')"), 'cancelled', 'ds_cancel_run cancels the run');
is(step_field($node, $u, 'charge', 'status || \'/\' || coalesce(error_class, \'\')'), 'cancelled/cancelled',
	'and its uncertain step with it');
like(sql_as_app("SELECT ds_resolve_step('$u', 'charge', 'succeeded', '{}')"),
	qr/step \Q$u\E\/charge is cancelled and cannot be resolved/, 'ds_resolve_step refuses it');
like(sql_as_app("SELECT ds_retry_step('$u', 'charge')"), qr/step \Q$u\E\/charge is cancelled and cannot be re-armed/,
	'ds_retry_step refuses it');
is($p->requests('unsure'), 1, 'one request reached the provider');

# --- an HTTP request in flight: waited for, then its step is cancelled instead of retried (its
# 10 s timeout leaves the test time to see it in flight and cancel it on a loaded machine)
my $f = start_run('charge', 'inflight',
	'{"url": "' . $p->url('inflight', 'fault=delay&secs=20')
	  . '", "header": "Idempotency-Key", "timeout": "10 s"}');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = '$f' AND step_id = 'charge'",
		'running'),
	'the keyed request is in flight');
is(sql_as_app("SELECT ds_cancel_run('$f')"), 'cancelled', 'ds_cancel_run answers cancelled');
is(step_field($node, $f, 'charge', 'status || \'/\' || (next_attempt_at IS NULL)'), 'cancelled/true',
	'the step whose request timed out is cancelled, with no retry scheduled');
is_deeply(attempts_of($node, $f, 'charge'), [ { attempt => 1, class => 'retryable', error_code => 'DS012', executor => 'worker' } ],
	'its one attempt ended before the cancellation');
is($p->requests('inflight'), 1, 'the provider saw one request');

# --- a run's SQL step claimed by an executor as a plain step, its attempt running: stopped
my $s = start_run('slow_step', 'slow', '{}');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$s'", 'waiting'),
	'the run waits an hour for the retry of its step');
# the retry falls due while the run still sleeps: an executor claims the step by itself
$node->safe_psql('postgres',
	"UPDATE durable_steps.steps SET next_attempt_at = now() WHERE run_id = '$s' AND step_id = 'work'");
ok(poll_until($node, 'postgres', "SELECT status || ':' || attempt FROM ds_steps WHERE run_id = '$s'",
		'running:2'),
	'an executor runs attempt 2 of the run step as a plain step');
my $t0 = time();
is(sql_as_app("SELECT ds_cancel_run('$s')"), 'cancelled', 'ds_cancel_run answers cancelled');
cmp_ok(time() - $t0, '<', 30, 'without waiting for the 60 s attempt to end');
is(step_field($node, $s, 'work', 'status'), 'cancelled', 'the step is cancelled');
is_deeply(attempts_of($node, $s, 'work'), [ { attempt => 1, class => 'retryable', error_code => 'DS002', executor => 'caller' }, { attempt => 2, class => 'cancelled', error_code => '57014', executor => 'worker' } ],
	'its running attempt was stopped');
is($node->safe_psql('postgres', "SELECT string_agg(attempt::text, ',') FROM ledger WHERE run = '$s'"),
	'', 'and no attempt of it took effect');
is($node->safe_psql('postgres', "SELECT status FROM ds_runs WHERE run_id = '$s'"), 'cancelled',
	'the run is cancelled');

# --- a ds_cancel_run that rolls back cancels nothing: a turn it stopped lets the run go on
$node->safe_psql(
	'postgres', q{
CREATE TABLE go (ok boolean);
GRANT SELECT ON go TO app;
CREATE FUNCTION sleepy(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM go) THEN
        PERFORM pg_sleep(60);
    END IF;
    RETURN '"done"';
END $$;
});
my $k = start_run('sleepy', 'kept', '{}');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND wait_event = 'PgSleep'"),
	'rolled back: the run\'s turn is running');
is($node->safe_psql('postgres', qq{BEGIN; SET LOCAL ROLE app; SELECT ds_cancel_run('$k'); ROLLBACK;
INSERT INTO go VALUES (true)}), 'cancelled', 'rolled back: ds_cancel_run answered cancelled');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$k'", 'succeeded'),
	'rolled back: the run went on, and succeeded');

done_testing();
