# DROP EXTENSION while the worker runs in a listed database (docs/worker.md): it waits for the
# extension (one log line, same process), and runs steps again once the extension is back.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# one executor: the test follows that process through the DROP
my $node = worker_node('worker', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');
# the executor has seen the extension: it ran a step's second attempt
$node->safe_psql('postgres', q{SELECT status FROM ds_run_step('seen', 's',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text ELSE ''ran'' END')});
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'seen'", 'succeeded'),
	'the executor runs steps before the DROP');

{
	my $t = 'DROP EXTENSION';
	my $pid = executor_pid($node);
	my $off = log_offset($node);
	$node->safe_psql('postgres', 'DROP EXTENSION durable_steps');
	$node->wait_for_log(
		qr/durable_steps: extension is not installed in database "postgres"; waiting for it/, $off);
	ok(wait_executor_loops($node, 'postgres', $pid, 1500),
		"$t: the executor keeps going round its loop without the extension");
	my $log = log_since($node, $off);
	is(count_matches($log, qr/extension is not installed in database/),
		1, "$t: the missing extension is logged once");
	is(count_matches($log, qr/durable_steps: worker \d+ started/),
		0, "$t: no executor was started again");
	is(count_matches($log, qr/exited with exit code|terminated by signal|ERROR:/),
		0, "$t: no process exited, no error was logged");
	is(executor_pid($node), $pid, "$t: the same executor process is still there");

	$off = log_offset($node);
	$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');
	$node->wait_for_log(qr/durable_steps: extension found at version [0-9.]+; running steps/, $off);
	is( $node->safe_psql(
			'postgres',
			q{SELECT status || '|' || attempt FROM ds_run_step('ext', 's1',
			  $$SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after('again', '0 s')::text
			              ELSE 'ran ' || ds_attempt_number() END$$)}),
		'retrying|1',
		"$t: after CREATE EXTENSION a step's first attempt asks for a retry");
	ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'ext'",
			'succeeded'),
		"$t: the worker runs the retry");
	is( $node->safe_psql(
			'postgres',
			q{SELECT s.result::text || '|' || a.executor || '|' || a.backend_pid
			    FROM ds_steps s JOIN ds_attempts a ON a.run_id = s.run_id AND a.step_id = s.step_id
			                                      AND a.attempt = s.attempt
			   WHERE s.run_id = 'ext'}),
		qq{"ran 2"|worker|$pid},
		"$t: attempt 2 was run by the same executor");
	is(count_matches(log_since($node, $off), qr/durable_steps: worker \d+ started|exited with exit code|terminated by signal/),
		0, "$t: still no restart of the executor");

	# DROP EXTENSION while the executors are busy: each of their transactions first takes a
	# shared lock on the extension, so a DROP waits for them instead of deadlocking with a
	# transaction that holds one of the tables. Steps keep coming due every 10 ms.
	$off = log_offset($node);
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET durable_steps.poll_interval = '10ms'; SELECT pg_reload_conf();");
	ok(poll_until($node, 'postgres', 'SHOW durable_steps.poll_interval', '10ms'),
		"$t: poll_interval is 10ms for the busy round");
	my $rounds = 12;
	my $dropped = 0;
	for my $round (1 .. $rounds)
	{
		$node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM generate_series(1, 50) AS i,
       LATERAL ds_run_step('busy$round', 's' || i,
                           \$\$SELECT CASE WHEN ds_attempt_number() < 3 THEN ds_retry_after('again', '0 s')::text
                                       ELSE 'ok' END\$\$) AS r});
		my ($rc, $out, $err) = $node->psql('postgres',
			'DROP EXTENSION durable_steps; CREATE EXTENSION durable_steps;');
		$dropped++ if $rc == 0;
		diag("round $round: $err") if $rc != 0;
	}
	is($dropped, $rounds, "$t: every DROP EXTENSION of a busy database succeeded");
	my $busy_log = log_since($node, $off);
	is(count_matches($busy_log, qr/deadlock detected/), 0, "$t: no deadlock was detected");
	is(count_matches($busy_log, qr/terminated by signal/), 0, "$t: no process crashed");
	$node->safe_psql('postgres',
		"ALTER SYSTEM RESET durable_steps.poll_interval; SELECT pg_reload_conf();");
	ok(poll_until($node, 'postgres', 'SHOW durable_steps.poll_interval', '200ms'),
		"$t: poll_interval is back to 200ms");
}

$node->stop;

done_testing();
