# A body that ignores its cancellation ends its executor (docs/security.md): the claims
# of its batch the executor never reached get their attempt back, so do those it ran before the
# stubborn one in the same transaction (their writes rolled back with it), and the step whose
# body had to be ended is the one charged -- it then runs alone, after the other claims of its batch, so it
# takes no other step's attempt with it again. A batch is one owner's (docs/queues.md, "Fair share between roles"): the claims given back are the owner's own; another role's steps, due in the
# same queue at the same time, are never in the batch. One executor.
#
# Which steps share the stubborn step's claim and transaction depends on the pace of the queue
# and on the clock (attempts share a transaction for 20 ms, docs/worker.md), so a loaded machine
# may run the stubborn step alone. The bodies log the transaction they ran in: the steps logged
# as rolled back must be exactly those that ran in the stubborn step's first transaction. A round
# is repeated, with new steps, until one has shared both its claim and its transaction with the
# stubborn step (at most five rounds).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('unstarted_claims',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n"
	  . "durable_steps.max_worker_attempt_time = '1s'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice;
CREATE ROLE mallory;
CREATE SCHEMA mallory AUTHORIZATION mallory;
-- logs the transaction a body runs in: the log line outlives a rollback
CREATE FUNCTION public.note_transaction(tag text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RAISE LOG 'body % ran in transaction %', tag, txid_current();
    RETURN 1;
END $$;
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
ok(executors_running($node, 1), 'the executor runs');
# the executor's first attempt, which prepares its statements, is not one of the batch below
$node->safe_psql('postgres', q{SET ROLE mallory; SELECT ds_run_step('m', 'warm-up', 'SELECT 1', run_at => now())});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.steps WHERE step_id = 'warm-up'}, 'succeeded'),
	'a first step ran in the worker');

my $shared_both = 0;
for my $round (1 .. 5)
{
	my $r = "r$round";
	my $offset = log_offset($node);

	# mallory's three 'before' steps come first in the batch (the lowest priority number), then the
	# stubborn step; the 33 other steps of mallory's and alice's 30 have
	# one attempt each: one attempt charged for nothing fails them for
	# good. They are all due at one instant (now() is the transaction's start), after their commit:
	# an executor that read the clock between two of the inserts and its rows after the commit would
	# find only the earlier steps due, and claim the stubborn step alone.
	$node->safe_psql('postgres', qq{
BEGIN;
SET LOCAL ROLE mallory;
SELECT ds_run_step('m', '$r-before-' || i, format('SELECT public.note_transaction(%L)', '$r-before-' || i),
    run_at => now() + interval '1 s', priority => 0, policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 3) i;
SELECT ds_run_step('m', '$r-stubborn', 'SELECT public.note_transaction(''$r-stubborn'') + mallory.never_stop()',
    run_at => now() + interval '1 s', timeout => '1s', priority => 1,
    policy => ds_retry_policy(max_attempts => 2, initial_delay => '0 s'));
SELECT ds_run_step('m', '$r-mine-' || i, 'SELECT ' || i, run_at => now() + interval '1 s', priority => 5,
    policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 30) i;
SET LOCAL ROLE alice;
SELECT ds_run_step('a', '$r-alice-' || i, 'SELECT ' || i, run_at => now() + interval '1 s', priority => 5,
    policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 30) i;
COMMIT;
});

	ok(poll_until($node, 'postgres',
			qq{SELECT status || ' ' || error_code || ' ' || attempts FROM durable_steps.steps WHERE step_id = '$r-stubborn'},
			'failed DS007 2'),
		"$r: the stubborn step is charged both its attempts, and fails for good");
	ok(poll_until($node, 'postgres', qq{
SELECT string_agg(DISTINCT status || ' ' || attempts, ',') FROM durable_steps.steps
 WHERE step_id LIKE '$r-%' AND step_id <> '$r-stubborn'}, 'succeeded 1'),
		"$r: alice's 30 steps and mallory's other 33 succeeded, each at its first attempt");
	is($node->safe_psql('postgres', qq{
SELECT count(*) FROM durable_steps.attempts
 WHERE step_id LIKE '$r-%' AND step_id <> '$r-stubborn' AND error_code IS NOT NULL}),
		'0', "$r: no attempt of theirs was recorded lost");
	is($node->safe_psql('postgres', qq{
SELECT string_agg(attempt || ' ' || error_code || ' ' || error_detail, E'\n' ORDER BY attempt)
  FROM ds_attempts WHERE step_id = '$r-stubborn'}),
		"1 DS007 Attempt 1 ignored its cancellation past its time limit; its process was ended.\n"
		  . "2 DS007 Attempt 2 ignored its cancellation past its time limit; its process was ended.",
		"$r: the stubborn attempts are recorded lost, saying why");

	my $log = log_since($node, $offset);
	is(count_matches($log, qr/a step body ignored its cancellation/), 2,
		"$r: the executor was ended twice, once for each stubborn attempt");
	is(count_matches($log, qr/of step a\/$r-alice-\d+ never started/), 0,
		"$r: alice's steps were in none of mallory's batches");

	# the steps given their attempt back because their writes rolled back with the stubborn
	# step's are exactly those that ran in its first transaction
	my ($stubborn_xact) = $log =~ /body $r-stubborn ran in transaction (\d+)/;
	ok(defined $stubborn_xact, "$r: the stubborn step's first attempt logged its transaction");
	$stubborn_xact //= -1;
	my %in_its_transaction;
	$in_its_transaction{$1} = 1 while $log =~ /body ($r-before-\d+) ran in transaction $stubborn_xact\b/g;
	my %rolled_back;
	$rolled_back{$1} = 1
	  while $log =~ /attempt 1 of step m\/($r-before-\d+) rolled back when another step's code ended its executor; it is not counted/g;
	is(join(',', sort keys %rolled_back), join(',', sort keys %in_its_transaction),
		"$r: the steps given back as rolled back are those that ran in the stubborn step's transaction");

	# The stubborn step's second attempt ran alone, after the rest of its batch: the second end of
	# the executor found none of the other steps left to give back.
	my %given_back;
	$given_back{$1}++ while $log =~ /attempt 1 of step m\/($r-mine-\d+) never started/g;
	is(join(',', grep { $given_back{$_} > 1 } sort keys %given_back), '',
		"$r: no other step of mallory was given back twice: the stubborn step ran after them");

	if (%rolled_back && %given_back)
	{
		$shared_both = 1;
		last;
	}
	note("$r: the stubborn step shared "
		  . (%given_back ? 'its claim but not its transaction' : 'no claim')
		  . ' with the other steps; another round');
}
ok($shared_both,
	"a round's stubborn step shared its claim and its transaction with other steps of mallory's, "
	  . 'and both kinds were given their attempt back');

$node->stop;
done_testing();
