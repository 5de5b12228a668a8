# ds_task inside a run's workflow (docs/tasks.md, "In SQL workflows"; docs/runs.md): the run waits
# for an application worker -- played here in SQL: a claim in autocommit, then the outcome in a
# transaction with the handler's own write -- and goes on with the task's result; a task failed
# for good fails the run with DS102; a correctable failure blocks the run until ds_retry_step
# gives the task corrected input; cancelling the run cancels its task, pending or held by a
# worker, whose outcome is then refused; the task is the workflow's role's, and another role
# cannot claim it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('tasks_in_runs');
my ($rc, $out, $err);
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
CREATE ROLE other;
CREATE TABLE receipts (order_id text PRIMARY KEY, sent_to text);
CREATE TABLE ledger (run text, step text, receipt jsonb);
GRANT ALL ON receipts, ledger TO app;
-- the receipt is a task, the step after it uses its result
CREATE FUNCTION checkout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    receipt jsonb;
BEGIN
    receipt := ds_task('receipt', 'send-receipt', input);
    PERFORM ds_step('record', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), $1) RETURNING 1',
                    receipt);
    RETURN jsonb_build_object('receipt', receipt);
END $$;
});

sub app
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', "SET ROLE app; $sql");
}

sub start_run
{
	my ($key, $order) = @_;
	return app(qq{SELECT run_id FROM ds_start_run('checkout', '{"order": "$order", "to": "ada\@example.com"}',
	                                               '$key', '{"max_attempts": 3}')});
}

sub run_field
{
	my ($run, $field) = @_;
	return $node->safe_psql('postgres', "SELECT $field FROM ds_runs WHERE run_id = '$run'");
}

sub task_field
{
	my ($run, $field) = @_;
	return $node->safe_psql('postgres',
		"SELECT $field FROM ds_steps WHERE run_id = '$run' AND step_id = 'receipt'");
}

# Wait until the run waits for its task, pending; then claim it as $role (autocommit, as a worker
# does): "token|input", or '' when nothing was claimed.
sub claim_receipt
{
	my ($run, $role) = @_;
	ok( poll_until(
			$node, 'postgres',
			"SELECT status || '|' || coalesce(wait_reason, '') FROM ds_runs WHERE run_id = '$run'",
			'waiting|task: step receipt waits for a worker of task send-receipt'),
		"$run: the run waits for a worker of its task")
	  or diag(run_field($run, 'status || coalesce(error_message, \'\')'));
	return $node->safe_psql('postgres',
		"SET ROLE $role; SELECT token || '|' || input FROM ds_claim_tasks(ARRAY['send-receipt'], 1, '30 s', 'test-worker')"
	);
}

# --- 1. the run waits for the task, a worker completes it, the run goes on with its result
my $ok = start_run('checkout:o-1', 'o-1');
is(claim_receipt($ok, 'other'), '', 'another role cannot claim the task');
is(task_field($ok, "kind || '|' || status || '|' || owner || '|' || task"),
	'task|pending|app|send-receipt',
	"the task is stored as the workflow's role, pending, and still unclaimed");
is(run_field($ok, 'current_step || \'|\' || (next_wake_at IS NULL)'), 'receipt|true',
	'the run waits at the task, with no wake-up time');
is( $node->safe_psql('postgres',
		"SELECT value FROM ds_stats() WHERE metric = 'runs_waiting' AND label = 'task'"),
	'1', "ds_stats() counts the run under the reason 'task'");

my ($token, $input) = split /\|/, claim_receipt($ok, 'app'), 2;
ok($token, "the workflow's role claims its task");
is($input, '{"to": "ada@example.com", "order": "o-1"}', "with the workflow's input");
is(task_field($ok, "status || '|' || worker"), 'running|test-worker', 'the task runs');
is(run_field($ok, 'status'), 'waiting', 'the run still waits while the handler runs');
is( app(qq{BEGIN;
INSERT INTO receipts VALUES ('o-1', 'ada\@example.com');
SELECT status FROM ds_complete_task('$token', '{"message_id": "m-1"}');
COMMIT;}),
	'succeeded',
	'the worker completes the task with its write');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$ok'", 'succeeded'),
	'the completion wakes the run, which succeeds')
  or diag(run_field($ok, "status || ' ' || coalesce(wait_reason, '') || coalesce(error_message, '')"));
is(run_field($ok, "output->'receipt'->>'message_id'"), 'm-1', "with the task's result as output");
is( $node->safe_psql('postgres', "SELECT receipt->>'message_id' FROM ledger WHERE run = '$ok'"),
	'm-1', "the step after the task ran once with the task's result");
is($node->safe_psql('postgres', "SELECT count(*) FROM receipts WHERE order_id = 'o-1'"),
	'1', "the handler's write committed with the outcome");

# --- 2. a task failed for good fails the run with DS102
my $failed = start_run('checkout:o-2', 'o-2');
($token) = split /\|/, claim_receipt($failed, 'app');
is( app(qq{SELECT status FROM ds_fail_task('$token', 'bounced', 'the address bounced',
                                            class => 'permanent')}),
	'failed', 'the worker fails the task for good');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$failed'", 'failed'),
	'the failure wakes the run, which fails');
is(run_field($failed, 'error_code'), 'DS102', 'with the step-failed error');
like(run_field($failed, 'error_message'), qr/^step receipt of run \Q$failed\E failed/,
	'naming the task');
like(run_field($failed, 'error_detail'), qr/bounced|the address bounced/,
	"with the handler's error in the detail");
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE run = '$failed'"),
	'0', 'the step after the task did not run');

# --- 3. a correctable failure blocks the run; ds_retry_step with corrected input lets it go on
my $blocked = start_run('checkout:o-3', 'o-3');
($token) = split /\|/, claim_receipt($blocked, 'app');
is( app(qq{SELECT status FROM ds_fail_task('$token', 'bad_address', 'no such mailbox',
                                            class => 'correctable',
                                            remediation => 'correct the address')}),
	'blocked', 'the worker says the task needs corrected input');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$blocked'", 'blocked'),
	'the run is blocked');
is( run_field($blocked, "current_step || '|' || wait_reason"),
	'receipt|task step receipt is blocked: correct the address',
	'at the task, with its remediation');
is( app(qq{SELECT status FROM ds_retry_step('$blocked', 'receipt', '{"order": "o-3", "to": "grace\@example.com"}')}),
	'pending', 'ds_retry_step re-arms the task with corrected input');
($token, $input) = split /\|/, claim_receipt($blocked, 'app'), 2;
is($input, '{"to": "grace@example.com", "order": "o-3"}', 'the worker gets the corrected input');
is( app(qq{BEGIN;
INSERT INTO receipts VALUES ('o-3', 'grace\@example.com');
SELECT status FROM ds_complete_task('$token', '{"message_id": "m-3"}');
COMMIT;}),
	'succeeded',
	'and completes the task');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_runs WHERE run_id = '$blocked'", 'succeeded'),
	'the run goes on and succeeds')
  or diag(run_field($blocked, "status || ' ' || coalesce(wait_reason, '') || coalesce(error_message, '')"));
is(run_field($blocked, "output->'receipt'->>'message_id'"), 'm-3', "with the task's result");

# --- 4. cancelling the run cancels its pending task: no worker claims it
my $cancelled = start_run('checkout:o-4', 'o-4');
ok( poll_until(
		$node, 'postgres',
		"SELECT r.status || '|' || s.status FROM ds_runs r JOIN ds_steps s USING (run_id)"
		  . " WHERE r.run_id = '$cancelled' AND s.step_id = 'receipt'",
		'waiting|pending'),
	'a run waits for its pending task');
is(app("SELECT ds_cancel_run('$cancelled')"), 'cancelled', 'the run is cancelled');
is(task_field($cancelled, 'status'), 'cancelled', 'and its task with it');
is(app("SELECT count(*) FROM ds_claim_tasks(ARRAY['send-receipt'])"), '0',
	'no worker claims the cancelled task');
is(run_field($cancelled, 'status'), 'cancelled', 'the run stays cancelled');

# --- 5. cancelling the run while a worker holds its task: the worker learns it, its outcome is
# refused and its transaction keeps nothing
my $held = start_run('checkout:o-5', 'o-5');
($token) = split /\|/, claim_receipt($held, 'app');
is(app("SELECT ds_cancel_run('$held')"), 'cancelled', 'the run is cancelled while its task runs');
is(task_field($held, 'status'), 'cancelled', 'and its task with it');
is(app("SELECT held || '|' || cancelled FROM ds_heartbeat('$token')"), 'false|true',
	"the worker's heartbeat says the task was cancelled");
($rc, $out, $err) = $node->psql('postgres', qq{SET ROLE app; BEGIN;
INSERT INTO receipts VALUES ('o-5', 'late');
SELECT ds_complete_task('$token', '{"message_id": "m-5"}');
COMMIT;}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS410/, "the worker's completion is refused");
is($node->safe_psql('postgres', "SELECT count(*) FROM receipts WHERE order_id = 'o-5'"),
	'0', 'and its transaction kept nothing');
is(run_field($held, 'status'), 'cancelled', 'the run stays cancelled');

# --- 6. ds_task outside a workflow is refused
($rc, $out, $err) = $node->psql('postgres', "SELECT ds_task('x', 'send-receipt')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS105/, 'ds_task outside a workflow raises DS105');

done_testing();
