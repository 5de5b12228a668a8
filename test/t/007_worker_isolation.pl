# A hostile role against the worker's superuser session (README, "Security model"): nothing a
# step body leaves behind runs later with the worker's privileges, no session state passes from
# one role's attempt to another's, a body cannot tell it runs in a superuser's session, and no
# body holds an executor past durable_steps.max_worker_attempt_time.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# one executor: the test cancels and follows the executor process
my $node = worker_node('isolation',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
CREATE ROLE alice LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
CREATE SCHEMA alice AUTHORIZATION alice;
GRANT CREATE ON DATABASE postgres TO mallory;
});

# Attempt 1 runs in the caller and asks for a retry at once; attempt 2 runs `$body` in the worker.
sub worker_step
{
	my ($role, $step, $body, $extra) = @_;
	$extra //= '';
	(my $quoted = $body) =~ s/'/''/g;
	my $status = $node->safe_psql('postgres', qq{
SET ROLE $role;
SELECT status FROM ds_run_step('iso', '$step',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''to the worker'', ''0 s'')::text
               ELSE ($quoted)::text END'$extra);
});
	is($status, 'retrying', "$step: attempt 1 handed the step to the worker");
	ok($node->poll_query_until('postgres',
			"SELECT status NOT IN ('retrying', 'running', 'pending') FROM ds_steps "
			  . "WHERE run_id = 'iso' AND step_id = '$step'"),
		"$step: the worker ran attempt 2");
	return $node->safe_psql('postgres',
		"SELECT status || '|' || coalesce(result #>> '{}', '') || '|' || coalesce(error_code, '') "
		  . "FROM ds_steps WHERE run_id = 'iso' AND step_id = '$step'");
}

sub is_superuser
{
	return $node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = '$_[0]'");
}

# mallory's payload: harmless as mallory, a privilege escalation if anything runs it as postgres
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.escalate() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        ALTER ROLE mallory SUPERUSER;
    END IF;
    RETURN 1;
END $$;
});

# 1. The issue's reproduction: a WITH HOLD cursor whose query would run at the worker's commit.
#    The caller's attempt fails on a cursor of the same name (42P03, listed in retry_on).
$node->safe_psql('postgres', q{
SET ROLE mallory;
BEGIN;
DECLARE c CURSOR FOR SELECT 1;
SELECT status FROM ds_run_step('iso', 'hold-cursor',
  'DECLARE c CURSOR WITH HOLD FOR SELECT mallory.escalate()', retry_on => '{42P03}',
  policy => ds_retry_policy(max_attempts => 2, initial_delay => '0 s'));
COMMIT;
});
ok($node->poll_query_until('postgres',
		"SELECT status = 'blocked' FROM ds_steps WHERE step_id = 'hold-cursor'"),
	'hold-cursor: the worker ran attempt 2');
is($node->safe_psql('postgres',
		"SELECT error_code || ': ' || error_message FROM ds_steps WHERE step_id = 'hold-cursor'"),
	'42501: cannot create a cursor WITH HOLD within security-restricted operation',
	'hold-cursor: a WITH HOLD cursor is refused in a worker attempt');
is(is_superuser('mallory'), 'f', 'hold-cursor: mallory is not a superuser');

# 2. Deferred triggers: a deferrable constraint trigger would fire at the worker's commit.
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE TABLE mallory.trap (n int);
CREATE FUNCTION mallory.trap_fires() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM mallory.escalate(); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER trap AFTER INSERT ON mallory.trap DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION mallory.trap_fires();
CREATE FUNCTION mallory.spring_trap() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mallory.trap VALUES (1);
    RETURN 1;
END $$;
CREATE FUNCTION mallory.defer_everything() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    SET CONSTRAINTS ALL DEFERRED;
    INSERT INTO mallory.trap VALUES (2);
    RETURN 2;
END $$;
});
my $deferred = worker_step('mallory', 'deferred-trigger', 'SELECT mallory.spring_trap()');
is($deferred, 'succeeded|1|', 'deferred-trigger: the step succeeded, its trigger fired at once');
is(is_superuser('mallory'), 'f', 'deferred-trigger: the trigger ran as mallory');
my $deferring = worker_step('mallory', 'set-constraints-deferred', 'SELECT mallory.defer_everything()');
is($deferring, 'blocked||42501', 'set-constraints-deferred: a trigger deferred past the body is refused')
  or note $deferring;
is(is_superuser('mallory'), 'f', 'set-constraints-deferred: mallory is not a superuser');

# 3. Commands that leave something for later are refused: temporary tables (ON COMMIT actions),
#    LISTEN, PREPARE.
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.make_temp() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    CREATE TEMP TABLE loot (card text) ON COMMIT DROP;
    RETURN 1;
END $$;
CREATE FUNCTION mallory.listen() RETURNS int LANGUAGE plpgsql AS $$
BEGIN LISTEN loot; RETURN 1; END $$;
CREATE FUNCTION mallory.prepare() RETURNS int LANGUAGE plpgsql AS $$
BEGIN PREPARE mallory_ps AS SELECT 42; RETURN 1; END $$;
});
is(worker_step('mallory', 'temp-table', 'SELECT mallory.make_temp()'), 'blocked||42501',
	'temp-table: a worker attempt cannot create a temporary table');
is(worker_step('mallory', 'listen', 'SELECT mallory.listen()'), 'blocked||42501',
	'listen: a worker attempt cannot LISTEN');
is(worker_step('mallory', 'prepare', 'SELECT mallory.prepare()'), 'blocked||42501',
	'prepare: a worker attempt cannot PREPARE');

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
CREATE FUNCTION alice.look() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    seen text;
    last text;
BEGIN
    BEGIN
        last := lastval()::text;
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
        last := 'none';
    END;
    SELECT session_user || ',' || current_user || ',' || current_setting('is_superuser')
           || ',cursors=' || (SELECT count(*) FROM pg_cursors)
           || ',lastval=' || last
           || ',tenant=' || coalesce(nullif(current_setting('app.tenant', true), ''), 'unset')
      INTO seen;
    RETURN seen;
END $$;
});
is(worker_step('mallory', 'leave-state', 'SELECT mallory.leave_state()'), 'succeeded|left|',
	'leave-state: mallory\'s attempt left a cursor, a sequence value, a session advisory lock '
	  . 'and a session setting behind');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 777"),
	'0', 'leave-state: the session advisory lock went with the attempt');
is(worker_step('alice', 'look', 'SELECT alice.look()'),
	'succeeded|alice,alice,off,cursors=0,lastval=none,tenant=unset|',
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
is(worker_step('mallory', 'plant-temp', 'SELECT mallory.plant()'), 'succeeded|1|',
	'temp objects: mallory\'s attempt made a function and an operator in pg_temp');
is(worker_step('alice', 'use-temp', 'SELECT alice.use_temp()'),
	'succeeded|no fmt; objects left: 0|',
	'temp objects: none of them outlived mallory\'s attempt, and alice\'s body finds no pg_temp.fmt');
is($node->safe_psql('postgres', 'SELECT count(*) FROM mallory.loot'), '0',
	'temp objects: nothing of alice\'s reached mallory');
is($node->safe_psql('postgres', q{
SELECT count(DISTINCT backend_pid) FROM ds_attempts
 WHERE step_id IN ('plant-temp', 'use-temp') AND executor = 'worker'}),
	'1', 'temp objects: both attempts ran in the same executor');

# 4b. Neither does a random() seed, and a plan made for one role never runs for another.
is(worker_step('mallory', 'seed', 'SELECT setseed(0.5)'), 'succeeded||', 'seed: mallory seeded random()');
my ($seeded) = reverse split /\n/, $node->safe_psql('postgres', 'SELECT setseed(0.5); SELECT random()');
my $alice_random = worker_step('alice', 'random', 'SELECT random()');
isnt($alice_random, "succeeded|$seeded|", 'random: alice\'s random() is not chosen by mallory\'s seed');

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
is($node->safe_psql('postgres', q{SET ROLE mallory; SET search_path = public;
SELECT error_code FROM ds_run_step('iso', 'plan-mallory',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''to the worker'', ''0 s'')::text
               ELSE (SELECT alice.private())::text END');
SELECT status FROM ds_retry_step('iso', 'plan-mallory');}), "42501\npending",
	'plan: mallory\'s attempt 1 is refused, and she re-arms the step for the worker');
ok($node->poll_query_until('postgres',
		"SELECT status = 'blocked' FROM ds_steps WHERE step_id = 'plan-mallory'"),
	'plan: the worker ran mallory\'s attempt 2');
is($node->safe_psql('postgres',
		"SELECT error_code || ' ' || attempt FROM ds_steps WHERE step_id = 'plan-mallory'"),
	'42501 2', 'plan: refused in the worker too, not run on alice\'s kept plan');

# 4c. Cancels: a body raising query_canceled, or an operator's pg_cancel_backend(), ends the
#     attempt (recorded as 57014), not the executor.
my $executor = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.fake_cancel() RETURNS text LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION USING ERRCODE = 'query_canceled', MESSAGE = 'fake cancel'; END $$;
});
is(worker_step('mallory', 'fake-cancel', 'SELECT mallory.fake_cancel()',
		q{, policy => ds_retry_policy(max_attempts => 3, initial_delay => '0 s')}), 'failed||57014',
	'fake-cancel: a body raising query_canceled fails its own attempts (retryable: 57014 twice)');
$node->safe_psql('postgres', q{
SET ROLE alice;
SELECT status FROM ds_run_step('iso', 'hangs',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text
               ELSE pg_sleep(600)::text END',
  policy => ds_retry_policy(max_attempts => 2));
});
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker' "
		  . "AND query LIKE '%/hangs attempt 2' AND wait_event = 'PgSleep'"),
	'hangs: the worker is running the hanging attempt');
# an attempt by another role with a guess at its definition learns nothing, even with nowait
$node->psql('postgres', q{SET ROLE mallory;
SELECT ds_run_step('iso', 'hangs', 'SELECT a_guess', nowait => true)}, stderr => \my $guess_err);
like($guess_err, qr/belongs to another role/,
	'guess: a wrong guess gets 42501, as any definition does, not DS409');
$node->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
ok($node->poll_query_until('postgres',
		"SELECT status = 'failed' AND error_code = '57014' FROM ds_steps WHERE step_id = 'hangs'"),
	'hangs: pg_cancel_backend() recorded the attempt as cancelled (57014, its last by its policy)');
is(worker_step('alice', 'after-cancels', 'SELECT 8'), 'succeeded|8|',
	'after-cancels: the executor goes on with the next step');
is($node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"),
	$executor, 'after-cancels: the same executor process, never restarted');

# 5. Worker attempts have a timeout even when their step sets none: durable_steps.default_timeout.
$node->append_conf('postgresql.conf', "durable_steps.default_timeout = '1s'\n");
$node->reload;
ok($node->poll_query_until('postgres', "SELECT current_setting('durable_steps.default_timeout') = '1s'"),
	'default-timeout: the setting is reloaded');
is(worker_step('alice', 'no-timeout', 'SELECT pg_sleep(30)',
		q{, policy => ds_retry_policy(max_attempts => 2)}), 'failed||DS004',
	'no-timeout: the worker attempt timed out');
is($node->safe_psql('postgres',
		"SELECT error_message FROM ds_attempts WHERE step_id = 'no-timeout' AND attempt = 2"),
	'step timed out after 00:00:01 (durable_steps.default_timeout)',
	'no-timeout: the message names the setting');
$node->append_conf('postgresql.conf', "durable_steps.default_timeout = '5min'\n");
$node->reload;

# 6. A role cannot hold an executor without bound: the ceiling stops a step that asks for an hour.
$node->append_conf('postgresql.conf', "durable_steps.max_worker_attempt_time = '2s'\n");
$node->reload;
my $ceiling = worker_step('mallory', 'long-sleep', 'SELECT pg_sleep(60)', q{, timeout => '1 hour'});
is($ceiling, 'failed||DS004', 'long-sleep: the attempt was stopped and recorded as timed out');
is($node->safe_psql('postgres',
		"SELECT error_message FROM ds_attempts WHERE step_id = 'long-sleep' AND attempt = 2"),
	'step attempt stopped after 00:00:02 by durable_steps.max_worker_attempt_time',
	'long-sleep: the message names the ceiling');
# A body that catches every cancellation is ended with its executor, and its attempt is lost.
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE FUNCTION mallory.never_stop() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM pg_sleep(60);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
});
my $stubborn = worker_step('mallory', 'never-stop', 'SELECT mallory.never_stop()',
	q{, policy => ds_retry_policy(max_attempts => 2, initial_delay => '0 s')});
is($stubborn, 'failed||DS007', 'never-stop: the executor ended and the attempt was recorded as lost');
ok($node->log_contains('a step body ignored its cancellation past durable_steps.max_worker_attempt_time'),
	'never-stop: the log says why the executor ended');
is(worker_step('alice', 'after-stubborn', 'SELECT 7'), 'succeeded|7|',
	'after-stubborn: a new executor runs the next step');

# 7. pg_stat_activity shows a worker's long identities whole and valid (no character cut in two).
my $long_run = 'é' x 200;
$node->safe_psql('postgres', qq{
SET ROLE alice;
SELECT status FROM ds_run_step('$long_run', 'sleepy',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text
               ELSE pg_sleep(1.5)::text END');
});
ok($node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker'
   AND convert_from(convert_to(query, 'UTF8'), 'UTF8') LIKE '%/sleepy attempt 2'}),
	'activity: the running attempt is shown whole, as valid UTF-8');

$node->stop;
done_testing();
