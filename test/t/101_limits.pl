# Limits (docs/limits.md), admitted by real executors and claimed by every claimer: a rate of 50
# per second over 30 s held by 4 executors and 2 task workers of the Python client together
# (within 5 % of it, never above limit + burst in any second); one step at a time per key,
# through a server restart; a receiver's 429 pauses its key for its Retry-After (or
# X-RateLimit-Reset) and the step's attempt count does not grow; the roles take turns within a
# key; a cancelled admitted step lets its slot go; a dropped limit lets its steps go.
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
my $node = worker_node('limits',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 4\nlog_statement = none\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app LOGIN IN ROLE durable_steps_http;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
-- when each attempt's body ran, by key: the spans of the concurrency test
CREATE TABLE spans (id serial PRIMARY KEY, key text, started timestamptz,
                    ended timestamptz DEFAULT clock_timestamp());
GRANT ALL ON spans, spans_id_seq TO app;
CREATE FUNCTION span(k text, secs float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_sleep(secs);
    INSERT INTO spans(key, started) VALUES (k, t0);
    RETURN 1;
END
$$;
});
ok(executors_running($node, 4), 'four executors are up');

sub app
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', "SET ROLE app; $sql");
}

# --- a rate of 50 per second, burst 5, for 30 s: SQL steps and tasks under one key ---
my $markdir = PostgreSQL::Test::Utils::tempdir('marks');
my $dsn = $node->connstr('postgres') . ' user=app';
my @task_workers;
for my $name ('tw1', 'tw2')
{
	my ($out, $err) = ('', '');
	push @task_workers,
	  IPC::Run::start([ 'python3', "$FindBin::RealBin/../task_worker.py", $dsn, $name, $markdir ],
		'<', \undef, '>', \$out, '2>', \$err);
}
$node->safe_psql('postgres', q{SELECT ds_set_rate_limit('api', 50, interval '1 second', 5)});
# 1,500 steps: each third a task, the others SQL steps; all due at once
app(q{
SELECT count(*) FROM generate_series(1, 1500) g,
  LATERAL (SELECT CASE WHEN g % 3 = 0
      THEN (ds_task_step('rate', 's' || g, 'tick', policy => '{"limit": "api", "limit_key": "k"}')).status
      ELSE (ds_run_step('rate', 's' || g, 'SELECT 1', defer => true,
                        policy => '{"limit": "api", "limit_key": "k"}')).status END) s;
});
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 1500 FROM ds_steps WHERE run_id = 'rate' AND status = 'succeeded'",
		't'),
	'rate: every step succeeded');
my ($n, $span, $per_second, $sliding, $tasks_by_workers, $attempts) = split /\|/,
  $node->safe_psql('postgres', q{
WITH a AS (SELECT claimed_at FROM ds_attempts WHERE run_id = 'rate')
SELECT (SELECT count(*) FROM a),
       (SELECT extract(epoch FROM max(claimed_at) - min(claimed_at)) FROM a),
       (SELECT max(c) FROM (SELECT count(*) AS c FROM a GROUP BY date_trunc('second', claimed_at)) s),
       (SELECT max(c) FROM (SELECT count(*) OVER (ORDER BY claimed_at
                RANGE BETWEEN CURRENT ROW AND interval '999 milliseconds' FOLLOWING) AS c FROM a) s),
       (SELECT count(*) FROM ds_steps WHERE run_id = 'rate' AND kind = 'task' AND worker IN ('tw1', 'tw2')),
       (SELECT max(attempt) FROM ds_steps WHERE run_id = 'rate')});
is($n, 1500, 'rate: one attempt per step');
is($attempts, 1, 'rate: no step took a second attempt');
is($tasks_by_workers, 500, 'rate: the task workers ran the 500 tasks');
# the first 5 went at once (the burst); the rest at 50 per second
my $rate = ($n - 5) / $span;
diag(sprintf('rate: %d attempts over %.2f s: %.2f per second; at most %d in a calendar second, %d in any second',
		$n, $span, $rate, $per_second, $sliding));
ok(abs($rate - 50) <= 2.5, 'rate: the observed rate is within 5 % of 50 per second');
ok($per_second <= 55, 'rate: never more than limit + burst (55) in any second of the run');
# the bound is on admissions; an attempt starts when a claimer takes it, later by its own clock
# and by how busy it is, so a window sliding over the starts is only reported
$_->signal('TERM') for @task_workers;
$_->finish for @task_workers;

# --- concurrency 1 per customer, across a restart ---
$node->safe_psql('postgres', q{SELECT ds_set_concurrency_limit('customer', 1)});
app(q{
SELECT count(*) FROM generate_series(1, 8) g, unnest(ARRAY['c1', 'c2', 'c3']) k,
  ds_run_step('conc', k || '-' || g, format('SELECT span(%L, 0.25)', k), defer => true,
              policy => jsonb_build_object('limit', 'customer', 'limit_key', k));
});
ok(poll_until($node, 'postgres', 'SELECT count(*) >= 6 FROM spans'), 'concurrency: steps ran');
$node->restart;
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 24 FROM ds_steps WHERE run_id = 'conc' AND status = 'succeeded'",
		't'),
	'concurrency: every step succeeded after the restart');
is( $node->safe_psql(
		'postgres', q{
SELECT coalesce(max(n), 0) FROM (
  SELECT count(*) AS n FROM spans a JOIN spans b
    ON b.key = a.key AND b.started <= a.started AND b.ended > a.started GROUP BY a.id) o}),
	'1',
	'concurrency: never two steps of one customer at once');
cmp_ok(
	$node->safe_psql(
		'postgres', q{
SELECT coalesce(max(n), 0) FROM (
  SELECT count(*) AS n FROM spans a JOIN spans b
    ON b.started <= a.started AND b.ended > a.started GROUP BY a.id) o}),
	'>=', 2,
	'concurrency: customers ran beside each other');
is($node->safe_psql('postgres', "SELECT count(*) FROM spans"), '24', 'concurrency: each effect once');

# --- a 429 pauses its key; the step's attempt is given back ---
$node->safe_psql('postgres', q{SELECT ds_set_rate_limit('host', 100, interval '1 second', 10)});
my $policy = q{{"limit": "host", "limit_key": "127.0.0.1"}};
my $url_a = $p->url('a', 'fault=429s&secs=2');
app(qq{SELECT ds_http_step('h', 'a', '{"method": "POST", "url": "$url_a"}', policy => '$policy')});
ok(poll_until($node, 'postgres', "SELECT paused_until IS NOT NULL FROM ds_limits WHERE \"limit\" = 'host'"),
	'429: the key is paused');
my $url_b = $p->url('b');
app(qq{SELECT ds_http_step('h', 'b', '{"method": "POST", "url": "$url_b"}', policy => '$policy')});
is($node->safe_psql('postgres', q{
SELECT l.paused_until - now() BETWEEN interval '1 second' AND interval '2.1 seconds', s.attempt, s.status
  FROM ds_limits l, ds_steps s WHERE l."limit" = 'host' AND s.run_id = 'h' AND s.step_id = 'a'}),
	't|0|pending', '429: paused for its Retry-After (2 s); the attempt was given back');
is(settle_http($node, 'h', 'a'), 'succeeded', '429: the step succeeded after the pause');
is(settle_http($node, 'h', 'b'), 'succeeded', '429: the other step of the key too');
is( $node->safe_psql(
		'postgres', q{
SELECT (SELECT string_agg(attempt::text, ',') FROM ds_attempts WHERE run_id = 'h' AND step_id = 'a'),
       (SELECT min(claimed_at) FROM ds_attempts WHERE run_id = 'h')
         >= (SELECT max(paused_until) - interval '10 milliseconds' FROM durable_steps.limit_keys WHERE limit_name = 'host')}),
	'1|t',
	'429: one attempt recorded, numbered 1; no step of the key was sent before the pause ended');
is($p->requests('a'), 2, '429: the receiver saw the refused request and the accepted one');
# X-RateLimit-Reset, without Retry-After
my $url_c = $p->url('c', 'fault=429x&secs=1');
app(qq{SELECT ds_http_step('h', 'c', '{"method": "POST", "url": "$url_c"}', policy => '$policy')});
is(settle_http($node, 'h', 'c'), 'succeeded', 'X-RateLimit-Reset: the step succeeded');
is($node->safe_psql('postgres', q{SELECT attempt FROM ds_steps WHERE run_id = 'h' AND step_id = 'c'}),
	'1', 'X-RateLimit-Reset: its attempt count did not grow');

# --- the roles take turns within a key ---
$node->safe_psql('postgres', q{SELECT ds_set_rate_limit('shared', 20, interval '1 second', 1)});
psql_as($node, 'alice', q{
SELECT count(*) FROM generate_series(1, 100) g,
  ds_run_step('fair-alice', 's' || g, 'SELECT 1', defer => true, policy => '{"limit": "shared"}')});
psql_as($node, 'bob', q{
SELECT count(*) FROM generate_series(1, 10) g,
  ds_run_step('fair-bob', 's' || g, 'SELECT 1', defer => true, policy => '{"limit": "shared"}')});
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 10 FROM ds_steps WHERE run_id = 'fair-bob' AND status = 'succeeded'",
		't'),
	'fair: bob\'s steps ran');
cmp_ok(
	$node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM ds_attempts WHERE run_id = 'fair-alice'
             AND claimed_at < (SELECT max(claimed_at) FROM ds_attempts WHERE run_id = 'fair-bob')}),
	'<', 40,
	'fair: bob\'s 10 steps did not wait behind alice\'s backlog of 100');

# --- a cancelled admitted step lets its slot go; a dropped limit lets its steps go ---
$node->safe_psql('postgres', q{SELECT ds_set_concurrency_limit('one', 1)});
app(q{SELECT ds_task_step('slot', 'x', 'nobody-runs-this', policy => '{"limit": "one"}')});
ok( poll_until(
		$node, 'postgres',
		"SELECT next_attempt_at IS NOT NULL FROM ds_steps WHERE run_id = 'slot' AND step_id = 'x'"),
	'slot: the first task is admitted');
app(q{SELECT ds_task_step('slot', 'y', 'nobody-runs-this', policy => '{"limit": "one"}')});
is( $node->safe_psql(
		'postgres',
		"SELECT held_from IS NOT NULL FROM ds_steps WHERE run_id = 'slot' AND step_id = 'y'"),
	't', 'slot: the second waits held while the first has the slot');
app(q{SELECT ds_cancel_step('slot', 'x')});
ok( poll_until(
		$node, 'postgres',
		"SELECT next_attempt_at IS NOT NULL FROM ds_steps WHERE run_id = 'slot' AND step_id = 'y'"),
	'slot: the cancel let the second in');
$node->safe_psql('postgres', q{SELECT ds_set_concurrency_limit('shut', 0)});
app(q{SELECT count(*) FROM generate_series(1, 3) g,
  ds_run_step('shut', 's' || g, 'SELECT 1', defer => true, policy => '{"limit": "shut"}')});
is($node->safe_psql('postgres', q{SELECT held FROM ds_limits WHERE "limit" = 'shut'}),
	'3', 'dropped: a limit of concurrency 0 holds its steps');
$node->safe_psql('postgres', q{SELECT ds_drop_limit('shut')});
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 3 FROM ds_steps WHERE run_id = 'shut' AND status = 'succeeded'"),
	'dropped: its steps ran as steps of no limit');

# --- 8,000 keys whose steps may all be admitted at once: the looks admit them a batch at a time ---
$node->safe_psql('postgres', q{SELECT ds_set_concurrency_limit('percust', 0)});
for my $b (0 .. 3)
{
	app(qq{SELECT count(*) FROM generate_series($b * 2000 + 1, $b * 2000 + 2000) i,
  ds_run_step('keys', 's' || i, 'SELECT 1', defer => true,
              policy => jsonb_build_object('limit', 'percust', 'limit_key', 'cust:' || i))});
}
$node->safe_psql('postgres', q{SELECT ds_set_concurrency_limit('percust', 1)});
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 8000 FROM ds_steps WHERE run_id = 'keys' AND status = 'succeeded'", 't'),
	'keys: every step of 8,000 keys was admitted and ran');
unlike(slurp_file($node->logfile), qr/too many steps for one transaction/,
	'keys: no look admitted more than its transaction could lock');

unlike(slurp_file($node->logfile), qr/TRAP|terminated by signal|PANIC/, 'no server process crashed');
$node->stop;
done_testing();
