# HTTP steps (docs/http.md): the HTTP worker sends a committed step's request once, with
# the step's idempotency key, and stores the response as its result; a replayed call, a
# rolled-back caller, a role without durable_steps_http, a host not allowed and a file: URL send
# nothing; connections are reused; SQL executors never run HTTP steps.
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
# the test framework logs every statement, and a statement names the secret; the extension
# itself must never log it
my $node = http_node('http_steps', "log_statement = none\n");
my $secret = 'sk_live_0123456789';

sub http_step
{
	my ($step, $request, $extra) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE app; SELECT status FROM ds_http_step('pay', '$step', '$request'" . ($extra // '') . ')');
}

# a POST with a JSON body: sent once after the commit, with the step's key, as the step's result
my $url = $p->url('order-1');
my $charge = qq({"method": "POST", "url": "$url", "expect": "json", "json": {"amount": 42},
  "headers": {"Authorization": "Bearer $secret"}});
is(http_step('charge', $charge), 'pending', 'the call stores the step pending');
is(settle_http($node, 'pay', 'charge'), 'succeeded', 'the step succeeded');
is($p->charges('order-1'), 1, 'one charge');
is($p->keys_seen('order-1'), 'pay:charge', 'sent with Idempotency-Key: run_id:step_id');
is($p->counts->{auth}{'order-1'}[0], "Bearer $secret", 'the Authorization header was sent');
is(step_field($node, 'pay', 'charge',
		"result->>'status' || ' ' || (result->'body'->>'charge') || ' ' || ((result->'body'->>'received')::jsonb->>'amount') || ' ' || (result->'headers'->>'content-type')"),
	'200 1 42 application/json', 'the result holds status, headers and the parsed JSON body');
is_deeply(attempts_of($node, 'pay', 'charge'), [ { attempt => 1, class => 'completed', error_code => undef, executor => 'worker' } ], 'one attempt, completed');
is($node->safe_psql('postgres', q{
SELECT a.backend_pid = p.pid FROM ds_attempts a, pg_stat_activity p
 WHERE a.step_id = 'charge' AND p.backend_type = 'durable_steps http'}),
	't', 'the HTTP worker ran it, not a SQL executor');

# SQL executors never claim HTTP steps: with the HTTP worker stopped, a due HTTP step waits
my $http_pid = http_worker_pid($node);
kill 'STOP', $http_pid;
http_step('while-stopped', qq({"url": "@{[$p->url('while-stopped')]}"}));
ok(wait_executor_loops($node, 'postgres', executor_pid($node), 600), 'the executors went round');
is(step_field($node, 'pay', 'while-stopped', 'status'), 'pending',
	'the SQL executors left the due HTTP step alone');
kill 'CONT', $http_pid;
is(settle_http($node, 'pay', 'while-stopped'), 'succeeded', 'the HTTP worker sent it once resumed');

# the same call again: replayed, nothing sent
is($node->safe_psql('postgres', qq{SET ROLE app;
SELECT status || ' ' || replayed || ' ' || (result->'body'->>'charge')
  FROM ds_http_step('pay', 'charge', '$charge')}),
	'succeeded true 1', 'the same ds_http_step again replays the stored response');
is($p->requests('order-1'), 1, 'and sends nothing');

# a refusal (400) blocks the step; the response is kept in error_detail, as its remediation says
http_step('refused', qq({"url": "@{[$p->url('refused', 'fault=400')]}"}));
is(settle_http($node, 'pay', 'refused'), 'blocked', 'a 400 blocks the step');
like(step_field($node, 'pay', 'refused', 'remediation'), qr/the response is kept in the step's error_detail/,
	"400: the remediation says where the response is");
like(step_field($node, 'pay', 'refused', 'error_detail'), qr/Response: .*bad request/,
	'400: and error_detail holds it');

# a text response, a GET, a custom idempotency header
my $get = $p->url('lookup', 'key_header=X-Request-Id');
http_step('lookup', qq({"url": "$get", "expect": "text"}), ", idempotency_header => 'X-Request-Id'");
is(settle_http($node, 'pay', 'lookup'), 'succeeded', 'text: succeeded');
is(step_field($node, 'pay', 'lookup', "jsonb_typeof(result->'body')"), 'string',
	'text: the body is kept as text');
is($p->keys_seen('lookup'), 'pay:lookup', 'the key went in the header named by idempotency_header');

# outcome hooks: on_success gets the response in the transaction that stores it, as the owner;
# a failing one blocks the step with the response kept, and ds_retry_step runs the hook again,
# never the request
$node->safe_psql('postgres', q{
CREATE TABLE charges (charge int, who text);
GRANT INSERT ON charges TO app;
CREATE TABLE hook_gate (open bool);
INSERT INTO hook_gate VALUES (false);
GRANT SELECT ON hook_gate TO app;
});
http_step('hooked', qq({"method": "POST", "url": "@{[$p->url('hooked')]}", "expect": "json"}),
	q{, on_success => $$INSERT INTO charges SELECT ($1->'result'->'body'->>'charge')::int, current_user$$});
is(settle_http($node, 'pay', 'hooked'), 'succeeded', 'on_success: succeeded');
is($node->safe_psql('postgres', q{SELECT charge || ' ' || who FROM charges}), '1 app',
	'on_success: ran once, as the owner, with the response');
http_step('gated', qq({"method": "POST", "url": "@{[$p->url('gated')]}", "expect": "json"}),
	q{, on_success => $$SELECT 1 / (SELECT open::int FROM hook_gate)$$});
is(settle_http($node, 'pay', 'gated'), 'blocked', 'a failing on_success hook blocks the step');
is(step_field($node, 'pay', 'gated', "(result->'body'->>'charge') || ' ' || error_code"), '1 22012',
	'the response stays stored, the hook\'s error recorded');
$node->safe_psql('postgres', "UPDATE hook_gate SET open = true");
is($node->safe_psql('postgres', "SET ROLE app; SELECT status FROM ds_retry_step('pay', 'gated')"),
	'succeeded', 'ds_retry_step runs the hook again');
is($p->requests('gated'), 1, 'and never the request');

# a hook's session-level advisory lock ends with its transaction: it is not left to the HTTP worker
http_step('locking-hook', qq({"url": "@{[$p->url('locking-hook')]}"}),
	q{, on_success => $$SELECT pg_advisory_lock(4242)$$});
is(settle_http($node, 'pay', 'locking-hook'), 'succeeded', 'a hook that takes an advisory lock: succeeded');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE a.backend_type = 'durable_steps http' AND l.locktype = 'advisory' AND l.objid = 4242}),
	'0', 'the HTTP worker holds no advisory lock of the hook');

# a rolled-back caller sends nothing
$node->safe_psql('postgres', qq{SET ROLE app; BEGIN;
SELECT ds_http_step('pay', 'rolled-back', '{"method": "POST", "url": "@{[$p->url('rolled-back')]}"}');
ROLLBACK;
SELECT ds_http_step('pay', 'after', '{"method": "POST", "url": "@{[$p->url('after')]}"}');});
is(settle_http($node, 'pay', 'after'), 'succeeded', 'a step committed later was sent');
is($p->requests('rolled-back'), 0, 'the rolled-back step was never sent');
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE step_id = 'rolled-back'"), '0',
	'and nothing of it is stored');

# a trigger is a webhook outbox: an order's committed insert sends its webhook, a rolled-back
# one does not
$node->safe_psql('postgres', qq{
CREATE TABLE orders (id int PRIMARY KEY, total int);
GRANT INSERT ON orders TO app;
CREATE FUNCTION order_webhook() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM ds_http_step('order:' || NEW.id, 'webhook',
        jsonb_build_object('method', 'POST', 'url', '@{[$p->url('hook')]}' || '-' || NEW.id,
                           'json', jsonb_build_object('id', NEW.id, 'total', NEW.total)));
    RETURN NEW;
END
\$\$;
CREATE TRIGGER orders_webhook AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_webhook();
SET ROLE app;
INSERT INTO orders VALUES (1, 100);
BEGIN; INSERT INTO orders VALUES (2, 200); ROLLBACK;
});
is(settle_http($node, 'order:1', 'webhook'), 'succeeded', 'outbox: the committed order sent its webhook');
is($p->requests('hook-1') . ' ' . $p->requests('hook-2'), '1 0',
	'outbox: once for the committed order, never for the rolled-back one');

# refused at call time, storing nothing: a role without durable_steps_http, a file: URL, a host
# the superuser's setting does not allow
my ($rc, $out, $err) = $node->psql('postgres',
	qq{SET ROLE plain; SELECT ds_http_step('pay', 'plain', '{"url": "@{[$p->url('plain')]}"}')});
like($err, qr/permission denied to create HTTP steps/, 'a role without durable_steps_http is refused');
($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE app; SELECT ds_http_step('pay', 'file', '{"url": "file:///etc/passwd"}')});
like($err, qr/must be an http or https URL/, 'a file: URL is refused');
$node->append_conf('postgresql.conf', "durable_steps.http_allowed_hosts = 'localhost'\n");
$node->reload;
ok(poll_until($node, 'postgres', 'SHOW durable_steps.http_allowed_hosts', 'localhost'), 'hosts restricted');
($rc, $out, $err) = $node->psql('postgres',
	qq{SET ROLE app; SELECT ds_http_step('pay', 'not-allowed', '{"url": "@{[$p->url('not-allowed')]}"}')});
like($err, qr/host "127.0.0.1" is not allowed/, 'a host not allowed is refused');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM ds_steps WHERE step_id IN ('plain', 'file', 'not-allowed')"), '0',
	'none of the refused calls stored a step');
is($p->requests('plain') + $p->requests('not-allowed'), 0, 'and none sent anything');

# a host allowed when the step was created but not when it is due: blocked, nothing sent
$node->append_conf('postgresql.conf', "durable_steps.http_allowed_hosts = '127.0.0.1'\n");
$node->reload;
ok(poll_until($node, 'postgres', 'SHOW durable_steps.http_allowed_hosts', '127.0.0.1'), 'hosts allowed');
http_step('later', qq({"url": "@{[$p->url('later')]}"}),
	", run_at => clock_timestamp() + interval '1 hour'");
$node->append_conf('postgresql.conf', "durable_steps.http_allowed_hosts = 'localhost'\n");
$node->reload;
ok(poll_until($node, 'postgres', 'SHOW durable_steps.http_allowed_hosts', 'localhost'), 'then only localhost');
# due now, once the setting changed (superuser back-dating)
$node->safe_psql('postgres',
	q{UPDATE durable_steps.steps SET next_attempt_at = now() WHERE run_id = 'pay' AND step_id = 'later'});
is(settle_http($node, 'pay', 'later'), 'blocked', 'a host no longer allowed blocks the step');
is_deeply(attempts_of($node, 'pay', 'later'), [ { attempt => 1, class => 'correctable', error_code => '42501', executor => 'worker' } ], 'its attempt says why');
is($p->requests('later'), 0, 'and nothing was sent');
$node->append_conf('postgresql.conf', "durable_steps.http_allowed_hosts = ''\n");
$node->reload;
ok(poll_until($node, 'postgres', 'SHOW durable_steps.http_allowed_hosts', ''), 'hosts unrestricted');

# connections are kept alive and reused: 4 rounds of 5 concurrent steps need about 5
# connections, not 20
my $before = $p->counts->{connections};
for my $round (1 .. 4)
{
	$node->safe_psql('postgres', qq{SET ROLE app;
SELECT count(ds_http_step('many', '$round-' || i, jsonb_build_object('url', '@{[$p->url('many')]}')))
  FROM generate_series(1, 5) i});
	poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') = 5 * $round FROM ds_steps WHERE run_id = 'many'")
	  or last;
}
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = 'many' AND status = 'succeeded'"),
	'20', '20 steps succeeded');
cmp_ok($p->counts->{connections} - $before, '<=', 10, 'over at most 10 connections');

# identities with CR, LF, spaces and '%': the key on the wire is header-safe and injective
# (docs/steps.md, "Keys"): no header is injected, identities differing in a control byte or a trailing
# space are charged apart, and ds_attempts shows the key each request carried
my $inj = $p->url('inject');
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step(E'order-7\\r\\nX-Evil', ' injected-value', '{"method": "POST", "url": "$inj"}');
SELECT ds_http_step(E'order-8\\r\\nA', 'charge', '{"method": "POST", "url": "$inj"}');
SELECT ds_http_step(E'order-8\\r\\nB', 'charge', '{"method": "POST", "url": "$inj"}');
SELECT ds_http_step('order-8 ', 'charge', '{"method": "POST", "url": "$inj"}');
SELECT ds_http_step('order-8', '100%', '{"method": "POST", "url": "$inj"}');
SELECT ds_http_step('keyless', 'get', '{"url": "$inj"}', idempotency_header => NULL);});
ok(poll_until($node, 'postgres',
	"SELECT count(*) FILTER (WHERE status = 'succeeded') = 6 FROM ds_steps WHERE request->>'url' = '$inj'"),
	'control bytes: the six steps succeeded');
is(join(',', sort split /,/, $p->keys_seen('inject')),
	'-,order-7%0D%0AX-Evil:%20injected-value,order-8%0D%0AA:charge,order-8%0D%0AB:charge,order-8%20:charge,order-8:100%25',
	'control bytes: each key percent-encoded, the keyless GET with none');
unlike($p->header_names_seen('inject'), qr/x-evil/, 'control bytes: no X-Evil header reached the receiver');
is($p->charges('inject'), 6, 'control bytes: six requests, six charges (no step was answered with another\'s)');
is($node->safe_psql('postgres', qq{
SELECT string_agg(coalesce(a.idempotency_key, '-'), ',' ORDER BY a.idempotency_key COLLATE "C" NULLS FIRST)
  FROM ds_attempts a JOIN ds_steps s USING (run_id, step_id) WHERE s.request->>'url' = '$inj'}),
	'-,order-7%0D%0AX-Evil:%20injected-value,order-8%0D%0AA:charge,order-8%0D%0AB:charge,order-8%20:charge,order-8:100%25',
	'control bytes: ds_attempts shows the keys sent, and none for the keyless step');

# the secret never reached the server log
unlike(slurp_file($node->logfile), qr/$secret/, 'the Authorization value is not in the server log');
settled_and_sound($node, 'pay', 'charge', 1, 'charge');

done_testing();
