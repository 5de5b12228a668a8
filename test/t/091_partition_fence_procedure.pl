# Copyright (c) durable_steps contributors
#
# Property (docs/partitions.md, "Moving a partition"): nothing written after a partition's fence
# belongs to it, whatever settings the writer's session began with. A backend reads the
# configuration file only between client statements, so a procedure that commits in a loop
# keeps the partitions it began with: before the partitions in force were shared, such a
# procedure went on storing steps of the fenced partition after its export -- steps then on
# neither server. Here a procedure stores a step of partition 1 and commits, over and over,
# across the fence: the export waits for the transaction it may still write in, the procedure's
# next step is refused with DS201, and every step of partition 1 that committed is in the export.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = worker_node('fence_procedure',
	"durable_steps.partition_count = 2\ndurable_steps.partitions = '0,1'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
-- a run id of each partition
CREATE TABLE ids AS
SELECT DISTINCT ON (ds_partition_of('r' || i)) ds_partition_of('r' || i) AS p, 'r' || i AS run_id
  FROM generate_series(1, 100) i ORDER BY ds_partition_of('r' || i), i;
-- stores a deferred step of partition 1 (due in an hour: no worker runs it) and commits, every
-- 20 ms, up to 1,000 times; the error that ends it is the procedure's outcome
CREATE PROCEDURE writer() LANGUAGE plpgsql AS $$
DECLARE
    v_run text := (SELECT run_id FROM ids WHERE p = 1);
BEGIN
    FOR i IN 1 .. 1000 LOOP
        PERFORM ds_run_step(v_run, 'w' || i, 'SELECT 1', defer => true,
                            run_at => now() + interval '1 hour');
        COMMIT;
        PERFORM pg_sleep(0.02);
    END LOOP;
END $$;
});
my $run = $node->safe_psql('postgres', 'SELECT run_id FROM ids WHERE p = 1');
my $steps = qq{SELECT count(*) FROM ds_steps WHERE run_id = '$run'};

# Waits, feeding the writer's session, until partition 1 has at least $n steps; true then.
sub wait_for_steps
{
	my ($session, $ticket, $n) = @_;
	for (my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default; time() < $deadline;)
	{
		return 1 if $node->safe_psql('postgres', $steps) >= $n;
		return 0 if $session->finished($ticket);
		usleep(20_000);
	}
	return 0;
}

# the procedure writes, committing, before the fence
my $writer = DurableSteps::Session->new($node, 'writer');
my $call = $writer->send('CALL writer();');
ok(wait_for_steps($writer, $call, 5), 'the procedure stores steps of partition 1 and commits them');

# the fence: partition 1 is no longer this server's
$node->safe_psql('postgres', q{ALTER SYSTEM SET durable_steps.partitions = '0'});
$node->reload;

# without track_activities no backend shows when its transaction began: the export refuses
my ($rc0, $out0, $err0) = $node->psql('postgres', q{SET track_activities = off; SELECT count(*) FROM ds_partition_export(1)});
like($err0, qr/ds_partition_export needs track_activities/, 'the export refuses without track_activities');

# The export refuses while a transaction open since the fence may still write the partition; it
# succeeds once none can, and then nothing more of partition 1 commits.
my ($exported, $refusals, $err) = (undef, 0, '');
for (my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default; time() < $deadline;)
{
	my ($rc, $out);
	($rc, $out, $err) = $node->psql('postgres',
		q{SELECT count(*) FILTER (WHERE line->>'table' = 'steps') FROM ds_partition_export(1)});
	if ($rc == 0)
	{
		$exported = $out;
		last;
	}
	die "the export failed otherwise than DS409: $err" unless $err =~ /transactions open since before the fence|worker processes have not taken the fence/;
	$refusals++;
	usleep(20_000);
}
ok(defined $exported, 'the export succeeds') or diag("last error: $err");
note("the export was refused $refusals times first");

my ($out, $perr) = $writer->wait($call);
like($perr, qr/DS201: run \Q$run\E belongs to partition 1, which this server no longer owns/,
	'the procedure\'s next step after the fence is refused with DS201: its session began before the reload');
like($perr, qr/A reload since this statement began fenced it/, '... saying why');
$writer->quit;

my $committed = $node->safe_psql('postgres', $steps);
cmp_ok($committed, '>=', 5, "the procedure committed $committed steps before it was refused");
is($exported, $committed, 'every step of partition 1 that committed is in the export');
# a new session, with the new settings, is refused too, and nothing of partition 1 changed
my ($rc) = $node->psql('postgres', qq{SELECT ds_run_step('$run', 'late', 'SELECT 1', defer => true)});
isnt($rc, 0, 'a new session\'s step of partition 1 is refused');
is($node->safe_psql('postgres', $steps), $committed, 'nothing of partition 1 was written after the export');

# the partition, owned again, is written again by a session that began before that reload
my $again = DurableSteps::Session->new($node, 'again');
$again->query_ok('SELECT 1;');
$node->safe_psql('postgres', q{ALTER SYSTEM SET durable_steps.partitions = '0,1'});
$node->reload;
ok( poll_until(
		$node, 'postgres', qq{SELECT status FROM ds_run_step('$run', 'owned-again', 'SELECT 1', defer => true)},
		'pending'),
	'owned again: a new session stores a step of partition 1');
is( $again->query_ok(qq{SELECT status FROM ds_run_step('$run', 'owned-again-2', 'SELECT 1', defer => true);}),
	'pending', 'and so does a session that began before the reload');
$again->quit;

unlike(slurp_file($node->logfile), $DurableSteps::Test::crash_re, 'no process crashed');
$node->stop;
done_testing();
