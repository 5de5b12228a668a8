# Copyright (c) durable_steps contributors
#
# Property: pg_upgrade from one major to a newer one (docs/backups.md: 16 to 18) keeps the
# extension's state, every column of every row: steps in every status that can be at rest,
# their attempt history, runs (succeeded, sleeping, waiting for an event), events, queue limits,
# the owners (two ordinary roles, by name and OID) and the effects' ledger.
#
# The scenario is DurableSteps::Upgrade's (test/perl/DurableSteps/Test.pm): the old cluster with
# its worker makes the steps and runs and is stopped while an attempt runs; then, without a
# worker, it makes the due work only the new cluster may run; pg_upgrade; the new cluster starts
# without a worker, so that nothing moves while the state is compared. TAP 046 has what the stored
# steps answer afterwards, 064 how the new worker carries on.

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
my $up = DurableSteps::Upgrade->prepare;
my $new = $up->{new};

my $t = 'new without a worker';
is( $new->safe_psql(
		'postgres', q{SELECT extversion = default_version FROM pg_extension, pg_available_extensions
		               WHERE extname = 'durable_steps' AND name = extname}),
	't', "$t: the extension is there, at this release's version");
is( $new->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'}),
	'0', "$t: no durable_steps process runs");

for my $what (qw(step attempt run event queue ledger))
{
	my ($was, $is) = ($up->{before}{$what}, $up->snapshot($new, $what));
	is_deeply([ sort keys %$is ], [ sort keys %$was ], "$t: the same $DurableSteps::Upgrade::plural{$what}");
	for my $key (sort keys %$was)
	{
		for my $column (sort keys %{ $was->{$key} })
		{
			is($json->encode($is->{$key}{$column}), $json->encode($was->{$key}{$column}),
				"$t: $what $key: $column as before");
		}
	}
}

$up->finish;
done_testing();
