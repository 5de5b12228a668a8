# A reload that makes the server read-only reaching an executor in the middle of a pass
# (docs/worker.md, "A read-only primary"): the executor takes a reload between its claims, so
# default_transaction_read_only may turn on after it looked whether it must wait and before it
# claims. It must look again and wait there, saying so once, instead of failing its claim
# (SQLSTATE 25006) and being restarted. The flip is made to land in that window: a step's body
# holds the executor inside its pass, waiting for an advisory lock this test holds, while the
# setting is turned on and reloaded; then the lock is let go. The step it was running commits
# (its transaction began before the reload); what comes due while the server is read-only runs
# exactly once when it accepts writes again, by the same processes.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start;
my $node = http_node('read_only_flip', "durable_steps.poll_interval = '200ms'\n");
$node->safe_psql('postgres', q{
CREATE TABLE done (step text);
GRANT INSERT ON done TO app;
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('only', 'INSERT INTO done VALUES (''run'') RETURNING 1');
END $$;
GRANT EXECUTE ON FUNCTION wf(text, jsonb) TO app;
});
my $workers = q{SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
 WHERE backend_type IN ('durable_steps worker', 'durable_steps http')};
my $writable = 'SET default_transaction_read_only = off; ';
my $waiting = qr/durable_steps: the server is read-only \(default_transaction_read_only\); waiting/;
my $failed = qr/read-only transaction|exited with exit code [1-9]/;
my $pids = $node->safe_psql('postgres', $workers);
like($pids, qr/^\d+,\d+$/, 'an executor and the HTTP worker run');
my $offset = log_offset($node);

# 1. the executor runs a step whose body waits for the test's lock
my $holder = DurableSteps::Session->new($node, 'holder');
$holder->query_ok('SELECT pg_advisory_lock(4242);');
$node->safe_psql('postgres', q{SET ROLE app;
SELECT ds_run_step('flip', 'slow', $$INSERT INTO done SELECT 'slow' FROM pg_advisory_xact_lock(4242)$$,
                   defer => true)});
ok(poll_until($node, 'postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'advisory'}),
	'held: the executor runs the step, whose body waits for the lock');

# 2. the server turns read-only meanwhile: the HTTP worker takes the reload at once, the executor
# only once its body goes on, in the middle of its pass
$node->safe_psql('postgres', 'ALTER SYSTEM SET default_transaction_read_only = on');
$node->reload;
is(poll_log($node, $offset, $waiting, 1), 1, 'flipped: the HTTP worker said it waits');
$holder->query_ok('SELECT pg_advisory_unlock(4242);');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'flip'", 'succeeded'),
	'let go: the step the executor was running succeeded');
is(poll_log($node, $offset, $waiting, 2), 2, 'let go: the executor said it waits too');
is($node->safe_psql('postgres', $workers), $pids, 'let go: no worker process was restarted');
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_attempts WHERE run_id = 'flip'"), '1',
	'let go: the step took one attempt');

# 3. what comes due while the server is read-only waits
my $url = $p->url('due');
$node->safe_psql('postgres', $writable . qq{SET ROLE app;
SELECT ds_run_step('due', 'sql', \$\$INSERT INTO done VALUES ('sql')\$\$, run_at => now() + interval '2 s');
SELECT ds_http_step('due', 'http', '{"method": "POST", "url": "$url"}', run_at => now() + interval '2 s');
SELECT ds_start_run('wf', '{}', 'run');});
ok(poll_until($node, 'postgres',
		"SELECT now() > max(next_attempt_at) + interval '3 s' FROM ds_steps WHERE run_id = 'due'"),
	'read-only: the steps came due a while ago');
is($node->safe_psql('postgres',
		"SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = 'due'"),
	'http:pending,sql:pending', 'read-only: neither step was claimed');
is($node->safe_psql('postgres', "SELECT status FROM ds_runs WHERE run_id = 'run'"), 'pending',
	'read-only: the run did not start');
is($p->requests('due'), 0, 'read-only: nothing was sent');
is($node->safe_psql('postgres', $workers), $pids, 'read-only: no worker process was restarted');
is(count_matches(log_since($node, $offset), $waiting), 2, 'read-only: each said it waits once, not again');
unlike(log_since($node, $offset), $failed, 'read-only: no worker failed on a write');

# 4. writable again: what came due runs, once, by the same processes
$node->safe_psql('postgres', $writable . 'ALTER SYSTEM RESET default_transaction_read_only');
$node->reload;
ok(poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') = 2 FROM ds_steps WHERE run_id = 'due'"),
	'writable: both steps succeeded');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = 'run'", 'succeeded'),
	'writable: the run succeeded');
is($node->safe_psql('postgres', "SELECT string_agg(step, ',' ORDER BY step) FROM done"),
	'run,slow,sql', 'writable: each SQL step and the run took effect once');
is($p->charges('due'), 1, 'writable: the HTTP step was sent once');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM ds_attempts WHERE run_id IN ('flip', 'due', 'run')"),
	'4', 'writable: one attempt each, none lost');
like(log_since($node, $offset), qr/durable_steps: the server accepts writes again/,
	'writable: the workers said so');
is($node->safe_psql('postgres', $workers), $pids, 'writable: by the same processes');
unlike(log_since($node, $offset), $failed, 'writable: no worker failed on a write');

$holder->quit;
done_testing();
