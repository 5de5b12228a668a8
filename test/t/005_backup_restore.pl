# Copyright (c) durable_steps contributors
#
# Backups: pg_dump keeps the steps, their attempts and the runs, and pg_restore into another
# cluster brings them back working. Owners travel by name: the new cluster's roles are created in
# another order, after an extra role, so their OIDs differ from the old cluster's. After the
# restore, completed steps replay without running again for the roles that own them, the new
# cluster's worker retries the retrying steps and the attempt that was running at dump time
# (recorded as lost), long-delayed and blocked steps wait as before, and the history survives.
# Also: pg_dump -t durable_steps.steps and pg_dumpall write the rows, a parallel pg_restore loads
# every attempt, and a step whose owner was dropped before the dump restores with a bare OID and
# fails closed.
#
# Every step body records each execution in a ledger row, with the cluster it ran in (app.site).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $conf = q{
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'app'
durable_steps.poll_interval = '200ms'
};

############################################################################################
# The old cluster: two executors claiming one step at a time, so that one can sit in an attempt
# while the other keeps retrying.
my $old = PostgreSQL::Test::Cluster->new('old');
$old->init;
$old->append_conf('postgresql.conf',
	$conf . "durable_steps.max_workers = 2\ndurable_steps.batch_size = 1\napp.site = 'primary'\n");
$old->start;

$old->safe_psql('postgres', q{
CREATE ROLE alice;
CREATE ROLE bob;
CREATE ROLE carol;
-- the run's owner: a new step under a run's id needs the privileges of its owner
CREATE ROLE team;
GRANT team TO alice, bob, carol;
CREATE DATABASE app;
});
$old->safe_psql(
	'app', q{
CREATE EXTENSION durable_steps;

-- one row per execution of a step body, with the role it ran as and the cluster it ran in
CREATE TABLE ledger (
    id   serial PRIMARY KEY,
    step text NOT NULL,
    who  text NOT NULL DEFAULT current_user,
    site text NOT NULL DEFAULT current_setting('app.site')
);
GRANT SELECT, INSERT ON ledger TO alice, bob, carol;
GRANT USAGE ON SEQUENCE ledger_id_seq TO alice, bob, carol;

CREATE FUNCTION book(step text) RETURNS integer LANGUAGE sql
    AS $$INSERT INTO ledger(step) VALUES (step) RETURNING id$$;

-- a step that cannot finish on the old cluster: every attempt there asks to be retried in 3 s;
-- with hold, the worker's attempts there sleep until the node stops (they stay running)
CREATE FUNCTION book_after_restore(step text, hold boolean) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('app.site') = 'primary' THEN
        IF hold AND ds_attempt_number() > 1 THEN
            PERFORM pg_sleep(600);
        END IF;
        PERFORM ds_retry_after('not on the primary', CASE WHEN hold THEN '0 s' ELSE '3 s' END::interval);
    END IF;
    RETURN book(step);
END
$$;

-- the run's default policy: short delays for the retries the new cluster makes
INSERT INTO durable_steps.runs (run_id, workflow, policy, owner)
VALUES ('bk', 'backup test', '{"initial_delay": "100 ms", "max_attempts": 100}', 'team'::regrole);
});

# Run $sql as $role in database app of $node; returns its status, attempt and replayed.
sub call_step
{
	my ($node, $role, $step, $sql) = @_;
	return decode_row(
		$node->safe_psql(
			'app',
			"SET ROLE $role; " . row_sql("SELECT status, attempt, replayed FROM ds_run_step('bk', '$step', \$\$$sql\$\$)")));
}

my %body = (
	'paid'     => q{SELECT book('paid')},
	'rejected' => q{SELECT ds_non_retriable('card declined')},
	'later'    => q{SELECT ds_retry_after('not before an hour', '1 h')},
	'blocked'  => q{SELECT ds_blocked('needs a person', 'Check the address.')},
	'soon'     => q{SELECT book_after_restore('soon', false)},
	'inflight' => q{SELECT book_after_restore('inflight', true)},
	'orphan'   => q{SELECT ds_retry_after('not before an hour', '1 h')},);

is_deeply(call_step($old, 'alice', 'paid', $body{paid}),
	{ status => 'succeeded', attempt => 1, replayed => 'false' },
	'old: alice: succeeded');
is_deeply(call_step($old, 'alice', 'rejected', $body{rejected}),
	{ status => 'failed', attempt => 1, replayed => 'false' },
	'old: alice: failed');
is_deeply(call_step($old, 'bob', 'later', $body{later}),
	{ status => 'retrying', attempt => 1, replayed => 'false' },
	'old: bob: retrying, next attempt in an hour');
is_deeply(call_step($old, 'bob', 'blocked', $body{blocked}),
	{ status => 'blocked', attempt => 1, replayed => 'false' },
	'old: bob: blocked');
is_deeply(call_step($old, 'carol', 'soon', $body{soon}),
	{ status => 'retrying', attempt => 1, replayed => 'false' },
	'old: carol: retrying every 3 s');
is_deeply(call_step($old, 'carol', 'inflight', $body{inflight}),
	{ status => 'retrying', attempt => 1, replayed => 'false' },
	'old: carol: retrying at once');
ok( $old->poll_query_until(
		'app', q{
SELECT count(*) = 1 FROM ds_steps s, pg_stat_activity p
 WHERE s.run_id = 'bk' AND s.step_id = 'inflight' AND s.status = 'running' AND s.attempt = 2
   AND p.pid = (SELECT claimed_by FROM durable_steps.steps WHERE step_id = 'inflight')
   AND p.wait_event = 'PgSleep'}),
	'old: the worker sits in attempt 2 of "inflight", committed as running');
ok( $old->poll_query_until(
		'app', q{SELECT attempt >= 2 FROM ds_steps WHERE run_id = 'bk' AND step_id = 'soon'}),
	'old: the other executor retries "soon"');

# A role dropped before the dump leaves a step with a bare OID for an owner. It is created last,
# so that its OID is above every role OID of the new cluster: were the OID a role there, the
# step would be that role's (docs/backups.md, says to look for such steps before a dump).
$old->safe_psql('postgres', 'CREATE ROLE dave IN ROLE team');
is_deeply(call_step($old, 'dave', 'orphan', $body{orphan}),
	{ status => 'retrying', attempt => 1, replayed => 'false' },
	'old: dave: retrying');
my ($rc, $out, $err) = $old->psql('app', 'DROP ROLE dave');
like(
	$err,
	qr/WARNING:  role "dave" owns 1 unfinished durable step in database "app"/,
	'old: DROP ROLE warns about the step the role leaves behind');
my $dave_oid = $old->safe_psql('app',
	"SELECT owner::oid FROM durable_steps.steps WHERE step_id = 'orphan'");

# the OIDs of alice, bob and carol in a cluster
sub role_oids
{
	my ($node) = @_;
	return { map { $_->{rolname} => $_->{oid} }
		  @{ rows_of($node, 'postgres', "SELECT rolname, oid FROM pg_roles WHERE rolname IN ('alice', 'bob', 'carol')") } };
}
my $old_roles = role_oids($old);
is_deeply(rows_of($old, 'app', 'SELECT id, step, who, site FROM ledger ORDER BY id'),
	[ { id => 1, step => 'paid', who => 'alice', site => 'primary' } ],
	'old: the ledger has the one execution of "paid"');

############################################################################################
# The dumps.
my $dir = PostgreSQL::Test::Utils::tempdir;
command_ok([ 'pg_dump', '-Fc', '-f', "$dir/app.dump", '-d', $old->connstr('app') ],
	'pg_dump -Fc of database app');

command_ok([ 'pg_dump', '-t', 'durable_steps.steps', '-f', "$dir/steps.sql", '-d', $old->connstr('app') ],
	'pg_dump -t durable_steps.steps');
my $steps_sql = slurp_file("$dir/steps.sql");
like($steps_sql, qr/^COPY durable_steps\.steps \(/m, 'pg_dump -t: the steps table\'s data');
like($steps_sql, qr/^bk\tpaid\tsql\t.*\talice\t/m, 'pg_dump -t: the step rows, owners by name');
unlike($steps_sql, qr/COPY durable_steps\.attempts/, 'pg_dump -t: only the table asked for');

command_ok([ 'pg_dumpall', '-f', "$dir/all.sql", '-d', $old->connstr('postgres') ], 'pg_dumpall');
my $all_sql = slurp_file("$dir/all.sql");
like($all_sql, qr/^CREATE ROLE carol;/m, 'pg_dumpall: the roles');
like($all_sql, qr/^COPY durable_steps\.attempts \(.*?^bk\tpaid\t1\tcompleted\t/ms,
	'pg_dumpall: the attempts');
like($all_sql, qr/^COPY durable_steps\.steps \(.*?^bk\tlater\tsql\t.*\tbob\t/ms, 'pg_dumpall: the steps');

# What must come back unchanged: every step but the two the new cluster goes on with, and the
# history of their attempts (times as epochs: the nodes need not share a TimeZone).
my $stable = q{
SELECT step_id, status, attempt, owner::text AS owner, error_code, result,
       extract(epoch FROM next_attempt_at)::text AS next_attempt_at_epoch
  FROM ds_steps WHERE step_id NOT IN ('soon', 'inflight') ORDER BY step_id};
my $history = q{
SELECT step_id, attempt, class, error_code, executor, role::text AS role,
       extract(epoch FROM started_at)::text AS started_at_epoch,
       extract(epoch FROM finished_at)::text AS finished_at_epoch
  FROM ds_attempts WHERE step_id NOT IN ('soon', 'inflight') ORDER BY step_id, attempt};
my $runs = q{SELECT run_id, owner::text AS owner, policy FROM ds_runs};
my $old_stable  = rows_of($old, 'app', $stable);
my $old_history = rows_of($old, 'app', $history);
my $old_runs    = rows_of($old, 'app', $runs);

############################################################################################
# The new cluster: the roles come first, in another order and after an extra role. Its worker
# serves database app, which does not exist until the restore.
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->append_conf('postgresql.conf', $conf . "app.site = 'restored'\n");
$new->start;
$new->safe_psql('postgres', q{
CREATE ROLE unrelated;
CREATE ROLE carol;
CREATE ROLE bob;
CREATE ROLE alice;
CREATE ROLE team;
GRANT team TO alice, bob, carol;
});
my $new_roles = role_oids($new);
my @oids = map { "$_ $old_roles->{$_} -> $new_roles->{$_}" } qw(alice bob carol);
ok((grep { $old_roles->{$_} ne $new_roles->{$_} } qw(alice bob carol)),
	"the roles' OIDs differ between the clusters (" . join(', ', @oids) . ')');
is($new->safe_psql('postgres', "SELECT count(*) FROM pg_roles WHERE oid = $dave_oid"),
	'0', "no role of the new cluster has the dropped role's OID $dave_oid");

# One transaction: the worker sees the extension only once everything is loaded.
$new->safe_psql('postgres', 'CREATE DATABASE app');
command_ok(
	[ 'pg_restore', '--single-transaction', '-d', $new->connstr('app'), "$dir/app.dump" ],
	'pg_restore --single-transaction into the new cluster');

is( $new->safe_psql('app',
		"SELECT count(*) FROM durable_steps.steps s WHERE s.owner::text = 'alice' AND s.owner::oid = 'alice'::regrole::oid"),
	'2', "new: alice's steps are owned by the new cluster's alice");
is_deeply(rows_of($new, 'app', $stable), $old_stable,
	'new: the finished, blocked and long-delayed steps, their owners by name and schedules, as they were');
is_deeply(rows_of($new, 'app', $history), $old_history, 'new: their attempt history, as it was');
is_deeply(rows_of($new, 'app', $runs), $old_runs, 'new: the run, its owner by name and its policy');

# Completed steps replay for the roles that own them; the ledger does not move.
is_deeply(call_step($new, 'alice', 'paid', $body{paid}),
	{ status => 'succeeded', attempt => 1, replayed => 'true' },
	'new: alice: "paid" replays');
is_deeply(call_step($new, 'alice', 'rejected', $body{rejected}),
	{ status => 'failed', attempt => 1, replayed => 'true' },
	'new: alice: "rejected" replays its failure');
is_deeply(call_step($new, 'bob', 'later', $body{later}),
	{ status => 'retrying', attempt => 1, replayed => 'true' },
	'new: bob: "later" is not due: the stored state');
is_deeply(call_step($new, 'bob', 'blocked', $body{blocked}),
	{ status => 'blocked', attempt => 1, replayed => 'true' },
	'new: bob: "blocked" waits for a person');
($rc, $out, $err) = $new->psql('app',
	"SET ROLE bob; SELECT * FROM ds_run_step('bk', 'paid', \$\$$body{paid}\$\$)");
like($err, qr/step bk\/paid belongs to another role/, "new: bob may not act on alice's step");

# The worker goes on with the steps that were due: "soon", and "inflight", whose running attempt
# is recorded as lost and retried.
ok( $new->poll_query_until(
		'app', q{SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps
		          WHERE step_id IN ('soon', 'inflight')},
		'inflight:succeeded,soon:succeeded'),
	'new: the worker finishes the retrying step and the one that was running at dump time');
is_deeply(
	rows_of($new, 'app',
		q{SELECT attempt, class, error_code, executor, role::text AS role FROM ds_attempts WHERE step_id = 'inflight' ORDER BY attempt}),
	[
		{ attempt => 1, class => 'retryable', error_code => 'DS002', executor => 'caller', role => 'carol' },
		{ attempt => 2, class => 'retryable', error_code => 'DS007', executor => 'worker', role => 'carol' },
		{ attempt => 3, class => 'completed', error_code => undef,   executor => 'worker', role => 'carol' }
	],
	'new: "inflight": the caller\'s attempt, the one running at dump time recorded as lost, the new worker\'s');
is( $new->safe_psql(
		'app', q{
SELECT bool_and(a.class = 'retryable' AND a.error_code IN ('DS002', 'DS007'))
              FILTER (WHERE a.attempt < s.attempt)
       AND bool_and(a.class = 'completed' AND a.executor = 'worker') FILTER (WHERE a.attempt = s.attempt)
       AND count(*) = s.attempt AND min(a.attempt) = 1 AND s.attempt >= 3
       AND (array_agg(a.executor || '|' || a.error_message ORDER BY a.attempt))[1] = 'caller|not on the primary'
  FROM ds_attempts a JOIN ds_steps s USING (run_id, step_id)
 WHERE step_id = 'soon' GROUP BY s.attempt}),
	't',
	'new: "soon": the old cluster\'s attempts, then one completed by the new worker');
is_deeply(
	rows_of($new, 'app', 'SELECT step, who, site FROM ledger ORDER BY step'),
	[
		{ step => 'inflight', who => 'carol', site => 'restored' },
		{ step => 'paid',     who => 'alice', site => 'primary' },
		{ step => 'soon',     who => 'carol', site => 'restored' }
	],
	'new: the ledger: "paid" ran once, in the old cluster; the two others once each, in the new one, as their owner');

# The dropped role's step: a bare OID for an owner. Made due, it fails closed.
is($new->safe_psql('app', "SELECT owner FROM ds_steps WHERE step_id = 'orphan'"),
	$dave_oid, 'new: the dropped role\'s step has its old OID for an owner');
$new->safe_psql('app',
	"UPDATE durable_steps.steps SET next_attempt_at = now() WHERE step_id = 'orphan'");
ok( $new->poll_query_until(
		'app', "SELECT status || '|' || error_code FROM ds_steps WHERE step_id = 'orphan'",
		'failed|42704'),
	'new: made due, it fails closed: the role does not exist');

############################################################################################
# A parallel restore (into a second database, which no worker serves) loads every attempt.
$new->safe_psql('postgres', 'CREATE DATABASE app2');
command_ok([ 'pg_restore', '-j', '2', '-d', $new->connstr('app2'), "$dir/app.dump" ],
	'pg_restore -j 2');
is_deeply(
	rows_of(
		$new, 'app2', q{
SELECT s.step_id, s.attempts AS attempts_started,
       (SELECT count(*) FROM ds_attempts a WHERE a.run_id = s.run_id AND a.step_id = s.step_id) AS attempts_shown
  FROM durable_steps.steps s
 WHERE s.attempts <>
       (SELECT count(*) FROM ds_attempts a WHERE a.run_id = s.run_id AND a.step_id = s.step_id)
 ORDER BY s.step_id}),
	[], 'pg_restore -j 2: each step shows every attempt it started (an attempt row, or its own row for a running or succeeded worker attempt)');
is_deeply(rows_of($new, 'app2', $history), $old_history, 'pg_restore -j 2: the history as it was');

$old->stop('fast');
$new->stop('fast');
done_testing();
