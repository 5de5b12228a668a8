# A body that ignores its cancellation ends its executor (docs/security.md): the claims
# of its batch the executor never reached get their attempt back, so do those it ran before the
# stubborn one in the same transaction (their writes rolled back with it), and the step whose
# body had to be ended is the one charged -- it then runs alone, after the other claims of its batch, so it
# takes no other step's attempt with it again. A batch is one owner's (docs/queues.md, "Fair share between roles"): the claims given back are the owner's own; another role's steps, due in the
# same queue at the same time, are never in the batch. One executor.

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
my $offset = log_offset($node);

# mallory's three 'before' steps come first in the batch (the lowest priority number), then the
# stubborn step, in the same transaction; the 33 other steps of mallory's and alice's 30 have
# one attempt each: one attempt charged for nothing fails them for
# good. They are all due at one instant (now() is the transaction's start), after their commit:
# an executor that read the clock between two of the inserts and its rows after the commit would
# find only the earlier steps due, and claim the stubborn step alone.
$node->safe_psql('postgres', q{
BEGIN;
SET LOCAL ROLE mallory;
SELECT ds_run_step('m', 'before-' || i, 'SELECT ' || i, run_at => now() + interval '1 s', priority => 0,
    policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 3) i;
SELECT ds_run_step('m', 'stubborn', 'SELECT mallory.never_stop()', run_at => now() + interval '1 s',
    timeout => '1s', priority => 1,
    policy => ds_retry_policy(max_attempts => 2, initial_delay => '0 s'));
SELECT ds_run_step('m', 'mine-' || i, 'SELECT ' || i, run_at => now() + interval '1 s', priority => 5,
    policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 30) i;
SET LOCAL ROLE alice;
SELECT ds_run_step('a', 'alice-' || i, 'SELECT ' || i, run_at => now() + interval '1 s', priority => 5,
    policy => ds_retry_policy(max_attempts => 1))
  FROM generate_series(1, 30) i;
COMMIT;
});

ok(poll_until($node, 'postgres',
		q{SELECT status || ' ' || error_code || ' ' || attempts FROM durable_steps.steps WHERE step_id = 'stubborn'},
		'failed DS007 2'),
	"the stubborn step is charged both its attempts, and fails for good");
ok(poll_until($node, 'postgres', q{
SELECT string_agg(DISTINCT status || ' ' || attempts, ',') FROM durable_steps.steps
 WHERE run_id = 'a' OR step_id LIKE 'mine-%' OR step_id LIKE 'before-%'}, 'succeeded 1'),
	"alice's 30 steps and mallory's other 33 succeeded, each at its first attempt");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM durable_steps.attempts a JOIN durable_steps.steps s USING (run_id, step_id)
 WHERE (s.run_id = 'a' OR s.step_id LIKE 'mine-%' OR s.step_id LIKE 'before-%')
   AND a.error_code IS NOT NULL}),
	'0', "no attempt of theirs was recorded lost");
is($node->safe_psql('postgres', q{
SELECT string_agg(attempt || ' ' || error_code || ' ' || error_detail, E'\n' ORDER BY attempt)
  FROM ds_attempts WHERE step_id = 'stubborn'}),
	"1 DS007 Attempt 1 ignored its cancellation past its time limit; its process was ended.\n"
	  . "2 DS007 Attempt 2 ignored its cancellation past its time limit; its process was ended.",
	'the stubborn attempts are recorded lost, saying why');

my $log = log_since($node, $offset);
is(count_matches($log, qr/a step body ignored its cancellation/), 2,
	'the executor was ended twice, once for each stubborn attempt');
cmp_ok(count_matches($log, qr/attempt 1 of step m\/mine-\d+ never started before its executor ended/),
	'>', 0, "the first time, mallory's other steps in the batch were given their attempt back");
# (a transaction takes attempts for 20 ms: the first 'before' step began the one the stubborn
# step joined, unless that attempt alone outlasted them)
cmp_ok(count_matches($log, qr/attempt 1 of step m\/before-\d+ rolled back when another step's code ended its executor; it is not counted/),
	'>=', 1, "the first time, the steps run before it in its transaction were given their attempt back");
is(count_matches($log, qr/of step a\/alice-\d+ never started/), 0,
	"alice's steps were in none of mallory's batches");
# The stubborn step's second attempt ran alone, after the rest of its batch: the second end of
# the executor found none of the other steps left to give back.
my %given_back;
$given_back{$1}++ while $log =~ /attempt 1 of step m\/(mine-\d+) never started/g;
is(join(',', grep { $given_back{$_} > 1 } sort keys %given_back), '',
	'no other step of mallory was given back twice: the stubborn step ran after them');

$node->stop;
done_testing();
