# Property: with nowait, a caller never waits for a lock (docs/steps.md, "How a step behaves").
# While another transaction holds the step identity, or holds the run_id while its ds_start_run
# is not committed, the call is refused at once with DS409 (not after lock_timeout's 55P03),
# catchable by SQLSTATE, and leaves nothing behind; once the holder has committed, nowait
# replays.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;

my $node = claims_node('nowait_claims');

my $sa = DurableSteps::Session->new($node, 'A');
my $sb = DurableSteps::Session->new($node, 'B');
my ($apid, $bpid) = ($sa->pid, $sb->pid);

############################################################################################
# 3. nowait: while A holds the key, B is refused at once with DS409 and changes nothing.
{
	my $t = 'test 3 (nowait)';
	$sa->query_ok('BEGIN;');
	my $a = decode_row($sa->query_ok(claim_sql('t3')));
	is_deeply([ $a->{status}, $a->{replayed} ], [ 'succeeded', 'false' ], "$t: A executed the step");

	# Should B wait instead of refusing, it fails with lock_timeout's 55P03, not DS409.
	$sb->query_ok("SET lock_timeout = '5s';");
	my ($out, $err) = $sb->query(claim_sql('t3', nowait => 1));
	is($out, '', "$t: B got no row");
	like(
		$err,
		qr/ERROR:\s+DS409: step t3\/s1 is in progress in another transaction/,
		"$t: B is refused with SQLSTATE DS409");

	($out, $err) = $sb->query(
		q{DO $$
BEGIN
    PERFORM ds_run_step('t3', 's1', $body$INSERT INTO effects(k) VALUES ($1->>'k') RETURNING id$body$,
                        '{"k": "t3"}'::jsonb, nowait => true);
    RAISE NOTICE 'not refused';
EXCEPTION WHEN SQLSTATE 'DS409' THEN
    RAISE NOTICE 'caught DS409: %', SQLERRM;
END
$$;});
	like($err, qr/NOTICE:\s+00000: caught DS409: step t3\/s1 is in progress/,
		"$t: DS409 can be caught by SQLSTATE in PL/pgSQL");
	unlike($err, qr/not refused/, "$t: the call in the DO block did not go through");

	# refused inside an explicit transaction too; that transaction is then the caller's to end
	($out, $err) = $sb->query("BEGIN;\n" . claim_sql('t3', nowait => 1));
	like($err, qr/DS409/, "$t: B is refused inside a transaction too");
	$sb->query_ok('ROLLBACK;');
	$sb->query_ok('RESET lock_timeout;');

	is_deeply(claim_counts($node, 't3'), { steps_in_view => 0, steps => 0, attempts => 0, effects => 0 },
		"$t: B's refusals left nothing behind");
	is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE pid = $bpid AND locktype = 'advisory'"),
		'0', "$t: B holds no lock afterwards");
	is($sa->query_ok('SELECT 1;'), '1', "$t: A's transaction is unaffected");
	$sa->query_ok('COMMIT;');
	is_deeply(claim_counts($node, 't3'), { steps_in_view => 1, steps => 1, attempts => 1, effects => 1 },
		"$t: after A commits: one step, one attempt, one effect");
	is_deeply(claim_effects($node, 't3'), [ { id => $a->{result}, pid => $apid } ], "$t: the effect is A's");
	is_deeply(decode_row($sb->query_ok(claim_sql('t3', nowait => 1))),
		{ status => 'succeeded', result => $a->{result}, attempt => 1, replayed => 'true' },
		"$t: once A committed, nowait replays instead of refusing");
}

############################################################################################
# 3b. nowait waits for no lock at all: while A's ds_start_run holds the run_id's lock, a new step
#     of that run_id is refused at once with DS409 (not after lock_timeout's 55P03).
{
	my $t = 'test 3b (nowait, a run being started)';
	$node->safe_psql('postgres',
		q{CREATE FUNCTION t3b_flow(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT input'});
	$sa->query_ok('BEGIN;');
	$sa->query_ok(q{SELECT created FROM ds_start_run('t3b_flow', '{}', run_key => 't3b');});
	$sb->query_ok("SET lock_timeout = '5s';");
	my ($out, $err) = $sb->query(q{SELECT status FROM ds_run_step('t3b', 's1', 'SELECT 1', nowait => true);});
	like($err, qr/ERROR:\s+DS409: run t3b is being started in another transaction/,
		"$t: ds_run_step is refused with DS409");
	($out, $err) = $sb->query(
		q{SELECT status FROM ds_http_step('t3b', 'h1', '{"url": "http://127.0.0.1:9/"}', nowait => true);});
	like($err, qr/ERROR:\s+DS409: run t3b is being started in another transaction/,
		"$t: ds_http_step is refused with DS409");
	$sb->query_ok('RESET lock_timeout;');
	$sa->query_ok('ROLLBACK;');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.steps WHERE run_id = 't3b'}),
		'0', "$t: the refusals stored nothing");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
