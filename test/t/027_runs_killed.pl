# Runs (docs/runs.md): kill -9 of the executor in the middle of a turn -- in the workflow
# between two steps, and inside a step's body. The steps completed before stay committed; the
# crash rolls the turn back; the run is found running with its executor gone, runs again, and no
# step's effect is committed twice.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('runs_killed', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (run text, step text);
-- the test turns a nap off (committed from its own session) before it kills the executor
CREATE TABLE naps (place text PRIMARY KEY, on_ boolean NOT NULL);
INSERT INTO naps VALUES ('between', true), ('body', true), ('held', true), ('poison', true);
CREATE FUNCTION effect() RETURNS int LANGUAGE sql AS
  $$ INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1 $$;
CREATE FUNCTION sleepy_body() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id());
    IF (SELECT on_ FROM naps WHERE place = 'body') THEN PERFORM pg_sleep(60); END IF;
    RETURN 2;
END $$;
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb := '[]';
BEGIN
    r := r || ds_step('s1', 'SELECT effect()');
    IF input->>'kill' = 'between' AND (SELECT on_ FROM naps WHERE place = 'between') THEN
        PERFORM pg_sleep(60);
    END IF;
    r := r || ds_step('s2', CASE WHEN input->>'kill' = 'body' THEN 'SELECT sleepy_body()'
                                 ELSE 'SELECT effect()' END);
    r := r || ds_step('s3', 'SELECT effect()');
    RETURN r;
END $$;
});

# The effects in the ledger of the runs $where selects, one row per step: run, step, effects.
sub effects_by_step
{
	my ($where) = @_;
	return rows_of($node, 'postgres',
		"SELECT run, step, count(*) AS effects FROM ledger WHERE $where GROUP BY run, step ORDER BY run, step");
}

# The attempts of run $run's steps, by step and number: step_id, attempt, class, error_code.
sub run_attempts
{
	my ($run) = @_;
	return rows_of($node, 'postgres',
		"SELECT step_id, attempt, class, error_code FROM ds_attempts WHERE run_id = '$run' ORDER BY step_id, attempt");
}

# s2's attempt lost with a turn (DS007), then its next one completed; s1 and s3 completed at once
my @s2_lost_once = (
	{ step_id => 's1', attempt => 1, class => 'completed', error_code => undef },
	{ step_id => 's2', attempt => 1, class => 'retryable', error_code => 'DS007' },
	{ step_id => 's2', attempt => 2, class => 'completed', error_code => undef },
	{ step_id => 's3', attempt => 1, class => 'completed', error_code => undef });

for my $where ('between', 'body')
{
	my $t = "killed $where steps";
	$t = 'killed in a step body' if $where eq 'body';
	my $run = "k-$where";
	$node->safe_psql('postgres', qq{SELECT ds_start_run('wf', '{"kill": "$where"}', '$run')});
	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'}),
		"$t: the executor sleeps in the turn");
	is($node->safe_psql('postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}),
		'running', "$t: the run is running");
	is_deeply(effects_by_step("run = '$run'"), [ { run => $run, step => 's1', effects => 1 } ],
		"$t: s1's effect committed before the kill (its own turn), nothing else");
	$node->safe_psql('postgres', qq{UPDATE naps SET on_ = false WHERE place = '$where'});
	my $pid = executor_pid($node);
	my $off = log_offset($node);
	kill 'KILL', $pid;
	$node->wait_for_log(
		qr/durable_steps worker.*\(PID $pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$off);
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: after the crash restart the run succeeds");
	like(log_since($node, $off), qr/the turn of run $run was lost with its executor; running it again/,
		"$t: the lost turn is logged");
	is_deeply(
		effects_by_step("run = '$run'"),
		[ map { { run => $run, step => $_, effects => 1 } } qw(s1 s2 s3) ],
		"$t: each step's effect is committed once");
	# the turn lost in the crash may have run s2's body (it did, killed in the body): nobody knows
	# after a crash, so s2 is charged the attempt (DS007), as a plain step's lost claim is, and its
	# next attempt has the next number
	is_deeply(run_attempts($run), \@s2_lost_once,
		"$t: s2's attempt lost with the turn is recorded (DS007), then its next one completed");
	is_deeply(
		row_of($node, 'postgres', qq{SELECT output, turns, claimed_by FROM durable_steps.runs WHERE run_id = '$run'}),
		{ output => '[1, ' . ($where eq 'body' ? 2 : 1) . ', 1]', turns => 5, claimed_by => undef },
		"$t: the output, and five turns: one per step, the lost one, and the one that finished; not claimed");
}

{
	# a run the executor keeps between its turns (its step done, the next one due): killed there,
	# outside any turn, it is lost like a turn in flight and taken up again. alice's run and bob's
	# are claimed together (a restarted executor knows no pace of turns yet and claims up to ten
	# runs: docs/worker.md, "Claim sizes"); the executor takes alice's first turn (her s1) in a transaction
	# of its own and keeps her run, then bob's first turn naps: that is when it is killed.
	my $t = 'killed while holding a run between turns';
	$node->restart;
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
CREATE ROLE alice;
CREATE ROLE bob;
GRANT INSERT, SELECT ON ledger TO alice, bob;
GRANT SELECT ON naps TO alice, bob;
CREATE FUNCTION blocker(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT on_ FROM naps WHERE place = 'held') THEN PERFORM pg_sleep(60); END IF;
    RETURN ds_step('b1', 'SELECT effect()');
END $$;
BEGIN;
SET ROLE alice;
SELECT ds_start_run('wf', '{}', 'held-a');
SET ROLE bob;
SELECT ds_start_run('blocker', '{}', 'held-b');
COMMIT;
});
	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'}),
		"$t: the executor naps in bob's turn");
	is_deeply(
		rows_of($node, 'postgres', q{SELECT run_id, status, turns FROM ds_runs WHERE run_id LIKE 'held-%' ORDER BY run_id}),
		[ { run_id => 'held-a', status => 'running', turns => 2 }, { run_id => 'held-b', status => 'running', turns => 1 } ],
		"$t: alice's run is held, running, its next turn counted; bob's turn runs");
	is_deeply(effects_by_step(q{run LIKE 'held-%'}), [ { run => 'held-a', step => 's1', effects => 1 } ],
		"$t: alice's s1 committed before the kill (a transaction of its own)");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'held'});
	my $pid = executor_pid($node);
	kill 'KILL', $pid;
	$node->wait_for_log(
		qr/durable_steps worker.*\(PID $pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$off);
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'held-%' AND status = 'succeeded'}, '2'),
		"$t: after the crash restart both runs succeed");
	like(log_since($node, $off), qr/the turn of run held-a was lost with its executor; running it again/,
		"$t: the held run's counted turn is logged as lost");
	is_deeply(
		effects_by_step(q{run LIKE 'held-%'}),
		[
			{ run => 'held-a', step => 's1', effects => 1 },
			{ run => 'held-a', step => 's2', effects => 1 },
			{ run => 'held-a', step => 's3', effects => 1 },
			{ run => 'held-b', step => 'b1', effects => 1 }
		],
		"$t: each step's effect is committed once");
	# the counted turn had not begun, but a crash leaves nobody who knows: the step the run
	# reaches next is charged the attempt, as every claim of a crashed executor is
	is_deeply(run_attempts('held-a'), \@s2_lost_once,
		"$t: alice's s2 is charged the lost turn's attempt (DS007), then completes");
	is_deeply(
		row_of($node, 'postgres', q{SELECT output, turns, claimed_by FROM durable_steps.runs WHERE run_id = 'held-a'}),
		{ output => '[1, 1, 1]', turns => 5, claimed_by => undef },
		"$t: alice's output, and five turns: s1's, the lost one, s2's, s3's and the one that finished; not claimed");
}

{
	# a run that lost a turn takes its next one in a transaction of its own, after the other runs
	# of its owner committed theirs: a workflow that ends its executor every time takes no other
	# run's work with it. `poisoned` naps in every turn until the test lets it go; it starts as
	# one whose last turn was lost (lost_turns = 1, as the recovery of a lost turn leaves it),
	# together with `bystander`, and one claim takes both: a restarted executor knows no pace of
	# turns yet and claims up to ten runs (docs/worker.md, "Claim sizes").
	my $t = 'a run that lost turns runs alone';
	$node->restart;
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION poisoned(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT on_ FROM naps WHERE place = 'poison') THEN PERFORM pg_sleep(60); END IF;
    RETURN ds_step('p1', 'SELECT effect()');
END $$;
BEGIN;
SELECT ds_start_run('poisoned', '{}', 'poisoned');
SELECT ds_start_run('wf', '{}', 'bystander');
UPDATE durable_steps.runs SET lost_turns = 1 WHERE run_id = 'poisoned';
COMMIT;
});
	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'}),
		"$t: the poisoned run's turn naps");
	is_deeply(
		rows_of($node, 'postgres',
			q{SELECT run_id, status FROM ds_runs WHERE run_id IN ('poisoned', 'bystander') ORDER BY run_id}),
		[ { run_id => 'bystander', status => 'running' }, { run_id => 'poisoned', status => 'running' } ],
		"$t: one claim took both");
	is_deeply(effects_by_step(q{run = 'bystander'}), [ { run => 'bystander', step => 's1', effects => 1 } ],
		"$t: the bystander's turn committed its step before the poisoned run's turn began");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'poison'});
	my $pid = executor_pid($node);
	kill 'KILL', $pid;
	$node->wait_for_log(
		qr/durable_steps worker.*\(PID $pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$off);
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FROM ds_runs WHERE run_id IN ('poisoned', 'bystander') AND status = 'succeeded'},
			'2'),
		"$t: both runs succeed in the end");
	is_deeply(
		effects_by_step(q{run IN ('poisoned', 'bystander')}),
		[
			{ run => 'bystander', step => 's1', effects => 1 },
			{ run => 'bystander', step => 's2', effects => 1 },
			{ run => 'bystander', step => 's3', effects => 1 },
			{ run => 'poisoned',  step => 'p1', effects => 1 }
		],
		"$t: each step's effect is committed once");
}

{
	# many runs in flight through two immediate stops: every step's effect once, and every
	# completed attempt recorded once with it
	my $t = 'immediate stops';
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION slow_effect() RETURNS int LANGUAGE sql AS
  $$ SELECT pg_sleep(0.05); INSERT INTO ledger VALUES (ds_run_id(), ds_step_id()) RETURNING 1 $$;
CREATE FUNCTION wf3(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('a', 'SELECT slow_effect()') || ds_step('b', 'SELECT slow_effect()')
        || ds_step('c', 'SELECT slow_effect()');
END $$;
SELECT count(*) FROM generate_series(1, 60) g, ds_start_run('wf3', '{}', 'many-' || g);
});
	for my $round (1 .. 2)
	{
		ok( poll_until($node, 'postgres',
				qq{SELECT count(*) >= $round * 20 FROM ledger WHERE run LIKE 'many-%'}),
			"$t: round $round: runs are under way");
		is( $node->safe_psql('postgres',
				q{SELECT count(*) > 0 FROM ds_runs WHERE run_id LIKE 'many-%' AND status = 'running'}),
			't', "$t: round $round: turns are running as the server stops");
		$node->stop('immediate');
		$node->start;
	}
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) = 60 FROM ds_runs WHERE run_id LIKE 'many-%' AND status = 'succeeded'}),
		"$t: all 60 runs succeed");
	is_deeply(
		row_of($node, 'postgres',
			q{SELECT count(*) AS effects, count(DISTINCT (run, step)) AS steps FROM ledger WHERE run LIKE 'many-%'}),
		{ effects => 180, steps => 180 },
		"$t: each of the 180 steps took effect exactly once");
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FILTER (WHERE class = 'completed')
			    FROM ds_attempts WHERE run_id LIKE 'many-%'}),
		'180', "$t: one completed attempt recorded per step");
	# every other attempt is one a lost turn may have run, charged to the step it reached: the
	# step's attempts are numbered 1, 2, ... without a hole, its last one the completed one
	is_deeply(
		row_of(
			$node, 'postgres',
			q{SELECT count(*) FILTER (WHERE class <> 'completed' AND error_code IS DISTINCT FROM 'DS007')
			           AS others_not_lost,
			         count(*) FILTER (WHERE class = 'retryable' AND error_code = 'DS007')
			           = count(*) FILTER (WHERE class <> 'completed') AS others_all_retryable_ds007,
			         bool_and(n = top AND last_class = 'completed') AS numbered_without_a_hole_ending_completed
			    FROM (SELECT run_id, step_id, error_code, class, count(*) OVER w AS n,
			                 max(attempt) OVER w AS top,
			                 last_value(class) OVER (w ORDER BY attempt
			                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_class
			            FROM ds_attempts WHERE run_id LIKE 'many-%'
			          WINDOW w AS (PARTITION BY run_id, step_id)) a}),
		{ others_not_lost => 0, others_all_retryable_ds007 => 'true', numbered_without_a_hole_ending_completed => 'true' },
		"$t: the other attempts are lost ones (DS007), each step's numbered without a hole and ending completed");
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'many-%' AND output <> '[1, 1, 1]'}),
		'0', "$t: every run's output");
	cmp_ok(count_matches(log_since($node, $off), qr/the turn of run many-\d+ was lost with its executor/),
		'>=', 2, "$t: turns were lost and taken again");
}

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed (other than our kill -9)');
$node->stop;
done_testing();
