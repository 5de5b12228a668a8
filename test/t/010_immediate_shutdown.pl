# Immediate shutdown under load (docs/worker.md): no step is lost, no effect
# is duplicated.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = worker_node('worker');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
-- no unique constraint, so that a duplicated effect would show
CREATE TABLE load_effects (
    step    text NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
-- one row: the first worker attempt to delete it, once 20 steps have succeeded, waits on the
-- test's advisory lock, so that the stop surely finds an attempt in flight
CREATE TABLE load_hold (one integer);
INSERT INTO load_hold VALUES (1);
CREATE FUNCTION load_body() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('later', '0 s');
    END IF;
    IF (SELECT count(*) FROM durable_steps.steps WHERE run_id = 'load' AND status = 'succeeded') >= 20 THEN
        DELETE FROM load_hold;
        IF FOUND THEN
            PERFORM pg_advisory_xact_lock_shared(4242);
        END IF;
    END IF;
    INSERT INTO load_effects(step, attempt) VALUES (ds_step_id(), ds_attempt_number());
    PERFORM pg_sleep(0.005);   -- slow enough that the stop finds work in flight
    RETURN ds_attempt_number();
END
$$;
});

{
	my $t = 'immediate shutdown';
	my $n = 400;
	my $off = log_offset($node);
	# the holder's lock is taken before the steps exist: taken after, a worker that had already
	# finished 20 of them would find it free, and no attempt would be in flight at the stop
	my $holder = DurableSteps::Session->new($node, 'postgres');
	$holder->query_ok('SELECT pg_advisory_lock(4242);');
	# all created in one transaction: they become due together when it commits
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM generate_series(1, $n) AS i,
       LATERAL ds_run_step('load', 's' || i, 'SELECT load_body()',
                           policy => '{"max_attempts": 10, "initial_delay": "10 ms", "backoff": "fixed"}') AS r
 WHERE r.status = 'retrying'}),
		$n,
		"$t: $n steps made due at once");

	# stop once the worker has finished some of them and an attempt waits on the holder's lock (a
	# stop that fell between two claims would find no attempt to lose); after the restart the lock
	# is free and the hold's row back, so the step that takes it again goes on at once
	my $held = poll_until($node, 'postgres', q{
SELECT count(*) >= 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted});
	my $done = $node->safe_psql('postgres',
		"SELECT count(*) FROM durable_steps.steps WHERE run_id = 'load' AND status = 'succeeded'");
	ok($held, "$t: a worker attempt waits on the holder's lock");
	$node->stop('immediate');
	note "$t: $done of $n steps had succeeded when the immediate shutdown began";
	cmp_ok($done, '>=', 1, "$t: the worker had completed some steps before the stop");
	cmp_ok($done, '<', $n, "$t: ... but not all of them");

	$node->start;
	my $all_done = poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') FROM ds_steps WHERE run_id = 'load'",
		$n);
	ok($all_done, "$t: after the restart all $n steps succeed");
	my $crashes = count_matches(log_since($node, $off), $crash_re);
	is($crashes, 0, "$t: no server process crashed after the restart");
	if ($crashes)
	{
		my $log = log_since($node, $off);
		my ($first) = $log =~ /((?:^.*\n){0,3}^.*was terminated by signal (?!9:)\d+.*\n^.*\n)/m;
		diag "$t: first crash after the restart (of $crashes):\n$first";
	}
  SKIP:
	{
		skip "$t: the steps did not all succeed after the restart", 8 unless $all_done;
		is( $node->safe_psql(
				'postgres', "SELECT count(*) || '|' || count(DISTINCT step) FROM load_effects"),
			"$n|$n", "$t: exactly one effect per step (count = count distinct = $n)");
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) FROM (SELECT step FROM load_effects GROUP BY step HAVING count(*) <> 1) d"
			),
			'0',
			"$t: no step has a duplicated effect");
		is( $node->safe_psql(
				'postgres', q{
	SELECT count(*) FILTER (WHERE class = 'completed') || '|' ||
	       count(*) FILTER (WHERE class IS NULL) || '|' ||
	       count(*) FILTER (WHERE attempt > 1 AND executor <> 'worker')
	  FROM ds_attempts WHERE run_id = 'load'}),
			"$n|0|0",
			"$t: one completed attempt per step, no attempt left without an outcome, retries by the worker"
		);
		is( $node->safe_psql(
				'postgres', q{
	SELECT count(*) FROM ds_steps s
	 WHERE run_id = 'load'
	   AND (s.attempt <> (SELECT count(*) FROM ds_attempts a WHERE a.run_id = s.run_id AND a.step_id = s.step_id)
	        OR s.result <> to_jsonb(s.attempt))}),
			'0',
			"$t: attempt numbers have no gaps and each result is its last attempt's number");
		is( $node->safe_psql(
				'postgres',
				q{SELECT count(*) FROM load_effects e JOIN ds_steps s ON s.run_id = 'load' AND s.step_id = e.step
				   WHERE e.attempt <> s.attempt}),
			'0',
			"$t: each effect was written by the step's completed attempt");
		my ($lost, $lost_ok) = split /\|/, $node->safe_psql(
			'postgres', q{
	SELECT count(*) || '|' ||
	       bool_and(class = 'retryable' AND error_message = 'invocation_lost' AND executor = 'worker'
	                AND attempt >= 2)
	  FROM ds_attempts WHERE run_id = 'load' AND error_code = 'DS007'});
		diag "$t: $lost of $n attempts were recorded as invocation_lost after the immediate shutdown";
		cmp_ok($lost, '>=', 1, "$t: the attempts in flight at the stop were recorded as lost");
		is($lost_ok, 'true', "$t: each lost attempt is a retryable worker attempt with invocation_lost");
		is(count_matches(log_since($node, $off), qr/attempt \d+ of step load\/s\d+ was lost/),
			$lost, "$t: one log line per lost attempt");
	}
}

$node->stop('immediate');

done_testing();
