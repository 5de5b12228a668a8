# A turn stopped by a query cancel that is not ds_cancel_run's -- an operator's pg_cancel_backend()
# of the executor -- is interrupted, not failed (docs/runs.md): it rolls back like a lost turn and
# the run runs again; only max_attempts such turns in a row fail the run. The fault trials
# (scripts/faults) found that the run failed with 57014 at the first one.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('runs_interrupted',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\ndurable_steps.poll_interval = '100ms'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (run text, step text);
CREATE TABLE gate (run text);
-- the workflow's own code waits (60 s) until the run's gate is open
CREATE FUNCTION gated(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('before', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    IF NOT EXISTS (SELECT FROM gate g WHERE g.run = run_id) THEN
        PERFORM pg_sleep(60);
    END IF;
    PERFORM ds_step('after', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    RETURN '"done"';
END $$;
});

# Cancel the executor's query once it sleeps in run $run's turn.
sub cancel_turn
{
	my ($run, $what) = @_;
	ok(poll_until($node, 'postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"
			  . " AND wait_event = 'PgSleep'"),
		"$what: the turn sleeps in the workflow's code");
	is($node->safe_psql('postgres',
			"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"),
		't', "$what: pg_cancel_backend() of the executor");
}

my $t = 'one interrupted turn';
$node->safe_psql('postgres', q{SELECT ds_start_run('gated', '{}', 'once', '{"max_attempts": 3}')});
cancel_turn('once', $t);
ok(poll_until($node, 'postgres', q{SELECT lost_turns FROM durable_steps.runs WHERE run_id = 'once'}, '1'),
	"$t: counted like a lost turn");
like($node->safe_psql('postgres', q{SELECT status || ': ' || wait_reason FROM ds_runs WHERE run_id = 'once'}),
	qr/^(waiting|running): turn interrupted: canceling statement due to user request$/,
	"$t: the run is not failed, and says why it runs again");
$node->safe_psql('postgres', q{INSERT INTO gate VALUES ('once')});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || output FROM ds_runs WHERE run_id = 'once'},
		'succeeded "done"'),
	"$t: the run goes on and succeeds");
is($node->safe_psql('postgres', q{SELECT string_agg(step, ',' ORDER BY step) FROM ledger WHERE run = 'once'}),
	'after,before', "$t: each step took effect once");
ok(count_matches(slurp_file($node->logfile), qr/the turn of run once was interrupted \(canceling statement due to user request\); running it again/) == 1,
	"$t: the server log says so");

$t = 'interrupted every time';
$node->safe_psql('postgres', q{SELECT ds_start_run('gated', '{}', 'always', '{"max_attempts": 2}')});
cancel_turn('always', "$t, 1st");
ok(poll_until($node, 'postgres', q{SELECT lost_turns FROM durable_steps.runs WHERE run_id = 'always'}, '1'),
	"$t: the first interrupted turn is counted");
cancel_turn('always', "$t, 2nd");
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || error_code FROM ds_runs WHERE run_id = 'always'},
		'failed 57014'),
	"$t: the run fails with the cancel at max_attempts interrupted turns in a row");
is($node->safe_psql('postgres', q{SELECT string_agg(step, ',') FROM ledger WHERE run = 'always'}),
	'before', "$t: its first step took effect once");

unlike(slurp_file($node->logfile), $DurableSteps::Test::crash_re, 'no server process crashed');
$node->stop;
done_testing();
