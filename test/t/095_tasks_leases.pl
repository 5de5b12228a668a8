# Tasks under their leases (docs/tasks.md), what the background worker does with them. A task
# stored from a trigger commits with its row, or not at all. A lease
# that runs out is recorded as a lost attempt and retried under the same idempotency key; a task
# stored with on_lost => 'uncertain' waits for a person instead; a deadline ends the lease with
# it; a commit that makes a task due wakes a session waiting in ds_wait_for_tasks at once, and
# the wait holds no snapshot; the server's restart keeps every lease, and a token that held its
# lease before the restart still completes its attempt.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = worker_node('tasks_leases');
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
CREATE TABLE effects (k text PRIMARY KEY);
GRANT ALL ON effects TO app;
});

sub app
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', "SET ROLE app; $sql");
}

# claim one task of $task with $lease: "attempt|idempotency_key|token"
sub claim
{
	my ($task, $lease) = @_;
	return app("SELECT attempt || '|' || idempotency_key || '|' || token"
		  . " FROM ds_claim_tasks(ARRAY['$task'], 1, '$lease')");
}

# 0. Stored from a trigger: with the row's transaction, or not at all
$node->safe_psql('postgres', q{
CREATE TABLE orders (id int PRIMARY KEY, email text);
GRANT ALL ON orders TO app;
CREATE FUNCTION order_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_task_step('order:' || NEW.id, 'receipt', 'mail', jsonb_build_object('to', NEW.email));
    RETURN NEW;
END $$;
CREATE TRIGGER order_receipt AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_receipt();
});
app(q{BEGIN; INSERT INTO orders VALUES (1, 'a@example.com'); ROLLBACK;
INSERT INTO orders VALUES (2, 'b@example.com');});
is(app(q{SELECT string_agg(run_id || ' ' || status || ' ' || (input->>'to'), ',') FROM ds_steps WHERE kind = 'task'}),
	'order:2 pending b@example.com', 'a trigger stores the task with its row; a rollback leaves none');
app(q{DELETE FROM orders}); $node->safe_psql('postgres', q{DELETE FROM durable_steps.steps WHERE run_id = 'order:2'});

# 1. A lease that runs out: lost, retried under the same key, and the stale token is refused.
app(q{SELECT ds_task_step('o1', 'receipt', 'mail', '{"to": "a@example.com"}',
        policy => ds_retry_policy(initial_delay => '10 ms'))});
my ($attempt, $key, $token) = split /\|/, claim('mail', '1 s');
is($attempt, 1, 'the first claim is attempt 1');
ok(poll_until($node, 'postgres',
		"SELECT status || ' ' || error_code FROM ds_steps WHERE step_id = 'receipt'",
		'retrying DS007'),
	'the background worker records the lease that ran out as a lost attempt');
like(
	$node->safe_psql('postgres',
		"SELECT error_detail FROM ds_attempts WHERE step_id = 'receipt' AND attempt = 1"),
	qr/lease of attempt 1 ran out/, 'saying so');
ok(poll_until($node, 'postgres',
		"SELECT count(*) > 0 FROM ds_steps WHERE step_id = 'receipt' AND next_attempt_at <= clock_timestamp()"),
	'the retry is due after its backoff');
my ($attempt2, $key2, $token2) = split /\|/, claim('mail', '30 s');
is("$attempt2 $key2", "2 $key", 'attempt 2 carries the same idempotency key');
my ($out, $err) = ('', '');
$node->psql('postgres',
	"SET ROLE app; BEGIN; INSERT INTO effects VALUES ('stale'); SELECT ds_complete_task('$token', '{}'); COMMIT;",
	stdout => \$out, stderr => \$err);
like($err, qr/DS410|no longer holds its lease/, 'the stale token is refused');
is(app("SELECT count(*) FROM effects WHERE k = 'stale'"), '0', 'and its transaction kept nothing');
is(app("BEGIN; INSERT INTO effects VALUES ('sent'); SELECT status FROM ds_complete_task('$token2', '{\"ok\": true}'); COMMIT;"),
	'succeeded', 'the live token completes the step');
is(app("SELECT string_agg(attempt || ':' || coalesce(class, ''), ',' ORDER BY attempt) FROM ds_attempts WHERE step_id = 'receipt'"),
	'1:retryable,2:completed', 'one lost attempt, one completed');

# 2. on_lost => 'uncertain': a person decides
app(q{SELECT ds_task_step('o1', 'charge', 'charge', '{}', on_lost => 'uncertain')});
claim('charge', '1 s');
ok(poll_until($node, 'postgres',
		"SELECT status FROM ds_steps WHERE step_id = 'charge'", 'uncertain'),
	'a lost lease of an on_lost => uncertain task makes it uncertain');
like(app("SELECT remediation FROM ds_steps WHERE step_id = 'charge'"),
	qr/handler may have taken effect/, 'with a remediation for tasks');
is(app("SELECT count(*) FROM ds_claim_tasks(ARRAY['charge'])"), '0', 'never claimed again by itself');
is(app("SELECT status FROM ds_resolve_step('o1', 'charge', 'succeeded', '{\"found\": true}')"),
	'succeeded', 'ds_resolve_step settles it');

# 3. A deadline ends the lease with it: heartbeats cannot keep an attempt past its timeout
app(q{SELECT ds_task_step('o1', 'slow', 'slow', '{}', timeout => '2 s',
        policy => ds_retry_policy(max_attempts => 1))});
my (undef, undef, $slow) = split /\|/, claim('slow', '1 hour');
like(app("SELECT lease_expires_at <= clock_timestamp() + interval '2 s' FROM ds_heartbeat('$slow', '1 hour')"),
	qr/^t$/, 'the heartbeat extends the lease no further than the deadline');
ok(poll_until($node, 'postgres',
		"SELECT status || ' ' || error_code FROM ds_steps WHERE step_id = 'slow'",
		'failed DS004'),
	'the deadline is recorded as a timeout (DS004), the budget spent');

# 4. A waiting session is woken by the commit that makes a task due, and holds no snapshot
my $waiter = DurableSteps::Session->new($node, 'waiter');
$waiter->query_ok('SET ROLE app;');
my $t0 = time();
my $ticket = $waiter->send("CALL ds_wait_for_tasks(ARRAY['wake'], '60 s');");
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'CALL ds_wait_for_tasks%' AND wait_event IS NOT NULL"),
	'the waiter sleeps');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL ds_wait_for_tasks%' AND backend_xmin IS NOT NULL"),
	'0', 'holding no snapshot while it sleeps');
app(q{SELECT ds_task_step('o1', 'wake', 'wake', '{}')});
my ($woke) = $waiter->wait($ticket);
my $elapsed = time() - $t0;
like($woke, qr/^t$/m, 'the wait returns true');
cmp_ok($elapsed, '<', 30, 'woken by the commit, not by its timeout');
# a task scheduled ahead ends the wait when it is due
app(q{SELECT ds_task_step('o1', 'later', 'later', '{}', run_at => clock_timestamp() + interval '1 s')});
$t0 = time();
($woke) = $waiter->query("CALL ds_wait_for_tasks(ARRAY['later'], '60 s');");
like($woke, qr/^t$/m, 'a task run_at ahead ends the wait when due');
cmp_ok(time() - $t0, '<', 30, 'not at the timeout');
$waiter->quit;

# 5. A restart keeps the leases: a token that holds its lease still completes its attempt
app(q{SELECT ds_task_step('o1', 'across', 'across', '{}')});
my (undef, undef, $across) = split /\|/, claim('across', '1 hour');
$node->restart;
is(app("SELECT held FROM ds_heartbeat('$across')"), 't', 'the lease survives a restart');
is(app("SELECT status FROM ds_complete_task('$across', '{}')"), 'succeeded',
	'and its attempt completes');

ok(log_since($node, 0) !~ $crash_re, 'no server process crashed');
$node->stop;
done_testing();
