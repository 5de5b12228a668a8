# Copyright (c) durable_steps contributors
#
# Property: a step identity claimed in another transaction makes a second caller wait for it
# (docs/steps.md, "How a step behaves"); then the first caller's outcome decides. A committed
# claim is replayed by the waiter, with the first caller's result and without running the body;
# after a rollback, the claim is as if never made and the waiter executes the body itself.
#
# Sessions are DurableSteps::Session (test/perl): psql processes of our own. TAP 023 has nowait,
# 024 a caller that rolls back alone, 039 a failing body, 059 the replay cache.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;

my $node = claims_node('concurrent_claims');
my %nothing = (steps_in_view => 0, steps => 0, attempts => 0, effects => 0);
my %one_each = (steps_in_view => 1, steps => 1, attempts => 1, effects => 1);

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
	my $a = decode_row($sa->query_ok(claim_sql('t1')));
	is($a->{status}, 'succeeded', "$t: A's step succeeded");
	is($a->{replayed}, 'false', "$t: A executed the body (not replayed)");
	like($a->{result}, qr/^\d+$/, "$t: A's result is the effect id");
	is_deeply(claim_counts($node, 't1'), \%nothing,
		"$t: A's uncommitted claim and effect are invisible to others");

	my $ticket = $sb->send(claim_sql('t1'));
	wait_until_lock_waiting($bpid, "$t: B");
	is($node->safe_psql('postgres', "SELECT pg_blocking_pids($bpid)"),
		"{$apid}", "$t: B is blocked by A");
	ok(!$sb->finished($ticket), "$t: B has not returned while A is open");

	$sa->query_ok('COMMIT;');
	my ($out, $err) = $sb->wait($ticket);
	is($err, '', "$t: B raised no error");
	is_deeply(decode_row($out),
		{ status => 'succeeded', result => $a->{result}, attempt => 1, replayed => 'true' },
		"$t: B returns A's stored result with replayed = true");
	is_deeply(claim_counts($node, 't1'), \%one_each, "$t: one step, one attempt, one effect");
	is_deeply(claim_effects($node, 't1'), [ { id => $a->{result}, pid => $apid } ],
		"$t: the only effect is A's, with the returned id");
	is_deeply(
		rows_of($node, 'postgres', "SELECT attempt, class, backend_pid FROM ds_attempts WHERE run_id = 't1'"),
		[ { attempt => 1, class => 'completed', backend_pid => $apid } ],
		"$t: the one attempt was A's");
	is_deeply(decode_row($sb->query_ok(claim_sql('t1'))),
		{ status => 'succeeded', result => $a->{result}, attempt => 1, replayed => 'true' },
		"$t: a later call replays too");
	is_deeply(claim_counts($node, 't1'), \%one_each, "$t: the later call changed nothing");
}

############################################################################################
# 2. A claims the key and rolls back; the waiting B then executes the body itself.
{
	my $t = 'test 2 (waiter after rollback executes)';
	$sa->query_ok('BEGIN;');
	my $a = decode_row($sa->query_ok(claim_sql('t2')));
	is_deeply([ $a->{status}, $a->{replayed} ], [ 'succeeded', 'false' ], "$t: A executed the step");

	my $ticket = $sb->send(claim_sql('t2'));
	wait_until_lock_waiting($bpid, "$t: B");
	is($node->safe_psql('postgres', "SELECT pg_blocking_pids($bpid)"),
		"{$apid}", "$t: B is blocked by A");
	ok(!$sb->finished($ticket), "$t: B has not returned while A is open");

	$sa->query_ok('ROLLBACK;');
	my ($out, $err) = $sb->wait($ticket);
	is($err, '', "$t: B raised no error");
	my $b = decode_row($out);
	is_deeply({ status => $b->{status}, attempt => $b->{attempt}, replayed => $b->{replayed} },
		{ status => 'succeeded', attempt => 1, replayed => 'false' },
		"$t: B executed the body itself (attempt 1, replayed = false)");
	isnt($b->{result}, $a->{result}, "$t: B's result is not A's rolled-back one");
	is_deeply(claim_counts($node, 't2'), \%one_each, "$t: one step, one attempt, one effect");
	is_deeply(claim_effects($node, 't2'), [ { id => $b->{result}, pid => $bpid } ],
		"$t: the only effect is B's; A's rolled back");
	is_deeply(
		rows_of($node, 'postgres', "SELECT attempt, class, backend_pid FROM ds_attempts WHERE run_id = 't2'"),
		[ { attempt => 1, class => 'completed', backend_pid => $bpid } ],
		"$t: the one attempt is B's");
	is_deeply(decode_row($sa->query_ok(claim_sql('t2'))),
		{ status => 'succeeded', result => $b->{result}, attempt => 1, replayed => 'true' },
		"$t: A now replays B's result");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
