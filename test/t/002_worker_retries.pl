# Copyright (c) durable_steps contributors
#
# The background worker carries out the remaining attempts of a step (README "Retry policy", §4, §5, §7): after
# the caller's transaction commits a retryable failure, the worker runs each further attempt no
# earlier than the policy schedules it (and not much later), as the role that created the step,
# with the step's stored search_path; exhausted steps fail, blocked steps wait for a person, and
# ds_retry_step re-arms both for the worker with a fresh attempt budget.
#
# Every wait for the worker polls a condition; nothing here sleeps for a fixed time.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('worker_retries');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'postgres'
durable_steps.poll_interval = '200ms'
});
$node->start;

# the superuser this test connects as (the bootstrap superuser)
my $su = $node->safe_psql('postgres', 'SELECT current_user');

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;

-- every successful body execution leaves one row here
CREATE TABLE effects (
    id      serial PRIMARY KEY,
    tag     text NOT NULL,
    attempt integer NOT NULL,
    who     text NOT NULL DEFAULT current_user,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
-- counts body executions, failed ones included: nextval is not rolled back
CREATE SEQUENCE body_runs;

-- fails retryably (P0001) while ds_attempt_number() < n; then inserts one effect, returns its id
CREATE FUNCTION fail_until(tag text, n integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    effect_id integer;
BEGIN
    PERFORM nextval('body_runs');
    IF ds_attempt_number() < n THEN
        RAISE EXCEPTION 'step % not yet (attempt %)', tag, ds_attempt_number();
    END IF;
    INSERT INTO effects(tag, attempt) VALUES (tag, ds_attempt_number())
        RETURNING id INTO effect_id;
    RETURN effect_id;
END
$$;

-- fails retryably while ds_attempt_number() < n, then returns the attempt number
CREATE FUNCTION gate(n integer) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < n THEN
        RAISE EXCEPTION 'gate: attempt % < %', ds_attempt_number(), n;
    END IF;
    RETURN ds_attempt_number();
END
$$;

CREATE FUNCTION always_fails(tag text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'always fails: %', tag;
END
$$;
});

# The worker is up: a launcher connected to no database and an executor in database postgres.
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) FILTER (WHERE backend_type = 'durable_steps launcher' AND datname IS NULL) = 1 "
		  . "AND count(*) FILTER (WHERE backend_type = 'durable_steps worker' AND datname = 'postgres') >= 1 "
		  . "FROM pg_stat_activity"),
	'the launcher and an executor are running');

# Wait until the step has left pending/running/retrying; returns its status.
sub settle
{
	my ($run, $step) = @_;
	$node->poll_query_until('postgres',
		"SELECT status NOT IN ('pending', 'running', 'retrying') FROM ds_steps "
		  . "WHERE run_id = '$run' AND step_id = '$step'")
	  or diag("step $run/$step did not settle");
	return $node->safe_psql('postgres',
		"SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

# One line per attempt: attempt|class|error_code|executor
sub attempts
{
	my ($run, $step) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT string_agg(attempt || '|' || coalesce(class, '-') || '|' || coalesce(error_code, '') || '|' || executor,
                  E'\n' ORDER BY attempt)
  FROM ds_attempts WHERE run_id = '$run' AND step_id = '$step'});
}

# Did every attempt of the given numbers run in an executor of the background worker?
sub ran_in_worker
{
	my ($run, $step, @nums) = @_;
	my $list = join(',', @nums);
	return $node->safe_psql(
		'postgres', qq{
SELECT count(*) = @{[scalar @nums]}
   AND bool_and(executor = 'worker')
   AND bool_and(EXISTS (SELECT 1 FROM pg_stat_activity p
                         WHERE p.pid = a.backend_pid AND p.backend_type = 'durable_steps worker'))
  FROM ds_attempts a
 WHERE run_id = '$run' AND step_id = '$step' AND attempt IN ($list)});
}

# "gap(n)": attempt n's started_at minus attempt n-1's finished_at, as seconds (for messages)
sub gap
{
	my ($run, $step, $n) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT round(extract(epoch FROM b.started_at - a.finished_at), 3)
  FROM ds_attempts a JOIN ds_attempts b USING (run_id, step_id)
 WHERE run_id = '$run' AND step_id = '$step' AND a.attempt = $n - 1 AND b.attempt = $n});
}

# Did attempt n start within [lo, hi) after attempt n-1 finished? Compared in SQL.
sub started_within
{
	my ($run, $step, $n, $lo, $hi) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT b.started_at >= a.finished_at + interval '$lo'
   AND b.started_at <  a.finished_at + interval '$hi'
   AND b.claimed_at >= a.finished_at + interval '$lo'
  FROM ds_attempts a JOIN ds_attempts b USING (run_id, step_id)
 WHERE run_id = '$run' AND step_id = '$step' AND a.attempt = $n - 1 AND b.attempt = $n});
}

############################################################################################
# 1. Two retryable failures, then success: the caller runs attempt 1, the worker attempts 2
#    and 3, each no earlier than its exponential backoff and not grossly later.
{
	my $t = 'test 1 (retry until success)';
	my $out = $node->safe_psql(
		'postgres', q{
SELECT status || '|' || attempt || '|' || max_attempts || '|' || error_class || '|' || error_code
  FROM ds_run_step('w1', 'flaky', $$SELECT fail_until('w1', 3)$$,
                   policy => '{"max_attempts": 5, "initial_delay": "1 s", "multiplier": 2}');});
	is($out, 'retrying|1|5|retryable|P0001',
		"$t: the caller's attempt 1 fails retryably; the step is retrying");
	is( $node->safe_psql(
			'postgres', q{
SELECT s.next_attempt_at = a.finished_at + interval '1 s'
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'w1' AND step_id = 'flaky' AND a.attempt = 1}),
		't',
		"$t: attempt 2 is scheduled exactly initial_delay after attempt 1 finished");

	is(settle('w1', 'flaky'), 'succeeded', "$t: the worker brings the step to succeeded");
	is( attempts('w1', 'flaky'),
		"1|retryable|P0001|caller\n2|retryable|P0001|worker\n3|completed||worker",
		"$t: three attempts: the caller's, then two by the worker");
	is(ran_in_worker('w1', 'flaky', 2, 3), 't',
		"$t: attempts 2 and 3 ran in a durable_steps worker process");
	is( $node->safe_psql(
			'postgres',
			"SELECT claimed_by IS NULL FROM durable_steps.steps WHERE run_id = 'w1' AND step_id = 'flaky'"),
		't', "$t: the finished step names no claiming executor");
	is( $node->safe_psql(
			'postgres', q{
SELECT (SELECT count(*) FROM effects WHERE tag = 'w1') || '|' ||
       (SELECT s.result = to_jsonb(e.id) FROM ds_steps s, effects e
         WHERE s.run_id = 'w1' AND s.step_id = 'flaky' AND e.tag = 'w1') || '|' ||
       (SELECT attempt FROM effects WHERE tag = 'w1') || '|' ||
       (SELECT last_value FROM body_runs)}),
		'1|true|3|3',
		"$t: one effect (by attempt 3), the stored result is its id, the body ran 3 times");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || max_attempts || '|' || (next_attempt_at IS NULL) || '|' "
			  . "|| (error_class IS NULL) FROM ds_steps WHERE run_id = 'w1' AND step_id = 'flaky'"),
		'3|5|true|true',
		"$t: the step row shows attempt 3 of 5, nothing scheduled, no error");

	my $gap2 = gap('w1', 'flaky', 2);
	my $gap3 = gap('w1', 'flaky', 3);
	is(started_within('w1', 'flaky', 2, '1 s', '2.5 s'), 't',
		"$t: attempt 2 started 1 s after attempt 1 (no earlier, < 1.5 s late; gap $gap2 s)");
	is(started_within('w1', 'flaky', 3, '2 s', '3.5 s'), 't',
		"$t: attempt 3 started 2 s after attempt 2 (no earlier, < 1.5 s late; gap $gap3 s)");
}

############################################################################################
# 2. Exhaustion: a body that always fails ends failed/exhausted after max_attempts, keeping the
#    last error.
{
	my $t = 'test 2 (exhaustion)';
	is( $node->safe_psql(
			'postgres', q{
SELECT status || '|' || attempt || '|' || max_attempts
  FROM ds_run_step('w2', 'doomed', $$SELECT always_fails('w2')$$,
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '200 ms'));}),
		'retrying|1|3',
		"$t: attempt 1 fails in the caller");
	is(settle('w2', 'doomed'), 'failed', "$t: the step ends failed");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || max_attempts || '|' || error_class || '|' || error_code || '|' "
			  . "|| error_message || '|' || (next_attempt_at IS NULL) || '|' || (result IS NULL) "
			  . "FROM ds_steps WHERE run_id = 'w2' AND step_id = 'doomed'"),
		'3|3|exhausted|P0001|always fails: w2|true|true',
		"$t: error_class exhausted, the last error (P0001 and its message) kept, nothing scheduled");
	is( attempts('w2', 'doomed'),
		"1|retryable|P0001|caller\n2|retryable|P0001|worker\n3|retryable|P0001|worker",
		"$t: exactly three attempts, each recorded with its error");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM ds_attempts WHERE run_id = 'w2' AND error_message = 'always fails: w2'"),
		'3', "$t: every attempt keeps its message");
	is(started_within('w2', 'doomed', 2, '200 ms', '1.7 s'), 't',
		"$t: attempt 2 waited initial_delay (gap " . gap('w2', 'doomed', 2) . ' s)');
	is(started_within('w2', 'doomed', 3, '400 ms', '1.9 s'), 't',
		"$t: attempt 3 waited initial_delay x 2 (gap " . gap('w2', 'doomed', 3) . ' s)');
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
	is( $node->safe_psql(
			'postgres', q{
SELECT status || '|' || error_class || '|' || error_code || '|' || error_message
  FROM ds_run_step('w3', 'send', 'SELECT rate_limited()',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'));}),
		'retrying|retryable|DS002|rate limited',
		"$t: attempt 1 asks to be retried later");
	is( $node->safe_psql(
			'postgres', q{
SELECT s.next_attempt_at = a.finished_at + interval '2 s'
  FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
 WHERE run_id = 'w3' AND step_id = 'send' AND a.attempt = 1}),
		't',
		"$t: the next attempt is scheduled at exactly the requested delay, not initial_delay");
	is(settle('w3', 'send'), 'succeeded', "$t: the worker completes the step");
	is( attempts('w3', 'send'),
		"1|retryable|DS002|caller\n2|completed||worker",
		"$t: two attempts, the second by the worker");
	is( $node->safe_psql(
			'postgres', "SELECT result FROM ds_steps WHERE run_id = 'w3' AND step_id = 'send'"),
		'"sent on attempt 2"', "$t: the result is attempt 2's");
	is(started_within('w3', 'send', 2, '2 s', '3.5 s'), 't',
		"$t: attempt 2 started 2 s after attempt 1, despite initial_delay 100 ms (gap "
		  . gap('w3', 'send', 2) . ' s)');
}

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
	is(settle('w4', 'later'), 'succeeded', "$t: the worker completed the later step");
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
	is(attempts('w4', 'charge'), '1|correctable|DS003|caller',
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
	is(settle('w4', 'charge'), 'succeeded', "$t: the re-armed step succeeds");
	is( attempts('w4', 'charge'),
		"1|correctable|DS003|caller\n2|completed||worker",
		"$t: attempt numbers keep growing: attempt 2, run by the worker");
	is(ran_in_worker('w4', 'charge', 2), 't', "$t: attempt 2 ran in a durable_steps worker process");
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
	is(settle('w5', 'flaky'), 'failed', "$t: after two attempts the step is failed");
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
	is(settle('w5', 'flaky'), 'succeeded',
		"$t: the worker retries within the fresh budget until success");
	is( attempts('w5', 'flaky'),
		"1|retryable|P0001|caller\n2|retryable|P0001|worker\n"
		  . "3|retryable|P0001|worker\n4|completed||worker",
		"$t: attempts 3 and 4 ran after the re-arm: the failed attempt 3 did not exhaust it");
	is(ran_in_worker('w5', 'flaky', 3, 4), 't',
		"$t: attempts 3 and 4 ran in a durable_steps worker process");
	is( $node->safe_psql(
			'postgres',
			"SELECT s.attempt || '|' || s.max_attempts || '|' || (s.result = to_jsonb(e.id)) || '|' || e.attempt "
			  . "FROM ds_steps s, effects e WHERE s.run_id = 'w5' AND s.step_id = 'flaky' AND e.tag = 'w5'"),
		'4|4|true|4',
		"$t: one effect, by attempt 4, and it is the stored result");
}

############################################################################################
# 6. The worker runs a step as the role that created it, and that role cannot get out.
{
	my $t = 'test 6 (owner role)';
	$node->safe_psql(
		'postgres', q{
CREATE ROLE app LOGIN;
CREATE TABLE app_log (who text, attempt int);
GRANT SELECT, INSERT ON app_log TO app;
CREATE TABLE secret (x int);
INSERT INTO secret VALUES (42);
REVOKE ALL ON secret FROM PUBLIC;

-- writes who ran it; fails (P0001) on attempt 1
CREATE FUNCTION log_attempt() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO app_log VALUES (current_user, ds_attempt_number());
    IF ds_attempt_number() < 2 THEN
        RAISE EXCEPTION 'attempt 1 fails';
    END IF;
    RETURN current_user;
END
$$;

-- reads a table app has no privilege on, from attempt 2 on
CREATE FUNCTION read_secret() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < 2 THEN
        RAISE EXCEPTION 'attempt 1 fails';
    END IF;
    RETURN (SELECT sum(x) FROM secret);
END
$$;

-- tries to become the bootstrap superuser, from attempt 2 on, then writes who it is
CREATE FUNCTION escalate(how text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    su name := (SELECT rolname FROM pg_roles WHERE oid = 10);
BEGIN
    IF ds_attempt_number() < 2 THEN
        RAISE EXCEPTION 'attempt 1 fails';
    END IF;
    CASE how
        WHEN 'set role' THEN EXECUTE format('SET ROLE %I', su);
        WHEN 'set local role' THEN EXECUTE format('SET LOCAL ROLE %I', su);
        WHEN 'reset role' THEN RESET ROLE;
        WHEN 'session authorization' THEN EXECUTE format('SET SESSION AUTHORIZATION %I', su);
        WHEN 'set_config' THEN PERFORM set_config('role', su, false);
    END CASE;
    INSERT INTO app_log VALUES (current_user, ds_attempt_number());
    RETURN current_user;
END
$$;});

	my @escalations = ('set role', 'set local role', 'reset role', 'session authorization',
		'set_config');
	my $policy = q{policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms')};
	my $sql = join(
		"\n",
		(   map {
				my $i = $_;
				"SELECT status FROM ds_run_step('w6', 'escalate-$i', 'SELECT escalate(\$1->>''how'')', "
				  . "jsonb_build_object('how', '$escalations[$i]'), $policy);"
			} 0 .. $#escalations),
		"SELECT status FROM ds_run_step('w6', 'secret', 'SELECT read_secret()', $policy);");
	is( $node->safe_psql('postgres', $sql, extra_params => [ '-U', 'app' ]),
		join("\n", ('retrying') x (@escalations + 1)),
		"$t: app's escalation and secret steps fail their attempt 1 in the caller");
	# created last, so due last: normally the worker runs it after the escalation attempts, and
	# in any order a role that leaked out of one of them would show up in app_log
	is( $node->safe_psql(
			'postgres',
			"SELECT status FROM ds_run_step('w6', 'log', 'SELECT log_attempt()', $policy);",
			extra_params => [ '-U', 'app' ]),
		'retrying',
		"$t: app's logging step fails its attempt 1 in the caller");
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(DISTINCT owner::text, ',') FROM ds_steps WHERE run_id = 'w6'"),
		'app', "$t: app owns the steps");

	is(settle('w6', 'log'), 'succeeded', "$t: the logging step succeeds in the worker");
	is( $node->safe_psql('postgres', "SELECT result FROM ds_steps WHERE run_id = 'w6' AND step_id = 'log'"),
		'"app"', "$t: current_user in the worker's attempt was app");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || executor || '|' || role FROM ds_attempts "
			  . "WHERE run_id = 'w6' AND step_id = 'log' ORDER BY attempt"),
		"1|caller|app\n2|worker|app",
		"$t: both attempts are recorded as app's");
	is(ran_in_worker('w6', 'log', 2), 't', "$t: attempt 2 ran in a durable_steps worker process");

	is(settle('w6', 'secret'), 'blocked',
		"$t: the worker cannot read what app cannot: the step is blocked");
	is( $node->safe_psql(
			'postgres',
			"SELECT error_class || '|' || error_code || '|' || error_message || '|' || (result IS NULL) "
			  . "FROM ds_steps WHERE run_id = 'w6' AND step_id = 'secret'"),
		'correctable|42501|permission denied for table secret|true',
		"$t: insufficient privilege (42501) is correctable, and no result was stored");
	is(attempts('w6', 'secret'), "1|retryable|P0001|caller\n2|correctable|42501|worker",
		"$t: the worker's attempt 2 failed with 42501");

	for my $i (0 .. $#escalations)
	{
		my $how = $escalations[$i];
		my $status = settle('w6', "escalate-$i");
		isnt($status, 'succeeded', "$t: '$how' in the worker does not succeed (status $status)");
		my $row = $node->safe_psql(
			'postgres',
			"SELECT coalesce(class, '-') || '|' || coalesce(error_code, '-') || '|' || coalesce(error_message, '-') "
			  . "FROM ds_attempts WHERE run_id = 'w6' AND step_id = 'escalate-$i' AND attempt = 2");
		like($row, qr/^(correctable|permanent)\|(?!-)\w{5}\|/,
			"$t: '$how': the worker's attempt 2 failed with a recorded error ($row)");
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) FROM ds_attempts WHERE run_id = 'w6' AND step_id = 'escalate-$i'"),
			'2', "$t: '$how': not retried after the failure");
	}
	is( $node->safe_psql(
			'postgres', "SELECT string_agg(who || '|' || attempt, ',' ORDER BY attempt) FROM app_log"),
		'app|2',
		"$t: app_log holds only the logging step's attempt 2, by app; nothing ran as $su");
}

############################################################################################
# 7. The worker uses the search_path the step was created under.
{
	my $t = 'test 7 (search_path)';
	$node->safe_psql(
		'postgres', q{
CREATE SCHEMA s1;
CREATE TABLE s1.t (x int);
-- a decoy: with the default search_path, an unqualified t would land here
CREATE TABLE public.t (x int);});
	is( $node->safe_psql(
			'postgres', q{
SET search_path = s1, public;
SELECT status FROM ds_run_step('w7', 'insert', 'INSERT INTO t(x) VALUES (gate(2)) RETURNING x',
                   policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'));}),
		'retrying',
		"$t: attempt 1 fails in the caller");
	is( $node->safe_psql(
			'postgres', "SELECT search_path FROM durable_steps.steps WHERE run_id = 'w7'"),
		's1, public', "$t: the step stores the caller's search_path");
	is(settle('w7', 'insert'), 'succeeded', "$t: the worker runs the step");
	is( attempts('w7', 'insert'), "1|retryable|P0001|caller\n2|completed||worker",
		"$t: attempt 2 was the worker's");
	is( $node->safe_psql(
			'postgres',
			"SELECT (SELECT string_agg(x::text, ',') FROM s1.t) || '|' || "
			  . "(SELECT count(*) FROM public.t) || '|' || "
			  . "(SELECT result::text FROM ds_steps WHERE run_id = 'w7')"),
		'2|0|2',
		"$t: the unqualified table resolved to s1.t, not public.t");
}

############################################################################################
# Afterwards: settled steps stayed settled, and no server process crashed.
{
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(run_id || '/' || step_id || ':' || attempt, ',' ORDER BY run_id) "
			  . "FROM ds_steps WHERE (run_id, step_id) IN (('w2', 'doomed'), ('w6', 'secret'))"),
		'w2/doomed:3,w6/secret:2',
		'the exhausted and the blocked step were not attempted again');
	my $log = slurp_file($node->logfile);
	unlike($log, qr/terminated by signal|PANIC:|exited with exit code [1-9]/,
		'no server process crashed or exited with an error');
}

$node->stop;

done_testing();
