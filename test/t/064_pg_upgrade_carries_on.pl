# Copyright (c) durable_steps contributors
#
# Property: after pg_upgrade to a newer major (docs/backups.md), the new worker carries on the
# work left before the upgrade, and every effect happens exactly once, on the server it belongs
# to. A due retry and a due deferred step run; the attempt the old server stopped is recorded as
# lost (DS007) and retried; a pending HTTP step is sent once; the sleeping run wakes when its
# time has come and the waiting run when its event is emitted; an event emitted before the
# upgrade is seen; a blocked step re-armed runs; an uncertain HTTP step is resolved; what ended
# before the upgrade is neither run nor sent again.
#
# The scenario is DurableSteps::Upgrade's (test/perl/DurableSteps/Test.pm). TAP 047 has the state
# the upgrade keeps, 046 what the stored steps answer before the worker starts.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Http;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $up = DurableSteps::Upgrade->prepare(newest_only => 1);
my ($new, $p, $old_num, $new_num) = @{$up}{qw(new p old_num new_num)};
# the steps as upgraded, before any worker of the new cluster ran
my $steps_upgraded = $up->snapshot($new, 'step');
$new->stop;

sub run_row
{
	my ($run, $columns) = @_;
	return row_of($new, 'postgres', "SELECT $columns FROM ds_runs WHERE run_id = '$run'");
}

# The new cluster with its worker
my $t = 'new';
$new->append_conf('postgresql.conf', "durable_steps.max_workers = 2\n");
$new->start;
ok( poll_until(
		$new, 'postgres',
		q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps worker') = 2
		     AND count(*) FILTER (WHERE backend_type = 'durable_steps http') = 1
		    FROM pg_stat_activity WHERE datname = 'postgres'}),
	"$t: two executors and the HTTP worker serve database postgres");

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
is(settle_http($new, 'up-http', 'after'), 'succeeded', "$t: HTTP after: succeeded");
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
	run_row('nap-run', q{output->>'before' AS before_the_sleep, output->>'after' AS after_the_sleep}),
	{ before_the_sleep => $old_num, after_the_sleep => $new_num },
	"$t: nap-run: the step before the sleep ran on the old server, the step after it on the new one");
is( $new->safe_psql(
		'postgres', q{
SELECT a.started_at >= (n.result->>'until')::timestamptz
  FROM ds_attempts a, ds_steps n
 WHERE a.run_id = 'nap-run' AND a.step_id = 'after' AND n.run_id = 'nap-run' AND n.step_id = 'nap'}),
	't', "$t: nap-run: not before the wake-up time recorded before the upgrade");

# the run waiting for its event waits on, and the event wakes it
is_deeply(run_row('ship-run', 'status, wait_event'), { status => 'waiting', wait_event => 'shipped:ship-run' },
	"$t: ship-run: still waits for its event");
is($new->safe_psql('postgres', q{SET ROLE bob; SELECT ds_emit_event('shipped:ship-run', '{"carrier": "DHL"}')}),
	't', "$t: bob emits ship-run's event");
ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ship-run'}, 'succeeded'),
	"$t: ship-run: woken, succeeded");
is_deeply(
	run_row('ship-run', q{output->'shipment' AS shipment, output->>'reserve' AS reserve, output->>'confirm' AS confirm}),
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
my $steps_now = $up->snapshot($new, 'step');
$up->unchanged("$t: $_: untouched by the new worker", 'step', $_, $steps_upgraded, $steps_now)
  for map { "up/$_" } qw(later scheduled declined exhausted dropped);
is_deeply(attempts_of($new, 'up-http', 'refused'),
	[ { attempt => 1, class => 'correctable', error_code => 'DS010', executor => 'worker' } ],
	"$t: HTTP refused: still blocked, not sent again");

# every effect once, each on the server it belongs to
my %effects = (
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

$up->finish;
done_testing();
