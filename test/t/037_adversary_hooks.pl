# Property: an outcome hook run by the worker leaves nothing in the executor's superuser session
# and cannot escape it (docs/security.md, docs/steps.md "Outcome hooks"). mallory's on_success
# hook sets settings and takes a session advisory lock: its step succeeds, the executor holds no
# lock afterwards and alice's next step in the same executor sees none of the settings. A hook
# that changes the session's authorization is refused with 42501, which blocks its step.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: mallory's hooks and alice's run in the same session
my $node = worker_node('adversary_hooks',
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

my $t = 'hooks';
psql_as_ok($node, 'mallory', q{SELECT ds_run_step('hook-run', 'h1', 'SELECT 1', defer => true,
    on_success => $h$SELECT set_config('app.leak', 'hook', false), pg_advisory_lock(4244),
                  set_config('work_mem', '78MB', false)$h$)});
psql_as_ok($node, 'mallory', q{SELECT ds_run_step('hook-run', 'h2', 'SELECT 1', defer => true,
    on_success => $h$SET SESSION AUTHORIZATION postgres$h$)});
ok( poll_row($node, 'postgres',
		q{SELECT max(status) FILTER (WHERE step_id = 'h1') AS h1, max(status) FILTER (WHERE step_id = 'h2') AS h2,
		         count(*) AS steps
		    FROM durable_steps.steps WHERE run_id = 'hook-run'},
		{ h1 => 'succeeded', h2 => 'blocked', steps => 2 }),
	"$t: the leaving hook's step succeeds; the escaping hook's is refused (blocked, 42501 is correctable)");
is($node->safe_psql('postgres', q{SELECT error_code FROM durable_steps.steps WHERE run_id = 'hook-run' AND step_id = 'h2'}),
	'42501', "$t: with 42501");
is($node->safe_psql('postgres',
		qq{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4244 AND pid = $pid}),
	'0', "$t: the executor holds no advisory lock of the hook");
psql_as_ok($node, 'alice', q{SELECT ds_start_run('alice_probe', '{}', 'probe-2')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'probe-2'}, 'succeeded'),
	"$t: alice's run succeeds");
is_deeply(
	row_of($node, 'postgres', q{SELECT output->>'leak' AS leak, output->>'work_mem' AS work_mem,
	                                   output->>'session_user' AS session_user
	                              FROM durable_steps.runs WHERE run_id = 'probe-2'}),
	{ leak => '', work_mem => '4MB', session_user => 'alice' },
	"$t: alice's step sees none of the hook's settings");

is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}),
	$pid, 'the same executor ran everything');
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
