# Copyright (c) durable_steps contributors
#
# The background worker's life (README): an attempt whose executor is killed is recorded as lost
# (invocation_lost) and retried; an immediate shutdown under load loses no step and duplicates no
# effect; reloadable settings change on SIGHUP; DROP EXTENSION and DROP DATABASE are waited out
# with one log line each, never a crash loop; without shared_preload_libraries the extension
# still works and says once per session that retries will not run.
#
# Three nodes: "worker" (preloaded, serves the database postgres), "appdb" (preloaded, serves a
# database appdb that does not exist at first) and "no_preload". The appdb node is started first,
# so that its launcher has waited for its database for the whole run before section 5 looks at
# it. The immediate shutdown comes last on the worker node: should recovery crash-loop there, the
# other sections have already run.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);

# Everything the node has logged since byte $offset of its log file.
sub log_since
{
	my ($node, $offset) = @_;
	return slurp_file($node->logfile, $offset // 0);
}

sub log_offset
{
	my ($node) = @_;
	return -s $node->logfile;
}

sub count_matches
{
	my ($text, $re) = @_;
	my $n = () = $text =~ /$re/g;
	return $n;
}

# A process that died of a signal other than our own kill -9 (SIGSEGV, SIGABRT, ...).
my $crash_re = qr/^.*was terminated by signal (?!9:)\d+.*$/m;

# Like poll_query_until, with two differences: the query goes on psql's command line (a psql that
# cannot connect, as during a crash restart, never reads its stdin, and IPC::Run then dies of the
# broken pipe), and it gives up at once, showing the log line, when a server process crashed:
# waiting out the timeout of a crash-looping server tells nothing more.
sub poll_until
{
	my ($node, $db, $query, $expected) = @_;
	$expected = 't' unless defined $expected;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my ($out, $err) = ('', '');
	while (time() < $deadline)
	{
		IPC::Run::run([ 'psql', '-XAtq', '-d', $node->connstr($db), '-c', $query ],
			'<', \undef, '>', \$out, '2>', \$err);
		chomp $out;
		chomp $err;
		return 1 if $out eq $expected && $err eq '';
		if (log_since($node, 0) =~ $crash_re)
		{
			my $line = $&;
			diag "server process crashed while polling:\n$query\nlog: $line\n"
			  . "last output: $out\nstderr: $err";
			return 0;
		}
		usleep(100_000);
	}
	diag "timed out polling:\n$query\nexpecting: $expected\nlast output: $out\nstderr: $err";
	return 0;
}

# Pid of the one executor of $node (dies if there is not exactly one).
sub executor_pid
{
	my ($node) = @_;
	my $pids = $node->safe_psql('postgres',
		"SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"
	);
	die "expected one durable_steps worker, found '$pids'" unless $pids =~ /^\d+$/;
	return $pids;
}

# Waits until executor $pid has gone round its loop for $ms milliseconds after now: every pass
# opens and commits a transaction, which moves its pg_stat_activity.state_change.
sub wait_executor_loops
{
	my ($node, $db, $pid, $ms) = @_;
	my $now = $node->safe_psql($db, 'SELECT now()');
	return poll_until($node, $db,
		"SELECT state_change > '$now'::timestamptz + interval '$ms ms' FROM pg_stat_activity WHERE pid = $pid"
	);
}

# The test framework turns restart_after_crash off; a crash restart is what section 1 is about.
my $preload = qq{
shared_preload_libraries = 'durable_steps'
durable_steps.poll_interval = '200ms'
restart_after_crash = on
};

my $appnode = PostgreSQL::Test::Cluster->new('appdb');
$appnode->init;
$appnode->append_conf('postgresql.conf', $preload . "durable_steps.database = 'appdb'\n");
$appnode->start;

my $node = PostgreSQL::Test::Cluster->new('worker');
$node->init;
$node->append_conf('postgresql.conf', $preload);
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;

-- section 1: one effect per step at most (a second committed effect would make the body fail)
CREATE TABLE kill_effects (
    step    text UNIQUE,
    attempt integer NOT NULL,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
-- attempt 1 (the caller) asks to be retried at once; attempt 2 (the worker) writes its effect
-- and then sleeps long enough to be killed; later attempts write the effect and return
CREATE FUNCTION kill_body() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('go', '0 s');
    END IF;
    INSERT INTO kill_effects(step, attempt) VALUES (ds_run_id() || '/' || ds_step_id(), ds_attempt_number());
    IF ds_attempt_number() = 2 THEN
        PERFORM pg_sleep(60);
    END IF;
    RETURN 'done at attempt ' || ds_attempt_number();
END
$$;

-- section 4: no unique constraint, so that a duplicated effect would show
CREATE TABLE load_effects (
    step    text NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
CREATE FUNCTION load_body() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM ds_retry_after('later', '0 s');
    END IF;
    INSERT INTO load_effects(step, attempt) VALUES (ds_step_id(), ds_attempt_number());
    PERFORM pg_sleep(0.005);   -- slow enough that the stop finds work in flight
    RETURN ds_attempt_number();
END
$$;
});

############################################################################################
# 1. kill -9 of the executor while it runs an attempt: the attempt is recorded as lost
#    (DS007 invocation_lost, retryable), the next attempt succeeds, and the lost attempt's
#    effect rolled back with it.
{
	my $t = 'kill -9';
	is( $node->safe_psql(
			'postgres',
			q{SELECT status || '|' || attempt FROM ds_run_step('k1', 's1', 'SELECT kill_body()',
			  policy => '{"max_attempts": 5, "initial_delay": "10 ms"}')}),
		'retrying|1',
		"$t: the caller's attempt asks for a retry");

	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'
   AND query LIKE 'durable_steps: running k1/s1 attempt 2%'}),
		"$t: the executor sleeps in attempt 2");
	my $pid = executor_pid($node);
	is( $node->safe_psql(
			'postgres',
			q{SELECT s.status || '|' || s.attempt || '|' || coalesce(a.class, 'null') || '|' ||
			         a.executor || '|' || a.backend_pid || '|' || (a.claimed_at IS NOT NULL)
			    FROM ds_steps s JOIN ds_attempts a USING (run_id, step_id)
			   WHERE s.run_id = 'k1' AND a.attempt = 2}),
		"running|2|null|worker|$pid|true",
		"$t: attempt 2 is committed as started (running, claimed, no outcome yet)");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM kill_effects'),
		'0', "$t: attempt 2's effect is not committed");

	my $off = log_offset($node);
	kill 'KILL', $pid;
	$node->wait_for_log(
		qr/durable_steps worker.*\(PID $pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$off);
	ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'k1'",
			'succeeded'),
		"$t: after the crash restart the step succeeds");
	like(log_since($node, $off),
		qr/durable_steps: attempt 2 of step k1\/s1 was lost; recording it as failed/,
		"$t: the lost attempt is logged");

	is( $node->safe_psql(
			'postgres',
			q{SELECT string_agg(attempt || '|' || class || '|' || coalesce(error_code, '') || '|' ||
			                    coalesce(error_message, '') || '|' || executor || '|' ||
			                    (claimed_at IS NOT NULL AND finished_at IS NOT NULL), ',' ORDER BY attempt)
			    FROM ds_attempts WHERE run_id = 'k1'}),
		'1|retryable|DS002|go|caller|true,'
		  . '2|retryable|DS007|invocation_lost|worker|true,'
		  . '3|completed|||worker|true',
		"$t: attempt 2 is recorded as invocation_lost (DS007, retryable), attempt 3 completed");
	is( $node->safe_psql(
			'postgres',
			q{SELECT status || '|' || attempt || '|' || result::text || '|' ||
			         coalesce(error_code, 'none') FROM ds_steps WHERE run_id = 'k1'}),
		'succeeded|3|"done at attempt 3"|none',
		"$t: the step row: succeeded at attempt 3, error cleared");
	is($node->safe_psql('postgres', q{SELECT string_agg(step || '|' || attempt, ',') FROM kill_effects}),
		'k1/s1|3', "$t: exactly one effect, attempt 3's; attempt 2's was lost with its transaction");
}

############################################################################################
# 2. SIGHUP: durable_steps.retention and durable_steps.poll_interval are reloadable; a reload
#    makes a purge pass due at once.
{
	my $t = 'reload';
	my $ok_step = sub {
		my ($step) = @_;
		return "SELECT status FROM ds_run_step('ret', '$step', 'SELECT 1');";
	};
	$node->safe_psql(
		'postgres', join(
			"\n",
			(map { $ok_step->("old30-$_") } 1 .. 3),
			(map { $ok_step->("old1h-$_") } 1 .. 3),
			$ok_step->('fresh'),
			q{SELECT status FROM ds_run_step('ret', 'blocked', $$SELECT ds_blocked('needs a person', 'Fix it.')$$);},
			# finished long ago (superuser back-dating; nobody else can write these tables)
			q{UPDATE durable_steps.steps SET finished_at = now() - interval '30 days'
			   WHERE run_id = 'ret' AND step_id LIKE 'old30-%';},
			q{UPDATE durable_steps.steps SET finished_at = now() - interval '1 hour'
			   WHERE run_id = 'ret' AND step_id LIKE 'old1h-%';},
			q{UPDATE durable_steps.steps SET created_at = now() - interval '30 days',
			                                 updated_at = now() - interval '30 days'
			   WHERE run_id = 'ret' AND step_id = 'blocked';}));
	my $left = sub {
		return $node->safe_psql(
			'postgres', q{
SELECT string_agg(step_id || ':' || status || ':' ||
                  (SELECT count(*) FROM durable_steps.attempts a
                    WHERE a.run_id = s.run_id AND a.step_id = s.step_id), ',' ORDER BY step_id)
  FROM durable_steps.steps s WHERE run_id = 'ret'});
	};
	is( $left->(),
		'blocked:blocked:1,fresh:succeeded:1,old1h-1:succeeded:1,old1h-2:succeeded:1,'
		  . 'old1h-3:succeeded:1,old30-1:succeeded:1,old30-2:succeeded:1,old30-3:succeeded:1',
		"$t: eight steps, one attempt each");
	is($node->safe_psql('postgres', 'SHOW durable_steps.retention'),
		'7d', "$t: the default retention is 7 days");

	# a reload without changes: the purge pass it makes due applies the default retention
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	ok( poll_until($node,
			'postgres',
			"SELECT count(*) FROM durable_steps.steps WHERE run_id = 'ret' AND step_id LIKE 'old30-%'",
			'0'),
		"$t: a reload purges steps finished 30 days ago with the default retention");
	is( $left->(),
		'blocked:blocked:1,fresh:succeeded:1,old1h-1:succeeded:1,old1h-2:succeeded:1,'
		  . 'old1h-3:succeeded:1',
		"$t: ... with their attempts; steps finished an hour ago stay");

	$node->safe_psql('postgres',
		"ALTER SYSTEM SET durable_steps.retention = '10min'; SELECT pg_reload_conf();");
	ok( poll_until($node,
			'postgres',
			"SELECT count(*) FROM durable_steps.steps WHERE run_id = 'ret' AND step_id LIKE 'old1h-%'",
			'0'),
		"$t: retention 10min after SIGHUP purges the steps finished an hour ago");
	is($left->(), 'blocked:blocked:1,fresh:succeeded:1',
		"$t: ... with their attempts; the fresh and the blocked step stay");
	is($node->safe_psql('postgres', 'SHOW durable_steps.retention'),
		'10min', "$t: a new session sees retention 10min");

	# the fresh step must be older than 1 s when the purge pass runs
	ok( poll_until($node,
			'postgres',
			"SELECT finished_at < now() - interval '1.5 s' FROM ds_steps WHERE run_id = 'ret' AND step_id = 'fresh'"
		),
		"$t: the fresh step finished more than a second ago");
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET durable_steps.retention = '1s'; SELECT pg_reload_conf();");
	ok( poll_until($node,
			'postgres',
			"SELECT count(*) FROM durable_steps.steps WHERE run_id = 'ret' AND step_id = 'fresh'",
			'0'),
		"$t: retention 1s after SIGHUP purges the fresh step");
	is($left->(), 'blocked:blocked:1',
		"$t: the blocked step (not finished) stays, with its attempt");
	is($node->safe_psql('postgres', "SELECT count(*) FROM durable_steps.attempts WHERE run_id = 'ret'"),
		'1', "$t: no orphaned attempts are left");

	is($node->safe_psql('postgres', 'SHOW durable_steps.poll_interval'),
		'200ms', "$t: poll_interval is 200ms as configured");
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET durable_steps.poll_interval = '150ms'; SELECT pg_reload_conf();");
	ok(poll_until($node, 'postgres', 'SHOW durable_steps.poll_interval', '150ms'),
		"$t: a new session sees poll_interval 150ms after ALTER SYSTEM and a reload");
	is( $node->safe_psql(
			'postgres',
			"SELECT setting || '|' || context FROM pg_settings WHERE name = 'durable_steps.poll_interval'"
		),
		'150|sighup',
		"$t: pg_settings shows the new value of a sighup setting");

	$node->safe_psql('postgres',
		"ALTER SYSTEM RESET durable_steps.retention; SELECT pg_reload_conf();");
	ok(poll_until($node, 'postgres', 'SHOW durable_steps.retention', '7d'),
		"$t: retention is back to its default");
}

############################################################################################
# 3. DROP EXTENSION while the worker runs: it waits for the extension (one log line, same
#    process), and runs steps again once the extension is back.
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
	$node->wait_for_log(qr/durable_steps: extension found; running steps/, $off);
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

############################################################################################
# 4. Immediate shutdown under load: no step is lost, no effect is duplicated.
{
	my $t = 'immediate shutdown';
	my $n = 400;
	my $off = log_offset($node);
	# all created in one transaction: they become due together when it commits
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM generate_series(1, $n) AS i,
       LATERAL ds_run_step('load', 's' || i, 'SELECT load_body()',
                           policy => '{"max_attempts": 10, "initial_delay": "10 ms", "backoff": "fixed"}') AS r
 WHERE r.status = 'retrying'}),
		$n,
		"$t: $n steps made due at once");

	# stop as soon as the worker has finished some of them
	my $done = 0;
	my $tries = 0;
	while ($tries++ < 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		$done = $node->safe_psql('postgres',
			"SELECT count(*) FROM durable_steps.steps WHERE run_id = 'load' AND status = 'succeeded'"
		);
		last if $done >= 20;
		usleep(20_000);
	}
	$node->stop('immediate');
	note "$t: $done of $n steps had succeeded when the immediate shutdown began";
	cmp_ok($done, '>=', 1, "$t: the worker had completed some steps before the stop");
	cmp_ok($done, '<', $n, "$t: ... but not all of them");

	$node->start;
	my $all_done = poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') FROM ds_steps WHERE run_id = 'load'",
		$n);
	ok($all_done, "$t: after the restart all $n steps succeed");
	my $crashes = count_matches(log_since($node, $off), $crash_re);
	is($crashes, 0, "$t: no server process crashed after the restart");
	if ($crashes)
	{
		my $log = log_since($node, $off);
		my ($first) = $log =~ /((?:^.*\n){0,3}^.*was terminated by signal (?!9:)\d+.*\n^.*\n)/m;
		diag "$t: first crash after the restart (of $crashes):\n$first";
	}
  SKIP:
	{
		skip "$t: the steps did not all succeed after the restart", 8 unless $all_done;
		is( $node->safe_psql(
				'postgres', "SELECT count(*) || '|' || count(DISTINCT step) FROM load_effects"),
			"$n|$n", "$t: exactly one effect per step (count = count distinct = $n)");
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) FROM (SELECT step FROM load_effects GROUP BY step HAVING count(*) <> 1) d"
			),
			'0',
			"$t: no step has a duplicated effect");
		is( $node->safe_psql(
				'postgres', q{
	SELECT count(*) FILTER (WHERE class = 'completed') || '|' ||
	       count(*) FILTER (WHERE class IS NULL) || '|' ||
	       count(*) FILTER (WHERE attempt > 1 AND executor <> 'worker')
	  FROM ds_attempts WHERE run_id = 'load'}),
			"$n|0|0",
			"$t: one completed attempt per step, no attempt left without an outcome, retries by the worker"
		);
		is( $node->safe_psql(
				'postgres', q{
	SELECT count(*) FROM ds_steps s
	 WHERE run_id = 'load'
	   AND (s.attempt <> (SELECT count(*) FROM ds_attempts a WHERE a.run_id = s.run_id AND a.step_id = s.step_id)
	        OR s.result <> to_jsonb(s.attempt))}),
			'0',
			"$t: attempt numbers have no gaps and each result is its last attempt's number");
		is( $node->safe_psql(
				'postgres',
				q{SELECT count(*) FROM load_effects e JOIN ds_steps s ON s.run_id = 'load' AND s.step_id = e.step
				   WHERE e.attempt <> s.attempt}),
			'0',
			"$t: each effect was written by the step's completed attempt");
		my ($lost, $lost_ok) = split /\|/, $node->safe_psql(
			'postgres', q{
	SELECT count(*) || '|' ||
	       bool_and(class = 'retryable' AND error_message = 'invocation_lost' AND executor = 'worker'
	                AND attempt >= 2)
	  FROM ds_attempts WHERE run_id = 'load' AND error_code = 'DS007'});
		diag "$t: $lost of $n attempts were recorded as invocation_lost after the immediate shutdown";
		cmp_ok($lost, '>=', 1, "$t: the attempts in flight at the stop were recorded as lost");
		is($lost_ok, 'true', "$t: each lost attempt is a retryable worker attempt with invocation_lost");
		is(count_matches(log_since($node, $off), qr/attempt \d+ of step load\/s\d+ was lost/),
			$lost, "$t: one log line per lost attempt");
	}
}

$node->stop('immediate');

############################################################################################
# 5. The database does not exist yet, then is dropped while the worker is connected to it.
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
	like($stderr, qr/There is 1 other session using the database/,
		"$t: ... exactly one: the executor");

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

############################################################################################
# 6. Not preloaded: the extension works in the caller; a retryable failure warns once per
#    session that retries will not run. Every session loads the library on its first call, so
#    each call below is a session of its own unless said otherwise.
{
	my $t = 'not preloaded';
	my $n = PostgreSQL::Test::Cluster->new('no_preload');
	$n->init;
	$n->start;
	my ($ret, $stdout, $stderr) = $n->psql('postgres', 'CREATE EXTENSION durable_steps');
	is($ret, 0, "$t: CREATE EXTENSION works without shared_preload_libraries");
	is($stderr, '', "$t: ... without any message") or diag "$t: CREATE EXTENSION said: $stderr";
  SKIP:
	{
		skip "$t: the extension could not be created", 9 if $ret != 0;
		($ret, $stdout, $stderr) = $n->psql('postgres',
			"SELECT status || '|' || result::text || '|' || attempt FROM ds_run_step('np', 'ok', 'SELECT 42')"
		);
		is("$stdout|$stderr", 'succeeded|42|1|', "$t: ds_run_step runs a step in the caller, silently");

		my $retry = sub {
			my ($step) = @_;
			return
			  "SELECT status FROM ds_run_step('np', '$step', \$\$SELECT ds_retry_after('later', '1 min')\$\$);";
		};
		my $warning =
		  qr/WARNING:\s+durable_steps is not in shared_preload_libraries: retries will not run until it is/;
		($ret, $stdout, $stderr) = $n->psql('postgres', $retry->('r1') . "\n" . $retry->('r2'));
		is($ret, 0, "$t: two retryable steps in one session: no error");
		is($stdout, "retrying\nretrying", "$t: both steps are retrying");
		is(count_matches($stderr, $warning), 1, "$t: the warning is given once in the session");
		unlike($stderr, qr/ERROR|FATAL/, "$t: ... and nothing worse");
		($ret, $stdout, $stderr) = $n->psql('postgres', $retry->('r3'));
		is($stdout, 'retrying', "$t: a step in a second session is retrying");
		is(count_matches($stderr, $warning), 1, "$t: a new session is warned again, once");
		($ret, $stdout, $stderr) =
		  $n->psql('postgres', "SELECT status FROM ds_run_step('np', 'ok2', 'SELECT 1')");
		is("$stdout|$stderr", 'succeeded|', "$t: a step that succeeds gives no warning");
		is( $n->safe_psql(
				'postgres',
				"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'"),
			'0',
			"$t: no launcher and no executor");
	}
	$n->stop;
}

$appnode->stop;

done_testing();
