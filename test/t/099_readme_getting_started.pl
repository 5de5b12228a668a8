# README, "Getting started": the block runs as pasted, in one psql session, and answers what its
# comments show (each table row under a comment header; the statements' own rows, in order).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $readme = slurp_file("$FindBin::RealBin/../../README.md");
my ($block) = $readme =~ /^## Getting started\n.*?^```sql\n(.*?)^```/ms;
ok(defined $block, 'README has a Getting started block of SQL');

# the rows its comments show: a comment line with cells after a comment header with cells
my @expected;
my $in_table = 0;
for my $line (split /\n/, $block)
{
	if ($line =~ /^--(.*\|.*)$/)
	{
		push @expected, join('|', map { s/^\s+|\s+$//gr } split /\|/, $1) if $in_table;
		$in_table = 1;
	}
	else
	{
		$in_table = 0;
	}
}
cmp_ok(scalar @expected, '>=', 5, 'its comments show the rows of its answers');

my $node = worker_node('readme', "durable_steps.database = 'postgres'\n");
my ($rc, $out, $err) = $node->psql('postgres', $block,
	extra_params => [ '-v', 'ON_ERROR_STOP=1', '-A', '-t' ]);
is($rc, 0, 'the block runs as pasted');
is($err, '', 'without an error or a warning');

# the statements' rows, in order; psql prints them unaligned, one row a line
my @got = grep { /\|/ } split /\n/, $out;
is_deeply(\@got, \@expected, 'every row is the one its comment shows');

$node->stop;
done_testing();
