# Copyright (c) durable_steps contributors
#
# Property: after pg_upgrade to a newer major (docs/backups.md), the steps that ended or wait
# answer from their stored state: a call of each SQL step (succeeded, retrying, pending, blocked,
# failed, exhausted, cancelled) and of each HTTP step (succeeded, blocked, uncertain) replays it
# with its stored status, attempt and result; nothing runs (no step, attempt or ledger row is
# added or changed) and nothing is sent to the provider.
#
# The scenario is DurableSteps::Upgrade's (test/perl/DurableSteps/Test.pm); the new cluster runs
# without a worker here. TAP 047 has the state the upgrade keeps, 064 how the new worker carries
# on.

use strict;
use warnings;

use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Http;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $json = JSON::PP->new->canonical->allow_nonref;
my $up = DurableSteps::Upgrade->prepare(newest_only => 1);
my $new = $up->{new};
my %upgraded = map { $_ => $up->snapshot($new, $_) } qw(step attempt ledger);

my $t = 'new without a worker';
# completed and stopped steps answer from their stored state: nothing runs, nothing is sent
my %replay = (
	'paid'      => { status => 'succeeded', attempt => 1 },
	'worked'    => { status => 'succeeded', attempt => 1 },
	'later'     => { status => 'retrying',  attempt => 1 },
	'scheduled' => { status => 'pending',   attempt => 0 },
	'fixed'     => { status => 'blocked',   attempt => 1 },
	'declined'  => { status => 'failed',    attempt => 1 },
	'exhausted' => { status => 'failed',    attempt => 2 },
	'dropped'   => { status => 'cancelled', attempt => 1 },);
for my $step (sort keys %replay)
{
	my $r = $up->call_step($new, $step);
	is_deeply(fields($r, qw(status attempt)), $replay{$step}, "$t: $step: the stored state answers");
	is($r->{replayed}, JSON::PP::true, "$t: $step: replayed");
	is($json->encode($r->{result}), $json->encode($up->{before}{step}{"up/$step"}{result}),
		"$t: $step: with the stored result");
}
my %http_replay = (
	'charge'  => { status => 'succeeded', attempt => 1 },
	'refused' => { status => 'blocked',   attempt => 1 },
	'unsure'  => { status => 'uncertain', attempt => 1 },);
for my $step (sort keys %http_replay)
{
	my $r = $up->call_http($new, $step);
	is_deeply(fields($r, qw(status attempt)), $http_replay{$step}, "$t: HTTP $step: the stored state answers");
	is($r->{replayed}, JSON::PP::true, "$t: HTTP $step: replayed");
}
is($up->call_http($new, 'charge')->{result}{body}{charge}, 1, "$t: HTTP charge: the stored response");
for my $what (qw(step attempt ledger))
{
	my $is = $up->snapshot($new, $what);
	is_deeply([ sort keys %$is ], [ sort keys %{ $upgraded{$what} } ],
		"$t: the replays added or removed none of the $DurableSteps::Upgrade::plural{$what}");
	$up->unchanged("$t: $what $_: unchanged by the replays", $what, $_, $upgraded{$what}, $is)
	  for sort keys %{ $upgraded{$what} };
}
is_deeply($up->provider_requests, $up->{requests_before}, "$t: the provider got no request");

$up->finish;
done_testing();
