# Too few slots of max_worker_processes (README, "Requirements"; docs/worker.md): every served
# database gets an executor and its HTTP worker before any gets a second executor -- a database
# that has more gives one back -- and a call that stores work in a database whose workers could
# not start is told so with a WARNING naming the setting, once a session; the launcher logs each
# lack once, not at every pass.
#
# 6 slots for durable_steps (max_worker_processes 7, less the launcher; no logical replication
# launcher, no parallel workers): three databases, created one after the other, first take 3 + 3
# (two executors and an HTTP worker each, greedily) and then share them out, one of each; a
# fourth database gets none.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('starved',
	"max_worker_processes = 7\nmax_logical_replication_workers = 0\n"
	  . "max_parallel_workers_per_gather = 0\nmax_parallel_maintenance_workers = 0\n"
	  . "durable_steps.database = 'db1,db2,db3,db4'\ndurable_steps.max_workers = 2\n");

# per database: executors, HTTP workers
my $workers = q{SELECT coalesce(string_agg(datname || ':' || e || '+' || h, ',' ORDER BY datname), '')
  FROM (SELECT datname, count(*) FILTER (WHERE backend_type = 'durable_steps worker') AS e,
               count(*) FILTER (WHERE backend_type = 'durable_steps http') AS h
          FROM pg_stat_activity WHERE backend_type IN ('durable_steps worker', 'durable_steps http')
         GROUP BY datname) w};

for my $db ('db1', 'db2')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION durable_steps');
}
ok(poll_until($node, 'postgres', $workers, 'db1:2+1,db2:2+1'),
	'two databases take two executors and an HTTP worker each: the six slots');

my $off = log_offset($node);
$node->safe_psql('postgres', 'CREATE DATABASE db3');
$node->safe_psql('db3', 'CREATE EXTENSION durable_steps');
ok(poll_until($node, 'postgres', $workers, 'db1:1+1,db2:1+1,db3:1+1'),
	'a third database: the others give back their second executors, and each has one of each');
like(log_since($node, $off), qr/durable_steps: worker \d+ leaves database "db[12]" for a database without a worker/,
	'the executors that gave their slots back said so');
for my $db ('db1', 'db2', 'db3')
{
	is( $node->safe_psql($db,
			q{SELECT status FROM ds_run_step('r', 's', $$SELECT CASE WHEN ds_attempt_number() = 1
			    THEN ds_retry_after('later', '0 s')::text ELSE 'ok' END$$)}),
		'retrying', "$db: a step whose first attempt fails is retrying");
	ok(poll_until($node, $db, q{SELECT status FROM ds_steps WHERE run_id = 'r'}, 'succeeded'),
		"$db: its executor runs the retry");
}

# a fourth: no slot is left, and nobody has two
$off = log_offset($node);
$node->safe_psql('postgres', 'CREATE DATABASE db4');
$node->safe_psql('db4', 'CREATE EXTENSION durable_steps');
$node->wait_for_log(qr/durable_steps: could not start an executor for database "db4"/, $off);
$node->wait_for_log(qr/durable_steps: could not start the HTTP worker of database "db4"/, $off);
my ($rc, $out, $err) = $node->psql('db4',
	q{SELECT status FROM ds_run_step('r', 'later', 'SELECT 1', defer => true);
	  SELECT status FROM ds_run_step('r', 'later-too', 'SELECT 1', defer => true);
	  SELECT status FROM ds_http_step('r', 'send', '{"url": "http://127.0.0.1:9/"}')});
is($rc, 0, 'db4: the calls store their steps');
like($err, qr/WARNING:  no durable_steps executor runs in this database: its deferred steps, retries and runs will not run/,
	'db4: a deferred step is told that no executor runs');
like($err, qr/DETAIL:  The launcher found no free slot for it: every slot of max_worker_processes \(7\) is taken/,
	'db4: with the setting named');
like($err, qr/HINT:  Raise max_worker_processes/, 'db4: and what to raise');
like($err, qr/WARNING:  no durable_steps HTTP worker runs in this database: its HTTP steps will not be sent/,
	'db4: an HTTP step is told that no HTTP worker runs');
is(count_matches($err, qr/no durable_steps executor runs/), 1, 'db4: once a session');
($rc, $out, $err) = $node->psql('db1', q{SELECT status FROM ds_run_step('r2', 'later', 'SELECT 1', defer => true)});
unlike($err, qr/WARNING/, 'db1, served: no warning');

# the launcher says each lack once, not at each of its passes
ok(poll_until($node, 'postgres', q{SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'durable_steps launcher'}),
	'the launcher runs');
sleep(3);    # three of its passes (LAUNCHER_CHECK_MS 1 s), each of which would log again
my $log = log_since($node, $off);
is(count_matches($log, qr/could not start an executor for database "db4"/), 1, 'the launcher logs the lack of an executor once');
is(count_matches($log, qr/could not start the HTTP worker of database "db4"/), 1, 'and of the HTTP worker once');
is($node->safe_psql('postgres', $workers), 'db1:1+1,db2:1+1,db3:1+1', 'the three served databases keep their workers');

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
