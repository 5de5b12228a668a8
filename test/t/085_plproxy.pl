# PL/Proxy in front of partitions (examples/plproxy, docs/plproxy.md): two servers of the major
# under test, four partitions (A owns 0 and 1, B 2 and 3), each with its own worker, and a proxy
# running Debian's PostgreSQL 15 with Debian's postgresql-15-plproxy, its functions written by
# examples/plproxy/generate-proxy.sql from A's catalog and its cluster by cluster-config.sh.
# Through the proxy: calls land on the server owning the run's partition, replay, retry in that
# server's worker; a run; an HTTP step charged once; an event broadcast to runs on both servers;
# the views and ds_stats of both servers; a ROLLBACK at the proxy undoes nothing. A call sent
# straight to the wrong server is refused with DS201. Partition 1 moved from A to B and the
# cluster written again: its completed steps replay through the proxy from B, never run again,
# and so does an idempotent request whose key is of partition 1.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Partitions;
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pg15 = '/usr/lib/postgresql/15';
plan skip_all => "PL/Proxy is not installed ($pg15/lib/plproxy.so: apt-get install postgresql-15-plproxy)"
  unless -e "$pg15/lib/plproxy.so" && -x "$pg15/bin/initdb";

my $examples = "$FindBin::RealBin/../../examples/plproxy";
my $p = DurableSteps::Http::Provider->start;
my ($a, $b) = partition_nodes('plx');
my $dir = PostgreSQL::Test::Utils::tempdir();

my $proxy = PostgreSQL::Test::Cluster->new('proxy', install_path => $pg15);
$proxy->init;
$proxy->start;
$proxy->safe_psql('postgres', 'CREATE ROLE app LOGIN');

# a command's stdout; dies with its stderr when it fails
sub run_ok
{
	my ($what, @cmd) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err)
	  or die "$what failed: $err";
	return $out;
}
my $psql = $a->config_data('--bindir') . '/psql';

# the proxy's functions, from A's catalog
my $functions = run_ok('generate-proxy.sql', $psql, '-X', '-At', '-v', 'ON_ERROR_STOP=1',
	'-f', "$examples/generate-proxy.sql", '-d', $a->connstr('postgres'));
like($functions, qr/CREATE FUNCTION public\.ds_run_step\(run_id text.*\n.*RETURNS public\.ds_step_result/,
	'the generator wrote ds_run_step with its signature');
$proxy->safe_psql('postgres', $functions);

# the cluster: from what each server says it owns
sub configure_cluster
{
	local $ENV{PSQL} = $psql;
	my $sql = run_ok('cluster-config.sh', "$examples/cluster-config.sh",
		$a->connstr('postgres'), $b->connstr('postgres'));
	$proxy->safe_psql('postgres', $sql);
	return $sql;
}
configure_cluster();
is($proxy->safe_psql('postgres',
		"SELECT array_to_string(srvoptions, ' ') ~ 'p1=.*port=@{[$a->port]}.*p2=.*port=@{[$b->port]}' FROM pg_foreign_server WHERE srvname = 'durable_steps'"),
	't', "the cluster: partitions 0 and 1 on A, 2 and 3 on B");

# run ids of each partition, as the proxy routes them: hashtext(run_id) & 3
my %id = ids_by_partition($proxy);
is($a->safe_psql('postgres', "SELECT ds_partition_of('$id{1}[0]')"), '1',
	"the proxy's hashtext & 3 is the servers' partition");

# calls through the proxy: each on the server that owns its run, replayed, retried by its worker
my ($r0, $r1, $r2, $r3) = ($id{0}[0], $id{1}[0], $id{2}[0], $id{3}[0]);
for ([ $a, $b, $r0, 'A' ], [ $b, $a, $r2, 'B' ])
{
	my ($node, $other, $run, $name) = @$_;
	my ($out, $err) = app_sql($proxy,
		"SELECT status || ' ' || replayed FROM ds_run_step('$run', 'sync', 'SELECT gate(1)')");
	is($out, 'succeeded false', "proxy: a call for $run runs") or diag $err;
	is(orders_of($node, $run) . ' ' . steps_on($other, $run), 'sync 0', "it ran on $name, nothing of it elsewhere");
	($out) = app_sql($proxy,
		"SELECT status || ' ' || replayed FROM ds_run_step('$run', 'sync', 'SELECT gate(1)')");
	is($out, 'succeeded true', 'proxy: the same call replays');
	($out, $err) = app_sql($proxy, "SELECT status FROM ds_run_step('$run', 'retried', 'SELECT gate(2)', defer => true,
	  policy => ds_retry_policy(max_attempts => 3, initial_delay => '100 ms'))");
	is($out, 'pending', 'proxy: a deferred step stored') or diag $err;
	($out) = app_sql($proxy, "SELECT status || ' ' || attempt FROM ds_wait_step('$run', 'retried', '60 s')");
	is($out, 'succeeded 2', "proxy: ds_wait_step saw it succeed at attempt 2");
	is(ran_in_worker($node, $run, 'retried', 1, 2), 't', "both attempts in $name\'s worker");
	is(orders_of($node, $run), 'retried,sync', "$name: one row of each step");
}

# a ROLLBACK at the proxy undoes nothing: the forwarded call committed on its server
my ($out, $err) = app_sql($proxy, "BEGIN;
SELECT status FROM ds_run_step('$r3', 'rolled', 'SELECT gate(1)');
ROLLBACK;");
is($out, 'succeeded', 'proxy: a call in a transaction');
is(orders_of($b, $r3), 'rolled', 'the ROLLBACK at the proxy did not undo it on B');

# runs through the proxy: without a key (any server draws an id of its own), and with one
my @started;
for (1 .. 6)
{
	($out, $err) = app_sql($proxy, "SELECT run_id FROM ds_start_run('book', '{}')");
	push @started, $out;
}
is(scalar(grep { $_ =~ /^[0-9a-f-]{36}$/ } @started), 6, 'proxy: six runs started without a key') or diag $err;
my $elsewhere = 0;
for my $run (@started)
{
	my $part = $a->safe_psql('postgres', "SELECT ds_partition_of('$run')");
	my $owner = $part < 2 ? $a : $b;
	($out) = app_sql($proxy, "SELECT status FROM ds_wait_run('$run', '60 s')");
	$elsewhere++ unless $out eq 'succeeded' && orders_of($owner, $run) eq 'book';
}
is($elsewhere, 0, 'each succeeded through the proxy, its step run once on the server of its id');
my $keyed = $id{3}[1];
($out) = app_sql($proxy, "SELECT created FROM ds_start_run('book', '{}', '$keyed')");
is($out, 't', 'proxy: a run with a key started');
($out) = app_sql($proxy, "SELECT status FROM ds_wait_run('$keyed', '60 s')");
is($out . ' ' . orders_of($b, $keyed), 'succeeded book', 'it ran on B, which owns its key');

# an HTTP step through the proxy: one charge, replayed without another
my $charge = qq{'$r2', 'charge', '{"method": "POST", "url": "@{[$p->url('charge-b')]}", "json": {"amount": 1}}'};
($out, $err) = app_sql($proxy, "SELECT status FROM ds_http_step($charge)");
is($out, 'pending', 'proxy: an HTTP step stored') or diag $err;
($out) = app_sql($proxy, "SELECT status FROM ds_wait_step('$r2', 'charge', '60 s')");
is($out, 'succeeded', "proxy: B's HTTP worker sent it");
($out) = app_sql($proxy, "SELECT status || ' ' || replayed FROM ds_http_step($charge)");
is($out, 'succeeded true', 'proxy: the HTTP step replays');
is($p->charges('charge-b'), 1, 'one charge');

# an event broadcast: runs waiting for it on both servers go on
my ($wa, $wb) = ($id{1}[1], $id{3}[2]);
app_sql($proxy, "SELECT ds_start_run('ship', '{}', '$wa'); SELECT ds_start_run('ship', '{}', '$wb');");
ok(poll_until($proxy, 'postgres',
		"SELECT count(*) = 2 FROM ds_runs WHERE run_id IN ('$wa', '$wb') AND status = 'waiting' AND wait_event = 'go'"),
	'proxy: a run on A and a run on B wait for event go (seen in the proxy\'s ds_runs)');
($out, $err) = app_sql($proxy, "SELECT ds_emit_event('go')");
is($out, 't', 'proxy: the event emitted') or diag $err;
for ([ $a, $wa, 'A' ], [ $b, $wb, 'B' ])
{
	my ($node, $run, $name) = @$_;
	($out) = app_sql($proxy, "SELECT status FROM ds_wait_run('$run', '60 s')");
	is($out . ' ' . orders_of($node, $run), 'succeeded pack,ship', "$name: the run got the event and shipped");
}
($out) = app_sql($proxy, "SELECT ds_emit_event('go')");
is($out, 'f', 'proxy: emitted again, every server already had it');

# admin reads across partitions
my $count_steps = 'SELECT count(*) FROM ds_steps';
is($proxy->safe_psql('postgres', $count_steps),
	$a->safe_psql('postgres', $count_steps) + $b->safe_psql('postgres', $count_steps),
	"proxy: ds_steps holds both servers' steps");
is($proxy->safe_psql('postgres',
		"SELECT count(DISTINCT run_id) FROM ds_steps WHERE run_id IN ('$r0', '$r2') AND owner = 'app'"),
	'2', 'runs of both servers, their owner by name');
is($proxy->safe_psql('postgres', 'SELECT count(*) FROM ds_stats()'),
	$a->safe_psql('postgres', 'SELECT count(*) FROM ds_stats()') + $b->safe_psql('postgres', 'SELECT count(*) FROM ds_stats()'),
	'proxy: as many ds_stats rows as both servers have');

# a queue's limit is each server's: set on both; ds_unwrap of a forwarded result
$proxy->safe_psql('postgres', "SELECT ds_set_queue('slow', 1)");
is($a->safe_psql('postgres', "SELECT concurrency FROM ds_queues WHERE queue = 'slow'")
	  . $b->safe_psql('postgres', "SELECT concurrency FROM ds_queues WHERE queue = 'slow'"),
	'11', 'proxy: ds_set_queue reached both servers');
($out, $err) = app_sql($proxy, "SELECT ds_unwrap(ds_run_step('$r2', 'sync', 'SELECT gate(1)'))");
is($out, '1', 'proxy: ds_unwrap of a replayed ds_step_result') or diag $err;

# a misrouted call, sent straight to the wrong server: DS201, nothing stored
($out, $err) = app_sql($b, "SELECT status FROM ds_run_step('$r0', 'misrouted', 'SELECT gate(1)')");
like($err, qr/ERROR:  DS201: run \Q$r0\E belongs to partition 0, which this server does not own/,
	'B refuses a call for partition 0 with DS201');
is(steps_on($b, $r0), '0', 'B stored nothing of it');

# partition 1 (A): a completed step and a completed HTTP step, to move to B
($out) = app_sql($proxy, "SELECT status FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
is($out, 'succeeded', 'proxy: a step of partition 1 succeeded on A');
my $charge1 = qq{'$r1', 'charge', '{"method": "POST", "url": "@{[$p->url('charge-a')]}", "json": {"amount": 2}}'};
app_sql($proxy, "SELECT ds_http_step($charge1)");
($out) = app_sql($proxy, "SELECT status FROM ds_wait_step('$r1', 'charge', '60 s')");
is($out . ' ' . $p->charges('charge-a'), 'succeeded 1', 'proxy: an HTTP step of partition 1 charged once on A');

# an idempotent request whose key is of partition 1: handled on A through the proxy, refused by B
my $checkout = sprintf(q{SELECT status || ' ' || replayed || ' ' || body::text FROM ds_idempotent('checkout', '%s', '{"cart": 1}',
    $h$WITH o AS (INSERT INTO orders VALUES ('%s', 'checkout') RETURNING 1) SELECT 201, jsonb_build_object('rows', count(*)) FROM o$h$)},
	$r1, $r1);
($out, $err) = app_sql($proxy, $checkout);
is($out, '201 false {"rows": 1}', 'proxy: an idempotent request of partition 1 handled on A') or diag $err;
($out, $err) = app_sql($b, $checkout);
like($err, qr/ERROR:  DS201: idempotency key \Q$r1\E belongs to partition 1, which this server does not own/,
	'B refuses the key of partition 1 with DS201');

# the move: fence on A (the proxy's calls for partition 1 are refused, not run anywhere) ...
ok(reload_executors($a, "ALTER SYSTEM SET durable_steps.partitions = '0'"), 'A: partition 1 fenced');
($out, $err) = app_sql($proxy, "SELECT status FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
like($err, qr/ERROR:  DS201: .*REMOTE ERROR: run \Q$r1\E belongs to partition 1/,
	'proxy: a call for partition 1 during the move fails with DS201');
{
	local $ENV{PSQL} = $psql;
	my ($cout, $cerr) = ('', '');
	my $ok = IPC::Run::run([ "$examples/cluster-config.sh", $a->connstr('postgres'), $b->connstr('postgres') ],
		'<', \undef, '>', \$cout, '2>', \$cerr);
	ok(!$ok && $cerr =~ /partition 1 has no owner/, 'cluster-config.sh refuses a map with a partition of no owner');
}
# ... export from A, import into B with the application's rows, drop A's copy, open on B
my $export = "$dir/partition-1.copy";
my $app_rows = "$dir/orders-1.copy";
$a->safe_psql('postgres', qq{\\copy (SELECT n, line FROM ds_partition_export(1)) TO '$export'
\\copy (SELECT * FROM orders WHERE ds_partition_of(run_id) = 1) TO '$app_rows'});
is($b->safe_psql('postgres', qq{CREATE TEMP TABLE staging (n bigint, line jsonb);
\\copy staging FROM '$export'
SELECT string_agg(r, ',') FILTER (WHERE r IN ('header', 'complete'))
  FROM (SELECT ds_partition_import(line) AS r FROM (SELECT line FROM staging ORDER BY n) l) i;}),
	'header,complete', 'B imported partition 1');
$b->safe_psql('postgres', qq{\\copy orders FROM '$app_rows'});
is($a->safe_psql('postgres', 'SELECT ds_partition_drop(1) > 0'), 't', 'A dropped its copy');
$a->safe_psql('postgres', 'DELETE FROM orders WHERE ds_partition_of(run_id) = 1');
ok(reload_executors($b, "ALTER SYSTEM SET durable_steps.partitions = '1,2,3'"), 'B: partition 1 opened');
like(configure_cluster(), qr/SET p1 '[^']*port=@{[$b->port]}/, "the proxy's cluster written again: p1 on B");

# through the proxy, from B: the completed steps replay, nothing runs again
($out, $err) = app_sql($proxy,
	"SELECT status || ' ' || replayed || ' ' || attempt FROM ds_run_step('$r1', 'done', 'SELECT gate(1)')");
is($out, 'succeeded true 1', 'proxy: the moved completed step replays from B') or diag $err;
($out) = app_sql($proxy, "SELECT status || ' ' || replayed FROM ds_http_step($charge1)");
is($out, 'succeeded true', 'proxy: the moved HTTP step replays from B');
is($p->charges('charge-a'), 1, 'still one charge');
($out, $err) = app_sql($proxy, $checkout);
is($out, '201 true {"rows": 1}', 'proxy: the idempotent request replays from B, with the response stored on A') or diag $err;
is(orders_of($b, $r1), 'checkout,done', "B: partition 1's rows, its step and the request's handler run once");
is(steps_on($a, $r1) . ' ' . $a->safe_psql('postgres', "SELECT count(*) FROM durable_steps.idempotency_keys WHERE key = '$r1'"),
	'0 0', 'A holds nothing of partition 1, steps nor keys');
($out) = app_sql($proxy, "SELECT status || ' ' || replayed FROM ds_run_step('$r1', 'after', 'SELECT gate(1)')");
is($out . ' ' . orders_of($b, $r1), 'succeeded false after,checkout,done', 'proxy: a new step of partition 1 runs on B');
is($proxy->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = '$r1'"), '3',
	"proxy: ds_steps shows partition 1's steps once");
settled_and_sound($b, $r1, 'done', 1, 'moved completed');

done_testing();
