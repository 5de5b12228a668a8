# Runs (docs/runs.md): ds_sleep, events, cancelling, resuming and re-arming, a workflow that
# catches its suspension, and many runs started at once.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = worker_node('runs_waits', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (run text, step text);
CREATE TABLE gate (open boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION napper(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_sleep('nap', (input->>'for')::interval);
    RETURN to_jsonb(clock_timestamp());
END $$;
CREATE FUNCTION waiter(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('ship', input->>'event', (input->>'timeout')::interval);
END $$;
CREATE FUNCTION reserve_then_wait(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('reserve', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    RETURN ds_await_event('ship', 'shipped:' || run_id);
END $$;
CREATE FUNCTION patient(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('ship', 'never', '300 ms');
EXCEPTION WHEN SQLSTATE 'DS408' THEN
    RETURN to_jsonb(SQLERRM);
END $$;
CREATE FUNCTION long_body() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id());
    PERFORM pg_sleep(60);
    RETURN 1;
END $$;
CREATE FUNCTION busy(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('long', 'SELECT long_body()');
END $$;
CREATE FUNCTION catchall(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM ds_sleep('nap', '1 hour');
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    INSERT INTO ledger VALUES (run_id, 'after the caught suspension');
    IF input->>'then' = 'step' THEN
        RETURN ds_step('next', 'SELECT 1');
    END IF;
    RETURN '"returned"';
END $$;
CREATE FUNCTION gated(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('gate', $q$SELECT CASE WHEN open THEN 'through' ELSE ds_non_retriable('closed')::text END FROM gate$q$);
END $$;
CREATE FUNCTION blocker(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('check', $q$SELECT CASE WHEN ($1->>'ok')::boolean THEN 'fine'
                                          ELSE ds_blocked('not ok', 'send ok')::text END$q$, input);
END $$;
-- a step that must find its row (expect => 'row'; docs/steps.md, "Expecting a row")
CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);
CREATE FUNCTION reserve(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('reserve', 'UPDATE stock SET qty = qty - 1 WHERE sku = $1->>''sku'' RETURNING qty',
                   input, expect => 'row');
END $$;
CREATE FUNCTION short(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('one', 'SELECT ($1->>''i'')::int * 2', input);
END $$;
});

my $t = 'sleep';
$node->safe_psql('postgres', q{SELECT ds_start_run('napper', '{"for": "1500 ms"}', 'nap')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'nap'}, 'succeeded'),
	"$t: the run succeeds");
is( $node->safe_psql('postgres',
		q{SELECT (r.output #>> '{}')::timestamptz >= (s.result->>'until')::timestamptz
		     AND (s.result->>'until')::timestamptz >= r.created_at + interval '1500 ms'
		   FROM ds_runs r JOIN ds_steps s USING (run_id) WHERE run_id = 'nap'}),
	't', "$t: the workflow went on no earlier than the sleep's end");
is($node->safe_psql('postgres', q{SELECT turns FROM ds_runs WHERE run_id = 'nap'}),
	'2', "$t: two turns: one that went to sleep, one woken when it was due");

$t = 'events';
is($node->safe_psql('postgres', q{SELECT ds_emit_event('early', '{"n": 1}')}), 't',
	"$t: an emit records the event");
is($node->safe_psql('postgres', q{SELECT ds_emit_event('early', '{"n": 2}')}), 'f',
	"$t: the first emit wins");
$node->safe_psql('postgres', q{SELECT ds_start_run('waiter', '{"event": "early"}', 'ev-early')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ev-early'}, 'succeeded'),
	"$t: an event emitted before the wait is seen");
is($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'ev-early'}),
	'{"n": 1}', "$t: with the first payload");
$node->safe_psql('postgres', q{SELECT ds_start_run('waiter', '{"event": "late"}', 'ev-late')});
ok( poll_row($node, 'postgres', q{SELECT status, wait_event, current_step, next_wake_at FROM ds_runs WHERE run_id = 'ev-late'},
		{ status => 'waiting', wait_event => 'late', current_step => 'ship', next_wake_at => undef }),
	"$t: a run waits for an event not yet emitted, with no wake-up time");
my $t0 = time();
$node->safe_psql('postgres', q{SELECT ds_emit_event('late', '"here"')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ev-late'}, 'succeeded'),
	"$t: the emit wakes it");
cmp_ok(time() - $t0, '<', 5, "$t: at once (not by a poll of its own)");
is($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'ev-late'}),
	'"here"', "$t: the workflow got the payload");
$node->safe_psql('postgres', q{SELECT ds_start_run('reserve_then_wait', '{}', 'ev-reserve')});
ok( poll_row($node, 'postgres', q{SELECT status, wait_event FROM ds_runs WHERE run_id = 'ev-reserve'},
		{ status => 'waiting', wait_event => 'shipped:ev-reserve' }),
	"$t: a run waits for its event after a step");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run = 'ev-reserve'}),
	'1', "$t: the step before the wait has taken effect while the run waits");
$node->safe_psql('postgres', q{SELECT ds_emit_event('shipped:ev-reserve')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ev-reserve'}, 'succeeded'),
	"$t: an event without payload wakes it too");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run = 'ev-reserve'}),
	'1', "$t: and the step took effect once");
$node->safe_psql('postgres',
	q{SELECT ds_start_run('waiter', '{"event": "never", "timeout": "300 ms"}', 'ev-timeout')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ev-timeout'}, 'failed'),
	"$t: an uncaught timeout fails the run");
is_deeply(
	row_of($node, 'postgres',
		q{SELECT r.error_code AS run_error_code, s.status AS step_status, s.error_code AS step_error_code
		    FROM ds_runs r JOIN ds_steps s USING (run_id) WHERE run_id = 'ev-timeout'}),
	{ run_error_code => 'DS408', step_status => 'failed', step_error_code => 'DS408' },
	"$t: with DS408, the wait's step recorded failed");
$node->safe_psql('postgres', q{SELECT ds_start_run('patient', '{}', 'ev-caught')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ev-caught'}, 'succeeded'),
	"$t: a caught timeout lets the workflow go on");
like($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'ev-caught'}),
	qr/event never was not emitted in time/, "$t: it caught DS408");

$t = 'cancel';
$node->safe_psql('postgres', q{SELECT ds_start_run('napper', '{"for": "1 hour"}', 'c-sleep')});
$node->safe_psql('postgres', q{SELECT ds_start_run('waiter', '{"event": "nope"}', 'c-wait')});
ok( poll_until($node, 'postgres',
		q{SELECT count(*) = 2 FROM ds_runs WHERE run_id IN ('c-sleep', 'c-wait') AND status = 'waiting'}),
	"$t: a sleeping and an event-waiting run wait");
is_deeply(row_of($node, 'postgres', q{SELECT ds_cancel_run('c-sleep') AS c_sleep, ds_cancel_run('c-wait') AS c_wait}),
	{ c_sleep => 'cancelled', c_wait => 'cancelled' }, "$t: both are cancelled");
is_deeply(
	rows_of($node, 'postgres',
		q{SELECT run_id, status, finished_at IS NOT NULL AS finished FROM ds_runs
		   WHERE run_id IN ('c-sleep', 'c-wait') ORDER BY run_id}),
	[
		{ run_id => 'c-sleep', status => 'cancelled', finished => 'true' },
		{ run_id => 'c-wait',  status => 'cancelled', finished => 'true' }
	],
	"$t: recorded cancelled");
is($node->safe_psql('postgres', q{SELECT status FROM ds_steps WHERE run_id = 'c-wait'}),
	'cancelled', "$t: the event wait's step is cancelled with its run");
$node->safe_psql('postgres', q{SELECT ds_start_run('busy', '{}', 'c-busy')});
ok( poll_until($node, 'postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity
		   WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'}),
	"$t: a run's step is running");
$t0 = time();
is($node->safe_psql('postgres', q{SELECT ds_cancel_run('c-busy')}), 'cancelled',
	"$t: a running run is cancelled");
cmp_ok(time() - $t0, '<', 10, "$t: without waiting for its step to end");
is_deeply(
	row_of($node, 'postgres',
		q{SELECT r.status, (SELECT count(*) FROM ledger WHERE run = 'c-busy') AS effects
		   FROM ds_runs r WHERE run_id = 'c-busy'}),
	{ status => 'cancelled', effects => 0 }, "$t: the step it ran took no effect");
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT ds_cancel_run('nap')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS103.*run nap is succeeded and cannot be cancelled/, "$t: a finished run cannot be");
($rc, $out, $err) = $node->psql('postgres', q{SELECT ds_cancel_run('nobody')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS404.*run nobody does not exist/, "$t: an unknown run is DS404");

$t = 'caught suspension';
$node->safe_psql('postgres', q{SELECT ds_start_run('catchall', '{}', 'catchall')});
$node->safe_psql('postgres', q{SELECT ds_start_run('catchall', '{"then": "step"}', 'catchall-step')});
ok( poll_until($node, 'postgres',
		q{SELECT string_agg(run_id || ':' || status || ':' || current_step, ',' ORDER BY run_id)
		    FROM ds_runs WHERE run_id LIKE 'catchall%'}, 'catchall:waiting:nap,catchall-step:waiting:nap'),
	"$t: a workflow that catches its suspension and returns, or calls on, still waits");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run LIKE 'catchall%'}),
	'0', "$t: what it did after catching it was rolled back");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ds_steps WHERE step_id = 'next'}),
	'0', "$t: the call after the caught suspension raised it again: its step never ran");

$t = 'resume';
$node->safe_psql('postgres', q{SELECT ds_start_run('gated', '{}', 'gated')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'gated'}, 'failed'),
	"$t: a run whose step failed for good fails");
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
is($node->safe_psql('postgres', q{SELECT status FROM ds_retry_step('gated', 'gate')}),
	'pending', "$t: its step is re-armed");
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'gated'}, 'succeeded'),
	"$t: the worker runs the re-armed step");
is($node->safe_psql('postgres', q{SELECT ds_resume_run('gated')}), 'waiting', "$t: the run is resumed");
ok( poll_row($node, 'postgres', q{SELECT status, output::text AS output FROM ds_runs WHERE run_id = 'gated'},
		{ status => 'succeeded', output => '"through"' }),
	"$t: and succeeds with the step's result");

$t = 'blocked';
$node->safe_psql('postgres', q{SELECT ds_start_run('blocker', '{"ok": false}', 'blocked')});
ok( poll_row($node, 'postgres', q{SELECT status, wait_reason FROM ds_runs WHERE run_id = 'blocked'},
		{ status => 'blocked', wait_reason => 'step check is blocked: send ok' }),
	"$t: a run whose step is blocked is blocked, with the remediation");
$node->safe_psql('postgres', q{SELECT ds_retry_step('blocked', 'check', '{"ok": true}')});
ok( poll_row($node, 'postgres', q{SELECT status, output::text AS output FROM ds_runs WHERE run_id = 'blocked'},
		{ status => 'succeeded', output => '"fine"' }),
	"$t: re-armed with corrected input, the run goes on with the step as it was re-armed");
is_deeply(
	rows_of($node, 'postgres', q{SELECT attempt, class FROM ds_attempts WHERE run_id = 'blocked' ORDER BY attempt}),
	[ { attempt => 1, class => 'correctable' }, { attempt => 2, class => 'completed' } ],
	"$t: the step's attempts");

$t = 'a step that expects a row';
$node->safe_psql('postgres', q{SELECT ds_start_run('reserve', '{"sku": "B-2"}', 'no-row')});
ok( poll_row($node, 'postgres', q{SELECT r.status, s.error_code, s.expect FROM ds_runs r
		JOIN ds_steps s USING (run_id) WHERE run_id = 'no-row'},
		{ status => 'blocked', error_code => 'DS008', expect => 'row' }),
	"$t: a sku that is not there blocks its step (DS008) and the run, rather than a NULL result");
$node->safe_psql('postgres', q{INSERT INTO stock VALUES ('B-2', 3)});
$node->safe_psql('postgres', q{SELECT ds_retry_step('no-row', 'reserve')});
ok( poll_row($node, 'postgres', q{SELECT status, output::text AS output FROM ds_runs WHERE run_id = 'no-row'},
		{ status => 'succeeded', output => '2' }),
	"$t: once the row is there, the re-armed step finds it and the run goes on");
$node->safe_psql('postgres',
	q{SELECT ds_run_step('no-row-deferred', 's', 'SELECT 1 WHERE false', expect => 'row', defer => true)});
ok( poll_row($node, 'postgres', q{SELECT status, error_code FROM ds_steps WHERE run_id = 'no-row-deferred'},
		{ status => 'blocked', error_code => 'DS008' }),
	"$t: the worker's attempt of a deferred step that finds no row is blocked the same way");

$t = 'many runs';
$t0 = time();
$node->safe_psql('postgres',
	q{SELECT count(*) FROM generate_series(1, 1000) g, ds_start_run('short', jsonb_build_object('i', g))});
ok( poll_until($node, 'postgres',
		q{SELECT count(*) = 1000 FROM ds_runs WHERE workflow LIKE 'public.short(%' AND status = 'succeeded'}),
	"$t: 1,000 runs started in one transaction all succeed");
note(sprintf("1,000 runs in %.1f s", time() - $t0));
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM ds_runs WHERE workflow LIKE 'public.short(%'
		    AND output::text::int = 2 * (input->>'i')::int}),
	'1000', "$t: each with its own output");

$t = 'an emit whose wake-up was lost';
# The emit commits while the turn that records the wait runs (it sees no waiting run to wake),
# and the executor ends before it looks once more after its commit: written here by hand, the
# event with no wake-up at all. An executor that ends makes the others look for such runs.
$node->safe_psql('postgres', q{SELECT ds_start_run('waiter', '{"event": "lost-wake"}', 'ev-lost')});
ok( poll_row($node, 'postgres', q{SELECT status, wait_event FROM ds_runs WHERE run_id = 'ev-lost'},
		{ status => 'waiting', wait_event => 'lost-wake' }),
	"$t: the run waits");
$node->safe_psql('postgres', q{
INSERT INTO durable_steps.events (owner, name, payload)
SELECT owner, 'lost-wake', '"found"' FROM durable_steps.runs WHERE run_id = 'ev-lost'});
my $executor = $node->safe_psql('postgres',
	"SELECT min(pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($executor)"), 't', "$t: an executor ends");
ok( poll_row($node, 'postgres', q{SELECT status, output::text AS output FROM ds_runs WHERE run_id = 'ev-lost'},
		{ status => 'succeeded', output => '"found"' }),
	"$t: the run is woken, finds its event and succeeds");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
