# Runs (docs/runs.md): a run step's attempt that its turn lost -- the executor ended by a body
# that ignored its cancellation, or the turn interrupted by a cancel of the executor -- is counted
# and recorded on the step (DS007 lost, 57014 interrupted), as a plain step's lost attempt is:
# the next attempt gets the next number and another ds_attempt_key(), never the lost one's. A
# turn that ended before it began its step charges nothing, nor does one that rolled back with
# another run's turn whose body ended the executor. Each body's run is told in the
# server log (RAISE LOG), which no rollback takes back.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('run_step_lost', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (run text, step text, attempt int);
-- the test turns a nap off (committed from its own session) to let a body or a workflow go on
CREATE TABLE naps (place text PRIMARY KEY, on_ boolean NOT NULL);
INSERT INTO naps VALUES ('between', true), ('cancel', true), ('once', true);
-- a body that tells the log every time it runs, with its attempt number and key
CREATE FUNCTION told(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE LOG 'body ran: run % step % attempt % key % (%) in transaction %', ds_run_id(), ds_step_id(),
        ds_attempt_number(), ds_attempt_key(), what, txid_current();
END $$;
-- attempt 1 ignores its cancellation until the executor is ended; later attempts complete
CREATE FUNCTION stubborn() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM told('stubborn');
    IF ds_attempt_number() = 1 THEN
        LOOP
            BEGIN
                PERFORM pg_sleep(0.2);
            EXCEPTION WHEN query_canceled THEN
                NULL;
            END;
        END LOOP;
    END IF;
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    RETURN ds_attempt_number();
END $$;
-- naps while naps.cancel is on (the test cancels the executor meanwhile), then completes
CREATE FUNCTION napper() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM told('napper');
    WHILE (SELECT on_ FROM naps WHERE place = 'cancel') LOOP PERFORM pg_sleep(0.05); END LOOP;
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    RETURN ds_attempt_number();
END $$;
CREATE FUNCTION effect() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM told('effect');
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    RETURN ds_attempt_number();
END $$;
CREATE FUNCTION wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb := '[]';
BEGIN
    r := r || ds_step('s1', 'SELECT effect()');
    IF input->>'nap' = 'between' THEN
        WHILE (SELECT on_ FROM naps WHERE place = 'between') LOOP PERFORM pg_sleep(0.05); END LOOP;
    END IF;
    r := r || ds_step('s2', 'SELECT ' || (input->>'body') || '()',
                      timeout => (input->>'timeout')::interval,
                      policy => input->'policy');
    RETURN r;
EXCEPTION WHEN SQLSTATE 'DS102' THEN
    -- s2 failed for good: the workflow says how, and fails
    RAISE EXCEPTION 'gave up: %', SQLERRM USING ERRCODE = 'DS102';
END $$;
});

# The step's attempts in order, each with its class and SQLSTATE.
sub attempt_classes
{
	my ($run, $step) = @_;
	return [ map { fields($_, qw(attempt class error_code)) } @{ attempts_of($node, $run, $step) } ];
}

# What the log says the bodies of step $step of $run ran with: "attempt/key" in order.
sub runs_told
{
	my ($off, $run, $step) = @_;
	my @told = log_since($node, $off) =~ /body ran: run \Q$run\E step \Q$step\E attempt (\d+) key (\S+)/g;
	my @pairs;
	push @pairs, "$told[$_]/$told[$_ + 1]" for grep { $_ % 2 == 0 } 0 .. $#told;
	return join(',', @pairs);
}

{
	# the executor is ended by a body that ignores its cancellation (its 1 s timeout, then the
	# backstop of the turn's step, then the grace period): not a crash, so the executor's last
	# words in shared memory say the turn's step had begun, and the step is charged the attempt
	my $t = 'a body that ended its executor';
	my $run = 'ignored';
	my $off = log_offset($node);
	my $pid = executor_pid($node);
	$node->safe_psql('postgres',
		qq{SELECT ds_start_run('wf', '{"body": "stubborn", "timeout": "1 s"}', '$run')});
	ok(poll_log($node, $off, qr/ignored its cancellation at its own timeout; ending the executor/),
		"$t: the executor ends");
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds afterwards");
	isnt(executor_pid($node), $pid, "$t: another executor took the run up");
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'retryable', error_code => 'DS007' }, { attempt => 2, class => 'completed', error_code => undef } ],
		"$t: the lost attempt is recorded (DS007), the next one has the next number");
	my $told = runs_told($off, $run, 's2');
	like($told, qr{^1/\S+,2/\S+$}, "$t: the body ran twice, as attempts 1 and 2 (told: $told)");
	my ($k1, $k2) = $told =~ m{^1/(\S+),2/(\S+)$};
	isnt($k1 // '', $k2 // '', "$t: the two runs of the body had two attempt keys");
	is( $node->safe_psql('postgres',
			qq{SELECT error_detail FROM ds_attempts WHERE run_id = '$run' AND step_id = 's2' AND attempt = 1}),
		'The turn running attempt 1 of the step ended with its executor before recording its outcome.',
		"$t: the lost attempt's detail says what happened");
	like(log_since($node, $off), qr/attempt 1 of step ignored\/s2 was lost with its turn; recording it as failed/,
		"$t: the recording is logged");
	is( $node->safe_psql('postgres',
			qq{SELECT output::text || '|' || (unrecorded_attempts IS NULL) FROM durable_steps.runs WHERE run_id = '$run'}),
		'[1, 2]|true', "$t: the output has attempt 2's value; nothing is left to record");
}

{
	# the executor is ended (pg_terminate_backend) while the workflow naps between s1 and s2:
	# its turn never began s2, the executor's last words say so, and nothing is charged
	my $t = 'an executor ended before the turn began its step';
	my $run = 'between';
	my $off = log_offset($node);
	$node->safe_psql('postgres', qq{SELECT ds_start_run('wf', '{"body": "effect", "nap": "between"}', '$run')});
	ok( poll_until($node, 'postgres',
			qq{SELECT count(*) = 1 FROM ledger WHERE run = '$run' AND step = 's1'}),
		"$t: s1 committed");
	ok( poll_until($node,
			'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker' AND wait_event = 'PgSleep'}),
		"$t: the turn naps in the workflow");
	my $pid = executor_pid($node);
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	ok(poll_log($node, $off, qr/the turn of run between was lost with its executor; running it again/),
		"$t: the lost turn is logged");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'between'});
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds");
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'completed', error_code => undef } ], "$t: s2 is charged nothing: its attempt 1 completed");
	is(runs_told($off, $run, 's2') =~ tr/,//, 0, "$t: s2's body ran once");
}

{
	# an operator cancels the executor while s2's body runs: the turn is interrupted and rolls
	# back with the attempt's record; the next turn records it (57014) and s2 retries
	my $t = 'a turn interrupted in its step';
	my $run = 'cancelled';
	my $off = log_offset($node);
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = true WHERE place = 'cancel'});
	$node->safe_psql('postgres', qq{SELECT ds_start_run('wf', '{"body": "napper"}', '$run')});
	ok(poll_log($node, $off, qr/body ran: run cancelled step s2 attempt 1/), "$t: s2's body runs");
	my $pid = executor_pid($node);
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
	ok(poll_log($node, $off, qr/the turn of run cancelled was interrupted/), "$t: the turn is interrupted");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'cancel'});
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds");
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'retryable', error_code => '57014' }, { attempt => 2, class => 'completed', error_code => undef } ],
		"$t: the interrupted attempt is recorded (57014), the next one has the next number");
	like(runs_told($off, $run, 's2'), qr{^1/\S+,2/\S+$}, "$t: the body ran as attempts 1 and 2");
	is(executor_pid($node), $pid, "$t: the executor went on: a cancel ends no executor");
	is( $node->safe_psql('postgres',
			qq{SELECT string_agg(step || ':' || attempt, ',' ORDER BY step) FROM ledger WHERE run = '$run'}),
		's1:1,s2:2', "$t: each step's effect committed once, s2's by attempt 2");
}

{
	# the same with one attempt allowed: the lost attempt uses it up, the step fails for good
	# (exhausted) without running again, and the workflow sees DS102
	my $t = 'a lost attempt that was the last';
	my $run = 'last';
	my $off = log_offset($node);
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = true WHERE place = 'cancel'});
	$node->safe_psql('postgres',
		qq{SELECT ds_start_run('wf', '{"body": "napper", "policy": {"max_attempts": 1}}', '$run')});
	ok(poll_log($node, $off, qr/body ran: run last step s2 attempt 1/), "$t: s2's body runs");
	$node->safe_psql('postgres', "SELECT pg_cancel_backend(" . executor_pid($node) . ")");
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'failed'),
		"$t: the run fails");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'cancel'});
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'retryable', error_code => '57014' } ], "$t: s2 has its one attempt, recorded as interrupted");
	is( $node->safe_psql('postgres',
			qq{SELECT s.status || ':' || s.error_class || '|' || r.error_code || '|' || (r.error_message LIKE 'gave up:%')
			     FROM ds_steps s JOIN ds_runs r USING (run_id) WHERE run_id = '$run' AND s.step_id = 's2'}),
		'failed:exhausted|DS102|true', "$t: s2 failed (exhausted), and the workflow gave up with DS102");
	is(runs_told($off, $run, 's2') =~ tr/,//, 0, "$t: s2's body ran once");
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM ledger WHERE run = '$run' AND step = 's2'}),
		'0', "$t: s2 took no effect");
}

{
	# attempt 2 of a step interrupted in a turn: attempt 1 failed, the step is due again at once
	# and the run goes on to it; the interrupted attempt is recorded on the step right away, so
	# that no executor takes the step up as a plain step with attempt 2's number meanwhile
	my $t = 'a later attempt interrupted in its turn';
	my $run = 'again';
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
UPDATE naps SET on_ = true WHERE place = 'cancel';
-- attempt 1 fails, attempt 2 naps until let go, attempt 3 completes
CREATE FUNCTION second_naps() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM told('second_naps');
    IF ds_attempt_number() = 1 THEN RAISE EXCEPTION 'first attempt fails'; END IF;
    IF ds_attempt_number() = 2 THEN
        WHILE (SELECT on_ FROM naps WHERE place = 'cancel') LOOP PERFORM pg_sleep(0.05); END LOOP;
    END IF;
    INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number());
    RETURN ds_attempt_number();
END $$;
});
	$node->safe_psql('postgres',
		qq{SELECT ds_start_run('wf', '{"body": "second_naps", "policy": {"initial_delay": 0}}', '$run')});
	ok(poll_log($node, $off, qr/body ran: run again step s2 attempt 2/), "$t: s2's attempt 2 runs");
	$node->safe_psql('postgres', "SELECT pg_cancel_backend(" . executor_pid($node) . ")");
	ok(poll_log($node, $off, qr/attempt 2 of step again\/s2 was interrupted with its turn/),
		"$t: the interrupted attempt is recorded");
	$node->safe_psql('postgres', q{UPDATE naps SET on_ = false WHERE place = 'cancel'});
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds");
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'retryable', error_code => 'P0001' }, { attempt => 2, class => 'retryable', error_code => '57014' }, { attempt => 3, class => 'completed', error_code => undef } ],
		"$t: attempts 1 (failed), 2 (interrupted) and 3 (completed), each once");
	my $told = runs_told($off, $run, 's2');
	like($told, qr{^1/\S+,2/\S+,3/\S+$}, "$t: the body ran as attempts 1, 2 and 3, never a number twice (told: $told)");
}

{
	# a workflow that makes its own step look interrupted (the body raises query_canceled itself)
	# and then, in its next turn, reaches another role's step through that role's SECURITY
	# DEFINER function, under the same step name: the interrupted attempt is its own step's,
	# never charged to the other role's step, which runs its attempt 1
	my $t = 'an interrupted attempt is its own step\'s';
	my $run = 'shifty';
	$node->safe_psql(
		'postgres', q{
CREATE ROLE victim;
CREATE ROLE shifty;
GRANT USAGE ON SCHEMA public TO victim, shifty;
GRANT INSERT ON ledger TO victim;
CREATE SEQUENCE shifty_turns;
GRANT USAGE ON SEQUENCE shifty_turns TO shifty;
CREATE FUNCTION victim_service() RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public AS $$
BEGIN
    RETURN ds_step('own', 'INSERT INTO ledger VALUES (ds_run_id(), ds_step_id(), ds_attempt_number()) RETURNING 1');
END $$;
ALTER FUNCTION victim_service() OWNER TO victim;
GRANT EXECUTE ON FUNCTION victim_service() TO shifty;
CREATE FUNCTION shifty_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $wf$
BEGIN
    IF nextval('shifty_turns') = 1 THEN
        RETURN ds_step('own', $b$DO $x$ BEGIN RAISE SQLSTATE '57014'; END $x$ $b$);
    END IF;
    RETURN victim_service();
END $wf$;
ALTER FUNCTION shifty_wf(text, jsonb) OWNER TO shifty;
SET ROLE shifty;
SELECT ds_start_run('shifty_wf', '{}', 'shifty');
RESET ROLE;
});
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds (its second turn takes the victim's step)");
	# the victim's step even has the name of the shifty step whose attempt was interrupted
	is_deeply(attempt_classes($run, 'own'), [ { attempt => 1, class => 'completed', error_code => undef } ], "$t: the victim's step is charged nothing");
	is( $node->safe_psql('postgres',
			qq{SELECT unrecorded_attempts::text FROM durable_steps.runs WHERE run_id = '$run'}),
		'', "$t: the finished run keeps nothing to record");
}

{
	# three runs' turns share a transaction with a fourth's (one owner's turns take their turns
	# in run id order, for at most 20 ms a transaction), whose step's body ignores its
	# cancellation and ends the executor: their turns rolled back for its sake and cost them
	# nothing -- no lost turn, no attempt of their steps charged -- while the culprit's turn is
	# counted lost. All four are due at once (one transaction). Which turns share the culprit's
	# transaction depends on the pace of the claims and on the clock: the turns logged as rolled
	# back must be exactly those whose bodies ran in the culprit's first transaction, and a round
	# is repeated, with new runs, until one shared it (at most five rounds).
	my $t = "turns rolled back with another run's";
	my $shared = 0;
	for my $round (1 .. 5)
	{
		my $r = "r$round";
		my $off = log_offset($node);
		$node->safe_psql('postgres', qq{
BEGIN;
SELECT ds_start_run('wf', '{"body": "effect"}', '$r-bystander-' || i) FROM generate_series(1, 3) i;
SELECT ds_start_run('wf', '{"body": "stubborn", "timeout": "1 s"}', '$r-culprit');
COMMIT;
});
		ok(poll_log($node, $off, qr/ignored its cancellation at its own timeout; ending the executor/),
			"$t, $r: the culprit's body ends the executor");
		ok( poll_until($node, 'postgres',
				qq{SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM ds_runs
				   WHERE run_id LIKE '$r-%'},
				"$r-bystander-1:succeeded,$r-bystander-2:succeeded,$r-bystander-3:succeeded,$r-culprit:succeeded"),
			"$t, $r: every run succeeds");
		my $log = log_since($node, $off);
		my ($culprit_xact) = $log =~ /body ran: run $r-culprit step s2 attempt 1 key \S+ \(stubborn\) in transaction (\d+)/;
		ok(defined $culprit_xact, "$t, $r: the culprit's attempt 1 logged its transaction");
		$culprit_xact //= -1;
		my (%in_its_transaction, %rolled_back);
		$in_its_transaction{$1} = 1 while $log =~ /body ran: run ($r-bystander-\d) step \S+ attempt \d+ key \S+ \(\w+\) in transaction $culprit_xact\b/g;
		$rolled_back{$1} = 1
		  while $log =~ /the turn of run ($r-bystander-\d) rolled back when another run's code ended its executor; it is not counted/g;
		is(join(',', sort keys %rolled_back), join(',', sort keys %in_its_transaction),
			"$t, $r: the turns logged as rolled back, not counted, are those that ran in the culprit's transaction");
		is(count_matches($log, qr/the turn of run $r-culprit was lost with its executor; running it again/),
			1, "$t, $r: the culprit's turn is counted lost");
		is(count_matches($log, qr/the turn of run $r-bystander-\d was lost/), 0, "$t, $r: no bystander's turn is");
		is( $node->safe_psql('postgres',
				qq{SELECT string_agg(DISTINCT attempt || ':' || class, ',') FROM ds_attempts WHERE run_id LIKE '$r-bystander-%'}),
			'1:completed', "$t, $r: the bystanders' steps completed at their attempt 1, none charged");
		is( $node->safe_psql('postgres',
				qq{SELECT string_agg(run || '/' || step || ':' || attempt, ',' ORDER BY run, step) FROM ledger
				   WHERE run LIKE '$r-bystander-%'}),
			join(',', map { ("$r-bystander-$_/s1:1", "$r-bystander-$_/s2:1") } 1 .. 3),
			"$t, $r: each of their effects committed once: the rolled-back writes left nothing");
		is_deeply(attempt_classes("$r-culprit", 's2'), [ { attempt => 1, class => 'retryable', error_code => 'DS007' }, { attempt => 2, class => 'completed', error_code => undef } ],
			"$t, $r: the culprit's step is charged its lost attempt");
		if (%rolled_back)
		{
			$shared = 1;
			last;
		}
		note("$t, $r: the culprit's turn shared no transaction with a bystander's; another round");
	}
	ok($shared, "$t: a round's bystander turns shared the culprit's transaction and were given back");
}

{
	# A turn that reaches a step with attempts earlier turns lost of it only records them (the
	# step's body does not run in that turn). Lost in turn, after a crash, before it committed
	# them, it ran nothing more of the step: the step is charged the attempt recorded, and no
	# second one. The state such a crash leaves is made by hand -- the run held by a process
	# that is gone, which was going on from its gate to s2, not yet created, with its lost
	# attempt 1 to record -- as a kill cannot be timed to land between a recording's start and
	# its commit. The run's current step stays the gate, as the last turn that committed left it
	# (a lost turn writes none): the gate is no step the lost turn could have run.
	my $t = 'a turn lost while it recorded an earlier loss';
	my $run = 'relost';
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION gated(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('s1', 'SELECT effect()');
    PERFORM ds_await_event('gate', 'go:' || run_id);
    RETURN ds_step('s2', 'SELECT effect()');
END $$;
});
	$node->safe_psql('postgres', qq{SELECT ds_start_run('gated', '{}', '$run')});
	ok( poll_until($node, 'postgres',
			qq{SELECT status || ':' || current_step FROM ds_runs WHERE run_id = '$run'}, 'waiting:gate'),
		"$t: the run waits at its gate, s1 done");
	$node->safe_psql(
		'postgres', qq{
BEGIN;
SELECT ds_emit_event('go:$run');
UPDATE durable_steps.runs SET status = 'running', claimed_by = 999999,
       updated_at = clock_timestamp(), next_wake_at = NULL, unrecorded_attempts = '{DS007}'
 WHERE run_id = '$run';
COMMIT;
});
	# an executor that ends looks for lost turns
	$node->safe_psql('postgres', "SELECT pg_terminate_backend(" . executor_pid($node) . ")");
	ok(poll_log($node, $off, qr/the turn of run relost was lost with its executor; running it again/),
		"$t: the lost turn is found");
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds");
	is_deeply(attempt_classes($run, 's2'), [ { attempt => 1, class => 'retryable', error_code => 'DS007' }, { attempt => 2, class => 'completed', error_code => undef } ],
		"$t: s2 is charged the one lost attempt it had to record, then completes");
	is($node->safe_psql('postgres', qq{SELECT string_agg(step || ':' || attempt, ',' ORDER BY step) FROM ledger WHERE run = '$run'}),
		's1:1,s2:2', "$t: each effect committed once");
}

{
	# The same at a run's first step: the run has no current step yet
	my $t = 'a first turn lost while it recorded an earlier loss';
	my $run = 'relost-first';
	my $off = log_offset($node);
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION gated_first(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_await_event('gate', 'go:' || run_id);
    RETURN ds_step('s1', 'SELECT effect()');
END $$;
});
	$node->safe_psql('postgres', qq{SELECT ds_start_run('gated_first', '{}', '$run')});
	ok( poll_until($node, 'postgres',
			qq{SELECT status || ':' || current_step FROM ds_runs WHERE run_id = '$run'}, 'waiting:gate'),
		"$t: the run waits at its gate");
	$node->safe_psql(
		'postgres', qq{
BEGIN;
SELECT ds_emit_event('go:$run');
UPDATE durable_steps.runs SET status = 'running', claimed_by = 999999, current_step = NULL,
       updated_at = clock_timestamp(), next_wake_at = NULL, unrecorded_attempts = '{DS007}'
 WHERE run_id = '$run';
COMMIT;
});
	$node->safe_psql('postgres', "SELECT pg_terminate_backend(" . executor_pid($node) . ")");
	ok(poll_log($node, $off, qr/the turn of run relost-first was lost with its executor; running it again/),
		"$t: the lost turn is found");
	ok(poll_until($node, 'postgres', qq{SELECT status FROM ds_runs WHERE run_id = '$run'}, 'succeeded'),
		"$t: the run succeeds");
	is_deeply(attempt_classes($run, 's1'), [ { attempt => 1, class => 'retryable', error_code => 'DS007' }, { attempt => 2, class => 'completed', error_code => undef } ],
		"$t: s1 is charged the one lost attempt it had to record, then completes");
	is($node->safe_psql('postgres', qq{SELECT string_agg(step || ':' || attempt, ',' ORDER BY step) FROM ledger WHERE run = '$run'}),
		's1:2', "$t: its effect committed once");
}

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
