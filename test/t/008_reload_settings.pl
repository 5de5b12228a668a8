# SIGHUP (docs/reference.md, "Settings"): durable_steps.retention and durable_steps.poll_interval are
# reloadable; a reload makes a purge pass due at once.

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

my $node = worker_node('worker');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;

});

{
	my $t = 'reload';
	my $ok_step = sub {
		my ($step) = @_;
		return "SELECT status FROM ds_run_step('ret', '$step', 'SELECT 1');";
	};
	my $left_sql = q{
SELECT string_agg(step_id || ':' || status || ':' ||
                  (SELECT count(*) FROM ds_attempts a
                    WHERE a.run_id = s.run_id AND a.step_id = s.step_id), ',' ORDER BY step_id)
  FROM durable_steps.steps s WHERE run_id = 'ret'};
	my $left = sub { return $node->safe_psql('postgres', $left_sql); };
	# one transaction creates and back-dates the steps and reads them back: an executor's first
	# purge, which may come at any moment, sees them only once they are back-dated
	my @created = split /\n/, $node->safe_psql(
		'postgres', join(
			"\n",
			'BEGIN;',
			(map { $ok_step->("old30-$_") } 1 .. 3),
			(map { $ok_step->("old1h-$_") } 1 .. 3),
			$ok_step->('fresh'),
			q{SELECT status FROM ds_run_step('ret', 'blocked', $$SELECT ds_blocked('needs a person', 'Fix it.')$$);},
			# finished long ago (superuser back-dating; nobody else can write these tables)
			# (created no later than finished, as every step is: the purge finds them by created_at)
			q{UPDATE durable_steps.steps SET finished_at = now() - interval '30 days',
			                                 created_at = now() - interval '30 days'
			   WHERE run_id = 'ret' AND step_id LIKE 'old30-%';},
			q{UPDATE durable_steps.steps SET finished_at = now() - interval '1 hour',
			                                 created_at = now() - interval '1 hour'
			   WHERE run_id = 'ret' AND step_id LIKE 'old1h-%';},
			q{UPDATE durable_steps.steps SET created_at = now() - interval '30 days',
			                                 updated_at = now() - interval '30 days'
			   WHERE run_id = 'ret' AND step_id = 'blocked';},
			"$left_sql;",
			'COMMIT;'));
	is( $created[-1],
		'blocked:blocked:1,fresh:succeeded:1,old1h-1:succeeded:1,old1h-2:succeeded:1,'
		  . 'old1h-3:succeeded:1,old30-1:succeeded:1,old30-2:succeeded:1,old30-3:succeeded:1',
		"$t: eight steps, one attempt each");
	is($node->safe_psql('postgres', 'SHOW durable_steps.retention'),
		'7d', "$t: the default retention is 7 days");

	# events: one emitted 30 days ago, a fresh one
	$node->safe_psql('postgres', q{
SELECT ds_emit_event('ret-old', '{}'), ds_emit_event('ret-fresh', '{}');
UPDATE durable_steps.events SET emitted_at = now() - interval '30 days' WHERE name = 'ret-old';});
	my $events = q{SELECT string_agg(name, ',' ORDER BY name) FROM durable_steps.events WHERE name LIKE 'ret-%'};

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
	is($node->safe_psql('postgres', $events), 'ret-fresh',
		"$t: the event emitted 30 days ago is purged too; the fresh one stays");

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

$node->stop;

done_testing();
