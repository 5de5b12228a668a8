# Outcome hooks in the worker (docs/steps.md, "Outcome hooks", "Logging"): on_success writes the answer
# back in the transaction that records the success; on_failure runs on exhaustion and on a
# permanent failure; a failing hook blocks the step and keeps its outcome; a hook runs as the
# step's owner, isolated; failed and blocked outcomes are logged without the step's input.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# no statement logging: the step's input must not reach the log by any way
# one executor: the test kills the one running a step
my $node = worker_node('hooks',
	"durable_steps.database = 'postgres'\nlog_statement = none\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app;
-- xid: the top-level transaction that wrote the row
CREATE TABLE answers (step text, answer jsonb, who text, xid bigint DEFAULT txid_current());
CREATE TABLE dead_letters (step text, outcome jsonb);
CREATE TABLE effects (step text);
CREATE TABLE hook_roles (step text, cur text, sess text, super text);
GRANT ALL ON answers, dead_letters, effects, hook_roles TO app;
});
my $log_start = log_offset($node);

# Run, as app, a deferred step (the worker runs all its attempts) and wait for it to settle.
sub run_in_worker
{
	my ($step, $sql, %opt) = @_;
	my $args = join('', map { ", $_ => \$h\$$opt{$_}\$h\$" } sort keys %opt);
	$node->safe_psql('postgres', qq{
SET ROLE app;
SELECT status FROM ds_run_step('hk', '$step', \$b\$$sql\$b\$, defer => true$args);
});
	ok(poll_until($node, 'postgres',
			"SELECT status NOT IN ('pending', 'running', 'retrying') FROM ds_steps WHERE step_id = '$step'"),
		"$step: the worker settled the step");
}

sub q1 { return $node->safe_psql('postgres', $_[0]); }
# the one row of a query, as a hash of its named columns
sub row1 { return row_of($node, 'postgres', $_[0]); }

my $answer_hook = q{INSERT INTO answers (step, answer, who) SELECT $1->>'step_id', $1->'result', current_user};
my $dead_letter_hook = q{INSERT INTO dead_letters SELECT $1->>'step_id', $1};
my $secret = 's3cr3t-input-value';

# on_success: the worker's answer written back, in the transaction that records the success
run_in_worker('answer', q{INSERT INTO effects VALUES ('answer') RETURNING 'forty-two'},
	on_success => $answer_hook, on_failure => $dead_letter_hook);
is_deeply(row1("SELECT status, result::text AS result FROM ds_steps WHERE step_id = 'answer'"),
	{ status => 'succeeded', result => '"forty-two"' }, 'answer: succeeded');
is_deeply(row1("SELECT answer::text AS answer, who FROM answers WHERE step = 'answer'"),
	{ answer => '"forty-two"', who => 'app' }, 'answer: on_success wrote the result, as app');
is(q1("SELECT a.xid % 4294967296 = s.xmin::text::bigint FROM answers a, durable_steps.steps s "
		  . "WHERE a.step = 'answer' AND s.step_id = 'answer'"),
	't', 'answer: written by the transaction that recorded the success');
is(q1("SELECT count(*) FROM dead_letters WHERE step = 'answer'"), '0',
	'answer: no on_failure for a success');

# a replay of the worker's success, deferred or not, runs no hook again
is_deeply(
	[
		map { decode_row($_) } split /\n/,
		$node->safe_psql(
			'postgres',
			"SET ROLE app;\n"
			  . row_sql(qq{SELECT status, replayed FROM ds_run_step('hk', 'answer',
  \$b\$INSERT INTO effects VALUES ('answer') RETURNING 'forty-two'\$b\$, defer => true,
  on_failure => \$h\$$dead_letter_hook\$h\$, on_success => \$h\$$answer_hook\$h\$)})
			  . "\n"
			  . row_sql(qq{SELECT status, replayed FROM ds_run_step('hk', 'answer',
  \$b\$INSERT INTO effects VALUES ('answer') RETURNING 'forty-two'\$b\$,
  on_failure => \$h\$$dead_letter_hook\$h\$, on_success => \$h\$$answer_hook\$h\$)}))
	],
	[ { status => 'succeeded', replayed => 'true' }, { status => 'succeeded', replayed => 'true' } ],
	'answer: replays, deferred or not');
is_deeply(
	row1("SELECT (SELECT count(*) FROM answers WHERE step = 'answer') AS answers, "
		  . "(SELECT count(*) FROM effects WHERE step = 'answer') AS effects"),
	{ answers => 1, effects => 1 }, 'answer: one answer, one effect after the replays');

# on_failure on exhaustion (not after the first, retried, attempt) and on a permanent failure
run_in_worker('exhausted', q{SELECT ds_retry_after('later', '10 ms')},
	policy => '{"max_attempts": 2}', on_failure => $dead_letter_hook, input => qq{{"k": "$secret"}});
is_deeply(
	rows_of($node, 'postgres',
		"SELECT outcome->>'status' AS status, outcome->>'error_class' AS error_class, "
		  . "outcome->>'error_code' AS error_code, outcome->>'attempt' AS attempt FROM dead_letters WHERE step = 'exhausted'"),
	[ { status => 'failed', error_class => 'exhausted', error_code => 'DS002', attempt => 2 } ],
	'exhausted: on_failure ran once, with the outcome of attempt 2');
run_in_worker('permanent', q{SELECT ds_non_retriable('declined: ' || ($1->>'k'))},
	on_success => $answer_hook, on_failure => $dead_letter_hook, input => qq{{"k": "$secret"}});
is_deeply(
	row1("SELECT outcome->>'error_class' AS error_class, outcome->>'error_code' AS error_code, "
		  . "outcome->>'error_message' AS error_message FROM dead_letters WHERE step = 'permanent'"),
	{ error_class => 'permanent', error_code => 'DS001', error_message => "declined: $secret" },
	'permanent: on_failure ran with the error');
is(q1("SELECT count(*) FROM answers WHERE step = 'permanent'"), '0',
	'permanent: no on_success for a failure');

# a failing hook blocks the step: the body's effect and its result are kept, the hook's writes
# are rolled back, the attempt is recorded as it was
run_in_worker('hook-fails', q{INSERT INTO effects VALUES ('hook-fails') RETURNING 7},
	on_success => q{WITH w AS (INSERT INTO answers (step) VALUES ('hook-fails')) SELECT 1 / 0},
	input => qq{{"k": "$secret"}});
is_deeply(
	row1("SELECT status, result::text AS result, error_class, error_code, error_message FROM ds_steps WHERE step_id = 'hook-fails'"),
	{
		status => 'blocked',
		result => '7',
		error_class => 'correctable',
		error_code => '22012',
		error_message => 'on_success hook failed: division by zero'
	},
	'hook-fails: blocked with the hook\'s error, result kept');
is(q1("SELECT count(*) FROM effects WHERE step = 'hook-fails'"), '1', 'hook-fails: the effect is kept');
is(q1("SELECT count(*) FROM answers WHERE step = 'hook-fails'"), '0',
	'hook-fails: the hook\'s write is rolled back');
is_deeply(rows_of($node, 'postgres', "SELECT attempt, class, executor FROM ds_attempts WHERE step_id = 'hook-fails'"),
	[ { attempt => 1, class => 'completed', executor => 'worker' } ], 'hook-fails: attempt 1 recorded as completed');

# a failing on_failure hook blocks a failed step too
run_in_worker('dead-letter-fails', q{SELECT ds_non_retriable('no')},
	on_failure => q{INSERT INTO no_such_table VALUES (1)});
is_deeply(row1("SELECT status, error_class, error_code FROM ds_steps WHERE step_id = 'dead-letter-fails'"),
	{ status => 'blocked', error_class => 'correctable', error_code => '42P01' },
	'dead-letter-fails: blocked with the hook\'s error');

# the hook runs as app, session and current user, not as the worker's superuser, and cannot
# escalate or leave anything behind
run_in_worker('roles', 'SELECT 1',
	on_success => q{INSERT INTO hook_roles SELECT 'roles', current_user, session_user, current_setting('is_superuser')});
is_deeply(rows_of($node, 'postgres', "SELECT cur, sess, super FROM hook_roles WHERE step = 'roles'"),
	[ { cur => 'app', sess => 'app', super => 'off' } ],
	'roles: the hook ran as app, session and current user, not superuser');
run_in_worker('escalate', 'SELECT 1', on_success => 'ALTER ROLE app SUPERUSER');
is_deeply(row1("SELECT status, error_code FROM ds_steps WHERE step_id = 'escalate'"),
	{ status => 'blocked', error_code => '42501' }, 'escalate: ALTER ROLE from a hook is refused');
is(q1("SELECT rolsuper FROM pg_roles WHERE rolname = 'app'"), 'f', 'escalate: app is no superuser');
run_in_worker('with-hold', 'SELECT 1', on_success => 'DECLARE c CURSOR WITH HOLD FOR SELECT 1');
is_deeply(
	row1("SELECT status, error_code, error_message FROM ds_steps WHERE step_id = 'with-hold'"),
	{
		status => 'blocked',
		error_code => '42501',
		error_message => 'on_success hook failed: cannot create a cursor WITH HOLD within security-restricted operation'
	},
	'with-hold: a hook cannot leave a WITH HOLD cursor behind');

# an attempt lost with its executor, and out of attempts: the next executor's recovery records
# it, outside any owner's group of attempts, and runs on_failure there -- still as app
$node->safe_psql('postgres', q{
SET ROLE app;
SELECT status FROM ds_run_step('hk', 'lost', 'SELECT pg_sleep(60)', defer => true,
  policy => '{"max_attempts": 1}',
  on_failure => $h$INSERT INTO hook_roles SELECT 'lost', current_user, session_user, current_setting('is_superuser')$h$);
});
ok(poll_until($node, 'postgres', "SELECT status = 'running' FROM ds_steps WHERE step_id = 'lost'"),
	'lost: the worker is running the step');
my $executor = executor_pid($node);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($executor)");
ok(poll_until($node, 'postgres', "SELECT status = 'failed' FROM ds_steps WHERE step_id = 'lost'"),
	'lost: the next executor recorded the lost attempt');
is_deeply(row1("SELECT error_class, error_code FROM ds_steps WHERE step_id = 'lost'"),
	{ error_class => 'exhausted', error_code => 'DS007' }, 'lost: exhausted by invocation_lost');
is_deeply(rows_of($node, 'postgres', "SELECT cur, sess, super FROM hook_roles WHERE step = 'lost'"),
	[ { cur => 'app', sess => 'app', super => 'off' } ],
	'lost: on_failure ran once, as app, session and current user');

# in the worker a hook is bounded like an attempt: here by the step's own timeout
run_in_worker('hook-timeout', 'SELECT 1', timeout => '1 s', on_success => 'SELECT pg_sleep(60)');
is_deeply(
	row1("SELECT status, result::text AS result, error_code, error_message FROM ds_steps WHERE step_id = 'hook-timeout'"),
	{ status => 'blocked', result => '1', error_code => 'DS004', error_message => 'on_success hook failed: timed out after 1000 ms' },
	'hook-timeout: the hook was stopped, the step blocked');

# ds_retry_step on a step blocked by on_success runs the hook again, not the step
run_in_worker('retry-hook-2', q{INSERT INTO effects VALUES ('retry-hook-2') RETURNING 2},
	on_success => q{INSERT INTO answers (step) SELECT 'retry-hook-2' WHERE 1 / (SELECT count(*) FROM dead_letters WHERE step = 'go')::int = 1});
is(q1("SELECT status FROM ds_steps WHERE step_id = 'retry-hook-2'"), 'blocked', 'retry-hook-2: blocked');
$node->safe_psql('postgres', "INSERT INTO dead_letters VALUES ('go', NULL)");
is_deeply(decode_row(q1("SET ROLE app; " . row_sql("SELECT status, attempt FROM ds_retry_step('hk', 'retry-hook-2')"))),
	{ status => 'succeeded', attempt => 1 }, 'retry-hook-2: ds_retry_step ran the hook, the step is succeeded at attempt 1');
is_deeply(
	row1("SELECT (SELECT count(*) FROM effects WHERE step = 'retry-hook-2') AS effects, "
		  . "(SELECT count(*) FROM answers WHERE step = 'retry-hook-2') AS answers"),
	{ effects => 1, answers => 1 }, 'retry-hook-2: the body ran once, the hook wrote its row');
# its success was blocked by the hook, so its attempt has its own row: the step row, succeeded
# later, does not record it a second time
is_deeply(
	{
		shown => rows_of($node, 'postgres', "SELECT attempt, class, executor FROM ds_attempts WHERE step_id = 'retry-hook-2'"),
		attempts_rows => q1("SELECT count(*) FROM durable_steps.attempts WHERE step_id = 'retry-hook-2'")
	},
	{ shown => [ { attempt => 1, class => 'completed', executor => 'worker' } ], attempts_rows => 1 },
	'retry-hook-2: one attempt shown, from its attempts row');

# Logging: the worker's failed and blocked outcomes, with identity and SQLSTATE, never the input
my $log = log_since($node, $log_start);
like($log, qr{LOG:  durable_steps: step hk/exhausted attempt 2 is failed \(exhausted\), SQLSTATE DS002},
	'log: the exhausted step');
like($log, qr{LOG:  durable_steps: step hk/permanent attempt 1 is failed \(permanent\), SQLSTATE DS001},
	'log: the permanent failure');
like($log, qr{LOG:  durable_steps: step hk/hook-fails attempt 1 is blocked \(correctable\), SQLSTATE 22012},
	'log: the step blocked by its hook');
is(count_matches($log, qr/durable_steps: step hk\/answer /), 0, 'log: nothing for a success');
is(count_matches($log, qr/durable_steps: step hk\/exhausted attempt 1 /), 0,
	'log: nothing for an attempt that will be retried');
is(count_matches($log, qr/\Q$secret\E/), 0, 'log: the input appears nowhere');

# the level is a setting: below log_min_messages, nothing
$node->append_conf('postgresql.conf', "durable_steps.log_outcomes_level = debug1\n");
$node->reload;
ok(poll_until($node, 'postgres',
		"SELECT setting = 'debug1' FROM pg_settings WHERE name = 'durable_steps.log_outcomes_level'"),
	'the level is reloaded');
# a new executor session reads it at its next reload: wait for one pass over a step
run_in_worker('reloaded-marker', 'SELECT 1');
$log_start = log_offset($node);
run_in_worker('quiet', q{SELECT ds_non_retriable('no')});
is(count_matches(log_since($node, $log_start), qr/durable_steps: step hk\/quiet /), 0,
	'log: at debug1 the failure is not logged');

unlike(log_since($node, 0), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
