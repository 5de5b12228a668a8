# A held horizon (docs/internals.md, "Claims under a held horizon"): while a transaction with an
# xid stays open, VACUUM removes no row version a later transaction made dead, and every step that
# finishes leaves its entry in steps_due_idx. Claims read each queue and priority from a floor past
# those entries: with 100,000 finished steps kept by the hold, steps stored at 200 a second each
# still finish within a second of being stored, for as long as the flow lasts; and runs of a
# one-step workflow started at 50 a second, after 10,000 others, each finish within two seconds.
#
# Steps made due before the floors (a run_at in the past, an operator's UPDATE, a prepared
# transaction committed later) are claimed all the same. And a statement that stores more steps
# than the server's lock table is sized for fails with a clear error (53200) before anything is
# stored; the same steps stored in batches go through (docs/steps.md, "Storing many steps at
# once").

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = worker_node('held_horizon',
	"durable_steps.database = 'postgres'\nmax_connections = 20\nmax_prepared_transactions = 2\n");
$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');

{
	my $t = 'a statement that stores 100,000 steps';
	my ($rc, $out, $err) = $node->psql('postgres',
		q{SELECT count(*) FROM generate_series(1, 100000) i,
		         LATERAL ds_run_step('bulk-' || (i / 1000), 's' || i, 'SELECT 1', defer => true) r},
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($rc, 0, "$t: fails");
	# (the second form when other locks filled the table first)
	like($err,
		qr/ERROR:  53200: too many steps for one transaction: (?:it holds the locks of \d+ steps, all the server's lock table is sized for|the server's lock table is full after \d+ of them)/,
		"$t: with a clear error and its SQLSTATE");
	like($err, qr/HINT:  Store the steps in batches of a few thousand a transaction, or raise max_locks_per_transaction\./,
		"$t: and a hint");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.steps}), '0', "$t: nothing is stored");
}

# Runs the statement $sql->(n) every $every seconds, n = 0, 1, ..., for $seconds seconds, from
# one session, on time (a late one goes at once); returns how many ran.
sub flow
{
	my ($seconds, $every, $sql) = @_;
	my $session = DurableSteps::Session->new($node, 'flow');
	my $start = time();
	my $n = 0;
	while (time() - $start < $seconds)
	{
		my $due = $start + $n * $every;
		sleep($due - time()) if $due > time();
		$session->query_ok($sql->($n));
		$n++;
	}
	$session->quit;
	return $n;
}

# the hold: a transaction with an xid, as a long pg_dump or a forgotten session keeps
my $hold = DurableSteps::Session->new($node, 'hold');
$hold->query_ok('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();');

{
	my $t = '100,000 steps stored in batches under the hold';
	for my $b (0 .. 49)
	{
		my $from = $b * 2000 + 1;
		my $to = $from + 1999;
		$node->safe_psql('postgres',
			qq{SELECT count(*) FROM generate_series($from, $to) i,
			          LATERAL ds_run_step('bulk-' || (i / 1000), 's' || i, 'SELECT 1', defer => true) r});
	}
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FILTER (WHERE status = 'succeeded') FROM durable_steps.steps WHERE run_id LIKE 'bulk-%'},
			'100000'),
		"$t: are all stored and run");
	$node->safe_psql('postgres', 'VACUUM durable_steps.steps');
	cmp_ok(
		$node->safe_psql('postgres',
			q{SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'durable_steps.steps'::regclass}),
		'>=', 100000, "$t: the hold keeps their finished rows' old versions, which VACUUM cannot remove");
}

{
	# 200 steps a second, 10 a transaction every 50 ms, for 15 s
	my $t = 'steps stored at 200 a second while the hold lasts';
	my $n = flow(15, 0.05,
		sub { "SELECT count(*) FROM generate_series(1, 10) i, LATERAL ds_run_step('flow-$_[0]', 's' || i, 'SELECT 1', defer => true) r;" });
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FILTER (WHERE status <> 'succeeded') FROM durable_steps.steps WHERE run_id LIKE 'flow-%'},
			'0'),
		"$t: every one of the " . ($n * 10) . " steps succeeds");
	my ($late, $worst) = split /\|/,
	  $node->safe_psql('postgres',
		q{SELECT count(*) FILTER (WHERE finished_at - created_at > interval '1 s'),
		         round(extract(epoch FROM max(finished_at - created_at)) * 1000)
		    FROM durable_steps.steps WHERE run_id LIKE 'flow-%'});
	is($late, 0, "$t: each finished within a second of being stored (the slowest in $worst ms)");
	is( $node->safe_psql('postgres',
			'SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = ' . $hold->pid),
		't', "$t: the hold lasted throughout");
}

{
	# runs: 10,000 of a one-step workflow started under the hold (each leaves several finished
	# entries in runs_due_idx: its turns), then 50 a second for 10 s
	my $t = 'runs started at 50 a second while the hold lasts';
	$node->safe_psql('postgres', q{
CREATE FUNCTION one_step(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('s', 'SELECT 1');
END $$;
});
	for my $b (0 .. 9)
	{
		$node->safe_psql('postgres',
			qq{SELECT count(*) FROM generate_series(1, 1000) i, LATERAL ds_start_run('one_step', '{}', 'early-$b-' || i) r});
	}
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FILTER (WHERE status = 'succeeded') FROM durable_steps.runs WHERE run_id LIKE 'early-%'},
			'10000'),
		"$t: the 10,000 earlier runs succeed");
	my $n = flow(10, 0.1,
		sub { "SELECT count(*) FROM generate_series(1, 5) i, LATERAL ds_start_run('one_step', '{}', 'flow-$_[0]-' || i) r;" });
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FILTER (WHERE status <> 'succeeded') FROM durable_steps.runs WHERE run_id LIKE 'flow-%'},
			'0'),
		"$t: every one of the " . ($n * 5) . " runs succeeds");
	my ($late, $worst) = split /\|/,
	  $node->safe_psql('postgres',
		q{SELECT count(*) FILTER (WHERE finished_at - created_at > interval '2 s'),
		         round(extract(epoch FROM max(finished_at - created_at)) * 1000)
		    FROM durable_steps.runs WHERE run_id LIKE 'flow-%'});
	is($late, 0, "$t: each finished within two seconds of being started (the slowest in $worst ms)");
	is( $node->safe_psql('postgres',
			'SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = ' . $hold->pid),
		't', "$t: the hold lasted throughout");
}

{
	# tasks: 50,000 stored and run under the hold leave their entries in steps_task_due_idx; the
	# claims and the waits of an application worker then read each (task, owner, priority) from
	# its floor, so that a task waited for, claimed and completed reads a few index pages
	my $t = 'tasks claimed while the hold lasts';
	my $worker = DurableSteps::Session->new($node, 'task worker');
	my $claim = q{SELECT count(*) FROM (SELECT ds_complete_tasks(array_agg(token), array_agg('{}'::jsonb))
	                FROM ds_claim_tasks(ARRAY['mail'], 1000)) c;};
	for my $b (0 .. 49)
	{
		$node->safe_psql('postgres',
			qq{SELECT count(*) FROM generate_series(1, 1000) i, LATERAL ds_task_step('mail-$b', 'm' || i, 'mail') r});
		$worker->query_ok($claim);
	}
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FROM durable_steps.steps WHERE task = 'mail' AND status = 'succeeded'}),
		'50000', "$t: 50,000 are stored and completed");
	my $pages = sub {
		$worker->query_ok('SELECT pg_stat_force_next_flush();');
		return $worker->query_ok(
			q{SELECT pg_stat_clear_snapshot();
			  SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes
			   WHERE indexrelid = 'durable_steps.steps_task_due_idx'::regclass;});
	};
	my $before = $pages->();
	my $cycles = 40;
	my (@not_due, @not_claimed);
	for my $i (1 .. $cycles)
	{
		$node->safe_psql('postgres', qq{SELECT ds_task_step('mail-late', 'm$i', 'mail')});
		push @not_due, $i
		  if $worker->query_ok(q{CALL ds_wait_for_tasks(ARRAY['mail'], '1 s', NULL, NULL);}) ne 't';
		push @not_claimed, $i if $worker->query_ok($claim) ne '1';
	}
	is("@not_due", '', "$t: a wait sees each task due");
	is("@not_claimed", '', "$t: a claim takes each one");
	my $per_task = (($pages->() - $before) / $cycles);
	cmp_ok($per_task, '<', 100,
		"$t: each of $cycles tasks waited for, claimed and completed reads $per_task pages of the index (from the start, a claim reads the 50,000 finished tasks' entries)");
	is( $node->safe_psql('postgres',
			q{SELECT count(*) FROM durable_steps.steps WHERE run_id = 'mail-late' AND status = 'succeeded'}),
		$cycles, "$t: every one succeeded");

	# tasks due before their group's floor are claimed all the same: a run_at in the past, an
	# operator's UPDATE, a task given back; and the groups a claim has not read yet: a new role's,
	# a name of the longest length
	my $take = sub {
		my ($names) = @_;
		return $worker->query_ok(
			qq{SELECT string_agg(run_id, ',' ORDER BY run_id) FROM (SELECT run_id, ds_complete_task(token)
			     FROM ds_claim_tasks($names, 10)) c;});
	};
	$node->safe_psql('postgres',
		q{SELECT ds_task_step('mail-past', 'p', 'mail', run_at => now() - interval '1 hour')});
	is($take->(q{ARRAY['mail']}), 'mail-past', "$t: a task stored due an hour ago is claimed");
	$node->safe_psql('postgres',
		q{SELECT ds_task_step('mail-by-sql', 'p', 'mail', run_at => now() + interval '1 day')});
	is($take->(q{ARRAY['mail']}), '', "$t: a task due tomorrow is not claimed");
	$node->safe_psql('postgres',
		q{UPDATE durable_steps.steps SET next_attempt_at = now() - interval '2 hours' WHERE run_id = 'mail-by-sql'});
	is($take->(q{ARRAY['mail']}), 'mail-by-sql', "$t: made due two hours ago by an UPDATE, it is claimed");
	$node->safe_psql('postgres', q{SELECT ds_task_step('mail-given-back', 'p', 'mail')});
	$worker->query_ok(q{SELECT ds_release_task(token) FROM ds_claim_tasks(ARRAY['mail'], 10);});
	is($take->(q{ARRAY['mail']}), 'mail-given-back', "$t: a task given back is claimed again");
	$node->safe_psql('postgres', q{
CREATE ROLE mailer LOGIN;
GRANT USAGE ON SCHEMA public TO mailer;
GRANT mailer TO postgres;
SET ROLE mailer;
SELECT ds_task_step('mail-mailer', 'p', 'mail');
RESET ROLE;
SELECT ds_task_step('mail-long', 'p', repeat('m', 200));});
	is($take->(q{ARRAY['mail', repeat('m', 200)]}), 'mail-long,mail-mailer',
		"$t: a new role's task and a task of a 200-byte name are claimed");

	# a transaction that took tasks out of waiting raises no floor past them: they wait again
	# once it rolls back
	$node->safe_psql('postgres',
		q{SELECT ds_task_step('mail-undone', 'a', 'mail', run_at => now() - interval '2 min');
		  SELECT ds_task_step('mail-undone', 'b', 'mail', run_at => now() - interval '1 min');});
	$worker->query_ok(q{BEGIN; SELECT ds_cancel_step('mail-undone', 'a'), ds_cancel_step('mail-undone', 'b');
	                    CALL ds_wait_for_tasks(ARRAY['mail'], '10 ms', NULL, NULL); ROLLBACK;});
	my (undef, $undone) = $worker->query(q{DO $$BEGIN PERFORM FROM ds_claim_tasks(ARRAY['mail'], 1);
	                    PERFORM FROM ds_claim_tasks(ARRAY['mail'], 1); RAISE EXCEPTION 'undone'; END$$;});
	like($undone, qr/ERROR:  P0001: undone/, "$t: two claims in one transaction, rolled back");
	is($take->(q{ARRAY['mail']}), 'mail-undone,mail-undone',
		"$t: tasks cancelled, or claimed twice in one transaction, and rolled back are claimed");
	# a wait in a REPEATABLE READ transaction looks with the latest snapshot, or not at all
	my $rr = DurableSteps::Session->new($node, 'repeatable read');
	$rr->query_ok(q{BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT now();});
	$node->safe_psql('postgres',
		q{SELECT ds_task_step('mail-after-snapshot', 'p', 'mail', run_at => now() - interval '1 min')});
	$rr->query_ok(q{CALL ds_wait_for_tasks(ARRAY['mail'], '10 ms', NULL, NULL); COMMIT;});
	$rr->quit;
	is($take->(q{ARRAY['mail']}), 'mail-after-snapshot',
		"$t: a task stored after a waiting transaction's snapshot is claimed");
	is( $node->safe_psql('postgres',
			'SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = ' . $hold->pid),
		't', "$t: the hold lasted throughout");
	$worker->quit;
}

{
	# the floors have moved up to the present with the flow: steps made due before it must be
	# claimed all the same (docs/internals.md, "Claims under a held horizon")
	my $t = 'a step due before the floor';
	$node->safe_psql('postgres',
		q{SELECT ds_run_step('before-floor', 'past', 'SELECT 1', run_at => now() - interval '1 hour')});
	ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'before-floor'}, 'succeeded'),
		"$t: stored with a run_at an hour ago, it runs");

	# an operator's UPDATE, SQL the extension did not write
	$node->safe_psql('postgres',
		q{SELECT ds_run_step('by-sql', 'later', 'SELECT 1', run_at => now() + interval '1 day')});
	$node->safe_psql('postgres',
		q{UPDATE durable_steps.steps SET next_attempt_at = now() - interval '2 hours' WHERE run_id = 'by-sql'});
	ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'by-sql'}, 'succeeded'),
		"$t: made due two hours ago by an UPDATE, it runs");

	# a prepared transaction's step becomes visible when it is committed, whenever that is
	my $prep = DurableSteps::Session->new($node, 'prepared');
	$prep->query_ok(
		q{BEGIN; SELECT ds_run_step('prepared', 'past', 'SELECT 1', run_at => now() - interval '3 hours'); PREPARE TRANSACTION 'ds_held';});
	$node->safe_psql('postgres',
		q{SELECT count(*) FROM generate_series(1, 20) i, LATERAL ds_run_step('meanwhile', 's' || i, 'SELECT 1', defer => true) r});
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FROM ds_steps WHERE run_id = 'meanwhile' AND status = 'succeeded'}, '20'),
		"$t: other steps run while a transaction that stored one is prepared");
	$prep->query_ok(q{COMMIT PREPARED 'ds_held';});
	$prep->quit;
	ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'prepared'}, 'succeeded'),
		"$t: stored due three hours ago by a prepared transaction, it runs once committed");
}

$hold->query_ok('COMMIT;');
$hold->quit;
unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
unlike(slurp_file($node->logfile), qr/request for BRIN range summarization/, 'no BRIN summarization request was lost');
$node->stop;
done_testing();
