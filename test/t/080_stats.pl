# Numbers for operators (docs/operations.md, "Numbers for operators"): ds_stats() after a known
# mix of steps -- the steps in flight by queue, kind and status, what is due and how long the
# oldest has waited, runs by status and what they wait for, the attempts counted by class since
# the server started and in the last minute, the status they left their steps in, lost
# attempts, the HTTP responses by status class, the workers. An attempt whose recording rolls
# back (the caller's transaction, a savepoint) is not counted; a restart starts the counters
# again. Only pg_monitor and durable_steps_admin may read them.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Socket::INET;

my $p = DurableSteps::Http::Provider->start();
my $node = http_node('stats');
$node->safe_psql('postgres', q{
CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA public TO app;
});

# ds_stats() as $role: "metric|queue|kind|label" => value, for the rows of the metrics named
sub stats
{
	my ($role, @metrics) = @_;
	my $in = join(',', map { "'$_'" } @metrics);
	my %v;
	for my $line (split /\n/, $node->safe_psql('postgres', qq{SET ROLE $role;
SELECT concat_ws('|', metric, coalesce(queue, '-'), coalesce(kind, '-'), coalesce(label, '-')), value
  FROM ds_stats() WHERE metric IN ($in)}))
	{
		my ($k, $val) = split /\|(?=[^|]*$)/, $line;
		$v{$k} = $val;
	}
	return \%v;
}

# the counted attempts only: the rows that are not zero
sub nonzero
{
	my ($v) = @_;
	return { map { $_ => $v->{$_} } grep { $v->{$_} != 0 } keys %$v };
}

my $before = stats('watcher', 'attempts_total');
is_deeply(nonzero($before), {}, 'a new server has counted no attempt');

# The mix, as app: three steps that succeed, one that fails for good (a permanent error, one
# attempt), one that fails retryably and waits for its retry in an hour; one attempt rolled back
# with its caller's transaction and one with a savepoint, which count nothing.
$node->safe_psql('postgres', q{
SET ROLE app;
SELECT ds_run_step('mix', 'ok-' || i, 'SELECT ' || i) FROM generate_series(1, 3) i;
SELECT ds_run_step('mix', 'broken', $q$DO $b$ BEGIN RAISE EXCEPTION 'broken' USING ERRCODE = 'XX000'; END $b$$q$);
SELECT ds_run_step('mix', 'later', $q$DO $b$ BEGIN RAISE EXCEPTION 'not yet'; END $b$$q$,
    policy => ds_retry_policy(max_attempts => 3, initial_delay => '1 hour', max_delay => '1 hour'));
BEGIN;
SELECT ds_run_step('mix', 'rolled-back', 'SELECT 1');
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT ds_run_step('mix', 'savepoint', 'SELECT 1');
ROLLBACK TO SAVEPOINT s;
COMMIT;
});
is_deeply(
	nonzero(stats('watcher', 'attempts_total', 'attempt_outcomes_total', 'attempts_last_minute')),
	{
		'attempts_total|-|sql|completed'         => 3,
		'attempts_total|-|sql|permanent'         => 1,
		'attempts_total|-|sql|retryable'         => 1,
		'attempt_outcomes_total|-|sql|succeeded' => 3,
		'attempt_outcomes_total|-|sql|failed'    => 1,
		'attempt_outcomes_total|-|sql|retrying'  => 1,
		'attempts_last_minute|-|sql|completed'   => 3,
		'attempts_last_minute|-|sql|permanent'   => 1,
		'attempts_last_minute|-|sql|retryable'   => 1,
	},
	'the committed attempts are counted by class and by the status they left; the rolled-back ones are not');

# Steps in flight: the retrying one (due in an hour), two deferred into a paused queue (one due
# now, one due a minute ago, so the oldest has waited a minute), one pending in a queue no
# administrator configured, due tomorrow: it counts under the queue '(unconfigured)'.
$node->safe_psql('postgres', q{
SELECT ds_set_queue('paused', 0);
SET ROLE app;
SELECT ds_run_step('mix', 'parked-now', 'SELECT 1', queue => 'paused', run_at => now());
SELECT ds_run_step('mix', 'parked-old', 'SELECT 1', queue => 'paused', run_at => now() - interval '1 minute');
SELECT ds_run_step('mix', 'tomorrow', 'SELECT 1', queue => 'slow', run_at => now() + interval '1 day');
});
my $live = stats('watcher', 'steps', 'steps_due');
is_deeply(
	$live,
	{
		'steps|default|sql|retrying' => 1,
		'steps|paused|sql|pending'   => 2,
		'steps|(unconfigured)|sql|pending' => 1,
		'steps_due|default|sql|-'    => 0,
		'steps_due|paused|sql|-'     => 2,
		'steps_due|(unconfigured)|sql|-'   => 0,
	},
	'the steps in flight by queue, kind and status, and those due now');
my $oldest = stats('watcher', 'oldest_due_seconds');
cmp_ok($oldest->{'oldest_due_seconds|paused|sql|-'}, '>=', 60, 'the oldest due step of the paused queue has waited a minute');
cmp_ok($oldest->{'oldest_due_seconds|paused|sql|-'}, '<', 600, '... and not ten');
is($oldest->{'oldest_due_seconds|(unconfigured)|sql|-'}, 0, 'a queue with nothing due has waited for nothing');

# HTTP: a 200 and a 503 then a 200 (the worker retries it), and a request to a closed port
# (no response). The responses are counted as the HTTP worker gets them.
my $closed = do
{
	# a port nobody listens on: bound, read, closed
	my $sock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1) or die $!;
	my $port = $sock->sockport;
	close $sock;
	$port;
};
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('web', 'ok', '{"method": "POST", "url": "@{[$p->url('ok')]}"}');
SELECT ds_http_step('web', 'flaky', '{"method": "POST", "url": "@{[$p->url('flaky', 'fault=status&code=503&times=1')]}"}',
    policy => '{"initial_delay": "10 ms", "max_attempts": 3}');
SELECT ds_http_step('web', 'nobody', '{"method": "GET", "url": "http://127.0.0.1:$closed/"}',
    policy => '{"max_attempts": 1}');
});
is(settle_http($node, 'web', $_), $_ eq 'nobody' ? 'failed' : 'succeeded', "the HTTP step $_ settled")
  for qw(ok flaky nobody);
is_deeply(
	nonzero(stats('watcher', 'http_responses_total')),
	{
		'http_responses_total|-|http|2xx'  => 2,
		'http_responses_total|-|http|5xx'  => 1,
		'http_responses_total|-|http|none' => 1,
	},
	'the HTTP responses by status class, and the transfer that got none');
my $http = nonzero(stats('watcher', 'attempts_total'));
is_deeply(
	{ map { $_ => $http->{$_} } grep { /\|http\|/ } keys %$http },
	{ 'attempts_total|-|http|completed' => 2, 'attempts_total|-|http|retryable' => 2 },
	'the HTTP attempts by class: two completed, the 503 and the refused connection retryable');

# Runs: one waiting for an event.
$node->safe_psql('postgres', q{
CREATE FUNCTION waits_for_event(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('wait', 'go');
END $$;
SELECT ds_start_run('waits_for_event', '{}', 'waiter');
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'waiter'}, 'waiting'),
	'the run waits for its event');
is_deeply(
	stats('watcher', 'runs', 'runs_waiting'),
	{ 'runs|-|-|waiting' => 1, 'runs_waiting|-|-|event' => 1 },
	'runs by status, and what the waiting ones wait for');

my $workers = stats('watcher', 'executors', 'http_workers');
is_deeply($workers, { 'executors|-|-|-' => 1, 'http_workers|-|-|-' => 1 }, 'the executor and the HTTP worker');

# A lost attempt: an executor killed while a body sleeps; its loss is counted once it is recorded.
$node->safe_psql('postgres', q{SET ROLE app;
SELECT ds_run_step('mix', 'sleeper', 'SELECT pg_sleep(30)', defer => true, policy => ds_retry_policy(max_attempts => 1))});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.steps WHERE step_id = 'sleeper'}, 'running'),
	'the sleeper runs in the worker');
$node->safe_psql('postgres', 'SELECT pg_terminate_backend(' . executor_pid($node) . ')');
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.steps WHERE step_id = 'sleeper'}, 'failed'),
	'its attempt is recorded lost');
is(stats('watcher', 'lost_attempts_total')->{'lost_attempts_total|-|sql|-'}, 1, 'the lost attempt is counted');

# Who may read them: not a plain role.
my ($rc, $out, $err) = $node->psql('postgres', 'SET ROLE app; SELECT * FROM ds_stats()');
like($err, qr/permission denied for function ds_stats/, 'a role outside pg_monitor may not read the numbers');

# A restart starts the counters again; the steps in flight are still counted.
my $since = stats('watcher', 'counters_since')->{'counters_since|-|-|-'};
$node->restart;
is_deeply(nonzero(stats('watcher', 'attempts_total')), {}, 'after a restart no attempt is counted');
cmp_ok(stats('watcher', 'counters_since')->{'counters_since|-|-|-'}, '>', $since, 'and the counters say since when');
is(stats('watcher', 'steps')->{'steps|paused|sql|pending'}, 2, 'the steps in flight are read from the table, as before');

$node->stop;
done_testing();
