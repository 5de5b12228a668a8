# kill -9 of the executor while it runs an attempt (docs/worker.md): the
# attempt is recorded as lost (DS007 invocation_lost, retryable), the next attempt succeeds, and
# the lost attempt's effect rolled back with it.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# one executor: the test kills the one running the step
my $node = worker_node('worker', "durable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
-- one effect per step at most (a second committed effect would make the body fail)
CREATE TABLE kill_effects (
    step    text UNIQUE,
    attempt integer NOT NULL,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
-- attempt 1 (the caller) asks to be retried at once; attempt 2 (the worker) writes its effect
-- and then sleeps long enough to be killed; later attempts write the effect and return
CREATE FUNCTION kill_body() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('go', '0 s');
    END IF;
    INSERT INTO kill_effects(step, attempt) VALUES (ds_run_id() || '/' || ds_step_id(), ds_attempt_number());
    IF ds_attempt_number() = 2 THEN
        PERFORM pg_sleep(60);
    END IF;
    RETURN 'done at attempt ' || ds_attempt_number();
END
$$;
});

{
	my $t = 'kill -9';
	is( $node->safe_psql(
			'postgres',
			q{SELECT status || '|' || attempt FROM ds_run_step('k1', 's1', 'SELECT kill_body()',
			  policy => '{"max_attempts": 5, "initial_delay": "10 ms"}')}),
		'retrying|1',
		"$t: the caller's attempt asks for a retry");

	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'
   AND query LIKE 'durable_steps: running k1/s1 attempt 2%'}),
		"$t: the executor sleeps in attempt 2");
	my $pid = executor_pid($node);
	is( $node->safe_psql(
			'postgres',
			q{SELECT s.status || '|' || s.attempt || '|' || coalesce(a.class, 'null') || '|' ||
			         a.executor || '|' || a.backend_pid || '|' || (a.claimed_at IS NOT NULL)
			    FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
			   WHERE s.run_id = 'k1' AND a.attempt = 2}),
		"running|2|null|worker|$pid|true",
		"$t: attempt 2 is committed as started (running, claimed, no outcome yet)");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM kill_effects'),
		'0', "$t: attempt 2's effect is not committed");

	my $off = log_offset($node);
	kill 'KILL', $pid;
	$node->wait_for_log(
		qr/durable_steps worker.*\(PID $pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$off);
	ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'k1'",
			'succeeded'),
		"$t: after the crash restart the step succeeds");
	like(log_since($node, $off),
		qr/durable_steps: attempt 2 of step k1\/s1 was lost; recording it as failed/,
		"$t: the lost attempt is logged");

	is( $node->safe_psql(
			'postgres',
			q{SELECT string_agg(attempt || '|' || class || '|' || coalesce(error_code, '') || '|' ||
			                    coalesce(error_message, '') || '|' || executor || '|' ||
			                    (claimed_at IS NOT NULL AND finished_at IS NOT NULL), ',' ORDER BY attempt)
			    FROM ds_attempts WHERE run_id = 'k1'}),
		'1|retryable|DS002|go|caller|true,'
		  . '2|retryable|DS007|invocation_lost|worker|true,'
		  . '3|completed|||worker|true',
		"$t: attempt 2 is recorded as invocation_lost (DS007, retryable), attempt 3 completed");
	is( $node->safe_psql(
			'postgres',
			q{SELECT status || '|' || attempt || '|' || result::text || '|' ||
			         coalesce(error_code, 'none') FROM ds_steps WHERE run_id = 'k1'}),
		'succeeded|3|"done at attempt 3"|none',
		"$t: the step row: succeeded at attempt 3, error cleared");
	is($node->safe_psql('postgres', q{SELECT string_agg(step || '|' || attempt, ',') FROM kill_effects}),
		'k1/s1|3', "$t: exactly one effect, attempt 3's; attempt 2's was lost with its transaction");
}

$node->stop;

done_testing();
