# Executors take turns to claim from a queue (docs/worker.md): the executor that
# claims holds the queue's claim lock until its claim commits and says how many steps it takes;
# another one reads past those (or waits for its turn, a little) instead of reading the same rows.
# A claim can be stuck -- its UPDATE waits for a row lock an operator's open transaction holds --
# and keep its turn for as long as that transaction lasts: the other executor goes on serving the
# queue meanwhile, every step of it but the stuck one (the stuck claim hides no more steps than it
# holds).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('claim_turns',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 2\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE done (step text);
});
ok(executors_running($node, 2), 'two executors run');

# 'DQ' in objsubid: the claim lock of a queue (step_lock.c)
my $claim_lock = 0x4451;

# the blocker becomes due in 10 s; before then an operator locks its row and keeps it locked
$node->safe_psql('postgres', q{
SELECT status FROM ds_run_step('turns', 'blocker', $$INSERT INTO done VALUES ('blocker')$$,
  defer => true, run_at => clock_timestamp() + interval '10 s')});
my $operator = DurableSteps::Session->new($node, 'postgres');
is( $operator->query_ok(
		q{BEGIN; SELECT status || ' ' || (clock_timestamp() < next_attempt_at) FROM durable_steps.steps WHERE step_id = 'blocker' FOR UPDATE;}),
	'pending true', 'the operator locked the blocker before it was due');

# an executor claims it when it is due, and its claim waits for the row lock, holding the turn
ok(poll_until($node, 'postgres', qq{
SELECT EXISTS (SELECT FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
  WHERE a.backend_type = 'durable_steps worker' AND a.wait_event_type = 'Lock'
    AND l.locktype = 'advisory' AND l.objsubid = $claim_lock AND l.granted)}),
	'a claim waits for the row lock and holds the queue\'s claim turn');
my $stuck = $node->safe_psql('postgres', qq{
SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = $claim_lock});

# steps of the same queue made due now: the other executor runs them all meanwhile
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 20) i,
  LATERAL ds_run_step('turns', 'after' || i, $$INSERT INTO done VALUES ('after')$$, defer => true)});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 20 FROM ds_steps WHERE step_id LIKE 'after%' AND status = 'succeeded'"),
	'the other executor ran the queue\'s later steps while the stuck claim held the turn');
is($node->safe_psql('postgres', q{
SELECT string_agg(DISTINCT a.backend_pid::text, ',') FROM ds_attempts a
WHERE a.step_id LIKE 'after%'}), $node->safe_psql('postgres', qq{
SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' AND pid <> $stuck}),
	'... the executor that was not stuck');
is($node->safe_psql('postgres', q{
SELECT status || ' ' || attempts FROM durable_steps.steps WHERE step_id = 'blocker'}),
	'pending 0', 'the blocker is not claimed while its row stays locked');

# the operator commits: the stuck claim goes through, and the blocker runs once
$operator->query_ok('COMMIT;');
ok(poll_until($node, 'postgres',
		"SELECT status = 'succeeded' FROM ds_steps WHERE step_id = 'blocker'"),
	'the blocker succeeded once its row was free');
is($node->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE step = 'blocker') || ' ' || count(*) FROM done}),
	'1 21', 'every step ran once');
is($node->safe_psql('postgres', qq{
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = $claim_lock}),
	'0', 'no claim lock outlives its claim');
$operator->quit;

done_testing();
