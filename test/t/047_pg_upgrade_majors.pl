# Copyright (c) durable_steps contributors
#
# pg_upgrade from one major to a newer one (README, "Backups": 16 to 18) keeps the extension's
# state: steps in every status that can be at rest (succeeded in a caller and in the worker,
# retrying and pending not yet due, blocked, failed permanently and exhausted, cancelled, HTTP
# steps succeeded, refused and uncertain, one running when the old server stopped), their
# attempt history, runs (succeeded, sleeping, waiting for an event), events, queue limits and the
# owners (two ordinary roles, by name and OID). Afterwards completed steps replay without running
# (no ledger row, no HTTP request), and the new worker carries on: a due retry and a due deferred
# step run, the attempt lost with the old server is recorded and retried, a pending HTTP step is
# sent once, the sleeping run wakes when its time has come and the waiting run when its event is
# emitted.
#
# The old cluster runs the install whose bin directory is DS_UPGRADE_OLD_BINDIR (scripts/test
# sets it to the PostgreSQL 16 it has just tested, with this same build of the extension), the
# new one the PostgreSQL on PATH. Each cluster is started twice:
#   old, worker on (one executor)  makes the steps and runs; stopped while an attempt runs;
#   old, max_workers = 0           makes the due work that only the new cluster may run;
#   pg_upgrade                     both clusters preloading the library, as in TAP 006;
#   new, max_workers = 0           the state compared column by column, the replays;
#   new, worker on                 the work carries on.
# Without a worker in the middle two phases nothing can move but what the test does, so no
# comparison races with an executor and no due step can run on the wrong side of the upgrade.

use strict;
use warnings;

use File::Basename qw(dirname);
use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use PostgreSQL::Version;
use Test::More;
use Time::HiRes qw(time);

my $old_bindir = $ENV{DS_UPGRADE_OLD_BINDIR} // '';
plan skip_all =>
  'DS_UPGRADE_OLD_BINDIR names no PostgreSQL 16 install (scripts/test sets it when the matrix runs 16 before 18)'
  if $old_bindir eq '';
$old_bindir =~ s{/+$}{};
my $old_version = PostgreSQL::Version->new(scalar qx{"$old_bindir/pg_config" --version});
die "$old_bindir/pg_config --version failed" if $? != 0;
my $new_version = PostgreSQL::Version->new(scalar qx{pg_config --version});
die "pg_config --version failed" if $? != 0;
plan skip_all =>
  "the PostgreSQL under test ($new_version) is not a newer major than DS_UPGRADE_OLD_BINDIR's ($old_version): nothing to upgrade"
  if $new_version->major <= $old_version->major;

my $conf = $DurableSteps::Test::preload;
my $json = JSON::PP->new->canonical->allow_nonref;

my $p = DurableSteps::Http::Provider->start(close => 1);

my $old = PostgreSQL::Test::Cluster->new('old', install_path => dirname($old_bindir));
# a fresh initdb (never a template of the newer major's), without data checksums like the new
# cluster below
$old->init(force_initdb => 1);
# One executor: the one whose attempt the stop interrupts is the only one that could record it
# lost (it does not, on its way out), and while that attempt runs no turn of a run is taken.
$old->append_conf('postgresql.conf', $conf . "durable_steps.max_workers = 1\n");
$old->start;
my $old_num = $old->safe_psql('postgres', q{SELECT current_setting('server_version_num')});
my $old_server = $old->safe_psql('postgres', q{SHOW server_version});

$old->safe_psql(
	'postgres', q{
CREATE ROLE alice;
CREATE ROLE bob;
CREATE EXTENSION durable_steps;
GRANT durable_steps_http TO alice;
-- every effect of a step is a row here, naming the role and the server that wrote it
CREATE TABLE ledger (
    id     serial PRIMARY KEY,
    tag    text NOT NULL,
    who    text NOT NULL DEFAULT current_user,
    server integer NOT NULL DEFAULT current_setting('server_version_num')::integer
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
SELECT ds_set_queue('slow', 1);
});

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

# ds_run_step of a step of %sql_step as its owner, the answer as a hash; $first adds the
# arguments only the first call passes
sub call_step
{
	my ($node, $step, $first) = @_;
	my $s = $sql_step{$step};
	my $args = $s->{args} ? ", $s->{args}" : '';
	$args .= $s->{first} // '' if $first;
	return decode_json(
		$node->safe_psql(
			'postgres', qq{SET ROLE $s->{role};
SELECT to_jsonb(r) FROM ds_run_step('up', '$step', \$body\$$s->{sql}\$body\$, '{}'$args) r}));
}

# the HTTP steps, all of run 'up-http' and alice's, against the fake provider (tag up-<step>)
my %http_step = (
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
	'after'   => { request => qq({"method": "POST", "url": "@{[$p->url('up-after')]}", "expect": "json"}) },);

sub call_http
{
	my ($node, $step) = @_;
	my $s = $http_step{$step};
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

sub run_field
{
	my ($node, $run, $expr) = @_;
	return $node->safe_psql('postgres', "SELECT $expr FROM ds_runs WHERE run_id = '$run'");
}

my $t = 'old';
ok( poll_until(
		$old, 'postgres',
		q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps worker') = 1
		     AND count(*) FILTER (WHERE backend_type = 'durable_steps http') = 1
		    FROM pg_stat_activity WHERE datname = 'postgres'}),
	"$t: an executor and the HTTP worker serve database postgres");

# steps in every status a step can rest in
my $r = call_step($old, 'paid', 1);
is("$r->{status} $r->{attempt}", 'succeeded 1', "$t: paid: succeeded in the caller");
$r = call_step($old, 'worked', 1);
is($r->{status}, 'pending', "$t: worked: deferred");
ok(poll_until($old, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'worked'}, 'succeeded'),
	"$t: worked: succeeded in the worker");
$r = call_step($old, 'later', 1);
is("$r->{status} $r->{attempt}", 'retrying 1', "$t: later: retrying in an hour");
$r = call_step($old, 'scheduled', 1);
is("$r->{status} $r->{attempt}", 'pending 0', "$t: scheduled: pending, due in an hour");
$r = call_step($old, 'fixed', 1);
is("$r->{status} $r->{error_class}", 'blocked correctable', "$t: fixed: blocked");
$r = call_step($old, 'declined', 1);
is("$r->{status} $r->{error_class} $r->{error_code}", 'failed permanent DS001', "$t: declined: failed permanently");
$r = call_step($old, 'exhausted', 1);
is($r->{status}, 'retrying', "$t: exhausted: attempt 1 failed");
ok( poll_until(
		$old, 'postgres',
		q{SELECT status || ' ' || error_class || ' ' || attempt FROM ds_steps WHERE step_id = 'exhausted'},
		'failed exhausted 2'),
	"$t: exhausted: attempt 2 in the worker failed too: exhausted");
$r = call_step($old, 'dropped', 1);
is($r->{status}, 'retrying', "$t: dropped: retrying");
is($old->safe_psql('postgres', q{SET ROLE alice; SELECT status FROM ds_cancel_step('up', 'dropped')}),
	'cancelled', "$t: dropped: cancelled");

# HTTP steps: one succeeded, one refused (400: blocked), one uncertain (a keyless POST whose
# connection was dropped after the provider charged)
for my $step (qw(charge unsure refused))
{
	is(call_http($old, $step)->{status}, 'pending', "$t: HTTP $step: stored");
}
is(settle_http($old, 'up-http', 'charge'),  'succeeded', "$t: HTTP charge: succeeded");
is(settle_http($old, 'up-http', 'refused'), 'blocked',   "$t: HTTP refused: blocked by the 400");
is(settle_http($old, 'up-http', 'unsure'),  'uncertain', "$t: HTTP unsure: uncertain");
is($p->charges('up-charge') . ' ' . $p->requests('up-charge'), '1 1', "$t: HTTP charge: sent once, charged once");
is($p->keys_seen('up-charge'), 'up-http:charge', "$t: HTTP charge: with its idempotency key");

# runs: one succeeded, one sleeping, one waiting for an event
$old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('short', '{}', 'done-run')});
ok(poll_until($old, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'done-run'}, 'succeeded'),
	"$t: done-run: succeeded");
# The sleep must not end before the one executor is taken by the step below, whose attempt holds
# it until the server stops (within moments); the phases after that have no worker. Should the
# sleep end first, the run goes on in the old cluster, and the next phase says so.
$old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('napper', '{"for": "10 s"}', 'nap-run')});
$old->safe_psql('postgres', q{SET ROLE bob; SELECT ds_start_run('shipper', '{}', 'ship-run')});
ok( poll_until(
		$old, 'postgres',
		q{SELECT string_agg(run_id || ' ' || status || ' ' || current_step || ' ' || coalesce(wait_event, '-'), ', ' ORDER BY run_id)
		    FROM ds_runs WHERE run_id IN ('nap-run', 'ship-run')},
		'nap-run waiting nap -, ship-run waiting shipped shipped:ship-run'),
	"$t: nap-run sleeps, ship-run waits for its event");

# the step whose attempt is running when the server stops: its executor is stopped with it
$r = call_step($old, 'in-flight', 1);
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
is( run_field($old, 'nap-run',
		q{status || ' ' || current_step || ' ' || (SELECT count(*) FROM ds_steps WHERE run_id = 'nap-run' AND step_id = 'after')}),
	'waiting nap 0', "$t: nap-run: still asleep, its step after the sleep not begun");
$r = call_step($old, 'due-retry', 1);
is("$r->{status} $r->{attempt} $r->{error_code}", 'retrying 1 P0001',
	"$t: due-retry: attempt 1 failed, its retry due in a second");
$r = call_step($old, 'due-deferred', 1);
is("$r->{status} $r->{attempt}", 'pending 0', "$t: due-deferred: pending, due now");
is(call_http($old, 'after')->{status}, 'pending', "$t: HTTP after: stored, due now");
is($old->safe_psql('postgres', q{SET ROLE alice; SELECT ds_emit_event('before-the-upgrade', '{"n": 1}')}),
	't', "$t: alice emits an event no run waits for yet");

# The state, as the new cluster must find it: every column of the extension's tables, the
# attempt history as the view shows it (it also reads the attempts recorded in step rows), the
# ledger. Owners and roles by name (to_jsonb of a regrole) and by OID.
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
	'ledger' => [ q{ledger},               q{id::text}, q{'{}'::jsonb} ],);

sub snapshot
{
	my ($node, $what) = @_;
	my ($from, $key, $extra) = @{ $state{$what} };
	return decode_json(
		$node->safe_psql(
			'postgres', qq{SET TimeZone = 'UTC';
SELECT coalesce(jsonb_object_agg($key, to_jsonb(t) || $extra), '{}') FROM $from t}));
}

my %before = map { $_ => snapshot($old, $_) } keys %state;
is( join(', ', sort keys %{ { map { $_->{status} => 1 } values %{ $before{step} } } }),
	'blocked, cancelled, failed, pending, retrying, running, succeeded, uncertain',
	"$t: the steps to upgrade are in every status");
is( join(', ', sort keys %{ { map { $_->{owner} => 1 } values %{ $before{step} } } }),
	'alice, bob', "$t: owned by alice and bob");
# What the provider was asked (its connection count also counts the test's own /counts
# requests). The provider is an argument: a named sub that closed over $p would keep it to the
# global destruction, whose kill of the provider's process then sets the test's exit status.
sub provider_requests
{
	my ($provider) = @_;
	my $c = $provider->counts;
	return $json->encode({ map { $_ => $c->{$_} } qw(requests charges keys) });
}
my $requests_before = provider_requests($p);
$old->stop;

# pg_upgrade
my $new = PostgreSQL::Test::Cluster->new('new');
# initdb of 18 and later turns data checksums on by default; the old cluster has none
$new->init(force_initdb => 1, $new_version->major >= 18 ? (extra => ['--no-data-checksums']) : ());
$new->append_conf('postgresql.conf', $conf . "durable_steps.max_workers = 0\n");
my $new_bindir = $new->config_data('--bindir');
my $new_num;
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

# The new cluster without a worker: the state as it was, the replays
$t = 'new without a worker';
$new->start;
$new_num = $new->safe_psql('postgres', q{SELECT current_setting('server_version_num')});
note("upgraded from PostgreSQL $old_server to PostgreSQL "
	  . $new->safe_psql('postgres', 'SHOW server_version'));
is($new->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'durable_steps'}),
	'0.1.0', "$t: the extension is there");
is( $new->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'}),
	'0', "$t: no durable_steps process runs");

my %plural = (step => 'steps', attempt => 'attempts', run => 'runs', event => 'events',
	queue => 'queue limits', ledger => 'ledger rows');
my %upgraded;
for my $what (qw(step attempt run event queue ledger))
{
	my ($was, $is) = ($before{$what}, snapshot($new, $what));
	$upgraded{$what} = $is;
	is(join(', ', sort keys %$is), join(', ', sort keys %$was), "$t: the same $plural{$what}");
	for my $key (sort keys %$was)
	{
		for my $column (sort keys %{ $was->{$key} })
		{
			is($json->encode($is->{$key}{$column}), $json->encode($was->{$key}{$column}),
				"$t: $what $key: $column as before");
		}
	}
}

# One test per row: the row $key of $what is in $is as it was in $was, every column; the
# columns that differ are shown.
sub unchanged
{
	my ($name, $what, $key, $was, $is) = @_;
	my @differ = grep { $json->encode($is->{$key}{$_}) ne $json->encode($was->{$key}{$_}) }
	  sort keys %{ { %{ $was->{$key} // {} }, %{ $is->{$key} // {} } } };
	ok(!@differ, $name)
	  or diag(join("\n",
			map { "$what $key: $_ was " . $json->encode($was->{$key}{$_}) . ', is ' . $json->encode($is->{$key}{$_}) }
			  @differ));
}

# completed and stopped steps answer from their stored state: nothing runs, nothing is sent
my %replay = (
	'paid'      => 'succeeded 1',
	'worked'    => 'succeeded 1',
	'later'     => 'retrying 1',
	'scheduled' => 'pending 0',
	'fixed'     => 'blocked 1',
	'declined'  => 'failed 1',
	'exhausted' => 'failed 2',
	'dropped'   => 'cancelled 1',);
for my $step (sort keys %replay)
{
	$r = call_step($new, $step);
	is("$r->{status} $r->{attempt}", $replay{$step}, "$t: $step: the stored state answers");
	is($r->{replayed}, JSON::PP::true, "$t: $step: replayed");
	is($json->encode($r->{result}), $json->encode($before{step}{"up/$step"}{result}),
		"$t: $step: with the stored result");
}
my %http_replay = ('charge' => 'succeeded 1', 'refused' => 'blocked 1', 'unsure' => 'uncertain 1');
for my $step (sort keys %http_replay)
{
	$r = call_http($new, $step);
	is("$r->{status} $r->{attempt}", $http_replay{$step}, "$t: HTTP $step: the stored state answers");
	is($r->{replayed}, JSON::PP::true, "$t: HTTP $step: replayed");
}
is(call_http($new, 'charge')->{result}{body}{charge}, 1, "$t: HTTP charge: the stored response");
for my $what (qw(step attempt ledger))
{
	my $is = snapshot($new, $what);
	is(join(', ', sort keys %$is), join(', ', sort keys %{ $upgraded{$what} }),
		"$t: the replays added or removed none of the $plural{$what}");
	unchanged("$t: $what $_: unchanged by the replays", $what, $_, $upgraded{$what}, $is)
	  for sort keys %{ $upgraded{$what} };
}
is(provider_requests($p), $requests_before, "$t: the provider got no request");
$new->stop;

# The new cluster with its worker
$t = 'new';
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
is(history($new, 'up', 'due-retry'), '1|retryable|P0001|caller 2|completed||worker',
	"$t: due-retry: attempt 1 before the upgrade, attempt 2 by the new worker");
is(history($new, 'up', 'due-deferred'), '1|completed||worker', "$t: due-deferred: attempt 1 by the new worker");
is(history($new, 'up', 'in-flight'), '1|retryable|DS007|worker 2|completed||worker',
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
is($p->charges('up-after') . ' ' . $p->requests('up-after'), '1 1', "$t: HTTP after: sent once, charged once");
is($p->keys_seen('up-after'), 'up-http:after', "$t: HTTP after: with its idempotency key");
is( $new->safe_psql('postgres', q{SELECT executor || ' ' || role FROM ds_attempts WHERE run_id = 'up-http' AND step_id = 'after'}),
	'worker alice', "$t: HTTP after: sent by the new HTTP worker, as alice");

# the sleeping run wakes when its time has come, and goes on on the new server
ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'nap-run'}, 'succeeded'),
	"$t: nap-run: woke and succeeded");
is(run_field($new, 'nap-run', q{output->>'before'}), $old_num, "$t: nap-run: the step before the sleep ran on the old server");
is(run_field($new, 'nap-run', q{output->>'after'}),  $new_num, "$t: nap-run: the step after it on the new one");
is( $new->safe_psql(
		'postgres', q{
SELECT a.started_at >= (n.result->>'until')::timestamptz
  FROM ds_attempts a, ds_steps n
 WHERE a.run_id = 'nap-run' AND a.step_id = 'after' AND n.run_id = 'nap-run' AND n.step_id = 'nap'}),
	't', "$t: nap-run: not before the wake-up time recorded before the upgrade");

# the run waiting for its event waits on, and the event wakes it
is(run_field($new, 'ship-run', q{status || ' ' || wait_event}), 'waiting shipped:ship-run',
	"$t: ship-run: still waits for its event");
is($new->safe_psql('postgres', q{SET ROLE bob; SELECT ds_emit_event('shipped:ship-run', '{"carrier": "DHL"}')}),
	't', "$t: bob emits ship-run's event");
ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'ship-run'}, 'succeeded'),
	"$t: ship-run: woken, succeeded");
is(run_field($new, 'ship-run', q{output->'shipment'}), '{"carrier": "DHL"}', "$t: ship-run: with the event's payload");
is(run_field($new, 'ship-run', q{output->>'reserve'}), $old_num, "$t: ship-run: reserved on the old server");
is(run_field($new, 'ship-run', q{output->>'confirm'}), $new_num, "$t: ship-run: confirmed on the new one");

# an event emitted before the upgrade is seen; the first emit still wins
$new->safe_psql('postgres', q{SET ROLE alice; SELECT ds_start_run('waiter', '{"event": "before-the-upgrade"}', 'late-run')});
ok(poll_until($new, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'late-run'}, 'succeeded'),
	"$t: late-run: waits for the event emitted before the upgrade, succeeds");
is(run_field($new, 'late-run', 'output'), '{"n": 1}', "$t: late-run: with its payload");
is($new->safe_psql('postgres', q{SET ROLE alice; SELECT ds_emit_event('before-the-upgrade', '{"n": 2}')}),
	'f', "$t: emitted again, the event keeps its first payload");

# the succeeded run is started again only in name
is( $new->safe_psql('postgres', q{SET ROLE alice; SELECT status || ' ' || created FROM ds_start_run('short', '{}', 'done-run')}),
	'succeeded false', "$t: done-run: started again, the existing run answers");

# the blocked step, re-armed with its correction, is run by the new worker, as bob
is($new->safe_psql('postgres', q{SET ROLE bob; SELECT status FROM ds_retry_step('up', 'fixed', '{"ok": true}')}),
	'pending', "$t: fixed: bob re-arms it");
ok(poll_until($new, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'up' AND step_id = 'fixed'}, 'succeeded'),
	"$t: fixed: the new worker runs it");
is(history($new, 'up', 'fixed'), '1|correctable|DS003|caller 2|completed||worker',
	"$t: fixed: attempt 2 after the one before the upgrade");

# the uncertain HTTP step is resolved by alice: an attempt of its own, nothing sent
is( $new->safe_psql(
		'postgres', q{SET ROLE alice;
SELECT status || ' ' || attempt FROM ds_resolve_step('up-http', 'unsure', 'succeeded', '{"status": 200, "body": {"id": "found"}}')}),
	'succeeded 2', "$t: HTTP unsure: resolved");
is(history($new, 'up-http', 'unsure'), '1|uncertain|DS012|worker 2|completed|00000|operator',
	"$t: HTTP unsure: the resolution is attempt 2");
is( join(' ', map { $p->requests("up-$_") } qw(charge unsure refused)),
	'1 1 1', "$t: the HTTP steps that ended before the upgrade were never sent again");

# the steps nobody touched are as they were, whatever the new worker did
my $steps_now = snapshot($new, 'step');
unchanged("$t: $_: untouched by the new worker", 'step', $_, $upgraded{step}, $steps_now)
  for map { "up/$_" } qw(later scheduled declined exhausted dropped);
is(history($new, 'up-http', 'refused'), '1|correctable|DS010|worker', "$t: HTTP refused: still blocked, not sent again");

# every effect once, each on the server it belongs to
my %effects = (
	'paid'         => "alice $old_num",
	'worked'       => "alice $old_num",
	'done:one'     => "alice $old_num",
	'nap:before'   => "alice $old_num",
	'ship:reserve' => "bob $old_num",
	'due-retry'    => "bob $new_num",
	'due-deferred' => "alice $new_num",
	'in-flight'    => "alice $new_num",
	'nap:after'    => "alice $new_num",
	'ship:confirm' => "bob $new_num",
	'fixed'        => "bob $new_num",);
my %ledger = map { my ($tag, $rest) = split /\|/, $_, 2; ($tag => $rest) } split /\n/,
  $new->safe_psql('postgres',
	q{SELECT tag || '|' || count(*) || ' ' || string_agg(who || ' ' || server, ', ') FROM ledger GROUP BY tag ORDER BY tag});
is(join(', ', sort keys %ledger), join(', ', sort keys %effects), "$t: the ledger holds the effects of the succeeded steps");
for my $tag (sort keys %effects)
{
	my ($who, $server) = split / /, $effects{$tag};
	is($ledger{$tag}, "1 $effects{$tag}", "$t: ledger: $tag written once, by $who, on server $server");
}

unlike(slurp_file($old->logfile), $crash_re, 'no process of the old server crashed');
unlike(slurp_file($new->logfile), $crash_re, 'no process of the new server crashed');
$new->stop;
done_testing();
