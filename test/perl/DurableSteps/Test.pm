# DurableSteps::Test -- what the TAP tests of the background worker share (test/t/*.pl).
#
#   my $node = DurableSteps::Test::worker_node('name');   # preloaded, worker on, started
#   poll_until($node, $db, $query [, $expected])           # poll, giving up on a crash
#   log_offset($node), log_since($node, $offset), count_matches($text, $re)
#   executor_pid($node), wait_executor_loops($node, $db, $pid, $ms)
#   reload_executors($node, @alter_system)   # ALTER SYSTEM, reload, every executor applied it
#   my $node = retry_node('name');   # a worker node with the extension and the retry fixtures
#   create_retry_fixtures($node); settle, ran_in_worker, gap, started_within ($node, run, step, ...)
#   row_of($node, $db, $query), rows_of(...)   # rows as hashes of named columns, for is_deeply
#   row_sql($query), decode_row($text)         # the same through a DurableSteps::Session
#   poll_row($node, $db, $query, {column => value, ...})   # poll until the row has those values
#   psql_as($node, $role, $sql), psql_as_ok(...)   # psql as a LOGIN role of database postgres
#   claims_node('name'); claim_sql($run, nowait => 1); claim_counts($node, $run); claim_effects(...)
#   worker_attempt($node, $role, $step, $body [, $extra])   # attempt 2 of a step run by the worker
#   attempts_of($node, $run, $step)            # a step's attempts as named rows
#   fields($hash, @keys)                       # the hash with only those keys
#   my $up = DurableSteps::Upgrade->prepare;   # TAP 046, 047, 064: a cluster upgraded across majors
package DurableSteps::Test;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use DurableSteps::Session;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(worker_node executors_running retry_node settled_and_sound log_since log_offset count_matches poll_log poll_until executor_pid
  wait_executor_loops reload_executors $crash_re create_retry_fixtures settle ran_in_worker gap
  started_within row_of rows_of row_sql decode_row poll_row psql_as psql_as_ok
  claims_node claim_sql claim_counts claim_effects worker_attempt attempts_of fields
  start_run_as settle_run);

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

# Starts a run of workflow $workflow with input $input (jsonb text) as LOGIN role $role of
# database postgres; its run_id (dies with psql's error).
sub start_run_as
{
	my ($node, $role, $workflow, $input) = @_;
	$input =~ s/'/''/g;
	my ($rc, $out, $err) = psql_as($node, $role, "SELECT run_id FROM ds_start_run('$workflow', '$input')");
	die "starting a run of $workflow: $err" if $rc;
	return $out;
}

# Waits until run $run has ended (neither pending, running nor waiting); its status.
sub settle_run
{
	my ($node, $run) = @_;
	poll_until($node, 'postgres',
		"SELECT status NOT IN ('pending', 'running', 'waiting') FROM ds_runs WHERE run_id = '$run'")
	  or Test::More::diag("run $run did not settle");
	return $node->safe_psql('postgres', "SELECT status FROM ds_runs WHERE run_id = '$run'");
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

# Like poll_query_until, with two differences: it polls through one psql session
# (DurableSteps::Session) for the whole wait rather than a psql and a backend forked per try,
# which on a small machine costs more CPU than the tests themselves; a session its server ended
# (a crash restart, a stop) is replaced by a new one as soon as one connects. And it gives up at
# once, showing the log line, when a server process crashed: waiting out the timeout of a
# crash-looping server tells nothing more.
sub poll_until
{
	my ($node, $db, $query, $expected) = @_;
	$expected = 't' unless defined $expected;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my ($out, $err) = ('', '');
	my $session;
	my $done = sub { $session->quit if $session; return $_[0]; };
	# psql sends a statement of its input when it reads the semicolon that ends it
	(my $statement = $query) =~ s/;?\s*\z/;/;
	while (time() < $deadline)
	{
		$session //= eval { DurableSteps::Session->new($node, 'poll', $db) };
		if (!$session)
		{
			($out, $err) = ('', "no session: $@");
		}
		elsif (!eval { ($out, $err) = $session->query($statement); 1 })
		{
			($out, $err) = ('', "session lost: $@");
			$session->abandon;
			undef $session;
		}
		return $done->(1) if $out eq $expected && $err eq '';
		if (log_since($node, 0) =~ $crash_re)
		{
			my $line = $&;
			diag "server process crashed while polling:\n$query\nlog: $line\n"
			  . "last output: $out\nstderr: $err";
			return $done->(0);
		}
		usleep(100_000);
	}
	diag "timed out polling:\n$query\nexpecting: $expected\nlast output: $out\nstderr: $err";
	return $done->(0);
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

# Rows as hashes of named columns, so that a test compares what it names: with is_deeply, a
# column that differs is shown by its name. Each value is the column's text as to_jsonb gives it
# (a boolean is 'true' or 'false', a jsonb column its JSON text, a jsonb string without quotes),
# undef for NULL.

# SQL that returns each row of $query as one line of JSON (an object of its columns' text).
sub row_sql
{
	my ($query) = @_;
	$query =~ s/;\s*$//;
	return qq{SELECT (SELECT jsonb_object_agg(k, v) FROM jsonb_each_text(to_jsonb(q)) AS e(k, v))
  FROM ($query) AS q;};
}

# A line of row_sql's output as a hash (undef for no line).
sub decode_row
{
	my ($text) = @_;
	return undef if !defined $text || $text eq '';
	die "more than one row: $text" if $text =~ /\n/;
	return decode_json($text);
}

# The one row $query returns in database $db (undef when none; dies when there are more).
sub row_of
{
	my ($node, $db, $query) = @_;
	return decode_row($node->safe_psql($db, row_sql($query)));
}

# Every row $query returns in database $db, in its order, as an array of hashes.
sub rows_of
{
	my ($node, $db, $query) = @_;
	my $text = $node->safe_psql($db, row_sql($query));
	return [ map { decode_json($_) } grep { $_ ne '' } split /\n/, $text ];
}

# Like poll_until, for the one row of $query: waits until the columns named in %$expected have
# those values (text as row_of gives it, undef for NULL; columns not named are not compared). True
# when they do; on giving up, shows the row as it last was.
sub poll_row
{
	my ($node, $db, $query, $expected) = @_;
	my $want = JSON::PP->new->canonical->encode(
		{ map { $_ => (defined $expected->{$_} ? "$expected->{$_}" : undef) } keys %$expected });
	$want =~ s/'/''/g;
	(my $q = $query) =~ s/;\s*$//;
	my $ok = poll_until($node, $db, qq{
SELECT coalesce((SELECT jsonb_object_agg(k, v) FROM jsonb_each_text(to_jsonb(q)) AS e(k, v))
                @> '$want'::jsonb, false)
  FROM ($q) AS q});
	diag('the row was: ', explain(eval { row_of($node, $db, $query) } // 'none')) unless $ok;
	return $ok;
}

# psql in database postgres as the LOGIN role $role: (exit code, stdout, stderr). Errors are
# verbose: stderr shows their SQLSTATE.
sub psql_as
{
	my ($node, $role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql,
		connstr => $node->connstr('postgres') . " user=$role",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($rc, $out, $err);
}

# psql_as's stdout; dies with its stderr when psql fails.
sub psql_as_ok
{
	my ($node, $role, $sql) = @_;
	my ($rc, $out, $err) = psql_as($node, $role, $sql);
	die "as $role: $sql\n$err" if $rc != 0;
	return $out;
}

# The tests of callers claiming one step identity (001, 023, 024, 039, 059): a started node without
# a worker, with the extension, the table effects (one row per execution of a step body, with the
# backend that ran it) and flaky(tag), which inserts an effect and then raises P0001.
sub claims_node
{
	my ($name) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', "shared_preload_libraries = 'durable_steps'");
	$node->start;
	$node->safe_psql(
		'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE effects (
    id  serial PRIMARY KEY,
    k   text NOT NULL,
    pid integer NOT NULL DEFAULT pg_backend_pid()
);
CREATE FUNCTION flaky(tag text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO effects(k) VALUES (tag);
    RAISE EXCEPTION 'x';
END
$$;
});
	return $node;
}

# The call of the step under test, as row_sql: run $run, step s1, whose body inserts one effect
# tagged $run and returns its id, with the same SQL and input on every call (the fingerprint
# always matches). Its row has status, result, attempt and replayed.
sub claim_sql
{
	my ($run, %opt) = @_;
	my $nowait = $opt{nowait} ? ', nowait => true' : '';
	return row_sql("SELECT status, result, attempt, replayed FROM ds_run_step('$run', 's1', "
		  . q{$body$INSERT INTO effects(k) VALUES ($1->>'k') RETURNING id$body$, }
		  . qq{'{"k": "$run"}'::jsonb$nowait)});
}

# What run $run has left, as others see it: its step rows in the view and in the table, its
# attempts, its effects.
sub claim_counts
{
	my ($node, $run) = @_;
	return row_of(
		$node, 'postgres', qq{
SELECT (SELECT count(*) FROM ds_steps WHERE run_id = '$run') AS steps_in_view,
       (SELECT count(*) FROM durable_steps.steps WHERE run_id = '$run') AS steps,
       (SELECT count(*) FROM ds_attempts WHERE run_id = '$run') AS attempts,
       (SELECT count(*) FROM effects WHERE k = '$run') AS effects});
}

# The effects of run $run in order, each with its id and the backend that wrote it.
sub claim_effects
{
	my ($node, $run) = @_;
	return rows_of($node, 'postgres', "SELECT id, pid FROM effects WHERE k = '$run' ORDER BY id");
}

# A step of run 'iso' whose attempt 2 runs $body in the worker (TAP 007, 060-063): attempt 1 runs
# in the caller as $role and asks for a retry at once; $extra adds arguments of ds_run_step. Once
# the worker has run attempt 2: the step's status, its result as text and its error_code ('' for
# none).
sub worker_attempt
{
	my ($node, $role, $step, $body, $extra) = @_;
	$extra //= '';
	(my $quoted = $body) =~ s/'/''/g;
	my $status = $node->safe_psql(
		'postgres', qq{
SET ROLE $role;
SELECT status FROM ds_run_step('iso', '$step',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''to the worker'', ''0 s'')::text
               ELSE ($quoted)::text END'$extra);
});
	is($status, 'retrying', "$step: attempt 1 handed the step to the worker");
	ok( $node->poll_query_until('postgres',
			"SELECT status NOT IN ('retrying', 'running', 'pending') FROM ds_steps "
			  . "WHERE run_id = 'iso' AND step_id = '$step'"),
		"$step: the worker ran attempt 2");
	return row_of($node, 'postgres',
		"SELECT status, coalesce(result #>> '{}', '') AS result, coalesce(error_code, '') AS error_code "
		  . "FROM ds_steps WHERE run_id = 'iso' AND step_id = '$step'");
}

# The attempts of step (run, step) in order, each with its attempt number, class ('running' for
# one not ended), error_code (undef for none) and executor.
sub attempts_of
{
	my ($node, $run, $step) = @_;
	return rows_of($node, 'postgres', qq{
SELECT attempt, coalesce(class, 'running') AS class, error_code, executor
  FROM ds_attempts WHERE run_id = '$run' AND step_id = '$step' ORDER BY attempt});
}

# The hash $h with only the keys @keys, to compare what a test names.
sub fields
{
	my ($h, @keys) = @_;
	return { map { $_ => $h->{$_} } @keys };
}

# pg_upgrade from one major to a newer one (docs/backups.md; TAP 046, 047 and 064 each show one
# property of the cluster this makes). The old cluster runs the install whose bin directory is
# DS_UPGRADE_OLD_BINDIR (scripts/test sets it to the PostgreSQL 16 it has just tested, with this
# same build of the extension), the new one the PostgreSQL on PATH. prepare() starts each cluster
# as the scenario needs:
#   old, worker on (one executor)  makes the steps and runs; stopped while an attempt runs;
#   old, max_workers = 0           makes the due work that only the new cluster may run;
#   pg_upgrade                     both clusters preloading the library, as in TAP 006;
#   new, max_workers = 0           what prepare() returns: started, nothing can move in it but
#                                  what the test does.
# Steps in every status that can be at rest (succeeded in a caller and in the worker, retrying
# and pending not yet due, blocked, failed permanently and exhausted, cancelled, HTTP steps
# succeeded, refused and uncertain, one running when the old server stopped), their attempt
# history, runs (succeeded, sleeping, waiting for an event), events, queue limits and the owners
# (two ordinary roles, by name and OID); due work for the new cluster: a retry, a deferred step, a
# pending HTTP step, an event emitted before any run waits for it.
package DurableSteps::Upgrade;

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Path ();
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use PostgreSQL::Version;
use Test::More;
use Time::HiRes qw(time);

# DurableSteps::Test's helpers, defined above (its @EXPORT is not assigned yet when this compiles).
# DurableSteps::Http, which uses DurableSteps::Test, is loaded by prepare() at run time.
BEGIN
{
	no strict 'refs';
	*{"DurableSteps::Upgrade::$_"} = \&{"DurableSteps::Test::$_"}
	  for qw(poll_until poll_row row_of rows_of fields attempts_of row_sql decode_row);
}

my $json = JSON::PP->new->canonical->allow_nonref;

# the SQL steps, all of run 'up': owner, body, input and the other arguments of ds_run_step
my %sql_step = (
	'paid'     => { role => 'alice', sql => q{SELECT book('paid')} },
	'worked'   => { role => 'alice', sql => q{SELECT book('worked')}, args => 'defer => true' },
	'later'    => { role => 'bob', sql => q{SELECT ds_retry_after('not before an hour', '1 h')} },
	'scheduled' => {
		role => 'alice',
		sql  => q{SELECT book('scheduled')},
		args => q{defer => true, queue => 'slow', priority => 5},
		first => q{, run_at => now() + interval '1 hour'}
	},
	'fixed'     => { role => 'bob',   sql => q{SELECT book_when_ok('fixed', $1)} },
	'declined'  => { role => 'alice', sql => q{SELECT ds_non_retriable('card declined')} },
	'exhausted' => {
		role => 'bob',
		sql  => q{SELECT always_fails('exhausted')},
		args => q{policy => '{"max_attempts": 2, "initial_delay": "10 ms"}'}
	},
	'dropped'   => { role => 'alice', sql => q{SELECT ds_retry_after('not before an hour', '1 h')} },
	'in-flight' => {
		role => 'alice',
		sql  => q{SELECT book_after_a_long_attempt_1('in-flight')},
		args => q{defer => true, policy => '{"initial_delay": "10 ms"}'}
	},
	'due-retry' => {
		role => 'bob',
		sql  => q{SELECT book_at_attempt_2('due-retry')},
		args => q{policy => '{"initial_delay": "1 s"}'}
	},
	'due-deferred' => { role => 'alice', sql => q{SELECT book('due-deferred')}, args => 'defer => true' },);

# The state the upgrade must keep: every column of the extension's tables, the attempt history as
# the view shows it (it also reads the attempts recorded in step rows), the ledger. Owners and
# roles by name (to_jsonb of a regrole) and by OID.
my %state = (
	'step' => [
		q{durable_steps.steps}, q{run_id || '/' || step_id},
		q{jsonb_build_object('owner (oid)', t.owner::oid)}
	],
	'attempt' => [
		q{ds_attempts}, q{run_id || '/' || step_id || ' attempt ' || attempt},
		q{jsonb_build_object('role (oid)', t.role::oid)}
	],
	'run'   => [ q{durable_steps.runs}, q{run_id}, q{jsonb_build_object('owner (oid)', t.owner::oid)} ],
	'event' => [
		q{durable_steps.events}, q{owner::text || ':' || name},
		q{jsonb_build_object('owner (oid)', t.owner::oid)}
	],
	'queue'  => [ q{durable_steps.queues}, q{name},    q{'{}'::jsonb} ],
	'schedule' => [ q{durable_steps.schedules}, q{job_name}, q{jsonb_build_object('owner (oid)', t.owner::oid)} ],
	'key'    => [
		q{durable_steps.idempotency_keys}, q{owner::text || ':' || scope || ':' || key},
		q{jsonb_build_object('owner (oid)', t.owner::oid)}
	],
	'ledger' => [ q{ledger},               q{id::text}, q{'{}'::jsonb} ],);

our %plural = (step => 'steps', attempt => 'attempts', run => 'runs', event => 'events',
	queue => 'queue limits', key => 'idempotency keys', schedule => 'schedules', ledger => 'ledger rows');

# ds_run_step of a step of %sql_step as its owner, the answer as a hash; $first adds the
# arguments only the first call passes
sub call_step
{
	my ($self, $node, $step, $first) = @_;
	my $s = $sql_step{$step};
	my $args = $s->{args} ? ", $s->{args}" : '';
	$args .= $s->{first} // '' if $first;
	return decode_json(
		$node->safe_psql(
			'postgres', qq{SET ROLE $s->{role};
SELECT to_jsonb(r) FROM ds_run_step('up', '$step', \$body\$$s->{sql}\$body\$, '{}'$args) r}));
}

# alice's request under the stored idempotency key: its handler books 'key-stored'
sub idempotent_sql
{
	return q{SELECT status, body, replayed FROM ds_idempotent('checkout', 'key-stored', '{"amount": 70}',
	  $$SELECT 201, jsonb_build_object('server', book('key-stored'))$$)};
}

# ds_http_step of a step of run 'up-http', alice's, against the fake provider (tag up-<step>)
sub call_http
{
	my ($self, $node, $step) = @_;
	my $s = $self->{http_step}{$step};
	my $args = $s->{args} ? ", $s->{args}" : '';
	return decode_json(
		$node->safe_psql(
			'postgres', qq{SET ROLE alice;
SELECT to_jsonb(r) FROM ds_http_step('up-http', '$step', '$s->{request}'$args) r}));
}

sub step_status
{
	my ($node, $run, $step) = @_;
	return $node->safe_psql('postgres',
		"SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

# The rows of one part of %state, by key: every column, as JSON.
sub snapshot
{
	my ($self, $node, $what) = @_;
	my ($from, $key, $extra) = @{ $state{$what} };
	return decode_json(
		$node->safe_psql(
			'postgres', qq{SET TimeZone = 'UTC';
SELECT coalesce(jsonb_object_agg($key, to_jsonb(t) || $extra), '{}') FROM $from t}));
}

# What the provider was asked: requests, charges and idempotency keys by tag (its connection
# count also counts the test's own /counts requests).
sub provider_requests
{
	my ($self) = @_;
	my $c = $self->{p}->counts;
	return { map { $_ => $c->{$_} } qw(requests charges keys) };
}

# One test per row: the row $key of $what is in $is as it was in $was, every column; the
# columns that differ are shown.
sub unchanged
{
	my ($self, $name, $what, $key, $was, $is) = @_;
	my @differ = grep { $json->encode($is->{$key}{$_}) ne $json->encode($was->{$key}{$_}) }
	  sort keys %{ { %{ $was->{$key} // {} }, %{ $is->{$key} // {} } } };
	ok(!@differ, $name)
	  or diag(join("\n",
			map { "$what $key: $_ was " . $json->encode($was->{$key}{$_}) . ', is ' . $json->encode($is->{$key}{$_}) }
			  @differ));
}

# The scenario up to the upgraded cluster, started without a worker. Two upgrades:
#   - pg_upgrade to a newer major (the default; skip_all when there is no older major to upgrade
#     from): the old cluster runs DS_UPGRADE_OLD_BINDIR's PostgreSQL, the new one this one;
#   - from_release => VERSION, a release of the extension: one cluster, on a private copy of this
#     PostgreSQL (private_install), runs the release's library (DS_RELEASE_LIBRARIES, which
#     scripts/test builds with scripts/release-build) with CREATE EXTENSION ... VERSION; then the
#     library under test replaces it and the cluster starts again, its extension still at
#     VERSION (docs/operations.md, "Upgrades").
# With `newest_only`, a part that repeats the whole upgrade
# to show one more property runs for one major of the matrix, the newest (scripts/test sets
# DS_UPGRADE_NEWEST for it), so that the upgrades stay a small share of CI. The object: old and new (the clusters: one
# and the same for a release), p (the fake provider), old_num and new_num (which server wrote an
# effect: server_version_num across pg_upgrade, 1 and 2 across a release), before (every part of
# %state in the old cluster as it stopped), requests_before (provider_requests then), app_sql
# (the application's tables and functions, to make them again elsewhere).
sub prepare
{
	my ($class, %opt) = @_;
	my $release = $opt{from_release};
	my ($old_bindir, $old_version, $new_version, $install);
	$new_version = PostgreSQL::Version->new(scalar qx{pg_config --version});
	die "pg_config --version failed" if $? != 0;
	if ($release)
	{
		my %libs = map { split /=/, $_, 2 } split ' ', ($ENV{DS_RELEASE_LIBRARIES} // '');
		plan skip_all =>
		  "DS_RELEASE_LIBRARIES names no library of durable_steps $release (scripts/test builds it with scripts/release-build)"
		  unless $libs{$release};
		$install = private_install();
		$install->{release_library} = $libs{$release};
		$install->use_library($libs{$release});
	}
	else
	{
		$old_bindir = $ENV{DS_UPGRADE_OLD_BINDIR} // '';
		plan skip_all =>
		  'DS_UPGRADE_OLD_BINDIR names no PostgreSQL 16 install (scripts/test sets it when the matrix runs 16 before 18)'
		  if $old_bindir eq '';
		plan skip_all => 'this part of the upgrade scenario runs for the newest major of the matrix only'
		  if $opt{newest_only} && !$ENV{DS_UPGRADE_NEWEST};
		$old_bindir =~ s{/+$}{};
		$old_version = PostgreSQL::Version->new(scalar qx{"$old_bindir/pg_config" --version});
		die "$old_bindir/pg_config --version failed" if $? != 0;
		plan skip_all =>
		  "the PostgreSQL under test ($new_version) is not a newer major than DS_UPGRADE_OLD_BINDIR's ($old_version): nothing to upgrade"
		  if $new_version->major <= $old_version->major;
	}
	# which server wrote an effect: its major's number across pg_upgrade; across a release, the
	# setting ds_test.server, 1 before the new library and 2 after
	my $server_expr =
	  $release
	  ? q{current_setting('ds_test.server')::integer}
	  : q{current_setting('server_version_num')::integer};

	require DurableSteps::Http;
	my $conf = $DurableSteps::Test::preload;
	my $p = DurableSteps::Http::Provider->start(close => 1);
	my $self = bless { p => $p }, $class;
	# the HTTP steps: one to succeed, one to be uncertain (a keyless POST whose connection is
	# dropped after the provider charged), one refused (400), one pending at the upgrade
	$self->{http_step} = {
		'charge' => {
			request =>
			  qq({"method": "POST", "url": "@{[$p->url('up-charge')]}", "expect": "json", "json": {"amount": 4200}})
		},
		'unsure' => {
			request => qq({"method": "POST", "url": "@{[$p->url('up-unsure', 'fault=drop')]}"}),
			args    => 'idempotency_header => NULL'
		},
		'refused' =>
		  { request => qq({"method": "POST", "url": "@{[$p->url('up-refused', 'fault=400')]}", "expect": "json"}) },
		'after'   => { request => qq({"method": "POST", "url": "@{[$p->url('up-after')]}", "expect": "json"}) },
	};

	my $old = PostgreSQL::Test::Cluster->new('old',
		install_path => $release ? $install->{install_path} : dirname($old_bindir));
	$self->{old} = $old;
	$self->{install} = $install;
	# a fresh initdb (never a template of the newer major's), without data checksums like the new
	# cluster below
	$old->init(force_initdb => 1);
	# One executor: the one whose attempt the stop interrupts is the only one that could record it
	# lost (it does not, on its way out), and while that attempt runs no turn of a run is taken.
	# across a release, a schedule too, where pg_cron is installed (Debian packages it for 15)
	$self->{cron} = $release && -e "$install->{pkglibdir}/pg_cron.so";
	$old->append_conf('postgresql.conf',
		$conf
		  . "durable_steps.max_workers = 1\n"
		  . ($release ? "ds_test.server = 1\n" : '')
		  . ($self->{cron}
			? "shared_preload_libraries = 'pg_cron,durable_steps'\ncron.database_name = 'postgres'\n"
			  . "cron.use_background_workers = on\nmax_worker_processes = 32\n"
			: ''));
	$old->start;
	$self->{old_num} = $old->safe_psql('postgres', "SELECT $server_expr");
	my $old_server = $old->safe_psql('postgres', q{SHOW server_version});
	my $version = $release ? " VERSION '$release'" : '';

	$self->{app_sql} = q{
-- every effect of a step is a row here, naming the role and the server that wrote it
CREATE TABLE ledger (
    id     serial PRIMARY KEY,
    tag    text NOT NULL,
    who    text NOT NULL DEFAULT current_user,
    server integer NOT NULL DEFAULT SERVER_EXPR
);
GRANT SELECT, INSERT ON ledger TO alice, bob;
GRANT USAGE ON SEQUENCE ledger_id_seq TO alice, bob;
-- one effect; the result is the server's version number
CREATE FUNCTION book(tag text) RETURNS integer LANGUAGE sql
    AS $$INSERT INTO ledger(tag) VALUES (tag) RETURNING server$$;
-- blocked until re-armed with {"ok": true}
CREATE FUNCTION book_when_ok(tag text, input jsonb) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF (input->>'ok') IS NULL THEN
        PERFORM ds_blocked('not ok', 'Re-arm it with {"ok": true}.');
    END IF;
    RETURN book(tag);
END $$;
-- fails retryably (P0001) at attempt 1
CREATE FUNCTION book_at_attempt_2(tag text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < 2 THEN
        RAISE EXCEPTION 'not yet: attempt %', ds_attempt_number();
    END IF;
    RETURN book(tag);
END $$;
-- attempt 1 runs until the server stops it
CREATE FUNCTION book_after_a_long_attempt_1(tag text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() = 1 THEN
        PERFORM pg_sleep(3600);
    END IF;
    RETURN book(tag);
END $$;
CREATE FUNCTION always_fails(tag text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'always fails: %', tag;
END $$;
-- workflows
CREATE FUNCTION short(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('one', 'SELECT book(''done:one'')');
END $$;
CREATE FUNCTION napper(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    before jsonb;
BEGIN
    before := ds_step('before', 'SELECT book(''nap:before'')');
    PERFORM ds_sleep('nap', (input->>'for')::interval);
    RETURN jsonb_build_object('before', before, 'after', ds_step('after', 'SELECT book(''nap:after'')'));
END $$;
CREATE FUNCTION shipper(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    reserved jsonb;
    shipment jsonb;
BEGIN
    reserved := ds_step('reserve', 'SELECT book(''ship:reserve'')');
    shipment := ds_await_event('shipped', 'shipped:' || run_id);
    RETURN jsonb_build_object('reserve', reserved, 'shipment', shipment,
                              'confirm', ds_step('confirm', 'SELECT book(''ship:confirm'')'));
END $$;
CREATE FUNCTION waiter(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('wait', input->>'event');
END $$;
};
	$self->{app_sql} =~ s/SERVER_EXPR/$server_expr/;
	$old->safe_psql(
		'postgres', qq{
CREATE ROLE alice;
CREATE ROLE bob;
CREATE EXTENSION durable_steps$version;
GRANT durable_steps_http TO alice;
$self->{app_sql}
SELECT ds_set_queue('slow', 1);
});
	if ($self->{cron})
	{
		# a schedule whose slots (1 January, 03:00) none of the test's minutes is
		$old->safe_psql('postgres', q{CREATE EXTENSION pg_cron; GRANT USAGE ON SCHEMA cron TO alice;
SET ROLE alice; SELECT ds_schedule('yearly-report', '0 3 1 1 *', 'short', '{"format": "pdf"}')});
	}

	my $t = 'old';
	ok( poll_until(
			$old, 'postgres',
			q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps worker') = 1
			     AND count(*) FILTER (WHERE backend_type = 'durable_steps http') = 1
			    FROM pg_stat_activity WHERE datname = 'postgres'}),
		"$t: an executor and the HTTP worker serve database postgres");

	# steps in every status a step can rest in
	my $r = $self->call_step($old, 'paid', 1);
	is_deeply(fields($r, qw(status attempt)), { status => 'succeeded', attempt => 1 }, "$t: paid: succeeded in the caller");
	$r = $self->call_step($old, 'worked', 1);
	is($r->{status}, 'pending', "$t: worked: deferred");
	ok(poll_until($old, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'worked'}, 'succeeded'),
		"$t: worked: succeeded in the worker");
	$r = $self->call_step($old, 'later', 1);
	is_deeply(fields($r, qw(status attempt)), { status => 'retrying', attempt => 1 }, "$t: later: retrying in an hour");
	$r = $self->call_step($old, 'scheduled', 1);
	is_deeply(fields($r, qw(status attempt)), { status => 'pending', attempt => 0 },
		"$t: scheduled: pending, due in an hour");
	$r = $self->call_step($old, 'fixed', 1);
	is_deeply(fields($r, qw(status error_class)), { status => 'blocked', error_class => 'correctable' },
		"$t: fixed: blocked");
	$r = $self->call_step($old, 'declined', 1);
	is_deeply(
		fields($r, qw(status error_class error_code)),
		{ status => 'failed', error_class => 'permanent', error_code => 'DS001' },
		"$t: declined: failed permanently");
	$r = $self->call_step($old, 'exhausted', 1);
	is($r->{status}, 'retrying', "$t: exhausted: attempt 1 failed");
	ok( poll_row($old, 'postgres', q{SELECT status, error_class, attempt FROM ds_steps WHERE step_id = 'exhausted'},
			{ status => 'failed', error_class => 'exhausted', attempt => 2 }),
		"$t: exhausted: attempt 2 in the worker failed too: exhausted");
	$r = $self->call_step($old, 'dropped', 1);
	is($r->{status}, 'retrying', "$t: dropped: retrying");
	is($old->safe_psql('postgres', q{SET ROLE alice; SELECT status FROM ds_cancel_step('up', 'dropped')}),
		'cancelled', "$t: dropped: cancelled");

	# HTTP steps: one succeeded, one refused (400: blocked), one uncertain (a keyless POST whose
	# connection was dropped after the provider charged)
	for my $step (qw(charge unsure refused))
	{
		is($self->call_http($old, $step)->{status}, 'pending', "$t: HTTP $step: stored");
	}
	is(DurableSteps::Http::settle_http($old, 'up-http', 'charge'),  'succeeded', "$t: HTTP charge: succeeded");
	is(DurableSteps::Http::settle_http($old, 'up-http', 'refused'), 'blocked',   "$t: HTTP refused: blocked by the 400");
	is(DurableSteps::Http::settle_http($old, 'up-http', 'unsure'),  'uncertain', "$t: HTTP unsure: uncertain");
	is_deeply({ charges => $p->charges('up-charge'), requests => $p->requests('up-charge') },
		{ charges => 1, requests => 1 }, "$t: HTTP charge: sent once, charged once");
	is($p->keys_seen('up-charge'), 'up-http:charge', "$t: HTTP charge: with its idempotency key");

	# runs: one succeeded, one sleeping, one waiting for an event
	$old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('short', '{}', 'done-run')});
	ok(poll_until($old, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'done-run'}, 'succeeded'),
		"$t: done-run: succeeded");
	# The sleep (20 s) must not end before the one executor is taken by the step below, whose attempt
	# holds it until the server stops (within moments); the phases after that have no worker.
	# Should the sleep end first, the run goes on in the old cluster, and the next phase says so.
	$old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('napper', '{"for": "20 s"}', 'nap-run')});
	$old->safe_psql('postgres', q{SET ROLE bob; SELECT ds_start_run('shipper', '{}', 'ship-run')});
	ok( poll_row(
			$old, 'postgres',
			q{SELECT n.status AS nap_run, n.current_step AS nap_run_step, n.wait_event AS nap_run_event,
			         s.status AS ship_run, s.current_step AS ship_run_step, s.wait_event AS ship_run_event
			    FROM ds_runs n, ds_runs s WHERE n.run_id = 'nap-run' AND s.run_id = 'ship-run'},
			{
				nap_run => 'waiting',
				nap_run_step => 'nap',
				nap_run_event => undef,
				ship_run => 'waiting',
				ship_run_step => 'shipped',
				ship_run_event => 'shipped:ship-run'
			}),
		"$t: nap-run sleeps, ship-run waits for its event");

	# the step whose attempt is running when the server stops: its executor is stopped with it
	$r = $self->call_step($old, 'in-flight', 1);
	is($r->{status}, 'pending', "$t: in-flight: deferred");
	ok( poll_until(
			$old, 'postgres',
			q{SELECT s.status = 'running' AND EXISTS (SELECT FROM pg_stat_activity
			                                           WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep')
			    FROM ds_steps s WHERE step_id = 'in-flight'}),
		"$t: in-flight: its attempt 1 runs in the executor");
	$old->stop;

	# Without a worker: the work that must be done by the new cluster, due before it starts
	$t = 'old without a worker';
	$old->append_conf('postgresql.conf', "durable_steps.max_workers = 0\n");
	$old->start;
	is( $old->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'}),
		'0', "$t: no durable_steps process runs");
	is(step_status($old, 'up', 'in-flight'), 'running', "$t: in-flight: still running (no executor found it lost)");
	is_deeply(
		row_of(
			$old, 'postgres', q{
SELECT status, current_step,
       (SELECT count(*) FROM ds_steps WHERE run_id = 'nap-run' AND step_id = 'after') AS steps_after_the_sleep
  FROM ds_runs WHERE run_id = 'nap-run'}),
		{ status => 'waiting', current_step => 'nap', steps_after_the_sleep => 0 },
		"$t: nap-run: still asleep, its step after the sleep not begun");
	$r = $self->call_step($old, 'due-retry', 1);
	is_deeply(
		fields($r, qw(status attempt error_code)),
		{ status => 'retrying', attempt => 1, error_code => 'P0001' },
		"$t: due-retry: attempt 1 failed, its retry due in a second");
	$r = $self->call_step($old, 'due-deferred', 1);
	is_deeply(fields($r, qw(status attempt)), { status => 'pending', attempt => 0 }, "$t: due-deferred: pending, due now");
	is($self->call_http($old, 'after')->{status}, 'pending', "$t: HTTP after: stored, due now");
	is($old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_emit_event('before-the-upgrade', '{"n": 1}')}),
		't', "$t: alice emits an event no run waits for yet");
	# idempotency keys: one stored with its response, one held by a holder that never finishes
	is_deeply(
		decode_row($old->safe_psql('postgres', q{SET ROLE alice; } . row_sql($self->idempotent_sql))),
		{ status => 201, body => qq({"server": $self->{old_num}}), replayed => 'false' },
		"$t: key-stored: alice's request ran its handler, its response stored");
	$self->{held_token} = $old->safe_psql('postgres',
		q{SET ROLE bob; SELECT token FROM ds_idempotent_begin('checkout', 'key-held', '{"amount": 5}', lease => '1 s')});
	like($self->{held_token}, qr/^[0-9a-f-]{36}$/, "$t: key-held: bob holds it, and never finishes");

	$self->{before} = { map { $_ => $self->snapshot($old, $_) } keys %state };
	is_deeply(
		[ sort keys %{ { map { $_->{status} => 1 } values %{ $self->{before}{step} } } } ],
		[qw(blocked cancelled failed pending retrying running succeeded uncertain)],
		"$t: the steps to upgrade are in every status");
	is_deeply([ sort keys %{ { map { $_->{owner} => 1 } values %{ $self->{before}{step} } } } ],
		[qw(alice bob)], "$t: owned by alice and bob");
	$self->{requests_before} = $self->provider_requests;
	$old->stop;

	my $new;
	if ($release)
	{
		# the library under test in place of the release's, the same cluster
		$install->use_library($install->{library_under_test});
		$new = $old;
		$new->append_conf('postgresql.conf', "ds_test.server = 2\n");
		$self->{new} = $new;
		note("the library of durable_steps $release replaced by the one under test");
	}
	else
	{
		$new = $self->pg_upgrade($old, $old_bindir, $old_version, $new_version, $conf, $old_server);
	}

	# The new cluster without a worker
	$new->start;
	$self->{new_num} = $new->safe_psql('postgres', "SELECT $server_expr");
	note("upgraded from PostgreSQL $old_server to PostgreSQL " . $new->safe_psql('postgres', 'SHOW server_version'));
	return $self;
}

# pg_upgrade of the stopped $old (its PostgreSQL in $old_bindir) into a new cluster of the
# PostgreSQL under test, which it returns (undef, the test done, when pg_upgrade failed).
sub pg_upgrade
{
	my ($self, $old, $old_bindir, $old_version, $new_version, $conf, $old_server) = @_;
	# pg_upgrade
	my $new = PostgreSQL::Test::Cluster->new('new');
	$self->{new} = $new;
	# initdb of 18 and later turns data checksums on by default; the old cluster has none
	$new->init(force_initdb => 1, $new_version->major >= 18 ? (extra => ['--no-data-checksums']) : ());
	$new->append_conf('postgresql.conf', $conf . "durable_steps.max_workers = 0\n");
	my $new_bindir = $new->config_data('--bindir');
	note("upgrading from PostgreSQL $old_server ($old_bindir) to PostgreSQL $new_version ($new_bindir)");

	# pg_upgrade writes its files under the new data directory and the current directory
	chdir ${PostgreSQL::Test::Utils::tmp_check};
	my $t0 = time();
	my $upgraded = ok(
		run_log(
			[
				'pg_upgrade', '--no-sync',
				'-d', $old->data_dir, '-D', $new->data_dir,
				'-b', $old_bindir, '-B', $new_bindir,
				'-p', $old->port, '-P', $new->port,
				'-s', $new->host
			]),
		"pg_upgrade from $old_version to $new_version with the library preloaded in both clusters");
	note(sprintf('pg_upgrade took %.1f s', time() - $t0));
	if (!$upgraded)
	{
		for my $log (glob($new->data_dir . '/pg_upgrade_output.d/*/log/*'),
			glob($new->data_dir . '/pg_upgrade_output.d/*/*.txt'))
		{
			diag("$log:\n" . slurp_file($log));
		}
		done_testing();
		exit;
	}
	return $new;
}

# How the new worker carries on the work the scenario left (TAP 064 after pg_upgrade, 090 after
# ALTER EXTENSION durable_steps UPDATE), once it runs: every effect exactly once, on the server it
# belongs to. A due retry and a due deferred step run; the attempt the old server stopped is
# recorded as lost (DS007) and retried; a pending HTTP step is sent once; the sleeping run wakes
# when its time has come and the waiting run when its event is emitted; an event emitted before
# the upgrade is seen; a blocked step re-armed runs; an uncertain HTTP step is resolved; what
# ended before the upgrade is neither run nor sent again. $steps_upgraded: snapshot($new,
# 'step') before the new worker started. Test names begin with $t.
sub carries_on
{
	my ($self, $t, $steps_upgraded) = @_;
	my ($new, $p, $old_num, $new_num) = @{$self}{qw(new p old_num new_num)};
	my $run_row = sub {
		my ($run, $columns) = @_;
		return row_of($new, 'postgres', "SELECT $columns FROM ds_runs WHERE run_id = '$run'");
	};

	# the due retry, the due deferred step and the lost attempt's retry run in the new worker
	for my $step (qw(due-retry due-deferred in-flight))
	{
		ok(poll_until($new, 'postgres', qq{SELECT status FROM ds_steps WHERE run_id = 'up' AND step_id = '$step'}, 'succeeded'),
			"$t: $step: succeeded");
		is($new->safe_psql('postgres', qq{SELECT result FROM ds_steps WHERE run_id = 'up' AND step_id = '$step'}),
			$new_num, "$t: $step: on the new server");
	}
	is_deeply(
		attempts_of($new, 'up', 'due-retry'),
		[
			{ attempt => 1, class => 'retryable', error_code => 'P0001', executor => 'caller' },
			{ attempt => 2, class => 'completed', error_code => undef,   executor => 'worker' }
		],
		"$t: due-retry: attempt 1 before the upgrade, attempt 2 by the new worker");
	is_deeply(attempts_of($new, 'up', 'due-deferred'),
		[ { attempt => 1, class => 'completed', error_code => undef, executor => 'worker' } ],
		"$t: due-deferred: attempt 1 by the new worker");
	is_deeply(
		attempts_of($new, 'up', 'in-flight'),
		[
			{ attempt => 1, class => 'retryable', error_code => 'DS007', executor => 'worker' },
			{ attempt => 2, class => 'completed', error_code => undef,   executor => 'worker' }
		],
		"$t: in-flight: the attempt the old server stopped is recorded lost (DS007), attempt 2 ran");
	is( $new->safe_psql('postgres', q{SELECT error_message FROM ds_attempts WHERE step_id = 'in-flight' AND attempt = 1}),
		'invocation_lost', "$t: in-flight: attempt 1 as invocation_lost");
	is( $new->safe_psql(
			'postgres', q{
	SELECT count(*) FROM ds_attempts a JOIN pg_stat_activity p ON p.pid = a.backend_pid
	 WHERE a.run_id = 'up' AND a.attempt = 2 AND a.step_id IN ('due-retry', 'in-flight')
	   AND p.backend_type = 'durable_steps worker'}),
		'2', "$t: the attempts 2 ran in executors of the new server");

	# the pending HTTP step is sent once; the ones that ended before the upgrade are not sent again
	is(DurableSteps::Http::settle_http($new, 'up-http', 'after'), 'succeeded', "$t: HTTP after: succeeded");
	is_deeply({ charges => $p->charges('up-after'), requests => $p->requests('up-after') },
		{ charges => 1, requests => 1 }, "$t: HTTP after: sent once, charged once");
	is($p->keys_seen('up-after'), 'up-http:after', "$t: HTTP after: with its idempotency key");
	is_deeply(
		row_of($new, 'postgres', q{SELECT executor, role FROM ds_attempts WHERE run_id = 'up-http' AND step_id = 'after'}),
		{ executor => 'worker', role => 'alice' },
		"$t: HTTP after: sent by the new HTTP worker, as alice");

	# the sleeping run wakes when its time has come, and goes on on the new server
	ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'nap-run'}, 'succeeded'),
		"$t: nap-run: woke and succeeded");
	is_deeply(
		$run_row->('nap-run', q{output->>'before' AS before_the_sleep, output->>'after' AS after_the_sleep}),
		{ before_the_sleep => $old_num, after_the_sleep => $new_num },
		"$t: nap-run: the step before the sleep ran on the old server, the step after it on the new one");
	is( $new->safe_psql(
			'postgres', q{
	SELECT a.started_at >= (n.result->>'until')::timestamptz
	  FROM ds_attempts a, ds_steps n
	 WHERE a.run_id = 'nap-run' AND a.step_id = 'after' AND n.run_id = 'nap-run' AND n.step_id = 'nap'}),
		't', "$t: nap-run: not before the wake-up time recorded before the upgrade");

	# the run waiting for its event waits on, and the event wakes it
	is_deeply($run_row->('ship-run', 'status, wait_event'), { status => 'waiting', wait_event => 'shipped:ship-run' },
		"$t: ship-run: still waits for its event");
	is($new->safe_psql('postgres', q{SET ROLE bob; SELECT ds_emit_event('shipped:ship-run', '{"carrier": "DHL"}')}),
		't', "$t: bob emits ship-run's event");
	ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ship-run'}, 'succeeded'),
		"$t: ship-run: woken, succeeded");
	is_deeply(
		$run_row->('ship-run', q{output->'shipment' AS shipment, output->>'reserve' AS reserve, output->>'confirm' AS confirm}),
		{ shipment => '{"carrier": "DHL"}', reserve => $old_num, confirm => $new_num },
		"$t: ship-run: with the event's payload, reserved on the old server, confirmed on the new one");

	# an event emitted before the upgrade is seen; the first emit still wins
	$new->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('waiter', '{"event": "before-the-upgrade"}', 'late-run')});
	ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'late-run'}, 'succeeded'),
		"$t: late-run: waits for the event emitted before the upgrade, succeeds");
	is($new->safe_psql('postgres', q{SELECT output FROM ds_runs WHERE run_id = 'late-run'}), '{"n": 1}',
		"$t: late-run: with its payload");
	is($new->safe_psql('postgres', q{SET ROLE alice; SELECT ds_emit_event('before-the-upgrade', '{"n": 2}')}),
		'f', "$t: emitted again, the event keeps its first payload");

	# the succeeded run is started again only in name
	is_deeply(
		decode_row($new->safe_psql('postgres',
			q{SET ROLE alice; } . row_sql(q{SELECT status, created FROM ds_start_run('short', '{}', 'done-run')}))),
		{ status => 'succeeded', created => 'false' },
		"$t: done-run: started again, the existing run answers");

	# the blocked step, re-armed with its correction, is run by the new worker, as bob
	is($new->safe_psql('postgres', q{SET ROLE bob; SELECT status FROM ds_retry_step('up', 'fixed', '{"ok": true}')}),
		'pending', "$t: fixed: bob re-arms it");
	ok(poll_until($new, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'up' AND step_id = 'fixed'}, 'succeeded'),
		"$t: fixed: the new worker runs it");
	is_deeply(
		attempts_of($new, 'up', 'fixed'),
		[
			{ attempt => 1, class => 'correctable', error_code => 'DS003', executor => 'caller' },
			{ attempt => 2, class => 'completed',   error_code => undef,   executor => 'worker' }
		],
		"$t: fixed: attempt 2 after the one before the upgrade");

	# the uncertain HTTP step is resolved by alice: an attempt of its own, nothing sent
	is_deeply(
		decode_row($new->safe_psql('postgres', q{SET ROLE alice; }
			  . row_sql(q{SELECT status, attempt FROM ds_resolve_step('up-http', 'unsure', 'succeeded',
			                                                         '{"status": 200, "body": {"id": "found"}}')}))),
		{ status => 'succeeded', attempt => 2 },
		"$t: HTTP unsure: resolved");
	is_deeply(
		attempts_of($new, 'up-http', 'unsure'),
		[
			{ attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' },
			{ attempt => 2, class => 'completed', error_code => undef, executor => 'operator' }
		],
		"$t: HTTP unsure: the resolution is attempt 2");
	is_deeply(
		{ map { $_ => $p->requests("up-$_") } qw(charge unsure refused) },
		{ charge => 1, unsure => 1, refused => 1 },
		"$t: the HTTP steps that ended before the upgrade were never sent again");

	# the steps nobody touched are as they were, whatever the new worker did
	my $steps_now = $self->snapshot($new, 'step');
	$self->unchanged("$t: $_: untouched by the new worker", 'step', $_, $steps_upgraded, $steps_now)
	  for map { "up/$_" } qw(later scheduled declined exhausted dropped);
	is_deeply(attempts_of($new, 'up-http', 'refused'),
		[ { attempt => 1, class => 'correctable', error_code => 'DS010', executor => 'worker' } ],
		"$t: HTTP refused: still blocked, not sent again");

	# the stored idempotency key replays its response without running the handler; the held one's
	# lease ran out: its holder's token is refused, the next request under it begins afresh
	is_deeply(
		decode_row($new->safe_psql('postgres', q{SET ROLE alice; } . row_sql($self->idempotent_sql))),
		{ status => 201, body => qq({"server": $old_num}), replayed => 'true' },
		"$t: key-stored: replayed, the handler not run again");
	my $begun = decode_row($new->safe_psql('postgres', q{SET ROLE bob; }
		  . row_sql(q{SELECT state, token FROM ds_idempotent_begin('checkout', 'key-held', '{"amount": 5}')})));
	is($begun->{state}, 'new', "$t: key-held: the next request begins afresh");
	my ($rc, $out, $err) = $new->psql('postgres', qq{\\set VERBOSITY verbose
SET ROLE bob; SELECT ds_idempotent_finish('checkout', 'key-held', '$self->{held_token}', 201, '{}')});
	like($err, qr/DS409/, "$t: key-held: the token of the holder whose lease ran out is refused (DS409)");
	is( $new->safe_psql('postgres',
			qq{SET ROLE bob; SELECT ds_idempotent_finish('checkout', 'key-held', '$begun->{token}', 201, '{"n": 2}')}),
		'', "$t: key-held: the new holder finishes it");

	# a task, new in 0.2.0, on the upgraded install: stored beside the old work in its queue,
	# claimed by its name (the executors do not take it), completed with the handler's write
	$new->safe_psql('postgres', q{SET ROLE alice;
SELECT ds_task_step('up-task', 'receipt', 'receipt', '{"to": "a@example.com"}');
SELECT ds_run_step('up-task', 'marker', 'SELECT 1', defer => true)});
	ok(poll_until($new, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'up-task' AND step_id = 'marker'}, 'succeeded'),
		"$t: task: a SQL step stored after it in the same queue ran");
	is($new->safe_psql('postgres', q{SELECT status FROM ds_steps WHERE run_id = 'up-task' AND step_id = 'receipt'}),
		'pending', "$t: task: no executor claimed the task");
	my $claim = decode_row($new->safe_psql('postgres', q{SET ROLE alice; }
		  . row_sql(q{SELECT attempt, idempotency_key, token FROM ds_claim_tasks(ARRAY['receipt'])})));
	is("$claim->{attempt} $claim->{idempotency_key}", '1 up-task:receipt', "$t: task: claimed");
	is( $new->safe_psql('postgres', qq{SET ROLE alice; BEGIN;
INSERT INTO ledger (tag, who, server) VALUES ('receipt', 'alice', $new_num);
SELECT status FROM ds_complete_task('$claim->{token}', '{"sent": true}'); COMMIT;}),
		'succeeded', "$t: task: completed in the handler's transaction");

	# every effect once, each on the server it belongs to
	my %effects = (
		'receipt'      => { who => 'alice', server => $new_num },
		'key-stored'   => { who => 'alice', server => $old_num },
		'paid'         => { who => 'alice', server => $old_num },
		'worked'       => { who => 'alice', server => $old_num },
		'done:one'     => { who => 'alice', server => $old_num },
		'nap:before'   => { who => 'alice', server => $old_num },
		'ship:reserve' => { who => 'bob',   server => $old_num },
		'due-retry'    => { who => 'bob',   server => $new_num },
		'due-deferred' => { who => 'alice', server => $new_num },
		'in-flight'    => { who => 'alice', server => $new_num },
		'nap:after'    => { who => 'alice', server => $new_num },
		'ship:confirm' => { who => 'bob',   server => $new_num },
		'fixed'        => { who => 'bob',   server => $new_num },);
	my %ledger;
	push @{ $ledger{ $_->{tag} } }, { who => $_->{who}, server => $_->{server} }
	  for @{ rows_of($new, 'postgres', q{SELECT tag, who, server FROM ledger ORDER BY tag, id}) };
	is_deeply([ sort keys %ledger ], [ sort keys %effects ], "$t: the ledger holds the effects of the succeeded steps");
	for my $tag (sort keys %effects)
	{
		is_deeply($ledger{$tag}, [ $effects{$tag} ],
			"$t: ledger: $tag written once, by $effects{$tag}{who}, on server $effects{$tag}{server}");
	}
}

# A private copy of the PostgreSQL under test: pg_config's bindir, pkglibdir and sharedir, copied
# under their common prefix, so that the copied programs find the copied directories (PostgreSQL
# finds them relative to its programs). A test swaps the extension's library in it without
# touching the install that other tests use at the same time. The object: install_path (for
# PostgreSQL::Test::Cluster), pkglibdir (the copy's), library_under_test (the installed one).
sub private_install
{
	my %dir = map { my $d = qx{pg_config --$_}; chomp $d; ($_ => $d) } qw(bindir pkglibdir sharedir);
	my @parts = map { [ split m{/}, $_ ] } values %dir;
	my @common;
	for (my $i = 0;; $i++)
	{
		my $c = $parts[0][$i];
		last if !defined $c || grep { !defined $_->[$i] || $_->[$i] ne $c } @parts;
		push @common, $c;
	}
	my $prefix = join('/', @common);
	my $root = PostgreSQL::Test::Utils::tempdir('install');
	my %copy = map { ($_ => $root . substr($dir{$_}, length $prefix)) } keys %dir;
	for my $d (keys %dir)
	{
		File::Path::make_path(dirname($copy{$d}));
		system('cp', '-R', $dir{$d}, $copy{$d}) == 0 or die "cp -R $dir{$d} $copy{$d} failed";
	}
	return bless {
		install_path       => dirname($copy{bindir}),
		pkglibdir          => $copy{pkglibdir},
		library_under_test => "$dir{pkglibdir}/durable_steps.so",
	}, 'DurableSteps::Upgrade::Install';
}

# At the end of a test: no process of either server crashed; the new server is stopped and the
# provider too (now, not in the global destruction at the test's exit).
sub finish
{
	my ($self) = @_;
	unlike(slurp_file($self->{old}->logfile), $DurableSteps::Test::crash_re, 'no process of the old server crashed');
	unlike(slurp_file($self->{new}->logfile), $DurableSteps::Test::crash_re, 'no process of the new server crashed');
	$self->{new}->stop;
	delete $self->{p};
}

package DurableSteps::Upgrade::Install;

use File::Copy ();

# The extension's library of this install becomes a copy of $library (a new file: the one it
# replaces may be mapped by a process still running).
sub use_library
{
	my ($self, $library) = @_;
	my $to = "$self->{pkglibdir}/durable_steps.so";
	unlink $to;
	File::Copy::copy($library, $to) or die "copying $library to $to: $!";
	return;
}

package DurableSteps::Test;

1;
