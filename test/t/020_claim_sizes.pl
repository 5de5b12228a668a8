# How much an executor claims at a time (docs/worker.md, claim sizes): a queue's
# first claim (and its first after a pause of 10 s) is one step, later ones grow to about 100 ms of
# work at the queue's recent pace, never past durable_steps.batch_size nor the executor's share of
# the server's lock table.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# a small lock table: 10 entries per backend slot
my $node = worker_node('claim_sizes',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 2\n"
	  . "max_locks_per_transaction = 10\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE done (step text);
});
ok(executors_running($node, 2), 'two executors run');

# the lock table's size as lock.c computes it -- max_locks_per_transaction times the backend
# slots (MaxBackends, postinit.c) and the prepared transactions -- and a quarter of it shared by
# the two executors. MaxBackends counts one special worker (the autovacuum launcher) up to 16,
# two from 17 (the slotsync worker too), and from 18 the autovacuum worker slots instead of
# autovacuum_max_workers.
my $share = $node->safe_psql('postgres', q{
SELECT current_setting('max_locks_per_transaction')::int
       * (current_setting('max_connections')::int
          + CASE WHEN current_setting('server_version_num')::int >= 180000
                 THEN current_setting('autovacuum_worker_slots', true)::int
                 ELSE current_setting('autovacuum_max_workers')::int END
          + CASE WHEN current_setting('server_version_num')::int >= 170000 THEN 2 ELSE 1 END
          + current_setting('max_worker_processes')::int + current_setting('max_wal_senders')::int
          + current_setting('max_prepared_transactions')::int) / 4 / 2});
cmp_ok($share, '<', 1000, "the lock share ($share) is below batch_size");

# deferred steps of queue $queue, n of them, named prefix1..prefixn, in one transaction
sub make_steps
{
	my ($prefix, $n, $sql, $queue) = @_;
	$queue //= 'default';
	$node->safe_psql('postgres', qq{
SELECT count(*) FROM generate_series(1, $n) i,
  LATERAL ds_run_step('claims', '$prefix' || i, \$\$$sql\$\$, defer => true, queue => '$queue') s});
}

# fast steps: the executors learn the default queue's pace
make_steps('warm', 400, 'SELECT 1');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 400 FROM ds_steps WHERE step_id LIKE 'warm%' AND status = 'succeeded'"),
	'warm-up: 400 fast steps succeeded');

# steps that wait for a lock the test holds: each executor's claim sits in its rows as running
my $holder = DurableSteps::Session->new($node, 'postgres');
$holder->query_ok('SELECT pg_advisory_lock(4242);');
make_steps('held', 600, 'SELECT pg_advisory_xact_lock_shared(4242)');
ok(poll_until($node, 'postgres', q{
SELECT count(DISTINCT claimed_by) = 2 FROM durable_steps.steps WHERE status = 'running'}),
	'held: both executors claimed steps');
my $claimed = $node->safe_psql('postgres', q{
SELECT string_agg(n::text, ' ' ORDER BY n) FROM
  (SELECT count(*) AS n FROM durable_steps.steps WHERE status = 'running' GROUP BY claimed_by) c});
my @sizes = split / /, $claimed;
note "claims of the two executors: @sizes (lock share $share)";
ok((grep { $_ <= $share } @sizes) == 2, "held: no claim is larger than the lock share ($claimed)");
# (an executor that made only its first claims during the warm-up, slowed by its start, may
# still size by that pace: one grown claim is what the test can count on)
# (a claim is sized to take about 100 ms at the pace learned: past 3 steps even at 25 ms a step,
# as on a loaded machine with assertions on; a claim of slow steps, below, starts at 1)
ok((grep { $_ > 3 } @sizes) >= 1,
	"held: after fast steps a claim grew past 3 steps ($claimed)");
$holder->query_ok('SELECT pg_advisory_unlock(4242);');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 600 FROM ds_steps WHERE step_id LIKE 'held%' AND status = 'succeeded'"),
	'held: all 600 succeeded once the lock was let go');

# slow steps in a queue of their own: its first claims are small, so both executors take part
make_steps('slow', 30, 'SELECT pg_sleep(0.1)', 'slow');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 30 FROM ds_steps WHERE step_id LIKE 'slow%' AND status = 'succeeded'"),
	'slow: 30 steps succeeded');
is($node->safe_psql('postgres', q{
SELECT count(DISTINCT backend_pid) FROM ds_attempts WHERE step_id LIKE 'slow%'}),
	'2', 'slow: both executors ran some');
is($node->safe_psql('postgres', q{
SELECT max(n) <= 1 FROM (SELECT a.backend_pid, count(*) AS n FROM ds_attempts a
  WHERE a.step_id LIKE 'slow%' AND a.claimed_at <= (SELECT min(finished_at) FROM ds_attempts
                                                    WHERE step_id LIKE 'slow%')
  GROUP BY a.backend_pid) c}),
	't', 'slow: no executor claimed more than one before the first finished');

$holder->quit;
$node->stop;
done_testing();
