# The worker's database does not exist yet, then is dropped while the worker is connected to
# it (docs/worker.md): the launcher waits with one log line, never a crash loop,
# and starts the executor again when the database comes back.

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

# one executor: the test counts its sessions, starts and exits
my $appnode = worker_node('appdb', "durable_steps.database = 'appdb'\ndurable_steps.max_workers = 1\n");
{
	my $t = 'DROP DATABASE';
	my $n = $appnode;
	# the launcher looks for its database once a second; the node has been up for a while
	ok( poll_until($n,
			'postgres', "SELECT now() - pg_postmaster_start_time() > interval '4 s'"),
		"$t: the launcher has been waiting for appdb for several of its passes");
	my $log = log_since($n, 0);
	is(count_matches($log, qr/durable_steps: database "appdb" does not exist; waiting for it/),
		1, "$t: the missing database is logged exactly once");
	is( $n->safe_psql(
			'postgres',
			q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps launcher') || '|' ||
			         count(*) FILTER (WHERE backend_type = 'durable_steps worker')
			    FROM pg_stat_activity}),
		'1|0',
		"$t: a launcher, no executor");

	my $run_step = sub {
		my ($run) = @_;
		is( $n->safe_psql(
				'appdb',
				qq{SELECT status || '|' || attempt FROM ds_run_step('$run', 's1',
				  \$\$SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after('again', '0 s')::text
				              ELSE 'ran ' || ds_attempt_number() END\$\$)}),
			'retrying|1',
			"$t: $run: the step's first attempt asks for a retry");
		ok( poll_until($n,
				'appdb', "SELECT status || '|' || result::text FROM ds_steps WHERE run_id = '$run'",
				'succeeded|"ran 2"'),
			"$t: $run: the worker runs it in appdb");
		is( $n->safe_psql(
				'appdb',
				"SELECT executor FROM ds_attempts WHERE run_id = '$run' AND attempt = 2"),
			'worker',
			"$t: $run: attempt 2 is the worker's");
	};

	my $off = log_offset($n);
	$n->safe_psql('postgres', 'CREATE DATABASE appdb');
	$n->wait_for_log(qr/durable_steps: database "appdb" exists; starting the worker/, $off);
	$n->safe_psql('appdb', 'CREATE EXTENSION durable_steps');
	$run_step->('app1');

	my ($ret, $stdout, $stderr) = $n->psql('postgres', 'DROP DATABASE appdb');
	isnt($ret, 0, "$t: plain DROP DATABASE fails while the worker is connected");
	like($stderr, qr/database "appdb" is being accessed by other users/,
		"$t: ... because of another session");
	like($stderr, qr/There are 2 other sessions using the database/,
		"$t: ... exactly two: the executor and the HTTP worker");

	$off = log_offset($n);
	$n->safe_psql('postgres', 'DROP DATABASE appdb WITH (FORCE)');
	pass("$t: DROP DATABASE WITH (FORCE) succeeds");
	$n->wait_for_log(qr/durable_steps: database "appdb" does not exist; waiting for it/, $off);
	ok( poll_until($n,
			'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'",
			'0'),
		"$t: no executor while appdb is gone");

	$off = log_offset($n);
	$n->safe_psql('postgres', 'CREATE DATABASE appdb');
	$n->wait_for_log(qr/durable_steps: database "appdb" exists; starting the worker/, $off);
	$n->safe_psql('appdb', 'CREATE EXTENSION durable_steps');
	$run_step->('app2');

	$log = log_since($n, 0);
	is(count_matches($log, qr/durable_steps: database "appdb" does not exist; waiting for it/),
		2, "$t: the missing database is logged once per absence (twice in all)");
	is(count_matches($log, qr/durable_steps: database "appdb" exists; starting the worker/),
		2, "$t: the launcher started the worker once per appearance of appdb");
	my $exits = count_matches($log, qr/"durable_steps (?:worker|launcher)[^"]*" \(PID \d+\) exited with exit code/);
	note "$t: executor/launcher exits logged: $exits";
	cmp_ok($exits, '<=', 3, "$t: no crash loop (at most a few executor exits)");
	is(count_matches($log, qr/terminated by signal/), 0, "$t: no process was killed by a signal");
	is(count_matches($log, qr/durable_steps: worker \d+ started in database "appdb"/),
		2, "$t: one executor start per appearance of appdb");
}

$appnode->stop;

done_testing();
