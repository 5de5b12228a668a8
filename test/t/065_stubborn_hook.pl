# Property: an outcome hook that ignores its cancellation ends its executor once, not for ever
# (docs/steps.md, "Outcome hooks"). The step's last attempt fails for good in the worker, its
# on_failure hook catches every cancellation until the executor is ended; recording that lost
# attempt must not run the hook again (which would end the next executor the same way): the step
# is blocked by its lost hook (DS007), and the worker goes on with other work.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('stubborn_hook', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE hook_runs (at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION stubborn_hook() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO hook_runs DEFAULT VALUES;
    LOOP
        BEGIN
            PERFORM pg_sleep(0.2);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
});

my $off = log_offset($node);
$node->safe_psql('postgres', q{
SELECT status FROM ds_run_step('hooked', 'last', $$SELECT ds_non_retriable('no')$$,
    policy => '{"max_attempts": 1}', timeout => '1 s', defer => true,
    on_failure => 'SELECT stubborn_hook()')});

ok( poll_until($node, 'postgres',
		q{SELECT status || '/' || error_code FROM ds_steps WHERE run_id = 'hooked' AND step_id = 'last'},
		'blocked/DS007'),
	'the step is blocked by its lost hook (DS007)');
is( $node->safe_psql('postgres',
		q{SELECT attempt || ':' || class || ':' || error_code FROM ds_attempts WHERE run_id = 'hooked' ORDER BY attempt}),
	'1:retryable:DS007', 'its one attempt is recorded once, as lost with its executor');

# the worker goes on: a step made now runs, and no executor ended again
$node->safe_psql('postgres', q{SELECT status FROM ds_run_step('after', 's', 'SELECT 1', defer => true)});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'after'}, 'succeeded'),
	'the worker runs other steps afterwards');
is(count_matches(log_since($node, $off), qr/background worker "durable_steps worker" \(PID \d+\) exited with exit code 1/),
	1, 'one executor was ended by the hook, no other');
is($node->safe_psql('postgres', 'SELECT count(*) FROM hook_runs'), '0',
	'the hook\'s writes rolled back with it (it never returned)');

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
