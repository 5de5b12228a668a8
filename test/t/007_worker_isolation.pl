# Property: nothing a step body leaves for later runs with the worker's privileges
# (docs/security.md). mallory's payload would make her a superuser if anything ran it as the
# executor's role: a WITH HOLD cursor (whose query runs at commit), a trigger deferred past the
# body, a temporary table (its ON COMMIT action), LISTEN and PREPARE are refused in a worker
# attempt (42501), a deferrable trigger fired within the body runs as mallory, and mallory stays
# an ordinary role.
#
# TAP 060 has session state between roles' attempts, 061 cancels, 062 the time bounds of worker
# attempts, 063 pg_stat_activity's view of them.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('isolation',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
CREATE SCHEMA mallory AUTHORIZATION mallory;
GRANT CREATE ON DATABASE postgres TO mallory;
});

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

# 1. The attack: a WITH HOLD cursor whose query would run at the worker's commit.
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
is_deeply(
	row_of($node, 'postgres', "SELECT error_code, error_message FROM ds_steps WHERE step_id = 'hold-cursor'"),
	{ error_code => '42501', error_message => 'cannot create a cursor WITH HOLD within security-restricted operation' },
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
is_deeply(worker_attempt($node, 'mallory', 'deferred-trigger', 'SELECT mallory.spring_trap()'),
	{ status => 'succeeded', result => '1', error_code => '' },
	'deferred-trigger: the step succeeded, its trigger fired at once');
is(is_superuser('mallory'), 'f', 'deferred-trigger: the trigger ran as mallory');
is_deeply(worker_attempt($node, 'mallory', 'set-constraints-deferred', 'SELECT mallory.defer_everything()'),
	{ status => 'blocked', result => '', error_code => '42501' },
	'set-constraints-deferred: a trigger deferred past the body is refused');
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
my %refused = (status => 'blocked', result => '', error_code => '42501');
is_deeply(worker_attempt($node, 'mallory', 'temp-table', 'SELECT mallory.make_temp()'), \%refused,
	'temp-table: a worker attempt cannot create a temporary table');
is_deeply(worker_attempt($node, 'mallory', 'listen', 'SELECT mallory.listen()'), \%refused,
	'listen: a worker attempt cannot LISTEN');
is_deeply(worker_attempt($node, 'mallory', 'prepare', 'SELECT mallory.prepare()'), \%refused,
	'prepare: a worker attempt cannot PREPARE');

$node->stop;
done_testing();
