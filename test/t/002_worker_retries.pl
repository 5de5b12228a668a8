# The background worker carries out the remaining attempts of a step (docs/steps.md, "Retry policy",
# "Outcome classes", "The background worker"): after the caller's transaction commits a
# retryable failure, the worker runs each further attempt no earlier than the policy schedules
# it (and not much later); exhausted steps fail; ds_retry_after replaces the backoff once.
#
# Every wait for the worker polls a condition; nothing here sleeps for a fixed time.

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
# 1. Two retryable failures, then success: the caller runs attempt 1, the worker attempts 2
#    and 3, each no earlier than its exponential backoff and not grossly later.
{
	my $t = 'test 1 (retry until success)';
	is_deeply(
		row_of(
			$node, 'postgres', q{
SELECT status, attempt, max_attempts, error_class, error_code
  FROM ds_run_step('w1', 'flaky', $$SELECT fail_until('w1', 3)$$,
                   policy => '{"max_attempts": 5, "initial_delay": "1 s", "multiplier": 2}')}),
		{ status => 'retrying', attempt => 1, max_attempts => 5, error_class => 'retryable', error_code => 'P0001' },
		"$t: the caller's attempt 1 fails retryably; the step is retrying");
	is( $node->safe_psql(
			'postgres', q{
SELECT s.next_attempt_at = a.finished_at + interval '1 s'
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'w1' AND step_id = 'flaky' AND a.attempt = 1}),
		't',
		"$t: attempt 2 is scheduled exactly initial_delay after attempt 1 finished");

	is(settle($node, 'w1', 'flaky'), 'succeeded', "$t: the worker brings the step to succeeded");
	is_deeply(
		attempts_of($node, 'w1', 'flaky'),
		[
			{ attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' },
			{ attempt => 2, class => 'retryable', error_code => 'P0001', executor => 'worker' },
			{ attempt => 3, class => 'completed', error_code => undef,   executor => 'worker' }
		],
		"$t: three attempts: the caller's, then two by the worker");
	is(ran_in_worker($node, 'w1', 'flaky', 2, 3), 't',
		"$t: attempts 2 and 3 ran in a durable_steps worker process");
	# the succeeded attempt is recorded in the step's row, the failed ones in attempts rows
	is_deeply(
		row_of(
			$node, 'postgres', q{
SELECT (SELECT array_agg(attempt ORDER BY attempt) FROM durable_steps.attempts
         WHERE run_id = 'w1' AND step_id = 'flaky') AS attempts_table_rows,
       a.claimed_at >= (SELECT p.finished_at FROM ds_attempts p
                         WHERE p.run_id = 'w1' AND p.step_id = 'flaky' AND p.attempt = 2)
         AS claimed_after_attempt_2_ended,
       EXISTS (SELECT FROM pg_stat_activity
                WHERE pid = a.backend_pid AND backend_type = 'durable_steps worker') AS ran_in_an_executor,
       (a.claimed_at <= a.started_at AND a.started_at <= a.finished_at) AS claimed_started_finished_in_order,
       s.finished_at = a.finished_at AS finished_with_the_step,
       a.role = s.owner AS role_is_the_owner,
       a.attempt_key, a.error_code
  FROM durable_steps.steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'w1' AND step_id = 'flaky' AND a.attempt = 3}),
		{
			attempts_table_rows => '[1, 2]',
			claimed_after_attempt_2_ended => 'true',
			ran_in_an_executor => 'true',
			claimed_started_finished_in_order => 'true',
			finished_with_the_step => 'true',
			role_is_the_owner => 'true',
			attempt_key => 'w1:flaky:3',
			error_code => undef
		},
		"$t: attempt 3, which succeeded, is recorded by its step row (claimed after attempt 2 ended, by an executor; start, end, role, key), not by an attempts row");
	is_deeply(
		row_of(
			$node, 'postgres', q{
SELECT (SELECT count(*) FROM effects WHERE tag = 'w1') AS effects,
       (SELECT s.result = to_jsonb(e.id) FROM ds_steps s, effects e
         WHERE s.run_id = 'w1' AND s.step_id = 'flaky' AND e.tag = 'w1') AS result_is_the_effect_id,
       (SELECT attempt FROM effects WHERE tag = 'w1') AS effect_by_attempt,
       (SELECT last_value FROM body_runs) AS body_runs}),
		{ effects => 1, result_is_the_effect_id => 'true', effect_by_attempt => 3, body_runs => 3 },
		"$t: one effect (by attempt 3), the stored result is its id, the body ran 3 times");
	is_deeply(
		row_of(
			$node, 'postgres',
			"SELECT attempt, max_attempts, next_attempt_at, error_class FROM ds_steps WHERE run_id = 'w1' AND step_id = 'flaky'"),
		{ attempt => 3, max_attempts => 5, next_attempt_at => undef, error_class => undef },
		"$t: the step row shows attempt 3 of 5, nothing scheduled, no error");

	my $gap2 = gap($node, 'w1', 'flaky', 2);
	my $gap3 = gap($node, 'w1', 'flaky', 3);
	is(started_within($node, 'w1', 'flaky', 2, '1 s', '4 s'), 't',
		"$t: attempt 2 started 1 s after attempt 1 (no earlier, < 3 s late; gap $gap2 s)");
	is(started_within($node, 'w1', 'flaky', 3, '2 s', '5 s'), 't',
		"$t: attempt 3 started 2 s after attempt 2 (no earlier, < 3 s late; gap $gap3 s)");
}

############################################################################################
# 2. Exhaustion: a body that always fails ends failed/exhausted after max_attempts, keeping the
#    last error.
{
	my $t = 'test 2 (exhaustion)';
	is_deeply(
		row_of(
			$node, 'postgres', q{
SELECT status, attempt, max_attempts
  FROM ds_run_step('w2', 'doomed', $$SELECT always_fails('w2')$$,
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '200 ms'))}),
		{ status => 'retrying', attempt => 1, max_attempts => 3 },
		"$t: attempt 1 fails in the caller");
	is(settle($node, 'w2', 'doomed'), 'failed', "$t: the step ends failed");
	is_deeply(
		row_of(
			$node, 'postgres',
			"SELECT attempt, max_attempts, error_class, error_code, error_message, next_attempt_at, "
			  . "result IS NULL AS no_result FROM ds_steps WHERE run_id = 'w2' AND step_id = 'doomed'"),
		{
			attempt => 3,
			max_attempts => 3,
			error_class => 'exhausted',
			error_code => 'P0001',
			error_message => 'always fails: w2',
			next_attempt_at => undef,
			no_result => 'true'
		},
		"$t: error_class exhausted, the last error (P0001 and its message) kept, nothing scheduled");
	is_deeply(
		attempts_of($node, 'w2', 'doomed'),
		[
			{ attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' },
			{ attempt => 2, class => 'retryable', error_code => 'P0001', executor => 'worker' },
			{ attempt => 3, class => 'retryable', error_code => 'P0001', executor => 'worker' }
		],
		"$t: exactly three attempts, each recorded with its error");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM ds_attempts WHERE run_id = 'w2' AND error_message = 'always fails: w2'"),
		'3', "$t: every attempt keeps its message");
	is(started_within($node, 'w2', 'doomed', 2, '200 ms', '3.2 s'), 't',
		"$t: attempt 2 waited initial_delay (gap " . gap($node, 'w2', 'doomed', 2) . ' s)');
	is(started_within($node, 'w2', 'doomed', 3, '400 ms', '3.4 s'), 't',
		"$t: attempt 3 waited initial_delay x 2 (gap " . gap($node, 'w2', 'doomed', 3) . ' s)');
}

############################################################################################
# 3. ds_retry_after replaces the backoff once: the next attempt waits exactly its delay.
{
	my $t = 'test 3 (ds_retry_after)';
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION rate_limited() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('rate limited', '2 s');
    END IF;
    RETURN 'sent on attempt ' || ds_attempt_number();
END
$$;});
	is_deeply(
		row_of(
			$node, 'postgres', q{
SELECT status, error_class, error_code, error_message
  FROM ds_run_step('w3', 'send', 'SELECT rate_limited()',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'))}),
		{ status => 'retrying', error_class => 'retryable', error_code => 'DS002', error_message => 'rate limited' },
		"$t: attempt 1 asks to be retried later");
	is( $node->safe_psql(
			'postgres', q{
SELECT s.next_attempt_at = a.finished_at + interval '2 s'
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'w3' AND step_id = 'send' AND a.attempt = 1}),
		't',
		"$t: the next attempt is scheduled at exactly the requested delay, not initial_delay");
	is(settle($node, 'w3', 'send'), 'succeeded', "$t: the worker completes the step");
	is_deeply(
		attempts_of($node, 'w3', 'send'),
		[
			{ attempt => 1, class => 'retryable', error_code => 'DS002', executor => 'caller' },
			{ attempt => 2, class => 'completed', error_code => undef,   executor => 'worker' }
		],
		"$t: two attempts, the second by the worker");
	is( $node->safe_psql(
			'postgres', "SELECT result FROM ds_steps WHERE run_id = 'w3' AND step_id = 'send'"),
		'"sent on attempt 2"', "$t: the result is attempt 2's");
	is(started_within($node, 'w3', 'send', 2, '2 s', '5 s'), 't',
		"$t: attempt 2 started 2 s after attempt 1, despite initial_delay 100 ms (gap "
		  . gap($node, 'w3', 'send', 2) . ' s)');
}

# Afterwards: settled steps stayed settled, and no server process crashed.
settled_and_sound($node, 'w2', 'doomed', 3, 'exhausted');

$node->stop;
done_testing();
