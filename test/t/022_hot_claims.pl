# A claim writes no index entry (docs/worker.md, steps 1 and 2): a step of a
# queue without a limit is claimed by a HOT update, a step of a limited queue is counted against
# its limit through running_queue, and an attempt lost while running (a running step is in no
# index of its own) is found when its executor ends, without waiting for the poll interval, and
# even behind a batch of live executors' running steps.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# eight executors: section 4 keeps up to six of them busy (a queue whose pace an executor has
# not learnt yet is claimed one step at a time, so its five live steps may take five executors)
my $node = worker_node('hot_claims',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 8\nmax_worker_processes = 20\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE done (step text);
});
ok(executors_running($node, 8), 'eight executors run');

# the steps table's updates and HOT updates, as the cumulative statistics have them (each
# safe_psql is a new session: a fresh statistics snapshot)
sub updates
{
	return split /\|/, $node->safe_psql('postgres', q{
SELECT n_tup_upd || '|' || n_tup_hot_upd FROM pg_stat_user_tables
 WHERE relid = 'durable_steps.steps'::regclass});
}

############################################################################################
# 1. 200 steps of the default queue: each is claimed (an update) and recorded (another). Every
#    claim is HOT; a success sets next_attempt_at NULL (it leaves steps_due_idx) and is not.
my ($upd0, $hot0) = updates();
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 200) i,
  LATERAL ds_run_step('hot', 's' || i, 'INSERT INTO done VALUES ($1->>''i'')',
                      jsonb_build_object('i', i), defer => true) s});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 200 FROM ds_steps WHERE run_id = 'hot' AND status = 'succeeded'"),
	'the worker ran the 200 steps');
# executors report their statistics at most once a second, after a commit; each commits
# something (its look for lost turns) while the test waits
my ($upd, $hot);
ok(poll_until($node, 'postgres', qq{
SELECT n_tup_upd - $upd0 >= 400 FROM pg_stat_user_tables
 WHERE relid = 'durable_steps.steps'::regclass}),
	'the statistics count the updates');
($upd, $hot) = updates();
is(($upd - $upd0) . ' ' . ($hot - $hot0), '400 200',
	'400 updates, the 200 claims HOT ones: a claim writes no index entry');
is($node->safe_psql('postgres', "SELECT count(*) FROM done"), '200', 'each step ran once');

############################################################################################
# 2. A step of a limited queue, held running by a lock the test holds: its row names the queue
#    in running_queue (counted by the limit), a running step of the default queue does not, and
#    neither does either step once recorded.
$node->safe_psql('postgres', "SELECT ds_set_queue('limited', 3)");
my $holder = DurableSteps::Session->new($node, 'postgres');
$holder->query_ok('SELECT pg_advisory_lock(4242);');
$node->safe_psql('postgres', q{
SELECT ds_run_step('held', 'in-limited', 'SELECT pg_advisory_xact_lock_shared(4242)',
                   defer => true, queue => 'limited');
SELECT ds_run_step('held', 'in-default', 'SELECT pg_advisory_xact_lock_shared(4242)',
                   defer => true)});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 2 FROM ds_steps WHERE run_id = 'held' AND status = 'running'"),
	'both held steps are running');
is($node->safe_psql('postgres', q{
SELECT string_agg(step_id || ':' || coalesce(running_queue, '-') || ':' || (next_attempt_at IS NOT NULL),
                  ' ' ORDER BY step_id)
  FROM durable_steps.steps WHERE run_id = 'held'}),
	'in-default:-:true in-limited:limited:true',
	'running: the limited queue\'s step is counted against it, both keep their due time');
is($node->safe_psql('postgres', "SELECT running FROM ds_queues WHERE queue = 'limited'"), '1',
	'ds_queues counts the limited queue\'s running step');
$holder->query_ok('SELECT pg_advisory_unlock(4242);');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 2 FROM ds_steps WHERE run_id = 'held' AND status = 'succeeded'"),
	'both held steps succeed once the lock is free');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM durable_steps.steps
 WHERE run_id = 'held' AND (running_queue IS NOT NULL OR next_attempt_at IS NOT NULL)}),
	'0', 'recorded: counted against no queue, out of the index of waiting steps');

############################################################################################
# 3. An executor that ends while it runs a step: another executor (or its successor) records
#    the attempt as lost at once, although the poll interval is now an hour, and the step is
#    retried and succeeds.
ok(reload_executors($node, "ALTER SYSTEM SET durable_steps.poll_interval = '1h'"),
	'both executors reloaded their settings');
$holder->query_ok('SELECT pg_advisory_lock(4343);');
$node->safe_psql('postgres', q{
SELECT ds_run_step('lost', 'killed', 'SELECT CASE WHEN ds_attempt_number() = 1
                                             THEN pg_advisory_xact_lock_shared(4343) END',
                   defer => true, policy => '{"max_attempts": 3, "initial_delay": "10 ms"}')});
ok(poll_until($node, 'postgres',
		"SELECT status = 'running' FROM ds_steps WHERE run_id = 'lost' AND step_id = 'killed'"),
	'the step is running, held by the lock');
# Terminate the executor running step $run/$step, then wait for the step to succeed (its lost
# attempt recorded, the next one run).
sub terminate_claimant_then_settle
{
	my ($run, $step, $what, $settled) = @_;
	my $pid = $node->safe_psql('postgres',
		"SELECT claimed_by FROM durable_steps.steps WHERE run_id = '$run' AND step_id = '$step'");
	is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"), 't', $what);
	ok(poll_until($node, 'postgres',
			"SELECT status = 'succeeded' FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'"),
		$settled);
}
terminate_claimant_then_settle('lost', 'killed', 'its executor is terminated',
	'the step succeeds, well within the hour of the poll interval');
is($node->safe_psql('postgres', q{
SELECT string_agg(attempt || ' ' || class || ' ' || coalesce(error_code, '-') || ' ' || coalesce(error_message, '-'),
                  ', ' ORDER BY attempt)
  FROM ds_attempts WHERE run_id = 'lost' AND step_id = 'killed'}),
	'1 retryable DS007 invocation_lost, 2 completed - -',
	'attempt 1 is recorded as lost, attempt 2 succeeded');
$holder->query_ok('SELECT pg_advisory_unlock(4343);');

############################################################################################
# 4. A lost attempt behind live ones: five live steps (held by a lock the test holds, leases of
#    an hour; in one executor's batch of batch_size 5, or in several executors) are claimed
#    before the step whose executor is then terminated. The look for lost attempts reads every running step, not the first
#    five by lease (all live): the lost one is recorded while the five still run.
# idle executors look for due steps every second again: a commit wakes only one of them
ok(reload_executors($node, "ALTER SYSTEM SET durable_steps.batch_size = 5",
		"ALTER SYSTEM RESET durable_steps.poll_interval"),
	'behind: the executors reloaded their settings');
$holder->query_ok('SELECT pg_advisory_lock(4444);');
$holder->query_ok('SELECT pg_advisory_lock(4545);');
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 5) i,
  LATERAL ds_run_step('behind', 'live' || i, 'SELECT pg_advisory_xact_lock_shared(4444)',
                      defer => true, timeout => '1 h') s});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 5 FROM ds_steps WHERE run_id = 'behind' AND status = 'running'"),
	'behind: five live steps are running');
$node->safe_psql('postgres', q{
SELECT ds_run_step('behind', 'victim', 'SELECT CASE WHEN ds_attempt_number() = 1
                                              THEN pg_advisory_xact_lock_shared(4545) END',
                   defer => true, timeout => '1 h', policy => '{"initial_delay": "10 ms"}')});
ok(poll_until($node, 'postgres',
		"SELECT status = 'running' FROM ds_steps WHERE run_id = 'behind' AND step_id = 'victim'"),
	'behind: the victim is running');
is($node->safe_psql('postgres', q{
SELECT bool_and(l.lease_expires_at < v.lease_expires_at)
  FROM durable_steps.steps l, durable_steps.steps v
 WHERE l.run_id = 'behind' AND l.step_id LIKE 'live%' AND v.run_id = 'behind' AND v.step_id = 'victim'}),
	't', 'behind: the live steps\' leases end before the victim\'s');
terminate_claimant_then_settle('behind', 'victim', 'behind: the victim\'s executor is terminated',
	'behind: the victim\'s lost attempt is recorded and it succeeds, the live steps still running');
is($node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM ds_steps WHERE run_id = 'behind' AND step_id LIKE 'live%' AND status = 'running')
       || ' ' || (SELECT string_agg(attempt || ' ' || coalesce(error_code, '-'), ', ' ORDER BY attempt)
                    FROM ds_attempts WHERE run_id = 'behind' AND step_id = 'victim')}),
	'5 1 DS007, 2 -', 'behind: the five still run; the victim\'s attempt 1 was lost, attempt 2 succeeded');
$holder->query_ok('SELECT pg_advisory_unlock(4444);');
$holder->query_ok('SELECT pg_advisory_unlock(4545);');
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 5 FROM ds_steps WHERE run_id = 'behind' AND step_id LIKE 'live%' AND status = 'succeeded'"),
	'behind: the live steps succeed once let go');
$holder->quit;

$node->stop;
done_testing();
