# Fan-out and join (docs/runs.md, "Fan-out and join: ds_map"): a map of 1,000 items with
# concurrency 10 under kill -9 of executors -- each item's effect once, never more than 10 in
# flight, the results in order; an item that fails for good raises at the join, or is one outcome
# among the others with outcomes => true; re-arming the failed item reruns it alone; a blocked
# item blocks the run until it is corrected; a cancelled run starts no more items; another role
# cannot store a map under a run that is not its own.
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

my $node = worker_node('map', "durable_steps.database = 'postgres'\nlog_statement = none\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA public TO alice, mallory;
-- each item's effect, with when its body ran
CREATE TABLE effects (n int, started timestamptz, ended timestamptz DEFAULT clock_timestamp());
GRANT ALL ON effects TO alice;
CREATE FUNCTION item(n int, secs float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_sleep(secs);
    INSERT INTO effects(n, started) VALUES (n, t0);
    RETURN n * n;
END
$$;
CREATE TABLE divisors (n int PRIMARY KEY, d int);
GRANT ALL ON divisors TO alice;
-- a workflow: map input->'items' through item(), joined; outcomes => input->'outcomes'
CREATE FUNCTION fan(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    RETURN jsonb_build_object('results', ds_map('m', input->>'sql', input->'items',
        concurrency => (input->>'concurrency')::int, outcomes => coalesce((input->>'outcomes')::boolean, false),
        policy => '{"max_attempts": 2, "initial_delay": 10}'));
END
$f$;
GRANT EXECUTE ON FUNCTION fan(text, jsonb) TO alice;
});
ok(executors_running($node, 2), 'two executors are up');

# --- 1,000 items, concurrency 10, executors killed meanwhile ---
my $items = join ', ', map { qq({"n": $_}) } 1 .. 1000;
my $big = start_run_as($node, 'alice', 'fan',
	qq({"sql": "SELECT item((\$1->>'n')::int, 0.002 + random() * 0.01)", "concurrency": 10, "items": [$items]}));
for my $kill (1 .. 3)
{
	ok( poll_until(
			$node, 'postgres', "SELECT count(*) >= @{[ $kill * 200 ]} FROM effects"),
		"big: $kill x 200 items ran");
	my $pid = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' LIMIT 1");
	kill 'KILL', $pid if $pid;
	ok(executors_running($node, 2), "big: the executors are back after kill $kill");
}
is(settle_run($node, $big), 'succeeded', 'big: the run succeeded');
is($node->safe_psql('postgres', 'SELECT count(*), count(DISTINCT n) FROM effects'), '1000|1000',
	'big: each item\'s effect once');
is( $node->safe_psql(
		'postgres', qq{
SELECT (SELECT array_agg(x::int ORDER BY o) FROM ds_runs r,
          jsonb_array_elements_text(r.output->'results') WITH ORDINALITY e(x, o) WHERE r.run_id = '$big')
       = (SELECT array_agg(g * g ORDER BY g) FROM generate_series(1, 1000) g)}),
	't', 'big: the results in the order of the inputs');
is( $node->safe_psql(
		'postgres', q{
SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM effects a JOIN effects b
    ON b.started <= a.started AND b.ended > a.started GROUP BY a.ctid) o}) <= 10
	? 'ok' : 'over',
	'ok', 'big: never more than 10 items in flight');
cmp_ok($node->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = '$big' AND step_id LIKE 'm/%'"),
	'==', 1000, 'big: 1,000 item steps');
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_limits WHERE \"limit\" LIKE 'ds_map:%'"), '0',
	'big: the map\'s own limit is gone with its join');

# --- an item that fails for good raises at the join; outcomes => true lists it ---
$node->safe_psql('postgres', 'INSERT INTO divisors VALUES (1, 1), (2, 1), (3, 0), (4, 1)');
my $div = q{"sql": "SELECT 12 / d FROM divisors, LATERAL (SELECT CASE WHEN d = 0 THEN ds_non_retriable('no divisor') END) x WHERE n = ($1->>'n')::int", "items": [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]};
my $raise = start_run_as($node, 'alice', 'fan', "{$div}");
is(settle_run($node, $raise), 'failed', 'failed item: the run failed');
is( $node->safe_psql(
		'postgres', "SELECT error_code, error_message LIKE '%m/3%' FROM ds_runs WHERE run_id = '$raise'"),
	'DS102|t', 'failed item: DS102 names the failed item m/3');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = '$raise'"),
	'm/1:succeeded,m/2:succeeded,m/3:failed,m/4:succeeded', 'failed item: the others succeeded');
my $all = start_run_as($node, 'alice', 'fan', qq({$div, "outcomes": true}));
is(settle_run($node, $all), 'succeeded', 'outcomes: the run succeeded');
is( $node->safe_psql(
		'postgres', qq{
SELECT string_agg(coalesce(o->>'result', o->>'error_code'), ',' ORDER BY i) FROM ds_runs r,
       jsonb_array_elements(r.output->'results') WITH ORDINALITY e(o, i) WHERE r.run_id = '$all'}),
	'12,12,DS001,12', 'outcomes: every item\'s outcome, in order');

# --- re-arming the failed item reruns it alone ---
$node->safe_psql('postgres', 'UPDATE divisors SET d = 3 WHERE n = 3');
my $before = $node->safe_psql('postgres',
	"SELECT string_agg(step_id || ':' || attempt, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = '$raise'");
psql_as($node, 'alice', "SELECT ds_retry_step('$raise', 'm/3'); SELECT ds_resume_run('$raise')");
is(settle_run($node, $raise), 'succeeded', 'rerun: the run succeeded');
is($node->safe_psql('postgres', "SELECT output->'results' FROM ds_runs WHERE run_id = '$raise'"),
	'[12, 12, 4, 12]', 'rerun: the results');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(step_id || ':' || attempt, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = '$raise'"),
	$before =~ s/m\/3:(\d+)/'m\/3:' . ($1 + 1)/er, 'rerun: only the failed item ran again');

# --- an empty map answers at once ---
my $empty = start_run_as($node, 'alice', 'fan', q{{"sql": "SELECT 1", "items": []}});
is(settle_run($node, $empty), 'succeeded', 'empty: the run succeeded');
is($node->safe_psql('postgres', "SELECT output->'results' FROM ds_runs WHERE run_id = '$empty'"),
	'[]', 'empty: no results');

# --- a blocked item blocks the run until it is corrected ---
my $blocked = start_run_as($node, 'alice', 'fan',
	q{{"sql": "SELECT 1 FROM (SELECT CASE WHEN NOT ($1->>'ok')::boolean THEN ds_blocked('not ok', 'correct the input') END) x", "items": [{"ok": true}, {"ok": false}]}});
ok( poll_until(
		$node, 'postgres',
		"SELECT status = 'waiting' AND wait_reason LIKE '%item m/2 waits for a person%' FROM ds_runs WHERE run_id = '$blocked'"),
	'blocked item: the run waits, and says which item waits for a person');
is($node->safe_psql('postgres', "SELECT status FROM ds_steps WHERE run_id = '$blocked' AND step_id = 'm/2'"),
	'blocked', 'blocked item: the item is blocked');
psql_as($node, 'alice', qq{SELECT ds_retry_step('$blocked', 'm/2', '{"ok": true}')});
is(settle_run($node, $blocked), 'succeeded', 'blocked item: corrected, the run succeeded');

# --- a cancelled run starts no more items ---
my $slow = start_run_as($node, 'alice', 'fan',
	q{{"sql": "SELECT item(-1, 0.3)", "concurrency": 1, "items": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}});
ok(poll_until($node, 'postgres', "SELECT count(*) >= 1 FROM effects WHERE n = -1"),
	'cancel: an item ran');
psql_as($node, 'alice', "SELECT ds_cancel_run('$slow')");
is(settle_run($node, $slow), 'cancelled', 'cancel: the run is cancelled');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) = 0 FROM ds_steps WHERE run_id = '$slow' AND status IN ('pending', 'retrying', 'running')"),
	'cancel: no item is left to run: the others are cancelled');
is( $node->safe_psql(
		'postgres',
		"SELECT (SELECT count(*) FROM effects WHERE n = -1) = (SELECT count(*) FROM ds_steps WHERE run_id = '$slow' AND status = 'succeeded')"),
	't', 'cancel: the items that ran are the ones that succeeded');
cmp_ok($node->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = '$slow' AND status = 'cancelled'"),
	'>=', 5, 'cancel: the rest were cancelled before they started');

# --- a map of tasks, run by an application worker ---
$node->safe_psql('postgres', q{
CREATE FUNCTION fan_tasks(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    RETURN ds_map('t', NULL, input->'items', concurrency => 2, task => 'tick');
END
$f$;
GRANT EXECUTE ON FUNCTION fan_tasks(text, jsonb) TO alice;
});
my $markdir = PostgreSQL::Test::Utils::tempdir('marks');
my ($wout, $werr) = ('', '');
my $tw = IPC::Run::start(
	[ 'python3', "$FindBin::RealBin/../task_worker.py", $node->connstr('postgres') . ' user=alice', 'tw', $markdir ],
	'<', \undef, '>', \$wout, '2>', \$werr);
my $tasks = start_run_as($node, 'alice', 'fan_tasks', '{"items": [1, 2, 3, 4, 5]}');
is(settle_run($node, $tasks), 'succeeded', 'tasks: the run succeeded');
is($node->safe_psql('postgres', "SELECT output FROM ds_runs WHERE run_id = '$tasks'"),
	'[{"attempt": 1}, {"attempt": 1}, {"attempt": 1}, {"attempt": 1}, {"attempt": 1}]',
	'tasks: every item\'s result, in order');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE kind = 'task' AND worker = 'tw') FROM ds_steps WHERE run_id = '$tasks'"),
	'5', 'tasks: the items are tasks the worker ran');
$tw->signal('TERM');
$tw->finish;

# --- a map of HTTP steps, sent by the HTTP worker with their idempotency keys ---
my $p = DurableSteps::Http::Provider->start();
$node->safe_psql('postgres', q{
GRANT durable_steps_http TO alice;
CREATE FUNCTION fan_http(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    RETURN ds_map('h', NULL, input->'requests', concurrency => 2, http => true,
                  policy => '{"max_attempts": 3, "initial_delay": 10}');
END
$f$;
GRANT EXECUTE ON FUNCTION fan_http(text, jsonb) TO alice;
});
my $requests = join ', ', map { '{"method": "POST", "url": "' . $p->url("h$_", $_ == 2 ? 'fault=500' : undef) . '"}' } 1 .. 3;
my $http = start_run_as($node, 'alice', 'fan_http', qq({"requests": [$requests]}));
is(settle_run($node, $http), 'succeeded', 'http: the run succeeded');
is( $node->safe_psql(
		'postgres', "SELECT string_agg((r->>'status'), ',' ORDER BY i) FROM ds_runs,
           jsonb_array_elements(output) WITH ORDINALITY e(r, i) WHERE run_id = '$http'"),
	'200,200,200', 'http: every response, in order (the 500 retried)');
is(join(',', map { $p->charges("h$_") } 1 .. 3), '1,1,1', 'http: the receiver charged each request once');
is( $node->safe_psql(
		'postgres', "SELECT string_agg(kind || ':' || attempt, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = '$http'"),
	'http:1,http:2,http:1', 'http: the items are HTTP steps, each retried on its own');

# --- another role cannot store a map under alice's run ---
my ($rc, $out, $err) = psql_as($node, 'mallory',
	qq{SELECT ds_start_map('$big', 'evil', 'SELECT 1', '[1]')});
like($err, qr/42501/, 'mallory: storing a map under alice\'s run is refused (42501)');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_steps.maps WHERE step_id = 'evil'"), '0',
	'mallory: nothing stored');

unlike(slurp_file($node->logfile), qr/TRAP|PANIC|terminated by signal 11/, 'no server process crashed');
$node->stop;
done_testing();
