# Partitions (docs/partitions.md): two servers, four partitions, A owning 0 and 1, B 2 and 3,
# each with its own worker. Calls, replays, retries by each server's worker, a run, an HTTP step
# charged once; a misrouted call refused with DS201 and leaving nothing; a fenced partition's due
# retry not run by its old server's worker; and partition 1 moved from A to B with
# ds_partition_export and ds_partition_import, the application's rows with it: its completed
# steps replay on B and never run again, its pending retry runs there exactly once, its waiting
# run goes on there. Only a superuser may export or import. A prepared transaction, which may
# hold a step or an idempotency key of a fenced partition, holds its export back.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Partitions;
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $p = DurableSteps::Http::Provider->start;
my ($a, $b) = partition_nodes('part', "max_prepared_transactions = 2\n");
my $dir = PostgreSQL::Test::Utils::tempdir();

# what the move's tests add to the application of both servers
for my $node ($a, $b)
{
	$node->safe_psql('postgres', q{
-- counts executions of move_body, failed ones included: nextval is not rolled back
CREATE SEQUENCE move_runs;
GRANT USAGE ON SEQUENCE move_runs TO app;
CREATE FUNCTION move_body() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('move_runs');
    IF ds_attempt_number() < 2 THEN
        RAISE EXCEPTION 'not yet (attempt %)', ds_attempt_number();
    END IF;
    INSERT INTO orders VALUES (ds_run_id(), ds_step_id());
    RETURN ds_attempt_number();
END $$;
CREATE ROLE mover LOGIN IN ROLE durable_steps_admin;
});
}

# run ids of each partition, as a router computes them: hashtext(run_id) & 3
my %id = ids_by_partition($a);
is($a->safe_psql('postgres', "SELECT ds_partition_of('$id{1}[0]')"), '1', 'ds_partition_of agrees with hashtext & 3');

# calls and replays on each server's own partitions
my ($r0, $r1, $r2) = ($id{0}[0], $id{1}[0], $id{2}[0]);
for ([ $a, $r0, 'A' ], [ $b, $r2, 'B' ])
{
	my ($node, $run, $name) = @$_;
	my ($out) = app_sql($node,
		"SELECT status || ' ' || replayed FROM ds_run_step('$run', 'sync', 'SELECT gate(1)')");
	is($out, 'succeeded false', "$name: a call on its own partition runs");
	($out) = app_sql($node,
		"SELECT status || ' ' || replayed FROM ds_run_step('$run', 'sync', 'SELECT gate(1)')");
	is($out, 'succeeded true', "$name: the same call replays");
	# a retry by this server's worker
	app_sql($node, "SELECT ds_run_step('$run', 'retried', 'SELECT gate(2)', defer => true,
	  policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'))");
	is(settle($node, $run, 'retried'), 'succeeded', "$name: a deferred step retried by the worker succeeded");
	is(ran_in_worker($node, $run, 'retried', 1, 2), 't', "$name: both attempts in this server's worker");
	is(orders_of($node, $run), 'retried,sync', "$name: one row of each step");
}

# a run without a key starts on one of A's partitions and runs there
my $run = $a->safe_psql('postgres', "SET ROLE app; SELECT run_id FROM ds_start_run('book', '{}')");
like($a->safe_psql('postgres', "SELECT ds_partition_of('$run')"), qr/^[01]$/, 'a run without a key gets an id of A');
is($a->safe_psql('postgres', "SELECT status FROM ds_wait_run('$run', '60 s')"), 'succeeded', 'the run succeeded on A');
is(orders_of($a, $run), 'book', 'its step ran once');

# an HTTP step on B: one charge
my ($out) = app_sql($b, qq{SELECT status FROM ds_http_step('$r2', 'charge',
  '{"method": "POST", "url": "@{[$p->url('charge-b')]}", "json": {"amount": 1}}')});
is($out, 'pending', 'B: an HTTP step stored');
is(settle_http($b, $r2, 'charge'), 'succeeded', 'B: the HTTP worker sent it');
is($p->charges('charge-b'), 1, 'B: one charge');

# a misrouted call: DS201, and nothing stored
my $err;
($out, $err) = app_sql($a, "SELECT status FROM ds_run_step('$r2', 'misrouted', 'SELECT gate(1)')");
like($err, qr/ERROR:  DS201: run \Q$r2\E belongs to partition 2, which this server does not own/, 'A refuses a call for partition 2 with DS201');
($out, $err) = app_sql($a, "SELECT run_id FROM ds_start_run('book', '{}', '$r2')");
like($err, qr/DS201/, 'A refuses a run keyed into partition 2');
is($a->safe_psql('postgres', "SELECT count(*) FROM durable_steps.steps WHERE run_id = '$r2'")
	  . $a->safe_psql('postgres', "SELECT count(*) FROM durable_steps.runs WHERE run_id = '$r2'")
	  . orders_of($a, $r2), '00', 'and A stored nothing of it');

# partition 1 on A: a completed step, a completed HTTP step, a waiting run, a retry due in 3 s
($out) = app_sql($a, "SELECT status FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
is($out, 'succeeded', 'A: a step of partition 1 succeeded');
app_sql($a, qq{SELECT ds_http_step('$r1', 'charge', '{"method": "POST", "url": "@{[$p->url('charge-a')]}", "json": {"amount": 2}}')});
is(settle_http($a, $r1, 'charge'), 'succeeded', 'A: an HTTP step of partition 1 sent');
is($p->charges('charge-a'), 1, 'A: one charge');
my $ship = $id{1}[1];
app_sql($a, "SELECT ds_start_run('ship', '{}', '$ship')");
ok(poll_until($a, 'postgres', "SELECT status = 'waiting' AND wait_event = 'go' FROM ds_runs WHERE run_id = '$ship'"),
	'A: a run of partition 1 waits for event go');
app_sql($a, "SELECT ds_run_step('$r1', 'retry', 'SELECT move_body()', defer => true,
  policy => ds_retry_policy(max_attempts => 5, initial_delay => '15 s', backoff => 'fixed', jitter => 0))");
# (15 s: the partition is fenced below long before the retry is due, even on a loaded machine)
ok(poll_until($a, 'postgres', "SELECT status = 'retrying' AND attempt = 1 FROM ds_steps WHERE run_id = '$r1' AND step_id = 'retry'"),
	'A: its attempt 1 failed, a retry is due in 15 s');

# a slow step of partition 1 in flight in A's worker when the partition is fenced
my $holder = DurableSteps::Session->new($a, 'postgres');
$holder->query_ok('SELECT pg_advisory_lock(8401);');
app_sql($a, "SELECT ds_run_step('$r1', 'slow', 'SELECT 1 FROM pg_advisory_xact_lock_shared(8401)', defer => true)");
ok(poll_until($a, 'postgres', "SELECT status = 'running' FROM ds_steps WHERE run_id = '$r1' AND step_id = 'slow'"),
	"A: a slow step of partition 1 is running in A's worker");

# fence partition 1 on A (the executor, busy with the slow step, reads the reload after it): an
# export refuses while the slow attempt is in flight, and its due retry is not run by A's worker
$a->safe_psql('postgres', "ALTER SYSTEM SET durable_steps.partitions = '0'");
$a->reload;
ok(poll_until($a, 'postgres', "SELECT current_setting('durable_steps.partitions') = '0'"), 'A: partition 1 fenced');
my ($eret, $eout, $eerr) = $a->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM ds_partition_export(1)");
like($eerr, qr/ERROR:  DS409: (partition 1 has attempts in flight|transactions open since before the fence|worker processes have not taken the fence)/,
	'an export refuses while an attempt of the partition is in flight');
$holder->query_ok('SELECT pg_advisory_unlock(8401);');
$holder->quit;
is(settle($a, $r1, 'slow'), 'succeeded', 'the attempt in flight when the partition was fenced finished on A');
is($a->safe_psql('postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE run_id = '$r1' AND step_id = 'retry'"),
	'retrying 1', 'the retry is not due yet');
ok(poll_until($a, 'postgres',
		"SELECT now() > next_attempt_at + interval '1 s' FROM ds_steps WHERE run_id = '$r1' AND step_id = 'retry'"),
	'the retry is past due');
ok(wait_executor_loops($a, 'postgres', executor_pid($a), 600), "A's executor went round since");
is($a->safe_psql('postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE run_id = '$r1' AND step_id = 'retry'"),
	'retrying 1', "A's worker did not run the fenced partition's due retry");
is($a->safe_psql('postgres', 'SELECT last_value FROM move_runs'), '1', 'its body ran once on A, attempt 1');
($out, $err) = app_sql($a, "SELECT status FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
like($err, qr/DS201/, 'A now refuses calls for partition 1');
($out, $err) = app_sql($a, "SELECT ds_emit_event('go')");
is($out, 't', 'an event belongs to no run: A accepts it') or diag $err;
wait_executor_loops($a, 'postgres', executor_pid($a), 400);
is($a->safe_psql('postgres', "SELECT status || ' ' || (next_wake_at < now()) FROM ds_runs WHERE run_id = '$ship'"),
	'waiting true', 'the fenced run is due after the event, and A does not take it');

# only a superuser moves a partition: a member of durable_steps_admin is refused
my ($ret, $mout, $merr) = $a->psql('postgres', 'SELECT count(*) FROM ds_partition_export(1)',
	extra_params => [ '-U', 'mover' ]);
like($merr, qr/permission denied for function ds_partition_export/, 'durable_steps_admin may not export');
($ret, $mout, $merr) = $b->psql('postgres',
	q{SELECT ds_partition_import('{"ds_partition_export": 1, "partition": 1, "partition_count": 4}')},
	extra_params => [ '-U', 'mover' ]);
like($merr, qr/permission denied for function ds_partition_import/, 'durable_steps_admin may not import');

# the move: export from A, import into B (twice: the same rows), the application's rows along
my $export = "$dir/partition-1.copy";
my $app_rows = "$dir/orders-1.copy";
$a->safe_psql('postgres', qq{\\copy (SELECT n, line FROM ds_partition_export(1)) TO '$export'
\\copy (SELECT * FROM orders WHERE ds_partition_of(run_id) = 1) TO '$app_rows'});
my $import = qq{CREATE TEMP TABLE staging (n bigint, line jsonb);
\\copy staging FROM '$export'
SELECT string_agg(r, ',') FILTER (WHERE r IN ('header', 'complete'))
  FROM (SELECT ds_partition_import(line) AS r FROM (SELECT line FROM staging ORDER BY n) l) i;};
is($b->safe_psql('postgres', $import), 'header,complete', 'B imported partition 1');
my $counts = "SELECT count(*) FILTER (WHERE ds_partition_of(run_id) = 1) FROM durable_steps.steps";
my $first = $b->safe_psql('postgres', $counts);
is($b->safe_psql('postgres', $import), 'header,complete', 'B imported it again');
is($b->safe_psql('postgres', $counts), $first, 'the same rows');
ok($first >= 4, "B holds partition 1's $first steps");
$b->safe_psql('postgres', qq{\\copy orders FROM '$app_rows'});
is($a->safe_psql('postgres', 'SELECT ds_partition_drop(1) > 0'), 't', "A dropped its copy of partition 1");
$a->safe_psql('postgres', 'DELETE FROM orders WHERE ds_partition_of(run_id) = 1');
is($b->safe_psql('postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE run_id = '$r1' AND step_id = 'retry'"),
	'retrying 1', 'B holds the pending retry, not run while B does not own partition 1');

# open partition 1 on B
ok(reload_executors($b, "ALTER SYSTEM SET durable_steps.partitions = '1,2,3'"), 'B: partition 1 opened');
is(settle($b, $r1, 'retry'), 'succeeded', 'B: the pending retry ran');
is($b->safe_psql('postgres', "SELECT string_agg(attempt || ' ' || class || ' ' || executor, ',' ORDER BY attempt) FROM ds_attempts WHERE run_id = '$r1' AND step_id = 'retry'"),
	'1 retryable worker,2 completed worker', "its history: attempt 1 from A, attempt 2 on B");
is(ran_in_worker($b, $r1, 'retry', 2), 't', "attempt 2 ran in B's worker");
is($b->safe_psql('postgres', 'SELECT last_value FROM move_runs'), '1', 'its body ran once on B');
($out) = app_sql($b, "SELECT status || ' ' || replayed || ' ' || attempt FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
is($out, 'succeeded true 1', 'B: the completed step replays');
($out) = app_sql($b, qq{SELECT status || ' ' || replayed FROM ds_http_step('$r1', 'charge', '{"method": "POST", "url": "@{[$p->url('charge-a')]}", "json": {"amount": 2}}')});
is($out, 'succeeded true', 'B: the completed HTTP step replays');
is($p->charges('charge-a'), 1, 'still one charge');
($out, $err) = app_sql($b, "SELECT ds_emit_event('go')");
ok(poll_until($b, 'postgres', "SELECT status = 'succeeded' FROM ds_runs WHERE run_id = '$ship'"),
	'B: the moved run went on after the event and succeeded');
is(orders_of($b, $r1), 'done,retry', "B: partition 1's application rows: moved, each step once");
is(orders_of($b, $ship), 'pack,ship', 'B: the run packed on A and shipped on B, once each');
is($a->safe_psql('postgres', 'SELECT count(*) FROM orders WHERE ds_partition_of(run_id) = 1')
	  . $a->safe_psql('postgres', 'SELECT count(*) FROM durable_steps.steps WHERE ds_partition_of(run_id) = 1'),
	'00', 'A holds nothing of partition 1 any more');
($out, $err) = app_sql($a, "SELECT status FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
like($err, qr/DS201/, 'A still refuses partition 1');
settled_and_sound($b, $r1, 'done', 1, 'moved completed');
settled_and_sound($a, $r0, 'sync', 1, "A's own");

# A worker that has not taken a fence yet may still claim a step of the partition: B's worker
# processes are stopped (SIGSTOP) before partition 3 is fenced, so that none can take the reload;
# the export refuses, naming them, until they go on and take it
my @workers = split /\n/, $b->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type IN ('durable_steps worker', 'durable_steps http') ORDER BY pid");
ok(scalar(@workers) >= 2, "B: an executor and the HTTP worker run");
# stopped between their transactions (an open one would be refused for its age instead)
my $between = 0;
for my $try (1 .. 50)
{
	kill 'STOP', @workers;
	$between = $b->safe_psql('postgres',
		'SELECT count(*) = 0 FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid IN ('
		  . join(',', @workers) . ')') eq 't';
	last if $between;
	kill 'CONT', @workers;
	usleep(100_000);
}
ok($between, "B: its worker processes are stopped between transactions");
$b->safe_psql('postgres', "ALTER SYSTEM SET durable_steps.partitions = '1,2'");
$b->reload;
ok(poll_until($b, 'postgres', "SELECT current_setting('durable_steps.partitions') = '1,2'"), 'B: partition 3 fenced');
($ret, $mout, $merr) = $b->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM ds_partition_export(3)");
like($merr, qr/ERROR:  DS409: worker processes have not taken the fence of partition 3 yet/,
	'B: the export refuses while its stopped workers have not taken the fence');
like($merr, qr/Processes (\d+, )*$workers[0](, \d+)* serve the partitions of the settings before the reload/,
	'... and names them');
kill 'CONT', @workers;
ok(poll_until($b, 'postgres', q{SELECT count(*) > 0 FROM ds_partition_export(3)}),
	'B: once they went on and took it, the export of partition 3 goes through');
ok(reload_executors($b, "ALTER SYSTEM SET durable_steps.partitions = '1,2,3'"), 'B: partition 3 opened again');

# A prepared transaction keeps what it wrote until it is committed, whenever that is, and no
# backend shows it open: one that took an idempotency key of partition 3 before the fence is
# committed after it. The export refuses while it is prepared, naming it, and has the key once it
# is committed.
my $key3 = $id{3}[1];
($out, $err) = app_sql($b, qq{BEGIN;
SELECT status FROM ds_idempotent('pay', '$key3', '{"amount": 3}', \$h\$SELECT 201, '{"paid": 3}'::jsonb\$h\$);
PREPARE TRANSACTION 'pay-3';});
is($out, '201', 'B: an idempotent request of partition 3 in a prepared transaction') or diag $err;
ok(reload_executors($b, "ALTER SYSTEM SET durable_steps.partitions = '1,2'"), 'B: partition 3 fenced again');
($ret, $mout, $merr) = $b->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM ds_partition_export(3)");
like($merr, qr/ERROR:  DS409: prepared transactions may still write partition 3.*DETAIL:  Prepared transactions 'pay-3'\./s,
	'B: the export refuses while a transaction is prepared, naming it');
$b->safe_psql('postgres', "COMMIT PREPARED 'pay-3'");
is($b->safe_psql('postgres', q{SELECT string_agg(line #>> '{row,key}' || ' ' || (line #>> '{row,status}'), ',')
  FROM ds_partition_export(3) WHERE line ->> 'table' = 'idempotency_keys'}),
	"$key3 201", 'B: once it is committed, the export has its key');
ok(reload_executors($b, "ALTER SYSTEM SET durable_steps.partitions = '1,2,3'"), 'B: partition 3 opened once more');

# an attempt of a fenced partition whose executor ended is recorded lost by no one (only the
# owner records it); once the partition is taken back, it is recorded at once -- the reload
# makes the executors look -- not at their backstop a minute later
{
	my $t = 'a lost attempt of a partition taken back';
	my $run = $id{2}[1];
	my $gate = DurableSteps::Session->new($b, 'postgres');
	$gate->query_ok('SELECT pg_advisory_lock(8402);');
	app_sql($b, "SELECT ds_run_step('$run', 'lost', 'SELECT 1 FROM pg_advisory_xact_lock_shared(8402)', defer => true)");
	ok(poll_until($b, 'postgres', "SELECT status = 'running' FROM ds_steps WHERE run_id = '$run' AND step_id = 'lost'"),
		"$t: its attempt runs in B's worker");
	$b->safe_psql('postgres', "ALTER SYSTEM SET durable_steps.partitions = '1,3'");
	$b->reload;
	ok(poll_until($b, 'postgres', "SELECT current_setting('durable_steps.partitions') = '1,3'"), "$t: partition 2 fenced");
	my $pid = $b->safe_psql('postgres',
		"SELECT backend_pid FROM ds_attempts WHERE run_id = '$run' AND step_id = 'lost' AND class IS NULL");
	$b->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	ok(poll_until($b, 'postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
		"$t: its executor is ended while the attempt runs");
	$gate->query_ok('SELECT pg_advisory_unlock(8402);');
	$gate->quit;
	sleep(2);    # the other executor's look for lost attempts (the ended one moved its epoch)
	is($b->safe_psql('postgres', "SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = 'lost'"),
		'running', "$t: fenced, its lost attempt is left to the partition's owner");
	my $t0 = time();
	$b->safe_psql('postgres', "ALTER SYSTEM SET durable_steps.partitions = '1,2,3'");
	$b->reload;
	is(settle($b, $run, 'lost'), 'succeeded', "$t: taken back, the step is retried and succeeds");
	my $took = time() - $t0;
	cmp_ok($took, '<', 30, "$t: within $took s of the reload (the backstop would take 60)");
	is($b->safe_psql('postgres', "SELECT string_agg(attempt || ' ' || coalesce(error_code, class), ',' ORDER BY attempt)
	  FROM ds_attempts WHERE run_id = '$run' AND step_id = 'lost'"),
		'1 DS007,2 completed', "$t: attempt 1 recorded lost, attempt 2 completed");
}

done_testing();
