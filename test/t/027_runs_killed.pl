# Runs (README, "Runs"): kill -9 of the executor in the middle of a turn -- in the workflow
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
	is( $node->safe_psql('postgres',
			qq{SELECT string_agg(step, ',' ORDER BY step) FROM ledger WHERE run = '$run'}),
		's1', "$t: s1's effect committed before the kill (its own turn), nothing else");
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
	is( $node->safe_psql('postgres',
			qq{SELECT string_agg(step || ':' || n, ',' ORDER BY step)
			     FROM (SELECT step, count(*) AS n FROM ledger WHERE run = '$run' GROUP BY step) s}),
		's1:1,s2:1,s3:1', "$t: each step's effect is committed once");
	is( $node->safe_psql('postgres',
			qq{SELECT string_agg(step_id || ':' || attempt || ':' || class, ',' ORDER BY step_id)
			     FROM ds_attempts WHERE run_id = '$run'}),
		's1:1:completed,s2:1:completed,s3:1:completed',
		"$t: one completed attempt per step (the lost turn recorded nothing)");
	is( $node->safe_psql('postgres',
			qq{SELECT output::text || '|' || turns || '|' || (claimed_by IS NULL)
			     FROM durable_steps.runs WHERE run_id = '$run'}),
		'[1, ' . ($where eq 'body' ? 2 : 1) . ', 1]|5|true',
		"$t: the output, and five turns: one per step, the lost one, and the one that finished");
}

{
	# a run the executor keeps between its turns (its step done, the next one due): killed there,
	# outside any turn, it is lost like a turn in flight and taken up again. alice's run and bob's
	# are claimed together (a restarted executor knows no pace of turns yet and claims up to ten
	# runs: README, "Claim sizes"); the executor takes alice's first turn (her s1) in a transaction
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
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(run_id || ':' || status || ':' || turns, ',' ORDER BY run_id)
			    FROM ds_runs WHERE run_id LIKE 'held-%'}),
		'held-a:running:2,held-b:running:1',
		"$t: alice's run is held, running, its next turn counted; bob's turn runs");
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(run || ':' || step, ',' ORDER BY step) FROM ledger WHERE run LIKE 'held-%'}),
		'held-a:s1', "$t: alice's s1 committed before the kill (a transaction of its own)");
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
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(run || ':' || step || ':' || n, ',' ORDER BY run, step)
			     FROM (SELECT run, step, count(*) AS n FROM ledger WHERE run LIKE 'held-%' GROUP BY run, step) s}),
		'held-a:s1:1,held-a:s2:1,held-a:s3:1,held-b:b1:1', "$t: each step's effect is committed once");
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(step_id || ':' || attempt || ':' || class, ',' ORDER BY step_id)
			     FROM ds_attempts WHERE run_id = 'held-a'}),
		's1:1:completed,s2:1:completed,s3:1:completed',
		"$t: one completed attempt per step of alice's run");
	is( $node->safe_psql('postgres',
			q{SELECT output::text || '|' || turns || '|' || (claimed_by IS NULL)
			     FROM durable_steps.runs WHERE run_id = 'held-a'}),
		'[1, 1, 1]|5|true',
		"$t: alice's output, and five turns: s1's, the lost one, s2's, s3's and the one that finished");
}

{
	# a run that lost a turn takes its next one in a transaction of its own, after the other runs
	# of its owner committed theirs: a workflow that ends its executor every time takes no other
	# run's work with it. `poisoned` naps in every turn until the test lets it go; it starts as
	# one whose last turn was lost (lost_turns = 1, as the recovery of a lost turn leaves it),
	# together with `bystander`, and one claim takes both: a restarted executor knows no pace of
	# turns yet and claims up to ten runs (README, "Claim sizes").
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
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id)
			    FROM ds_runs WHERE run_id IN ('poisoned', 'bystander')}),
		'bystander:running,poisoned:running', "$t: one claim took both");
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(step, ',' ORDER BY step) FROM ledger WHERE run = 'bystander'}),
		's1', "$t: the bystander's turn committed its step before the poisoned run's turn began");
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
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(run || ':' || step || ':' || n, ',' ORDER BY run, step)
			     FROM (SELECT run, step, count(*) AS n FROM ledger
			            WHERE run IN ('poisoned', 'bystander') GROUP BY run, step) s}),
		'bystander:s1:1,bystander:s2:1,bystander:s3:1,poisoned:p1:1',
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
	is( $node->safe_psql('postgres',
			q{SELECT count(*) || '|' || count(DISTINCT (run, step)) FROM ledger WHERE run LIKE 'many-%'}),
		'180|180', "$t: each of the 180 steps took effect exactly once");
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FILTER (WHERE class = 'completed') || '|' || count(*)
			    FROM ds_attempts WHERE run_id LIKE 'many-%'}),
		'180|180', "$t: one completed attempt recorded per step, nothing else");
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'many-%' AND output <> '[1, 1, 1]'}),
		'0', "$t: every run's output");
	cmp_ok(count_matches(log_since($node, $off), qr/the turn of run many-\d+ was lost with its executor/),
		'>=', 2, "$t: turns were lost and taken again");
}

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed (other than our kill -9)');
$node->stop;
done_testing();
