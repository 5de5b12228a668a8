# The worker runs a step as the role that created it, and that role cannot get out; it uses the
# search_path the step was created under (docs/security.md).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = retry_node('worker_retries');
# the superuser this test connects as (the bootstrap superuser)
my $su = $node->safe_psql('postgres', 'SELECT current_user');

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

	is(settle($node, 'w6', 'log'), 'succeeded', "$t: the logging step succeeds in the worker");
	is( $node->safe_psql('postgres', "SELECT result FROM ds_steps WHERE run_id = 'w6' AND step_id = 'log'"),
		'"app"', "$t: current_user in the worker's attempt was app");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || executor || '|' || role FROM ds_attempts "
			  . "WHERE run_id = 'w6' AND step_id = 'log' ORDER BY attempt"),
		"1|caller|app\n2|worker|app",
		"$t: both attempts are recorded as app's");
	is(ran_in_worker($node, 'w6', 'log', 2), 't', "$t: attempt 2 ran in a durable_steps worker process");

	is(settle($node, 'w6', 'secret'), 'blocked',
		"$t: the worker cannot read what app cannot: the step is blocked");
	is( $node->safe_psql(
			'postgres',
			"SELECT error_class || '|' || error_code || '|' || error_message || '|' || (result IS NULL) "
			  . "FROM ds_steps WHERE run_id = 'w6' AND step_id = 'secret'"),
		'correctable|42501|permission denied for table secret|true',
		"$t: insufficient privilege (42501) is correctable, and no result was stored");
	is_deeply(attempts_of($node, 'w6', 'secret'), [ { attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' }, { attempt => 2, class => 'correctable', error_code => '42501', executor => 'worker' } ],
		"$t: the worker's attempt 2 failed with 42501");

	for my $i (0 .. $#escalations)
	{
		my $how = $escalations[$i];
		my $status = settle($node, 'w6', "escalate-$i");
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
	is(settle($node, 'w7', 'insert'), 'succeeded', "$t: the worker runs the step");
	is_deeply(attempts_of($node, 'w7', 'insert'), [ { attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
		"$t: attempt 2 was the worker's");
	is( $node->safe_psql(
			'postgres',
			"SELECT (SELECT string_agg(x::text, ',') FROM s1.t) || '|' || "
			  . "(SELECT count(*) FROM public.t) || '|' || "
			  . "(SELECT result::text FROM ds_steps WHERE run_id = 'w7')"),
		'2|0|2',
		"$t: the unqualified table resolved to s1.t, not public.t");
}

# Afterwards: settled steps stayed settled, and no server process crashed.
settled_and_sound($node, 'w6', 'secret', 2, 'blocked');

$node->stop;
done_testing();
