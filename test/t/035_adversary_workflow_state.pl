# Property: a workflow leaves nothing in the executor's superuser session for the next turn
# (docs/security.md). mallory's workflow sets settings and its search_path with
# set_config(..., false) and takes advisory locks; the same executor then runs alice's workflow,
# whose step sees none of it, runs as alice and not as a superuser.

use strict;
use warnings;

use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: mallory's turn and alice's run in the same session
my $node = worker_node('adversary_workflow_state',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});
ok(executors_running($node, 1), 'an executor is running');
my $pid = executor_pid($node);

psql_as_ok($node, 'alice', q{
-- records what its step sees of the executor's session
CREATE FUNCTION alice_probe(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('probe', $q$SELECT jsonb_build_object(
        'session_user', session_user, 'current_user', current_user,
        'superuser', current_setting('is_superuser'),
        'search_path', current_setting('search_path'),
        'leak', coalesce(current_setting('app.leak', true), ''),
        'work_mem', current_setting('work_mem'),
        'cursors', (SELECT count(*) FROM pg_cursors),
        'prepared', (SELECT count(*) FROM pg_prepared_statements),
        'temp', (SELECT count(*) FROM pg_class WHERE relpersistence = 't'),
        'listening', (SELECT count(*) FROM pg_listening_channels()))$q$);
END $$;
});

my $t = 'workflow state left behind';
psql_as_ok($node, 'mallory', q{
CREATE FUNCTION mallory_leave(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('app.leak', 'mallory', false);
    PERFORM set_config('search_path', 'mallory_schema, public', false);
    PERFORM set_config('work_mem', '77MB', false);
    PERFORM pg_advisory_lock(4242);
    PERFORM pg_advisory_xact_lock(4243);
    RETURN '"left"';
END $$;
});
psql_as_ok($node, 'mallory', q{SELECT ds_start_run('mallory_leave', '{}', 'leave')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'leave'}, 'succeeded'),
	"$t: mallory's run succeeds");
is($node->safe_psql('postgres',
		qq{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid IN (4242, 4243) AND pid = $pid}),
	'0', "$t: the executor holds none of the workflow's advisory locks");
psql_as_ok($node, 'alice', q{SELECT ds_start_run('alice_probe', '{}', 'probe')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'probe'}, 'succeeded'),
	"$t: alice's run succeeds");
my $seen = decode_json($node->safe_psql('postgres', q{SELECT output FROM durable_steps.runs WHERE run_id = 'probe'}));
my $search_path = delete $seen->{search_path};
is_deeply(
	$seen,
	{
		session_user => 'alice',
		current_user => 'alice',
		superuser => 'off',
		leak => '',
		work_mem => '4MB',
		cursors => 0,
		prepared => 0,
		temp => 0,
		listening => 0
	},
	"$t: alice's step sees none of mallory's settings, as alice");
unlike($search_path, qr/mallory/, "$t: nor her search_path");

is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}),
	$pid, 'the same executor ran everything');
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
