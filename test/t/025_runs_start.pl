# Runs (docs/runs.md): ds_start_run is idempotent by its run key, and a run starts only once the
# transaction that started it commits -- a rolled-back start starts nothing.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Session;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('runs_start', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (run text, step text);
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('only', 'INSERT INTO ledger VALUES (ds_run_id(), ''only'') RETURNING $1',
                   input);
END $$;
});

my $t = 'run key';
is( $node->safe_psql('postgres',
		q{SELECT run_id || '|' || status || '|' || created FROM ds_start_run('wf', '{"n": 1}', 'k1')}),
	'k1|pending|true', "$t: a first start creates the run, named by its key");
is( $node->safe_psql('postgres',
		q{SELECT run_id || '|' || created FROM ds_start_run('wf', '{"n": 1}', 'k1')}),
	'k1|false', "$t: the same key, workflow and input answer the same run");
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM ds_start_run('wf', '{"n": 2}', 'k1')}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS422.*run key k1 already names a run of another workflow or input/,
	"$t: a different input under the key is a conflict (DS422)");
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'k1'}, 'succeeded'),
	"$t: the run succeeds");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ds_runs}), '1', "$t: one run");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run = 'k1'}),
	'1', "$t: its step took effect once");
is($node->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'k1'}),
	'{"n": 1}', "$t: the workflow's value is the run's output");
is( $node->safe_psql('postgres',
		q{SELECT run_id || '|' || status || '|' || created FROM ds_start_run('wf', '{"n": 1}', 'k1')}),
	'k1|succeeded|false', "$t: a start after it finished answers the finished run");

$t = 'without a key';
my $id = $node->safe_psql('postgres', q{SELECT run_id FROM ds_start_run('wf', '{"n": 3}')});
like($id, qr/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
	"$t: a generated run id");
ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$id'}, 'succeeded'),
	"$t: the run succeeds");

$t = 'after commit';
my $s = DurableSteps::Session->new($node);
$s->query_ok(q{BEGIN;});
$s->query_ok(q{SELECT ds_start_run('wf', '{"n": 4}', 'k4');});
my $pid = executor_pid($node);
ok(wait_executor_loops($node, 'postgres', $pid, 300), "$t: the executor went round its loop");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run = 'k4'}),
	'0', "$t: nothing runs before the start commits");
$s->query_ok(q{ROLLBACK;});
$s->query_ok(q{BEGIN;});
$s->query_ok(q{SELECT ds_start_run('wf', '{"n": 5}', 'k5');});
$s->query_ok(q{COMMIT;});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'k5'}, 'succeeded'),
	"$t: a committed start runs");
ok(wait_executor_loops($node, 'postgres', $pid, 300), "$t: the executor went round its loop");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ds_runs WHERE run_id = 'k4'}),
	'0', "$t: a rolled-back start left no run");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE run = 'k4'}),
	'0', "$t: and started nothing");
$s->quit;

$t = 'another role';
$node->safe_psql('postgres', q{CREATE ROLE alice LOGIN; GRANT EXECUTE ON FUNCTION wf(text, jsonb) TO alice});
($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE alice; SELECT * FROM ds_start_run('wf', '{"n": 1}', 'k1')});
like($err, qr/run k1 belongs to another role/, "$t: cannot take over another role's run key");

$t = 'malformed arguments';
# a new step's malformed argument raises at its ds_step call, where the workflow can catch it, as
# ds_run_step raises it -- the turn does not end there to leave the error to the executor's work
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION bad_calls(in_run boolean) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    caught jsonb := '[]';
    calls text[] := ARRAY[
        $c$sql => '  ;  '$c$,
        $c$sql => NULL$c$,
        $c$sql => 'SELECT 1', policy => '{"max_attempts": 0}'$c$,
        $c$sql => 'SELECT 1', policy => '{"colour": "blue"}'$c$,
        $c$sql => 'SELECT 1', timeout => '0 s'$c$,
        $c$sql => 'SELECT 1', on_timeout => 'later'$c$,
        $c$sql => NULL, timeout => '-1 s'$c$,
        $c$sql => 'SELECT 1', retry_on => ARRAY['nope']$c$,
        $c$sql => 'SELECT 1', fail_on => ARRAY['P0001', '']$c$];
    i int;
BEGIN
    FOR i IN 1 .. array_length(calls, 1) LOOP
        BEGIN
            IF in_run THEN
                EXECUTE format('SELECT ds_step(step_id => %L, %s)', 'bad' || i, calls[i]);
            ELSE
                EXECUTE format('SELECT ds_run_step(run_id => %L, step_id => %L, %s)',
                               'direct', 'bad' || i, calls[i]);
            END IF;
            caught := caught || to_jsonb('no error'::text);
        EXCEPTION WHEN OTHERS THEN
            caught := caught || to_jsonb(SQLSTATE || ' ' || SQLERRM);
        END;
    END LOOP;
    RETURN caught;
END $$;
CREATE FUNCTION bad_args(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql
    AS $$ SELECT bad_calls(true) $$;
SELECT ds_start_run('bad_args', '{}', 'bad');
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'bad'}, 'succeeded'),
	"$t: the workflow caught every error and the run succeeded");
is( $node->safe_psql('postgres',
		q{SELECT r.output = bad_calls(false) AND jsonb_array_length(r.output) = 9
		         AND NOT r.output @> '["no error"]'
		    FROM ds_runs r WHERE run_id = 'bad'}),
	't', "$t: each call raised what ds_run_step raises for the same arguments");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ds_steps WHERE run_id IN ('bad', 'direct')}),
	'0', "$t: no step was stored");

$node->stop;
done_testing();
