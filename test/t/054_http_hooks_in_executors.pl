# The outcome hooks of HTTP steps run in an executor, not in the HTTP worker (docs/steps.md, "Outcome hooks", "Security model"): the HTTP worker keeps the outcome on the step and an executor
# records it with the hook, in one transaction. A hook that sleeps holds back no other role's
# request; a hook that ignores its cancellation ends an executor, not the HTTP worker -- other
# roles' requests in flight go on -- and its step is blocked by it, never run again by itself.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start;
my $node = http_node('http_hooks');
$node->safe_psql('postgres', q{
CREATE ROLE mallory LOGIN IN ROLE durable_steps_http;
CREATE SCHEMA mallory AUTHORIZATION mallory;
CREATE TABLE hooked (who text, status int);
GRANT INSERT ON hooked TO mallory;
SET ROLE mallory;
CREATE FUNCTION mallory.never_stop() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM pg_sleep(0.2);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
});
my $http_pid = http_worker_pid($node);

sub http_step
{
	my ($role, $step, $request, $extra) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE $role; SELECT status FROM ds_http_step('hooks', '$step', '$request'" . ($extra // '') . ')');
}

# 1. A hook that sleeps: it runs in an executor, after its outcome is kept; alice's request is
#    sent and answered meanwhile.
http_step('mallory', 'sleepy', qq({"url": "@{[$p->url('sleepy')]}"}),
	q{, timeout => '1 min', on_success => $$SELECT pg_advisory_xact_lock(77), pg_sleep(600)$$});
ok(poll_until($node, 'postgres', q{
SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE l.locktype = 'advisory' AND l.objid = 77 AND l.granted
   AND a.backend_type = 'durable_steps worker'}),
	'sleepy: the hook runs in an executor');
is(step_field($node, 'hooks', 'sleepy', 'status'), 'running', 'sleepy: its step is running meanwhile');
http_step('app', 'alice-get', qq({"url": "@{[$p->url('alice-get')]}"}));
is(settle_http($node, 'hooks', 'alice-get'), 'succeeded', "sleepy: another role's request succeeded");
is(step_field($node, 'hooks', 'sleepy', 'status'), 'running',
	"sleepy: while the hook still ran (it held nobody else's request back)");
$node->safe_psql('postgres', q{
SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'});
is(settle_http($node, 'hooks', 'sleepy'), 'blocked', 'sleepy: a cancelled hook blocks its step');
is(step_field($node, 'hooks', 'sleepy', "error_code || ' ' || (result->>'status')"), '57014 200',
	'sleepy: with the hook\'s error, and the response kept');

# 2. A hook that records the response: the outcome and the hook's write commit together, as the
#    owner, and the attempt names the HTTP worker that sent it.
http_step('mallory', 'recording', qq({"url": "@{[$p->url('recording')]}"}),
	q{, on_success => $$INSERT INTO hooked VALUES (current_user, ($1->'result'->>'status')::int)$$});
is(settle_http($node, 'hooks', 'recording'), 'succeeded', 'recording: succeeded');
is($node->safe_psql('postgres', q{SELECT who || ' ' || status FROM hooked}), 'mallory 200',
	'recording: the hook ran once, as the owner, with the response');
is($node->safe_psql('postgres', qq{
SELECT executor || ' ' || (backend_pid = $http_pid) FROM ds_attempts WHERE step_id = 'recording'}),
	'worker true', 'recording: the attempt is the HTTP worker\'s');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM durable_steps.steps WHERE kept_outcome IS NOT NULL}),
	'0', 'recording: no outcome is left kept');

# 3. A hook that ignores its cancellation, while alice's keyless POST is in flight.
my $offset = log_offset($node);
http_step('app', 'alice-post', qq({"method": "POST", "url": "@{[$p->url('alice-post', 'fault=delay&secs=10')]}"}),
	q{, timeout => '1 min', idempotency_header => NULL});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'alice-post'}, 'running'),
	"stubborn: alice's keyless POST is in flight");
http_step('mallory', 'stubborn', qq({"url": "@{[$p->url('stubborn')]}"}),
	q{, timeout => '1 s', on_success => $$SELECT mallory.never_stop()$$});
is(settle_http($node, 'hooks', 'stubborn'), 'blocked', 'stubborn: the step is blocked');
is(step_field($node, 'hooks', 'stubborn', "error_code || ' ' || error_message || ' ' || (result->>'status')"),
	'DS007 on_success hook failed: the process running it ended before it finished 200',
	'stubborn: by its hook, which ended its executor (DS007), the response kept');
ok(poll_log($node, $offset, qr/durable_steps: worker \d+ started/) >= 1,
	'stubborn: an executor was ended and another started');
is(settle_http($node, 'hooks', 'alice-post'), 'succeeded', "stubborn: alice's POST succeeded");
is($p->requests('alice-post'), 1, 'stubborn: sent once');
is(http_worker_pid($node), $http_pid, 'stubborn: the HTTP worker was never ended');
is($p->requests('stubborn'), 1, 'stubborn: its own request was sent once, and never again');

$node->stop;
done_testing();
