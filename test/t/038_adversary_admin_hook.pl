# Property: a hook run again in an admin's session runs as its owner and leaves nothing there
# (docs/security.md). mallory's step is blocked by its failing on_success hook; an admin's
# ds_retry_step runs the hook again in the admin's session, where the hook sets search_path,
# a custom setting and work_mem: the step succeeds, and the admin's session keeps none of them
# and is still the admin's.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_admin_hook',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO mallory;
CREATE ROLE adm LOGIN IN ROLE durable_steps_admin;
});
ok(executors_running($node, 1), 'an executor is running');

my $t = 'a hook in an admin\'s session';
psql_as_ok($node, 'mallory', q{
CREATE TABLE mallory_flag (x int);
SELECT ds_run_step('hook-admin', 's', 'SELECT 1',
    on_success => $h$SELECT set_config('search_path', 'mallory_s, public', false),
                            set_config('app.leak', 'hook', false),
                            set_config('work_mem', '79MB', false),
                            1 / (SELECT count(*) FROM public.mallory_flag)$h$);
});
is($node->safe_psql('postgres', q{SELECT status FROM durable_steps.steps WHERE run_id = 'hook-admin'}),
	'blocked', "$t: mallory's step is blocked by its failing hook");
psql_as_ok($node, 'mallory', q{INSERT INTO mallory_flag VALUES (1)});
# one psql session of adm: the re-run, then what its session has
my ($status, $session) = split /\n/, psql_as_ok($node, 'adm', q{SELECT (ds_retry_step('hook-admin', 's')).status;}
	  . row_sql(q{SELECT current_setting('search_path') AS search_path,
	                     coalesce(current_setting('app.leak', true), '') AS app_leak,
	                     current_setting('work_mem') AS work_mem, current_user AS role_name}));
is($status, 'succeeded', "$t: the admin re-runs the hook, and the step succeeds");
is_deeply(
	decode_row($session),
	{ search_path => '"$user", public', app_leak => '', work_mem => '4MB', role_name => 'adm' },
	"$t: the admin's session keeps none of the hook's settings, and is still the admin's");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
