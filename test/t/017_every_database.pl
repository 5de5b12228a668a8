# The worker serves every database in which the extension is installed (docs/worker.md): durable_steps.database = '*' (the default) finds them, starts at most
# durable_steps.max_workers executors in each, leaves databases without the extension alone,
# follows CREATE and DROP EXTENSION and a restart; a list serves only the databases it names, and
# a call in another database warns once per session.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# debug1: the log says when a probing executor found no extension
my $node = worker_node('every',
	"durable_steps.max_workers = 2\nmax_worker_processes = 16\nlog_min_messages = debug1\n");

# executors per database, as 'db:n' sorted by name
my $executors = q{SELECT coalesce(string_agg(datname || ':' || n, ',' ORDER BY datname), '')
		    FROM (SELECT datname, count(*) AS n FROM pg_stat_activity
		           WHERE backend_type = 'durable_steps worker' GROUP BY datname) e};

# A step whose first attempt asks for a retry: only the worker can finish it.
sub retried_step
{
	my ($db, $run) = @_;
	return $node->safe_psql($db,
		qq{SELECT status FROM ds_run_step('$run', 's', \$\$SELECT CASE WHEN ds_attempt_number() = 1
		     THEN ds_retry_after('later', '0 s')::text ELSE current_database() END\$\$)});
}

sub ran_in
{
	my ($db, $run) = @_;
	return poll_until($node, $db,
		"SELECT status || '|' || (result #>> '{}') FROM ds_steps WHERE run_id = '$run'",
		"succeeded|$db");
}

{
	my $t = 'every database';
	# database postgres has no extension: its probing executor leaves
	ok(poll_until($node, 'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'", '0'),
		"$t: no executor stays in a database without the extension");

	for my $db ('db1', 'db2')
	{
		my $off = log_offset($node);
		$node->safe_psql('postgres', "CREATE DATABASE $db");
		# the launcher probes a new database, and leaves it when it has no extension
		$node->wait_for_log(
			qr/DEBUG:  durable_steps: extension is not installed in database "$db"; its worker stops/,
			$off);
		$node->safe_psql($db, 'CREATE EXTENSION durable_steps');
	}
	# CREATE EXTENSION alone has the launcher start the database's executors
	ok(poll_until($node, 'postgres', $executors, 'db1:2,db2:2'),
		"$t: CREATE EXTENSION starts max_workers executors in each database, none elsewhere");

	# the worker's own log lines name the database they are about
	for my $db ('db1', 'db2')
	{
		$node->wait_for_log(qr/durable_steps: HTTP worker started \(database "$db"\)/);
	}
	pass("$t: the worker's log lines name their database");

	for my $db ('db1', 'db2')
	{
		is(retried_step($db, "r-$db"), 'retrying', "$t: $db: the first attempt asks for a retry");
		ok(ran_in($db, "r-$db"), "$t: $db: the worker runs its second attempt in $db");
		is($node->safe_psql($db, "SELECT executor FROM ds_attempts WHERE run_id = 'r-$db' AND attempt = 2"),
			'worker', "$t: $db: attempt 2 is the worker's");
	}
}

{
	my $t = 'DROP and CREATE EXTENSION';
	$node->safe_psql('db2', 'DROP EXTENSION durable_steps');
	ok(poll_until($node, 'postgres', $executors, 'db1:2'),
		"$t: db2's executors leave with its extension; db1's stay");
	$node->safe_psql('db2', 'CREATE EXTENSION durable_steps');
	is(retried_step('db2', 'again'), 'retrying', "$t: a step in db2 after CREATE EXTENSION");
	ok(ran_in('db2', 'again'), "$t: is run by db2's new executors");
}

{
	my $t = 'restart';
	# due in a few seconds: the restart happens before any executor could run it
	$node->safe_psql('db2',
		q{SELECT ds_run_step('after-restart', 's', 'SELECT current_database()', defer => true,
		                     run_at => clock_timestamp() + interval '3 s')});
	$node->restart;
	ok(ran_in('db2', 'after-restart'), "$t: the launcher finds db2's extension again and runs its step");
	ok(poll_until($node, 'postgres',
			q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' AND datname = 'postgres'}, '0'),
		"$t: and again leaves postgres alone");
}

{
	my $t = 'a list';
	$node->append_conf('postgresql.conf', "durable_steps.database = 'db1'\n");
	$node->reload;
	ok(poll_until($node, 'postgres', $executors, 'db1:2'),
		"$t: a reload that drops db2 from the setting stops its executors");

	my ($ret, $out, $err) = $node->psql('db2',
		q{SELECT status FROM ds_run_step('unserved', 's1', 'SELECT 1', defer => true);
		  SELECT status FROM ds_run_step('unserved', 's2', 'SELECT 2', defer => true);});
	is($ret, 0, "$t: deferred steps in an unserved database are stored");
	is(count_matches($err, qr/WARNING:  the durable_steps worker does not serve database "db2"/), 1,
		"$t: the session is warned once");
	like($err, qr/HINT:  Add the database to durable_steps.database/, "$t: with the fix");

	# db1 is still served: a step there runs; db2's stay pending
	is(retried_step('db1', 'served'), 'retrying', "$t: a step in the listed database");
	ok(ran_in('db1', 'served'), "$t: runs");
	is($node->safe_psql('db2', q{SELECT string_agg(status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = 'unserved'}),
		'pending,pending', "$t: db2's steps wait");

	$node->append_conf('postgresql.conf', "durable_steps.database = '*'\n");
	$node->reload;
	ok(poll_until($node, 'db2', q{SELECT string_agg(status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = 'unserved'},
			'succeeded,succeeded'),
		"$t: back to '*', db2's waiting steps run");
}

unlike(log_since($node, 0), $crash_re, 'no server process crashed');
unlike(log_since($node, 0), qr/could not start an executor|executor slots are taken/, 'no executor was refused a slot');
done_testing();
