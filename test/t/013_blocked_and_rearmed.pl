# Blocked and exhausted steps (docs/steps.md, "Outcome classes", "Functions"): the worker never retries
# a blocked step; ds_retry_step re-arms a blocked step with corrected input, and an exhausted one
# with a fresh budget of attempts, for the worker to run.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = retry_node('worker_retries');

############################################################################################
# 4. A blocked step is never retried by the worker; re-armed with corrected input, the worker
#    runs it (not the caller) and attempt numbers keep growing.
{
	my $t = 'test 4 (blocked)';
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION charge(input jsonb) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('body_runs');
    IF input->>'card' = 'expired' THEN
        PERFORM ds_blocked('card expired', 'Ask for a new card');
    END IF;
    RETURN 'charged ' || (input->>'card');
END
$$;});
	is( $node->safe_psql(
			'postgres', q{
SELECT status || '|' || attempt || '|' || error_class || '|' || error_code || '|' || error_message
       || '|' || remediation || '|' || (next_attempt_at IS NULL)
  FROM ds_run_step('w4', 'charge', 'SELECT charge($1)', '{"card": "expired"}',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'));}),
		'blocked|1|correctable|DS003|card expired|Ask for a new card|true',
		"$t: ds_blocked makes the step blocked with its remediation, nothing scheduled");
	my $runs_before = $node->safe_psql('postgres', 'SELECT last_value FROM body_runs');

	# A later step, retrying 600 ms (3 x poll_interval) after the blocked one: once the worker
	# has completed it, the worker has had every chance to (wrongly) retry the blocked step.
	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM ds_run_step('w4', 'later', 'SELECT gate(2)',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '600 ms'));}),
		'retrying',
		"$t: a later step is retrying");
	is(settle($node, 'w4', 'later'), 'succeeded', "$t: the worker completed the later step");
	is( $node->safe_psql(
			'postgres', q{
SELECT l.started_at >= c.finished_at + interval '600 ms'
  FROM ds_attempts l, ds_attempts c
 WHERE l.run_id = 'w4' AND l.step_id = 'later' AND l.attempt = 2
   AND c.run_id = 'w4' AND c.step_id = 'charge' AND c.attempt = 1}),
		't',
		"$t: at least 3 x poll_interval passed since the step was blocked");
	is( $node->safe_psql(
			'postgres',
			"SELECT status || '|' || attempt || '|' || error_class || '|' || remediation "
			  . "FROM ds_steps WHERE run_id = 'w4' AND step_id = 'charge'"),
		'blocked|1|correctable|Ask for a new card',
		"$t: the blocked step is still blocked");
	is_deeply(attempts_of($node, 'w4', 'charge'), [ { attempt => 1, class => 'correctable', error_code => 'DS003', executor => 'caller' } ],
		"$t: the worker never retried it: still one attempt");
	is($node->safe_psql('postgres', 'SELECT last_value FROM body_runs'),
		$runs_before, "$t: its body did not run again");

	# re-armed with corrected input: the call returns at once, the worker runs the attempt
	is( $node->safe_psql(
			'postgres', q{
SELECT status || '|' || attempt || '|' || max_attempts || '|' || (error_class IS NULL) || '|'
       || (next_attempt_at <= clock_timestamp())
  FROM ds_retry_step('w4', 'charge', '{"card": "new"}');}),
		'pending|1|4|true|true',
		"$t: ds_retry_step re-arms: pending, due now, budget = 1 used + 3");
	is(settle($node, 'w4', 'charge'), 'succeeded', "$t: the re-armed step succeeds");
	is_deeply(attempts_of($node, 'w4', 'charge'),
		[ { attempt => 1, class => 'correctable', error_code => 'DS003', executor => 'caller' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
		"$t: attempt numbers keep growing: attempt 2, run by the worker");
	is(ran_in_worker($node, 'w4', 'charge', 2), 't', "$t: attempt 2 ran in a durable_steps worker process");
	is( $node->safe_psql(
			'postgres',
			"SELECT result::text || '|' || input::text || '|' || attempt || '|' || max_attempts || '|' "
			  . "|| (remediation IS NULL) FROM ds_steps WHERE run_id = 'w4' AND step_id = 'charge'"),
		'"charged new"|{"card": "new"}|2|4|true',
		"$t: the result comes from the corrected input; max_attempts = attempt_base + policy max");
}

############################################################################################
# 5. An exhausted step, re-armed, gets a fresh budget of attempts from the worker.
{
	my $t = 'test 5 (re-arm an exhausted step)';
	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM ds_run_step('w5', 'flaky', $$SELECT fail_until('w5', 4)$$,
                   policy => ds_retry_policy(max_attempts => 2, initial_delay => '100 ms'));}),
		'retrying',
		"$t: attempt 1 fails");
	is(settle($node, 'w5', 'flaky'), 'failed', "$t: after two attempts the step is failed");
	is( $node->safe_psql(
			'postgres',
			"SELECT error_class || '|' || attempt || '|' || max_attempts FROM ds_steps "
			  . "WHERE run_id = 'w5' AND step_id = 'flaky'"),
		'exhausted|2|2',
		"$t: exhausted at 2 of 2");
	is( $node->safe_psql(
			'postgres',
			"SELECT status || '|' || attempt || '|' || max_attempts FROM ds_retry_step('w5', 'flaky')"),
		'pending|2|4',
		"$t: ds_retry_step re-arms with a fresh budget of 2 (max_attempts 2 + 2)");
	is(settle($node, 'w5', 'flaky'), 'succeeded',
		"$t: the worker retries within the fresh budget until success");
	is_deeply(attempts_of($node, 'w5', 'flaky'),
		[ { attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' }, { attempt => 2, class => 'retryable', error_code => 'P0001', executor => 'worker' }, { attempt => 3, class => 'retryable', error_code => 'P0001', executor => 'worker' }, { attempt => 4, class => 'completed', error_code => undef, executor => 'worker' } ],
		"$t: attempts 3 and 4 ran after the re-arm: the failed attempt 3 did not exhaust it");
	is(ran_in_worker($node, 'w5', 'flaky', 3, 4), 't',
		"$t: attempts 3 and 4 ran in a durable_steps worker process");
	is( $node->safe_psql(
			'postgres',
			"SELECT s.attempt || '|' || s.max_attempts || '|' || (s.result = to_jsonb(e.id)) || '|' || e.attempt "
			  . "FROM ds_steps s, effects e WHERE s.run_id = 'w5' AND s.step_id = 'flaky' AND e.tag = 'w5'"),
		'4|4|true|4',
		"$t: one effect, by attempt 4, and it is the stored result");
}

$node->stop;
done_testing();
