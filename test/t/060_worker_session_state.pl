# Property: no session state passes from one role's worker attempt to another's
# (docs/security.md). One executor runs mallory's attempt and then alice's: a cursor, a sequence
# value, a session advisory lock, a session setting, a function and an operator in pg_temp, a
# random() seed, and a plan kept for alice's statement are all gone or of no use to the next
# attempt, which runs as session user alice, not as a superuser.

use strict;
use warnings;

use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: every attempt runs in the same session
my $node = worker_node('worker_session_state',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
CREATE ROLE alice LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
CREATE SCHEMA alice AUTHORIZATION alice;
GRANT CREATE ON DATABASE postgres TO mallory;
});

# 4. Session state does not pass from one role's attempt to the next (one executor runs both).
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE SEQUENCE mallory.seq;
CREATE FUNCTION mallory.leave_state() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur refcursor := 'mallory_cursor';
BEGIN
    OPEN cur FOR SELECT 1;
    PERFORM nextval('mallory.seq');
    PERFORM pg_advisory_lock(777);
    PERFORM set_config('app.tenant', 'mallory', false);
    RETURN 'left';
END $$;
});
$node->safe_psql('postgres', q{
SET ROLE alice;
CREATE FUNCTION alice.look() RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    last text;
BEGIN
    BEGIN
        last := lastval()::text;
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
        last := 'none';
    END;
    RETURN jsonb_build_object('session_user', session_user, 'current_user', current_user,
                              'superuser', current_setting('is_superuser'),
                              'cursors', (SELECT count(*) FROM pg_cursors),
                              'lastval', last,
                              'tenant', coalesce(nullif(current_setting('app.tenant', true), ''), 'unset'));
END $$;
});
is_deeply(worker_attempt($node, 'mallory', 'leave-state', 'SELECT mallory.leave_state()'),
	{ status => 'succeeded', result => 'left', error_code => '' },
	'leave-state: mallory\'s attempt left a cursor, a sequence value, a session advisory lock '
	  . 'and a session setting behind');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 777"),
	'0', 'leave-state: the session advisory lock went with the attempt');
my $look = worker_attempt($node, 'alice', 'look', 'SELECT alice.look()');
is_deeply([ $look->{status}, $look->{error_code} ], [ 'succeeded', '' ], 'look: alice\'s attempt succeeded');
is_deeply(
	decode_json($look->{result}),
	{
		session_user => 'alice',
		current_user => 'alice',
		superuser => 'off',
		cursors => 0,
		lastval => 'none',
		tenant => 'unset'
	},
	'look: alice\'s attempt runs as session user alice, not a superuser, and finds nothing of mallory\'s');
is($node->safe_psql('postgres', q{
SELECT string_agg(DISTINCT backend_pid::text, ',') = string_agg(DISTINCT backend_pid::text, ',')
       AND count(DISTINCT backend_pid) = 1
  FROM ds_attempts WHERE step_id IN ('leave-state', 'look') AND executor = 'worker'}),
	't', 'look: both attempts ran in the same executor');

# 4a. Nor does a temporary object: the restricted operation refuses temporary tables, but a
#     body can still make the session's temporary schema and put a function or an operator
#     in it. Mallory's pg_temp.fmt() would run as alice, and copy her secrets, should
#     alice's later body call it in the same executor.
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE TABLE mallory.loot (who text, seen text);
GRANT INSERT ON mallory.loot TO PUBLIC;
CREATE FUNCTION mallory.plant() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    CREATE FUNCTION pg_temp.fmt(t text) RETURNS text LANGUAGE sql
        AS 'INSERT INTO mallory.loot VALUES (current_user, $1) RETURNING $1';
    CREATE OPERATOR pg_temp.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq);
    RETURN (SELECT count(*) FROM pg_proc WHERE proname = 'fmt'
              AND pronamespace = pg_my_temp_schema())::text;
END $$;
});
$node->safe_psql('postgres', q{
SET ROLE alice;
CREATE FUNCTION alice.use_temp() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    left_over int;
BEGIN
    SELECT count(*) INTO left_over FROM pg_depend WHERE refobjid = pg_my_temp_schema();
    BEGIN
        PERFORM pg_temp.fmt('alice''s secret');
        RETURN 'called mallory''s fmt; objects left: ' || left_over;
    EXCEPTION WHEN undefined_function THEN
        RETURN 'no fmt; objects left: ' || left_over;
    END;
END $$;
});
is_deeply(worker_attempt($node, 'mallory', 'plant-temp', 'SELECT mallory.plant()'),
	{ status => 'succeeded', result => '1', error_code => '' },
	'temp objects: mallory\'s attempt made a function and an operator in pg_temp');
is_deeply(worker_attempt($node, 'alice', 'use-temp', 'SELECT alice.use_temp()'),
	{ status => 'succeeded', result => 'no fmt; objects left: 0', error_code => '' },
	'temp objects: none of them outlived mallory\'s attempt, and alice\'s body finds no pg_temp.fmt');
is($node->safe_psql('postgres', 'SELECT count(*) FROM mallory.loot'), '0',
	'temp objects: nothing of alice\'s reached mallory');
is($node->safe_psql('postgres', q{
SELECT count(DISTINCT backend_pid) FROM ds_attempts
 WHERE step_id IN ('plant-temp', 'use-temp') AND executor = 'worker'}),
	'1', 'temp objects: both attempts ran in the same executor');

# 4b. Neither does a random() seed, and a plan made for one role never runs for another.
is_deeply(worker_attempt($node, 'mallory', 'seed', 'SELECT setseed(0.5)'),
	{ status => 'succeeded', result => '', error_code => '' }, 'seed: mallory seeded random()');
my ($seeded) = reverse split /\n/, $node->safe_psql('postgres', 'SELECT setseed(0.5); SELECT random()');
my $alice_random = worker_attempt($node, 'alice', 'random', 'SELECT random()');
isnt($alice_random->{result}, $seeded, 'random: alice\'s random() is not chosen by mallory\'s seed');

$node->safe_psql('postgres', q{
SET ROLE alice;
CREATE FUNCTION alice.private() RETURNS text LANGUAGE sql AS $$SELECT 'alice''s secret'$$;
REVOKE ALL ON FUNCTION alice.private() FROM PUBLIC;
});
# Both under the same search_path, which resolves to the same schemas: one plan would fit both.
# Alice's body runs often enough (more than 5 times) for the plan cache to keep a generic plan,
# in which her SQL function is inlined: nothing in it checks EXECUTE or USAGE any more.
for my $i (1 .. 7)
{
	$node->safe_psql('postgres', qq{SET ROLE alice; SET search_path = public;
SELECT status FROM ds_run_step('iso', 'plan-alice-$i',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''to the worker'', ''0 s'')::text
               ELSE (SELECT alice.private())::text END');});
	$node->poll_query_until('postgres',
		"SELECT status = 'succeeded' FROM ds_steps WHERE step_id = 'plan-alice-$i'")
	  or die "alice's step $i did not succeed";
}
pass('plan: alice ran her private function in the worker 7 times (a generic plan is kept)');
# mallory's own first attempt is refused at once; re-armed, the worker runs the same text
my ($first_error, $rearmed) = split /\n/, $node->safe_psql('postgres', q{SET ROLE mallory; SET search_path = public;
SELECT error_code FROM ds_run_step('iso', 'plan-mallory',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''to the worker'', ''0 s'')::text
               ELSE (SELECT alice.private())::text END');
SELECT status FROM ds_retry_step('iso', 'plan-mallory');});
is_deeply({ attempt_1_error_code => $first_error, status_after_rearming => $rearmed },
	{ attempt_1_error_code => '42501', status_after_rearming => 'pending' },
	'plan: mallory\'s attempt 1 is refused, and she re-arms the step for the worker');
ok($node->poll_query_until('postgres',
		"SELECT status = 'blocked' FROM ds_steps WHERE step_id = 'plan-mallory'"),
	'plan: the worker ran mallory\'s attempt 2');
is_deeply(row_of($node, 'postgres', "SELECT error_code, attempt FROM ds_steps WHERE step_id = 'plan-mallory'"),
	{ error_code => '42501', attempt => 2 }, 'plan: refused in the worker too, not run on alice\'s kept plan');

$node->stop;
done_testing();
