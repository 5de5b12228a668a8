# Copyright (c) durable_steps contributors
#
# Concurrent claims of one step identity (README, "How a step behaves"): a key in flight in another transaction makes a
# second caller wait (or, with nowait, refuse with DS409); a committed claim is replayed, a
# rolled-back one is as if never made; a failing body never aborts the caller's transaction.
#
# Sessions are DurableSteps::Session (test/perl): psql processes of our own.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;


my $node = PostgreSQL::Test::Cluster->new('concurrent_claims');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'durable_steps'");
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
-- every execution of a step body leaves one row here, tagged with the backend that ran it
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

# The step under test: run $run, step s1, whose body inserts one effect tagged $run and returns
# its id. Same SQL and input on every call, so the fingerprint always matches.
sub step_sql
{
	my ($run, %opt) = @_;
	my $nowait = $opt{nowait} ? ', nowait => true' : '';
	return "SELECT status, result, attempt, replayed FROM ds_run_step('$run', 's1', "
	  . q{$body$INSERT INTO effects(k) VALUES ($1->>'k') RETURNING id$body$, }
	  . qq{'{"k": "$run"}'::jsonb$nowait);};
}

# Visible state of run $run: step rows (view | table), attempt rows, effect rows.
sub counts
{
	my ($run) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT (SELECT count(*) FROM ds_steps WHERE run_id = '$run') || '|' ||
       (SELECT count(*) FROM durable_steps.steps WHERE run_id = '$run') || '|' ||
       (SELECT count(*) FROM ds_attempts WHERE run_id = '$run') || '|' ||
       (SELECT count(*) FROM effects WHERE k = '$run')});
}

sub effect_row
{
	my ($run) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(id || '|' || pid, ',' ORDER BY id) FROM effects WHERE k = '$run'");
}

sub wait_until_lock_waiting
{
	my ($pid, $name) = @_;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid"),
		"$name: waits on a lock");
}

my $sa = DurableSteps::Session->new($node, 'A');
my $sb = DurableSteps::Session->new($node, 'B');
my ($apid, $bpid) = ($sa->pid, $sb->pid);

############################################################################################
# 1. A claims the key in an open transaction; B waits for it, then replays A's result.
{
	my $t = 'test 1 (waiter replays)';
	$sa->query_ok('BEGIN;');
	my ($status, $result, $attempt, $replayed) = split /\|/, $sa->query_ok(step_sql('t1'));
	is($status, 'succeeded', "$t: A's step succeeded");
	is($replayed, 'f', "$t: A executed the body (not replayed)");
	like($result, qr/^\d+$/, "$t: A's result is the effect id");
	is(counts('t1'), '0|0|0|0', "$t: A's uncommitted claim and effect are invisible to others");

	my $ticket = $sb->send(step_sql('t1'));
	wait_until_lock_waiting($bpid, "$t: B");
	is($node->safe_psql('postgres', "SELECT pg_blocking_pids($bpid)"),
		"{$apid}", "$t: B is blocked by A");
	ok(!$sb->finished($ticket), "$t: B has not returned while A is open");

	$sa->query_ok('COMMIT;');
	my ($out, $err) = $sb->wait($ticket);
	is($err, '', "$t: B raised no error");
	is($out, "succeeded|$result|1|t", "$t: B returns A's stored result with replayed = true");
	is(counts('t1'), '1|1|1|1', "$t: one step, one attempt, one effect");
	is(effect_row('t1'), "$result|$apid", "$t: the only effect is A's, with the returned id");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || class || '|' || backend_pid FROM ds_attempts WHERE run_id = 't1'"
		),
		"1|completed|$apid",
		"$t: the one attempt was A's");
	is($sb->query_ok(step_sql('t1')), "succeeded|$result|1|t", "$t: a later call replays too");
	is(counts('t1'), '1|1|1|1', "$t: the later call changed nothing");
}

############################################################################################
# 2. A claims the key and rolls back; the waiting B then executes the body itself.
{
	my $t = 'test 2 (waiter after rollback executes)';
	$sa->query_ok('BEGIN;');
	my ($status, $a_result, undef, $replayed) = split /\|/, $sa->query_ok(step_sql('t2'));
	is("$status|$replayed", 'succeeded|f', "$t: A executed the step");

	my $ticket = $sb->send(step_sql('t2'));
	wait_until_lock_waiting($bpid, "$t: B");
	is($node->safe_psql('postgres', "SELECT pg_blocking_pids($bpid)"),
		"{$apid}", "$t: B is blocked by A");
	ok(!$sb->finished($ticket), "$t: B has not returned while A is open");

	$sa->query_ok('ROLLBACK;');
	my ($out, $err) = $sb->wait($ticket);
	is($err, '', "$t: B raised no error");
	my ($b_status, $b_result, $b_attempt, $b_replayed) = split /\|/, $out;
	is("$b_status|$b_attempt|$b_replayed", 'succeeded|1|f',
		"$t: B executed the body itself (attempt 1, replayed = false)");
	isnt($b_result, $a_result, "$t: B's result is not A's rolled-back one");
	is(counts('t2'), '1|1|1|1', "$t: one step, one attempt, one effect");
	is(effect_row('t2'), "$b_result|$bpid", "$t: the only effect is B's; A's rolled back");
	is( $node->safe_psql(
			'postgres',
			"SELECT attempt || '|' || class || '|' || backend_pid FROM ds_attempts WHERE run_id = 't2'"
		),
		"1|completed|$bpid",
		"$t: the one attempt is B's");
	is($sa->query_ok(step_sql('t2')), "succeeded|$b_result|1|t", "$t: A now replays B's result");
}

############################################################################################
# 3. nowait: while A holds the key, B is refused at once with DS409 and changes nothing.
{
	my $t = 'test 3 (nowait)';
	$sa->query_ok('BEGIN;');
	my ($status, $result, undef, $replayed) = split /\|/, $sa->query_ok(step_sql('t3'));
	is("$status|$replayed", 'succeeded|f', "$t: A executed the step");

	# Should B wait instead of refusing, it fails with lock_timeout's 55P03, not DS409.
	$sb->query_ok("SET lock_timeout = '5s';");
	my ($out, $err) = $sb->query(step_sql('t3', nowait => 1));
	is($out, '', "$t: B got no row");
	like(
		$err,
		qr/ERROR:\s+DS409: step t3\/s1 is in progress in another transaction/,
		"$t: B is refused with SQLSTATE DS409");

	($out, $err) = $sb->query(
		q{DO $$
BEGIN
    PERFORM ds_run_step('t3', 's1', $body$INSERT INTO effects(k) VALUES ($1->>'k') RETURNING id$body$,
                        '{"k": "t3"}'::jsonb, nowait => true);
    RAISE NOTICE 'not refused';
EXCEPTION WHEN SQLSTATE 'DS409' THEN
    RAISE NOTICE 'caught DS409: %', SQLERRM;
END
$$;});
	like($err, qr/NOTICE:\s+00000: caught DS409: step t3\/s1 is in progress/,
		"$t: DS409 can be caught by SQLSTATE in PL/pgSQL");
	unlike($err, qr/not refused/, "$t: the call in the DO block did not go through");

	# refused inside an explicit transaction too; that transaction is then the caller's to end
	($out, $err) = $sb->query("BEGIN;\n" . step_sql('t3', nowait => 1));
	like($err, qr/DS409/, "$t: B is refused inside a transaction too");
	$sb->query_ok('ROLLBACK;');
	$sb->query_ok('RESET lock_timeout;');

	is(counts('t3'), '0|0|0|0', "$t: B's refusals left nothing behind");
	is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE pid = $bpid AND locktype = 'advisory'"),
		'0', "$t: B holds no lock afterwards");
	is($sa->query_ok('SELECT 1;'), '1', "$t: A's transaction is unaffected");
	$sa->query_ok('COMMIT;');
	is(counts('t3'), '1|1|1|1', "$t: after A commits: one step, one attempt, one effect");
	is(effect_row('t3'), "$result|$apid", "$t: the effect is A's");
	is($sb->query_ok(step_sql('t3', nowait => 1)),
		"succeeded|$result|1|t", "$t: once A committed, nowait replays instead of refusing");
}

############################################################################################
# 3b. nowait waits for no lock at all: while A's ds_start_run holds the run_id's lock, a new step
#     of that run_id is refused at once with DS409 (not after lock_timeout's 55P03).
{
	my $t = 'test 3b (nowait, a run being started)';
	$node->safe_psql('postgres',
		q{CREATE FUNCTION t3b_flow(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT input'});
	$sa->query_ok('BEGIN;');
	$sa->query_ok(q{SELECT created FROM ds_start_run('t3b_flow', '{}', run_key => 't3b');});
	$sb->query_ok("SET lock_timeout = '5s';");
	my ($out, $err) = $sb->query(q{SELECT status FROM ds_run_step('t3b', 's1', 'SELECT 1', nowait => true);});
	like($err, qr/ERROR:\s+DS409: run t3b is being started in another transaction/,
		"$t: ds_run_step is refused with DS409");
	($out, $err) = $sb->query(
		q{SELECT status FROM ds_http_step('t3b', 'h1', '{"url": "http://127.0.0.1:9/"}', nowait => true);});
	like($err, qr/ERROR:\s+DS409: run t3b is being started in another transaction/,
		"$t: ds_http_step is refused with DS409");
	$sb->query_ok('RESET lock_timeout;');
	$sa->query_ok('ROLLBACK;');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.steps WHERE run_id = 't3b'}),
		'0', "$t: the refusals stored nothing");
}

############################################################################################
# 4. A rolled-back caller leaves no step, no attempt and no effect; a new call executes.
{
	my $t = 'test 4 (rolled-back caller)';
	my ($out, $err) = $sa->query("BEGIN;\n" . step_sql('t4') . "\nROLLBACK;");
	is($err, '', "$t: no error");
	like($out, qr/^succeeded\|\d+\|1\|f$/, "$t: the step ran inside the transaction");
	is(counts('t4'), '0|0|0|0', "$t: after ROLLBACK no step, no attempt, no effect");

	# the claim ended with the transaction: another session may take it even with nowait
	($out, $err) = $sb->query(step_sql('t4', nowait => 1));
	is($err, '', "$t: a new caller is not refused");
	my ($status, $result, $attempt, $replayed) = split /\|/, $out;
	is("$status|$attempt|$replayed", 'succeeded|1|f',
		"$t: the new call executes the body (replayed = false)");
	is(counts('t4'), '1|1|1|1', "$t: now one step, one attempt, one effect");
	is(effect_row('t4'), "$result|$bpid", "$t: the effect is the new caller's");

	# the same within a transaction, by a savepoint
	($out, $err) = $sa->query(
		"BEGIN;\nSAVEPOINT sp;\n" . step_sql('t4s') . "\nROLLBACK TO SAVEPOINT sp;
SELECT count(*) FROM ds_steps WHERE run_id = 't4s';
SELECT count(*) FROM effects WHERE k = 't4s';\n" . step_sql('t4s') . "\nCOMMIT;");
	is($err, '', "$t: savepoint: no error");
	my @lines = split /\n/, $out;
	is(scalar(@lines), 4, "$t: savepoint: four result lines");
	like($lines[0], qr/^succeeded\|\d+\|1\|f$/, "$t: savepoint: first call executed");
	is($lines[1], '0', "$t: savepoint: no step row after ROLLBACK TO SAVEPOINT");
	is($lines[2], '0', "$t: savepoint: no effect after ROLLBACK TO SAVEPOINT");
	like($lines[3], qr/^succeeded\|\d+\|1\|f$/,
		"$t: savepoint: the call after the rollback executes again (replayed = false)");
	my ($second) = $lines[3] =~ /^succeeded\|(\d+)\|/;
	is(counts('t4s'), '1|1|1|1', "$t: savepoint: one step, one attempt, one effect committed");
	is(effect_row('t4s'), "$second|$apid", "$t: savepoint: the effect is the second execution's");
}

############################################################################################
# 5. A retryable failure of the body does not abort the caller's transaction; it is recorded.
{
	my $t = 'test 5 (retryable failure)';
	# a long first delay, so that nothing retries the step while the test looks at it
	my $policy =
	  q{ds_retry_policy(max_attempts => 3, initial_delay => '1 hour', max_delay => '2 hours')};
	my $call =
	    "SELECT status, error_class, error_code, error_message, attempt, max_attempts, "
	  . "next_attempt_at > now() + interval '30 minutes', replayed "
	  . "FROM ds_run_step('t5', 's1', \$\$SELECT flaky('t5')\$\$, policy => $policy);";
	$sa->query_ok('BEGIN;');
	my ($out, $err) = $sa->query($call);
	is($err, '', "$t: the failing step raised no error to the caller");
	is($out, 'retrying|retryable|P0001|x|1|3|t|f',
		"$t: the call returns status retrying, class retryable, P0001, next attempt scheduled");
	($out, $err) = $sa->query(
		"INSERT INTO effects(k) VALUES ('t5-after');\nSELECT count(*) FROM effects WHERE k = 't5';"
	);
	is($err, '', "$t: a later statement in the same transaction works");
	is($out, '0', "$t: the body's own write was rolled back");
	$sa->query_ok('COMMIT;');

	is( $node->safe_psql(
			'postgres',
			"SELECT (SELECT count(*) FROM effects WHERE k = 't5-after') || '|' || "
			  . "(SELECT count(*) FROM effects WHERE k = 't5')"),
		'1|0',
		"$t: the caller's transaction committed, with none of the body's writes");
	is( $node->safe_psql(
			'postgres',
			"SELECT status || '|' || error_class || '|' || error_code || '|' || error_message || '|' || attempt || '|' "
			  . "|| (next_attempt_at IS NOT NULL AND next_attempt_at > now() + interval '30 minutes') "
			  . "FROM ds_steps WHERE run_id = 't5'"),
		'retrying|retryable|P0001|x|1|true',
		"$t: the step row is retrying with next_attempt_at set");
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(attempt || '|' || class || '|' || error_code || '|' || error_message || '|' || executor, ',') "
			  . "FROM ds_attempts WHERE run_id = 't5'"),
		'1|retryable|P0001|x|caller',
		"$t: one attempt row, class retryable");

	# not yet due: a new call answers with the pending state and does not run the body early
	($out, $err) = $sb->query($call);
	is($err, '', "$t: calling again raises no error");
	like($out, qr/^retrying\|retryable\|P0001\|x\|1\|3\|t\|/,
		"$t: calling again before it is due returns the retrying state");
	is($node->safe_psql('postgres', "SELECT count(*) FROM ds_attempts WHERE run_id = 't5'"),
		'1', "$t: ... without another attempt");
}

# 6. A backend remembers the answers of succeeded steps it replays (src/replay_cache.c). Another
#    session's DELETE or TRUNCATE of the step makes it forget at once: its next call runs the
#    body again instead of replaying a step that no longer exists.
{
	my $t = 'replay cache';
	my $effects = sub {
		return $node->safe_psql('postgres', "SELECT count(*) FROM effects WHERE k = 'cache'");
	};
	my $call = step_sql('cache');
	my $replayed = sub {
		my ($out) = @_;
		return (split /\|/, $out)[3];
	};
	is($replayed->($sa->query_ok($call)), 'f', "$t: the first call runs the body");
	is($replayed->($sa->query_ok($call)), 't', "$t: the second call replays (and remembers)");
	is($replayed->($sa->query_ok($call)), 't', "$t: the third call replays");
	is($effects->(), '1', "$t: one effect");

	$sb->query_ok("DELETE FROM durable_steps.attempts WHERE run_id = 'cache'; "
		  . "DELETE FROM durable_steps.steps WHERE run_id = 'cache';");
	is($replayed->($sa->query_ok($call)), 'f',
		"$t: after another session deleted the step, the remembering session runs it again");
	is($effects->(), '2', "$t: a second effect");
	is($replayed->($sa->query_ok($call)), 't', "$t: which it then replays");

	$sb->query_ok('TRUNCATE durable_steps.steps, durable_steps.attempts;');
	is($replayed->($sa->query_ok($call)), 'f',
		"$t: after another session truncated the steps, the remembering session runs it again");
	is($effects->(), '3', "$t: a third effect");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
