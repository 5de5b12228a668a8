# Property: an outcome hook that ignores its cancellation ends its executor once, not for ever
# (docs/steps.md, "Outcome hooks"). The step's last attempt fails for good in the worker, its
# on_failure hook catches every cancellation until the executor is ended; recording that lost
# attempt must not run the hook again (which would end the next executor the same way): the step
# is blocked by its lost hook (DS007), and the worker goes on with other work. A stubborn
# on_success hook at the last attempt is another matter: the loss it causes runs on_failure,
# a hook that has not failed anyone, so that step fails for good and its dead-letter path runs.

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

# on_success ignores its cancellation at the step's last attempt: the attempt is lost (its body's
# writes and the hook's rolled back), and recording the loss exhausts the step, which runs its
# on_failure hook, once
$node->safe_psql('postgres', q{
CREATE TABLE dead_letters (step text, attempt int, code text);
CREATE TABLE body_writes (n int);
SELECT status FROM ds_run_step('hooked', 'success_hook', $$INSERT INTO body_writes VALUES (1)$$,
    policy => '{"max_attempts": 1}', timeout => '1 s', defer => true,
    on_success => 'SELECT stubborn_hook()',
    on_failure => $$INSERT INTO dead_letters SELECT $1->>'step_id', ($1->>'attempt')::int, $1->>'error_code'$$)});
ok( poll_until($node, 'postgres',
		q{SELECT status || '/' || error_class || '/' || error_code FROM ds_steps WHERE run_id = 'hooked' AND step_id = 'success_hook'},
		'failed/exhausted/DS007'),
	'a lost on_success hook at the last attempt: the step fails for good (not blocked)');
is( $node->safe_psql('postgres', q{SELECT step || ':' || attempt || ':' || code FROM dead_letters}),
	'success_hook:1:DS007', 'its on_failure hook ran once, with the lost attempt');
is( $node->safe_psql('postgres',
		q{SELECT error_detail FROM ds_attempts WHERE run_id = 'hooked' AND step_id = 'success_hook'}),
	'The on_success hook of attempt 1 ignored its cancellation past its time limit; its process was ended.',
	'the lost attempt says which hook ended its executor');
is($node->safe_psql('postgres', 'SELECT count(*) FROM body_writes') . '/' . $node->safe_psql('postgres', 'SELECT count(*) FROM hook_runs'),
	'0/0', 'the body\'s writes and the hook\'s rolled back with the lost attempt');
is(count_matches(log_since($node, $off), qr/background worker "durable_steps worker" \(PID \d+\) exited with exit code 1/),
	2, 'the on_success hook ended one executor, and on_failure none');

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
