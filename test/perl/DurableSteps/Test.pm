# DurableSteps::Test -- what the TAP tests of the background worker share (test/t/*.pl).
#
#   my $node = DurableSteps::Test::worker_node('name');   # preloaded, worker on, started
#   poll_until($node, $db, $query [, $expected])           # poll, giving up on a crash
#   log_offset($node), log_since($node, $offset), count_matches($text, $re)
#   executor_pid($node), wait_executor_loops($node, $db, $pid, $ms)
#   reload_executors($node, @alter_system)   # ALTER SYSTEM, reload, every executor applied it
#   my $node = retry_node('name');   # a worker node with the extension and the retry fixtures
#   create_retry_fixtures($node); settle, attempts, ran_in_worker, gap, started_within ($node, run, step, ...)
package DurableSteps::Test;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(worker_node executors_running retry_node settled_and_sound log_since log_offset count_matches poll_log poll_until executor_pid
  wait_executor_loops reload_executors $crash_re create_retry_fixtures settle attempts ran_in_worker gap
  started_within);

# The test framework turns restart_after_crash off; a crash restart is what some tests are about.
our $preload = qq{
shared_preload_libraries = 'durable_steps'
durable_steps.poll_interval = '200ms'
restart_after_crash = on
};

# A started node with the library preloaded; $conf is appended to postgresql.conf.
sub worker_node
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', $preload . ($conf // ''));
	$node->start;
	return $node;
}

# Waits until $n executors of $node run; true when they do.
sub executors_running
{
	my ($node, $n) = @_;
	return poll_until($node, 'postgres',
		"SELECT count(*) = $n FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
}

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

# Waits until the node has logged $re at least $n times (default 1) since byte $offset of its
# log; the count it reached.
sub poll_log
{
	my ($node, $offset, $re, $n) = @_;
	$n //= 1;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my $seen;
	while (($seen = count_matches(log_since($node, $offset), $re)) < $n && time() < $deadline)
	{
		usleep(100_000);
	}
	return $seen;
}

# A process that died of a signal other than our own kill -9 (SIGSEGV, SIGABRT, ...).
our $crash_re = qr/^.*was terminated by signal (?!9:)\d+.*$/m;

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

# Runs the ALTER SYSTEM statements @alter, reloads, and waits until every executor of database
# postgres went round its loop since: the reload wakes each one, which applies it in that pass
# (a transaction, which moves pg_stat_activity.state_change). True when they all have.
sub reload_executors
{
	my ($node, @alter) = @_;
	my $before = $node->safe_psql('postgres', 'SELECT now()');
	$node->safe_psql('postgres', $_) for @alter;
	$node->reload;
	return poll_until($node, 'postgres', qq{
SELECT bool_and(state_change > '$before') FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker'});
}

# A worker node serving database postgres, with the extension and the retry fixtures, once its
# launcher and an executor are up.
sub retry_node
{
	my ($name) = @_;
	my $node = worker_node($name, "durable_steps.database = 'postgres'\n");
	$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');
	create_retry_fixtures($node);
	# a launcher connected to no database and an executor in database postgres
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) FILTER (WHERE backend_type = 'durable_steps launcher' AND datname IS NULL) = 1 "
			  . "AND count(*) FILTER (WHERE backend_type = 'durable_steps worker' AND datname = 'postgres') >= 1 "
			  . "FROM pg_stat_activity"),
		'the launcher and an executor are running');
	return $node;
}

# At the end of a retry test: step (run, step) is still at attempt $attempt (it was not
# attempted again), and no server process crashed or exited with an error.
sub settled_and_sound
{
	my ($node, $run, $step, $attempt, $what) = @_;
	is($node->safe_psql('postgres',
			"SELECT attempt FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'"),
		$attempt, "the $what step was not attempted again");
	unlike(slurp_file($node->logfile), qr/terminated by signal|PANIC:|exited with exit code [1-9]/,
		'no server process crashed or exited with an error');
}

# The tables and functions the retry tests use: an effect ledger, a run counter, bodies that
# fail until an attempt number.
sub create_retry_fixtures
{
	my ($node) = @_;
	$node->safe_psql(
	'postgres', q{
-- every successful body execution leaves one row here
CREATE TABLE effects (
    id      serial PRIMARY KEY,
    tag     text NOT NULL,
    attempt integer NOT NULL,
    who     text NOT NULL DEFAULT current_user,
    pid     integer NOT NULL DEFAULT pg_backend_pid()
);
-- counts body executions, failed ones included: nextval is not rolled back
CREATE SEQUENCE body_runs;

-- fails retryably (P0001) while ds_attempt_number() < n; then inserts one effect, returns its id
CREATE FUNCTION fail_until(tag text, n integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    effect_id integer;
BEGIN
    PERFORM nextval('body_runs');
    IF ds_attempt_number() < n THEN
        RAISE EXCEPTION 'step % not yet (attempt %)', tag, ds_attempt_number();
    END IF;
    INSERT INTO effects(tag, attempt) VALUES (tag, ds_attempt_number())
        RETURNING id INTO effect_id;
    RETURN effect_id;
END
$$;

-- fails retryably while ds_attempt_number() < n, then returns the attempt number
CREATE FUNCTION gate(n integer) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < n THEN
        RAISE EXCEPTION 'gate: attempt % < %', ds_attempt_number(), n;
    END IF;
    RETURN ds_attempt_number();
END
$$;

CREATE FUNCTION always_fails(tag text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'always fails: %', tag;
END
$$;
});
}

# Wait until the step has left pending/running/retrying; returns its status.
sub settle
{
	my ($node, $run, $step) = @_;
	$node->poll_query_until('postgres',
		"SELECT status NOT IN ('pending', 'running', 'retrying') FROM ds_steps "
		  . "WHERE run_id = '$run' AND step_id = '$step'")
	  or diag("step $run/$step did not settle");
	return $node->safe_psql('postgres',
		"SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

# One line per attempt: attempt|class|error_code|executor
sub attempts
{
	my ($node, $run, $step) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT string_agg(attempt || '|' || coalesce(class, '-') || '|' || coalesce(error_code, '') || '|' || executor,
                  E'\n' ORDER BY attempt)
  FROM ds_attempts WHERE run_id = '$run' AND step_id = '$step'});
}

# Did every attempt of the given numbers run in an executor of the background worker?
sub ran_in_worker
{
	my ($node, $run, $step, @nums) = @_;
	my $list = join(',', @nums);
	return $node->safe_psql(
		'postgres', qq{
SELECT count(*) = @{[scalar @nums]}
   AND bool_and(executor = 'worker')
   AND bool_and(EXISTS (SELECT 1 FROM pg_stat_activity p
                         WHERE p.pid = a.backend_pid AND p.backend_type = 'durable_steps worker'))
  FROM ds_attempts a
 WHERE run_id = '$run' AND step_id = '$step' AND attempt IN ($list)});
}

# "gap(n)": attempt n's started_at minus attempt n-1's finished_at, as seconds (for messages)
sub gap
{
	my ($node, $run, $step, $n) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT round(extract(epoch FROM b.started_at - a.finished_at), 3)
  FROM ds_attempts a JOIN ds_attempts b USING (run_id, step_id)
 WHERE run_id = '$run' AND step_id = '$step' AND a.attempt = $n - 1 AND b.attempt = $n});
}

# Did attempt n start within [lo, hi) after attempt n-1 finished? Compared in SQL.
sub started_within
{
	my ($node, $run, $step, $n, $lo, $hi) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT b.started_at >= a.finished_at + interval '$lo'
   AND b.started_at <  a.finished_at + interval '$hi'
   AND b.claimed_at >= a.finished_at + interval '$lo'
  FROM ds_attempts a JOIN ds_attempts b USING (run_id, step_id)
 WHERE run_id = '$run' AND step_id = '$step' AND a.attempt = $n - 1 AND b.attempt = $n});
}

1;
