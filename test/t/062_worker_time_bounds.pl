# Property: no step body holds an executor without bound (docs/worker.md, docs/reference.md
# "Settings"). A worker attempt of a step without a timeout of its own is stopped after
# durable_steps.default_timeout; one whose step asks for more is stopped at
# durable_steps.max_worker_attempt_time; both fail as timed out (DS004) with a message naming
# the setting. A body that catches every cancellation is ended with its executor, its attempt
# recorded as lost (DS007), and a new executor runs the next step.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('worker_time_bounds',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
CREATE ROLE alice LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT CREATE ON DATABASE postgres TO mallory;
});

# 5. Worker attempts have a timeout even when their step sets none: durable_steps.default_timeout.
$node->append_conf('postgresql.conf', "durable_steps.default_timeout = '1s'\n");
$node->reload;
ok($node->poll_query_until('postgres', "SELECT current_setting('durable_steps.default_timeout') = '1s'"),
	'default-timeout: the setting is reloaded');
is_deeply(
	worker_attempt($node, 'alice', 'no-timeout', 'SELECT pg_sleep(30)',
		q{, policy => ds_retry_policy(max_attempts => 2)}),
	{ status => 'failed', result => '', error_code => 'DS004' },
	'no-timeout: the worker attempt timed out');
is($node->safe_psql('postgres',
		"SELECT error_message FROM ds_attempts WHERE step_id = 'no-timeout' AND attempt = 2"),
	'step timed out after 00:00:01 (durable_steps.default_timeout)',
	'no-timeout: the message names the setting');
$node->append_conf('postgresql.conf', "durable_steps.default_timeout = '5min'\n");
$node->reload;

# 6. A role cannot hold an executor without bound: the ceiling stops a step that asks for an hour.
$node->append_conf('postgresql.conf', "durable_steps.max_worker_attempt_time = '2s'\n");
$node->reload;
is_deeply(
	worker_attempt($node, 'mallory', 'long-sleep', 'SELECT pg_sleep(60)', q{, timeout => '1 hour'}),
	{ status => 'failed', result => '', error_code => 'DS004' },
	'long-sleep: the attempt was stopped and recorded as timed out');
is($node->safe_psql('postgres',
		"SELECT error_message FROM ds_attempts WHERE step_id = 'long-sleep' AND attempt = 2"),
	'step attempt stopped after 00:00:02 by durable_steps.max_worker_attempt_time',
	'long-sleep: the message names the ceiling');
# A body that catches every cancellation is ended with its executor, and its attempt is lost.
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.never_stop() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM pg_sleep(60);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
});
is_deeply(
	worker_attempt($node, 'mallory', 'never-stop', 'SELECT mallory.never_stop()',
		q{, policy => ds_retry_policy(max_attempts => 2, initial_delay => '0 s')}),
	{ status => 'failed', result => '', error_code => 'DS007' },
	'never-stop: the executor ended and the attempt was recorded as lost');
ok($node->log_contains('a step body ignored its cancellation at durable_steps.max_worker_attempt_time; ending the executor'),
	'never-stop: the log says why the executor ended');
is_deeply(worker_attempt($node, 'alice', 'after-stubborn', 'SELECT 7'),
	{ status => 'succeeded', result => '7', error_code => '' },
	'after-stubborn: a new executor runs the next step');

$node->stop;
done_testing();
