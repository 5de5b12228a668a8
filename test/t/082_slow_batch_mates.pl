# A slow step does not hold its batch-mates (docs/worker.md, "Claim sizes"): three deferred slow
# steps due at one instant in a fresh queue, with two executors, are claimed one at a time while
# their pace is not known, so that both executors run them at once: no executor claims a second
# of them before its first finished, and the third starts as soon as either executor is free --
# with 4-second steps, all three end about 8 s after they were due, not 12 (4 s: time enough for
# the second executor to claim while the first runs, even on a loaded machine).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('slow_batch_mates',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 2\n");
$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');
ok(executors_running($node, 2), 'two executors run');

$node->safe_psql('postgres', q{
SELECT ds_run_step('slow', 's' || i, 'SELECT pg_sleep(4)', queue => 'reports',
                   run_at => now() + interval '1 s')
  FROM generate_series(1, 3) i;
});
ok(poll_until($node, 'postgres',
		q{SELECT count(*) = 3 FROM ds_steps WHERE run_id = 'slow' AND status = 'succeeded'}),
	'the three steps succeeded');

# each attempt: its executor, when it was claimed and when it finished
my $rows = $node->safe_psql('postgres', q{
SELECT backend_pid, extract(epoch FROM claimed_at), extract(epoch FROM finished_at)
  FROM ds_attempts WHERE run_id = 'slow' ORDER BY claimed_at});
my @att = map { [ split /\|/ ] } split /\n/, $rows;
is(scalar @att, 3, 'one attempt each');
my %pids = map { $_->[0] => 1 } @att;
is(scalar keys %pids, 2, 'both executors ran some of them');
# an executor that held two at once would have claimed its second before its first finished
my $overlap = 0;
for my $i (0 .. $#att)
{
	for my $j ($i + 1 .. $#att)
	{
		$overlap++ if $att[$i][0] == $att[$j][0] && $att[$j][1] < $att[$i][2];
	}
}
is($overlap, 0, 'no executor claimed a second of them before its first finished');
# the first two ran side by side: the second was claimed before the first finished
cmp_ok($att[1][1], '<', $att[0][2], 'the first two ran at once, in the two executors');

$node->stop;
done_testing();
