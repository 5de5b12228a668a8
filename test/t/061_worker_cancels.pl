# Property: a cancel ends a worker attempt, not the executor (docs/worker.md). A body raising
# query_canceled, or an operator's pg_cancel_backend() of the executor, fails the attempt with
# 57014; the same executor process goes on with the next step. Meanwhile another role's call
# with a guess at the running step's definition learns nothing, even with nowait (42501, not
# DS409).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: the test cancels and follows the executor process
my $node = worker_node('worker_cancels',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
CREATE ROLE alice LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT CREATE ON DATABASE postgres TO mallory;
});
ok(executors_running($node, 1), 'an executor is running');

# 4c. Cancels: a body raising query_canceled, or an operator's pg_cancel_backend(), ends the
#     attempt (recorded as 57014), not the executor.
my $executor = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.fake_cancel() RETURNS text LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION USING ERRCODE = 'query_canceled', MESSAGE = 'fake cancel'; END $$;
});
is_deeply(
	worker_attempt($node, 'mallory', 'fake-cancel', 'SELECT mallory.fake_cancel()',
		q{, policy => ds_retry_policy(max_attempts => 3, initial_delay => '0 s')}),
	{ status => 'failed', result => '', error_code => '57014' },
	'fake-cancel: a body raising query_canceled fails its own attempts (retryable: 57014 twice)');
$node->safe_psql('postgres', q{
SET ROLE alice;
SELECT status FROM ds_run_step('iso', 'hangs',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text
               ELSE pg_sleep(600)::text END',
  policy => ds_retry_policy(max_attempts => 2));
});
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND query LIKE '%/hangs attempt 2' AND wait_event = 'PgSleep'"),
	'hangs: the worker is running the hanging attempt');
# an attempt by another role with a guess at its definition learns nothing, even with nowait
$node->psql('postgres', q{SET ROLE mallory;
SELECT ds_run_step('iso', 'hangs', 'SELECT a_guess', nowait => true)}, stderr => \my $guess_err);
like($guess_err, qr/belongs to another role/,
	'guess: a wrong guess gets 42501, as any definition does, not DS409');
$node->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
ok($node->poll_query_until('postgres',
		"SELECT status = 'failed' AND error_code = '57014' FROM ds_steps WHERE step_id = 'hangs'"),
	'hangs: pg_cancel_backend() recorded the attempt as cancelled (57014, its last by its policy)');
is_deeply(worker_attempt($node, 'alice', 'after-cancels', 'SELECT 8'),
	{ status => 'succeeded', result => '8', error_code => '' },
	'after-cancels: the executor goes on with the next step');
is($node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"),
	$executor, 'after-cancels: the same executor process, never restarted');

$node->stop;
done_testing();
