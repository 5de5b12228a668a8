# Runs (docs/runs.md): a workflow's steps replay, a step that must wait for its retry suspends
# the run, each attempt is recorded once, a step that used up its attempts throws
# DS102 into the workflow (caught: the workflow goes on; uncaught: the run fails), and the
# workflow runs as the role that started the run, isolated like a worker attempt.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('runs_retry', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE TABLE ledger (run text, step text, attempt int);
GRANT INSERT, SELECT ON ledger TO alice;
-- fails (retryably) until attempt `need`; then writes its effect
CREATE FUNCTION flaky(need int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < need THEN
        RAISE EXCEPTION 'flaky attempt %', ds_attempt_number();
    END IF;
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    RETURN ds_attempt_number();
END $$;
CREATE FUNCTION three(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE a jsonb; b jsonb; c jsonb;
BEGIN
    a := ds_step('s1', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number()) RETURNING 1');
    b := ds_step('s2', 'SELECT flaky(3)');
    c := ds_step('s3', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number()) RETURNING 3');
    RETURN jsonb_build_array(a, b, c, session_user, current_user);
END $$;
CREATE FUNCTION caught(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r text;
BEGIN
    BEGIN
        PERFORM ds_step('doomed', 'SELECT flaky(99)');
        r := 'not thrown';
    EXCEPTION WHEN SQLSTATE 'DS102' THEN
        GET STACKED DIAGNOSTICS r = PG_EXCEPTION_DETAIL;
    END;
    RETURN jsonb_build_array(r, ds_step('after', 'SELECT flaky(1)'));
END $$;
CREATE FUNCTION uncaught(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('doomed', 'SELECT flaky(99)');
    PERFORM ds_step('never', 'SELECT flaky(1)');
    RETURN '"unreachable"';
END $$;
CREATE FUNCTION restricted(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    CREATE TEMP TABLE sneaky (x int);
    RETURN '"created"';
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO alice;
});

my $t = 'three steps';
$node->safe_psql('postgres', q{SET ROLE alice;
	SELECT ds_start_run('three', '{}', 'r3', '{"initial_delay": "200 ms", "backoff": "fixed"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'r3'}, 'succeeded'),
	"$t: the run succeeds");
is($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'r3'}),
	'[1, 3, 3, "alice", "alice"]',
	"$t: its output is the workflow's value; the workflow ran as the role that started the run");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(step || '@' || attempt, ',' ORDER BY step) FROM ledger WHERE run = 'r3'}),
	's1@1,s2@3,s3@1',
	"$t: each step's effect committed once (s2's at its third attempt)");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(step_id || ':' || attempt || ':' || class || ':' || coalesce(error_message, '') || ':' || role,
		                    ',' ORDER BY step_id, attempt) FROM ds_attempts WHERE run_id = 'r3'}),
	's1:1:completed::alice,s2:1:retryable:flaky attempt 1:alice,s2:2:retryable:flaky attempt 2:alice,'
	  . 's2:3:completed::alice,s3:1:completed::alice',
	"$t: s2's failed attempts are recorded, each once");
ok( $node->safe_psql('postgres',
		q{SELECT bool_and(owner = 'alice'::regrole AND status = 'succeeded') AND count(*) = 3
		    FROM ds_steps WHERE run_id = 'r3'}) eq 't',
	"$t: the run's steps belong to alice and succeeded");
ok( $node->safe_psql('postgres',
		q{SELECT turns >= 3 AND policy->>'backoff' = 'fixed' FROM ds_runs WHERE run_id = 'r3'}) eq 't',
	"$t: the run suspended for each retry (three turns at least)");
ok( $node->safe_psql('postgres',
		q{SELECT bool_and(policy->>'backoff' = 'fixed') FROM ds_steps WHERE run_id = 'r3'}) eq 't',
	"$t: the run's policy is its steps' default");

$t = 'caught';
$node->safe_psql('postgres', q{SET ROLE alice;
	SELECT ds_start_run('caught', '{}', 'rc', '{"max_attempts": 2, "initial_delay": "100 ms"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'rc'}, 'succeeded'),
	"$t: a workflow that catches DS102 carries on and succeeds");
is($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'rc'}),
	'["SQLSTATE P0001: flaky attempt 2", 1]',
	"$t: the error's detail carries the step's last SQLSTATE and message");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(step_id || ':' || attempt || ':' || class, ',' ORDER BY step_id, attempt)
		    FROM ds_attempts WHERE run_id = 'rc'}),
	'after:1:completed,doomed:1:retryable,doomed:2:retryable',
	"$t: the failed step's attempts are recorded");
is( $node->safe_psql('postgres',
		q{SELECT status || ':' || error_class FROM ds_steps WHERE run_id = 'rc' AND step_id = 'doomed'}),
	'failed:exhausted', "$t: the failed step is recorded failed (exhausted)");

$t = 'uncaught';
$node->safe_psql('postgres', q{SET ROLE alice;
	SELECT ds_start_run('uncaught', '{}', 'ru', '{"max_attempts": 2, "initial_delay": "100 ms"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ru'}, 'failed'),
	"$t: a workflow that does not catch DS102 fails the run");
is( $node->safe_psql('postgres',
		q{SELECT error_code || '|' || error_message || '|' || error_detail || '|' || (finished_at IS NOT NULL)
		    FROM ds_runs WHERE run_id = 'ru'}),
	'DS102|step doomed of run ru failed (exhausted)|SQLSTATE P0001: flaky attempt 2|true',
	"$t: the run records the step-failed error");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(step_id || ':' || attempt || ':' || class, ',' ORDER BY step_id, attempt)
		    FROM ds_attempts WHERE run_id = 'ru'}),
	'doomed:1:retryable,doomed:2:retryable',
	"$t: the failed attempts are recorded; the next step never ran");

$t = 'isolation';
$node->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('restricted', '{}', 'ri')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ri'}, 'failed'),
	"$t: the run fails");
like($node->safe_psql('postgres', q{SELECT error_message FROM ds_runs WHERE run_id = 'ri'}),
	qr/cannot create temporary table within security-restricted operation/,
	"$t: a workflow runs as a security-restricted operation");

$t = 'outside a run';
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT ds_step('x', 'SELECT 1')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS105.*ds_step\(\) can only be called by a run's workflow/,
	"$t: ds_step outside a workflow raises DS105");
($rc, $out, $err) = $node->psql('postgres', q{SELECT three('r9', '{}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS105/, "$t: so does a workflow called directly");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
