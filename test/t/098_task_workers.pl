# Task workers are distributed systems (docs/tasks.md, "Leases and the fence"): real worker
# processes of the Python client (test/task_worker.py), killed and stopped by signals.
#   1. A worker killed with SIGKILL inside a handler, after the provider charged: the lease runs
#      out, the attempt is recorded lost, the other worker retries it with the same idempotency
#      key, and the provider records one charge.
#   2. A worker stopped (SIGSTOP) past its lease inside its handler's transaction, then
#      continued: the other worker completes the next attempt; the stopped one's completion is
#      refused and its handler's write rolls back with it.
#   3. Two workers of concurrency 10 over 5,000 tasks: each step completes once, at attempt 1,
#      each attempt's effect written once.
#   4. A restart of the server: the workers claim again, and complete at the first attempt.
#   5. SIGTERM stops a worker gracefully: it gives back nothing it started, and exits 0.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start();
my $node = worker_node('task_workers');
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
CREATE ROLE app_worker LOGIN IN ROLE app;
CREATE TABLE effects (step_id text, attempt integer, worker text);
GRANT ALL ON effects TO app;
});
my $markdir = PostgreSQL::Test::Utils::tempdir('marks');
my $dsn = $node->connstr('postgres') . ' user=app_worker';

my %workers;

sub start_worker
{
	my ($name) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'python3', "$FindBin::RealBin/../task_worker.py", $dsn, $name, $markdir, $p->url('') =~ s{/charge/$}{}r ],
		'<', \undef, '>', \$out, '2>', \$err);
	$workers{$name} = { h => $h, pid => $h->{KIDS}[0]{PID}, err => \$err };
	return $workers{$name};
}

sub app
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', "SET ROLE app; $sql");
}

# waits for the marker a handler writes at attempt $attempt of $step; the worker's name
sub marker
{
	my ($step, $attempt) = @_;
	my $path = "$markdir/$step.$attempt";
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	Time::HiRes::usleep(50_000) while !-e $path && time() < $deadline;
	return -e $path ? slurp_file($path) : undef;
}

start_worker($_) for qw(A B);

# 1. SIGKILL after the provider charged
app(q{SELECT ds_task_step('o1', 'pay', 'charge', '{"amount": 42, "hang_on": 1}',
        policy => ds_retry_policy(initial_delay => '10 ms'))});
my $first = marker('pay', 1);
ok(defined $first, 'attempt 1 charged the provider and hangs');
kill 'KILL', $workers{$first}{pid};
$workers{$first}{h}->finish;
ok(poll_until($node, 'postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE step_id = 'pay'",
		'succeeded 2'),
	'the lease ran out, and the other worker completed attempt 2');
is_deeply(attempts_of($node, 'o1', 'pay'),
	[ { attempt => 1, class => 'retryable', error_code => 'DS007', executor => 'worker' },
	  { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'attempt 1 recorded lost (DS007), attempt 2 completed');
is($p->charges('pay') . ' ' . $p->requests('pay'), '1 2', 'two requests, one charge');
is($p->keys_seen('pay'), 'o1:pay,o1:pay', 'both under the step\'s idempotency key');
my $survivor = $first eq 'A' ? 'B' : 'A';
is(app("SELECT worker FROM ds_steps WHERE step_id = 'pay'"), $survivor, 'attempt 2 ran in the other worker');
start_worker($first);

# 2. SIGSTOP past the lease inside the handler's transaction, then SIGCONT
app(q{SELECT ds_task_step('o1', 'record', 'effect', '{"pause_on": 1, "pause": 4}',
        policy => ds_retry_policy(initial_delay => '10 ms'))});
my $stopped = marker('record', 1);
ok(defined $stopped, 'attempt 1 wrote its effect in its transaction');
kill 'STOP', $workers{$stopped}{pid};
ok(poll_until($node, 'postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE step_id = 'record'",
		'succeeded 2'),
	'while it is stopped, its lease runs out and the other worker completes attempt 2');
kill 'CONT', $workers{$stopped}{pid};
# the continued worker finishes its handler, then its outcome is refused: its transaction ends
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE usename = 'app_worker' AND state LIKE 'idle in transaction%'"),
	'the continued worker ended its transaction');
is(app("SELECT string_agg(attempt || ' ' || worker, ',' ORDER BY attempt) FROM effects WHERE step_id = 'record'"),
	'2 ' . ($stopped eq 'A' ? 'B' : 'A'), 'one effect, attempt 2\'s: the stopped attempt\'s write rolled back');
is(app("SELECT result->>'attempt' FROM ds_steps WHERE step_id = 'record'"), '2', 'the step keeps attempt 2\'s result');

# 3. two workers x concurrency 10 over 5,000 tasks
app(q{SELECT count(ds_task_step('bulk', 'e' || g, 'effect', '{}')) FROM generate_series(1, 5000) g});
ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM ds_steps WHERE run_id = 'bulk' AND status = 'succeeded'", '5000'),
	'5,000 tasks succeeded');
is(app(q{SELECT count(*) || ' ' || count(DISTINCT step_id) || ' ' || max(attempt)
           FROM effects WHERE step_id LIKE 'e%'}),
	'5000 5000 1', 'each effect written once, at attempt 1');
is(app(q{SELECT count(*) FROM ds_steps WHERE run_id = 'bulk' AND attempt <> 1}), '0',
	'each step completed at its first attempt');
is(app(q{SELECT count(DISTINCT worker) FROM ds_steps WHERE run_id = 'bulk'}), '2', 'both workers ran tasks');

# 4. A restart breaks every idle connection of the workers: they claim again, and an outcome
#    whose connection broke is sent again on a new one, not lost
$node->restart;
app(q{SELECT ds_task_step('o1', 'after-restart', 'charge', '{"amount": 1}')});
ok(poll_until($node, 'postgres', "SELECT status || ' ' || attempt FROM ds_steps WHERE step_id = 'after-restart'",
		'succeeded 1'),
	'after a restart, a task completes at its first attempt');

# 5. SIGTERM: a graceful stop
for my $name (sort keys %workers)
{
	my $w = $workers{$name};
	kill 'TERM', $w->{pid};
	$w->{h}->finish;
	is($w->{h}->result(0), 0, "worker $name stopped on SIGTERM with exit status 0");
}
is(app(q{SELECT count(*) FROM ds_steps WHERE kind = 'task' AND status NOT IN ('succeeded')}), '0',
	'every task succeeded');

ok(log_since($node, 0) !~ $crash_re, 'no server process crashed');
$node->stop;
done_testing();
