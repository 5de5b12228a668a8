# Property: a step claimed by a caller that rolls back is as if never made (docs/steps.md, "How
# a step behaves"). After a ROLLBACK, or a ROLLBACK TO SAVEPOINT, there is no step, no attempt
# and no effect, and the claim ended with it: the next call, from another session (even with
# nowait) or from the same transaction, executes the body again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;

my $node = claims_node('rolled_back_caller');
my %nothing = (steps_in_view => 0, steps => 0, attempts => 0, effects => 0);
my %one_each = (steps_in_view => 1, steps => 1, attempts => 1, effects => 1);

my $sa = DurableSteps::Session->new($node, 'A');
my $sb = DurableSteps::Session->new($node, 'B');
my ($apid, $bpid) = ($sa->pid, $sb->pid);

############################################################################################
# 4. A rolled-back caller leaves no step, no attempt and no effect; a new call executes.
{
	my $t = 'test 4 (rolled-back caller)';
	my ($out, $err) = $sa->query("BEGIN;\n" . claim_sql('t4') . "\nROLLBACK;");
	is($err, '', "$t: no error");
	my $a = decode_row($out);
	is_deeply([ $a->{status}, $a->{attempt}, $a->{replayed} ], [ 'succeeded', 1, 'false' ],
		"$t: the step ran inside the transaction");
	like($a->{result}, qr/^\d+$/, "$t: its result is the effect id");
	is_deeply(claim_counts($node, 't4'), \%nothing, "$t: after ROLLBACK no step, no attempt, no effect");

	# the claim ended with the transaction: another session may take it even with nowait
	($out, $err) = $sb->query(claim_sql('t4', nowait => 1));
	is($err, '', "$t: a new caller is not refused");
	my $b = decode_row($out);
	is_deeply([ $b->{status}, $b->{attempt}, $b->{replayed} ], [ 'succeeded', 1, 'false' ],
		"$t: the new call executes the body (replayed = false)");
	is_deeply(claim_counts($node, 't4'), \%one_each, "$t: now one step, one attempt, one effect");
	is_deeply(claim_effects($node, 't4'), [ { id => $b->{result}, pid => $bpid } ],
		"$t: the effect is the new caller's");

	# the same within a transaction, by a savepoint
	($out, $err) = $sa->query(
		"BEGIN;\nSAVEPOINT sp;\n" . claim_sql('t4s') . "\nROLLBACK TO SAVEPOINT sp;
SELECT count(*) FROM ds_steps WHERE run_id = 't4s';
SELECT count(*) FROM effects WHERE k = 't4s';\n" . claim_sql('t4s') . "\nCOMMIT;");
	is($err, '', "$t: savepoint: no error");
	my @lines = split /\n/, $out;
	is(scalar(@lines), 4, "$t: savepoint: four result lines");
	my ($first, $second) = (decode_row($lines[0]), decode_row($lines[3]));
	is_deeply([ $first->{status}, $first->{attempt}, $first->{replayed} ], [ 'succeeded', 1, 'false' ],
		"$t: savepoint: first call executed");
	like($first->{result}, qr/^\d+$/, "$t: savepoint: its result is the effect id");
	is($lines[1], '0', "$t: savepoint: no step row after ROLLBACK TO SAVEPOINT");
	is($lines[2], '0', "$t: savepoint: no effect after ROLLBACK TO SAVEPOINT");
	is_deeply([ $second->{status}, $second->{attempt}, $second->{replayed} ], [ 'succeeded', 1, 'false' ],
		"$t: savepoint: the call after the rollback executes again (replayed = false)");
	like($second->{result}, qr/^\d+$/, "$t: savepoint: its result is the effect id too");
	is_deeply(claim_counts($node, 't4s'), \%one_each,
		"$t: savepoint: one step, one attempt, one effect committed");
	is_deeply(claim_effects($node, 't4s'), [ { id => $second->{result}, pid => $apid } ],
		"$t: savepoint: the effect is the second execution's");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
