# Adversary: tasks (docs/tasks.md) against hostile roles and broken workers. Every attack below is
# asserted to fail: another role's tasks are neither claimed, waited for, kept, completed, failed,
# released nor read; no hook and no store statement runs code as a more privileged role; a token
# that no longer holds its lease commits nothing, whatever races it; bad arguments are refused
# with their documented SQLSTATE and change nothing; a wait holds no snapshot and yields to a
# cancel; queue limits hold under concurrent claims; a dump and restore keeps the leases as they
# were. Attacks that still succeed are kept under TODO blocks marked "BUG:" so that this file
# passes today and flags the fix.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_tasks',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE alice_worker LOGIN IN ROLE alice;
CREATE ROLE alice_noinherit LOGIN NOINHERIT IN ROLE alice;
CREATE ROLE bob LOGIN;
CREATE ROLE mallory LOGIN;
CREATE ROLE flood LOGIN;
CREATE ROLE doomed LOGIN;
CREATE ROLE ops LOGIN IN ROLE durable_steps_admin;
CREATE SCHEMA evil AUTHORIZATION mallory;
GRANT CREATE ON SCHEMA public TO bob;
CREATE TABLE effects (k text PRIMARY KEY);
GRANT ALL ON effects TO PUBLIC;
CREATE TABLE hook_log (cu text, su text, what text);
GRANT ALL ON hook_log TO PUBLIC;
});
my $super = $node->safe_psql('postgres', 'SELECT current_user');

# The SQLSTATE of $sql run as $role ('ok' when it succeeded).
sub state_as
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = psql_as($node, $role, $sql);
	return $1 if $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return $rc == 0 ? 'ok' : "rc $rc: $err";
}

sub sql { return $node->safe_psql('postgres', $_[0]); }

# Store task $step (run $run) of $task as $role; extra named arguments in $extra.
sub store_task
{
	my ($role, $run, $step, $task, $extra) = @_;
	$extra = defined $extra ? ", $extra" : '';
	return psql_as_ok($node, $role,
		"SELECT status FROM ds_task_step('$run', '$step', '$task', '{\"secret\": \"$step\"}'$extra)");
}

# One claim of $task as $role with $lease: its token ('' when nothing was claimed).
sub claim_token
{
	my ($role, $task, $lease) = @_;
	$lease //= '1 hour';
	return psql_as_ok($node, $role,
		"SELECT token FROM ds_claim_tasks(ARRAY['$task'], 1, '$lease', 'adversary')");
}

sub step_status
{
	my ($run, $step) = @_;
	return sql("SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

# ---------------------------------------------------------------------------------------------
# 1. Another role's tasks
# ---------------------------------------------------------------------------------------------
store_task('alice', 'a', 'secret', 'mail');
is(psql_as_ok($node, 'bob', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['mail'], 1000)}), '0',
	'bob claims none of alice\'s tasks of a name they share');
is(psql_as_ok($node, 'bob', q{CALL ds_wait_for_tasks(ARRAY['mail'], '300 ms')}), 'f',
	'bob\'s wait is not ended by alice\'s due task');
is(psql_as_ok($node, 'bob', q{SELECT count(*) FROM ds_steps WHERE run_id = 'a'}), '0',
	'bob does not see alice\'s task in ds_steps');
is(psql_as_ok($node, 'alice_noinherit', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['mail'], 1000)}),
	'0', 'a NOINHERIT member claims nothing without SET ROLE');
is(psql_as_ok($node, 'alice_noinherit', q{CALL ds_wait_for_tasks(ARRAY['mail'], '300 ms')}), 'f',
	'nor is its wait ended');
is(state_as('bob', q{SET ROLE alice}), '42501', 'bob cannot SET ROLE alice');

my $tok = claim_token('alice_worker', 'mail');
like($tok, qr/^1\.\d+\.1\.asecret$/, 'alice\'s member claims her task');
for my $call ("SELECT * FROM ds_heartbeat('$tok')",
	"SELECT ds_complete_task('$tok', '{\"stolen\": true}')",
	"SELECT ds_fail_task('$tok', 'x', 'y', class => 'permanent')",
	"SELECT ds_release_task('$tok')")
{
	is(state_as('bob', $call), 'DS404', "bob: $call is DS404");
	is(state_as('alice_noinherit', $call), 'DS404', "NOINHERIT member: $call is DS404");
	is(state_as('ops', $call), '42501', "administrator: $call is 42501");
}
# NULL, odd and forged variants of the token name no other role's task either
for my $forged ("1.1.1.asecret", "1.0000001.1.asecret", "01.1.01.asecret", " 1. 1. 1.asecret",
	"1.1.6.asecre" . "t")
{
	like(state_as('bob', "SELECT * FROM ds_heartbeat('$forged')"), qr/^(DS404|22023)$/,
		"bob's forged token '$forged' is refused");
}
my ($rc, $out, $err) = psql_as($node, 'bob', "SELECT ds_complete_task('$tok')");
unlike($err, qr/alice|secret\"/, 'the refusal names neither the owner nor the input');
# a SECURITY DEFINER function of bob, called by alice, acts as bob
psql_as_ok($node, 'bob', q{
CREATE FUNCTION public.bob_completes(t text) RETURNS text LANGUAGE sql SECURITY DEFINER
    AS $$ SELECT (ds_complete_task(t)).status $$;
});
is(state_as('alice', "SELECT public.bob_completes('$tok')"), 'DS404',
	'a SECURITY DEFINER function of another role acts as that role, not as its caller');
# bob's refused call inside a transaction he keeps open holds no lock on alice's task
my $bob = DurableSteps::Session->new($node, 'bob');
$bob->query_ok('SET ROLE bob;');
$bob->query("BEGIN; SELECT ds_complete_task('$tok');");
is(psql_as_ok($node, 'alice_worker', "SET statement_timeout = '5s'; SELECT held FROM ds_heartbeat('$tok')"),
	't', 'alice\'s heartbeat is not blocked by bob\'s aborted transaction');
$bob->query('ROLLBACK;');
# with SET ROLE inside a transaction, the member acts as alice: allowed, and only then
is(psql_as_ok($node, 'alice_noinherit',
		"BEGIN; SET LOCAL ROLE alice; SELECT held FROM ds_heartbeat('$tok'); COMMIT;"),
	't', 'the NOINHERIT member acts after SET ROLE alice');
is(step_status('a', 'secret'), 'running', 'after all this alice\'s task still runs');
is(psql_as_ok($node, 'alice_worker', "SELECT status FROM ds_complete_task('$tok', '{}')"),
	'succeeded', 'and her worker completes it');

# ---------------------------------------------------------------------------------------------
# 2. Escalation
# ---------------------------------------------------------------------------------------------
# 2a. The store's statements run as the tables' owner: an operator of mallory's found through her
# search_path must never be called by them.
psql_as_ok($node, 'mallory', q{
CREATE TABLE evil.log (who text, a text, b text);
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.log VALUES (current_user, a, b);
    RETURN a OPERATOR(pg_catalog.=) b;
END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
});
store_task('mallory', 'm', 'm1', 'evil-task');
psql_as($node, 'mallory', q{SET search_path = evil, pg_catalog, public;
SELECT count(*) FROM public.ds_claim_tasks(ARRAY['evil-task']);});
psql_as($node, 'mallory', q{SET search_path = evil, pg_catalog, public;
CALL public.ds_wait_for_tasks(ARRAY['evil-task'], '10 ms');});
TODO:
{
	# BUG: task_store.c runs its statements as the tables' owner (ds_store_spi_begin) with the
	# caller's search_path and unqualified operators (=, IN, <=, +): any role with a schema of
	# its own runs code as the extension's owner (a superuser) through ds_claim_tasks or
	# ds_wait_for_tasks.
	local $TODO = 'BUG: ds_claim_tasks/ds_wait_for_tasks call operators from the caller\'s search_path as the tables\' owner';
	is(sql(q{SELECT string_agg(DISTINCT who, ',') FROM evil.log WHERE who <> 'mallory'}), '',
		'mallory\'s operator never runs as another role (the tables\' owner)');
}
is(sql(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}), 'f', 'mallory is no superuser');

# 2b. A superuser worker completes mallory's task: her hooks run as mallory, leave nothing behind
psql_as_ok($node, 'mallory', q{
CREATE TABLE evil.t (x int);
CREATE FUNCTION evil.trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hook_log VALUES (current_user, session_user, 'deferred trigger');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER tt AFTER INSERT ON evil.t DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION evil.trg();
GRANT USAGE ON SCHEMA evil TO PUBLIC;
});
store_task('mallory', 'h', 'deferred', 'hook-deferred', q{on_success => 'INSERT INTO evil.t VALUES (1)'});
store_task('mallory', 'h', 'guc', 'hook-guc',
	q{on_success => $$SELECT set_config('search_path', 'evil, pg_catalog', false)$$});
store_task('mallory', 'h', 'who', 'hook-who',
	q{on_success => $$INSERT INTO public.hook_log SELECT current_user, session_user, 'hook'$$});
my $superworker = DurableSteps::Session->new($node, 'superworker');
for my $task ('hook-deferred', 'hook-guc', 'hook-who')
{
	my $t = $superworker->query_ok(
		"SELECT token FROM ds_claim_tasks(ARRAY['$task'], 1, '1 hour');");
	$superworker->query_ok("BEGIN; SELECT status FROM ds_complete_task('$t'); COMMIT;");
}
is($superworker->query_ok('SHOW search_path;'), '"$user", public',
	'a hook\'s SET does not outlive it in the superuser worker\'s session');
is($superworker->query_ok('SELECT current_user;'), $super, 'nor does its role');
is(sql(q{SELECT count(*) FROM hook_log WHERE what = 'deferred trigger'}), '0',
	'a deferred trigger the hook queued never fires as the superuser');
is(sql(q{SELECT status FROM ds_steps WHERE step_id = 'deferred'}), 'blocked',
	'the hook that tried is refused, the step blocked');
is(sql(q{SELECT cu FROM hook_log WHERE what = 'hook'}), 'mallory', 'a hook runs as the task\'s owner');
$superworker->quit;

# 2c. The background worker records a lost lease; the on_failure hook it runs runs as the owner,
# and not at all once the owner is dropped
store_task('mallory', 'x', 'lost', 'lost-hook',
	q{policy => '{"max_attempts": 1}', on_failure => $$INSERT INTO public.hook_log SELECT current_user, session_user, 'expiry hook'$$});
claim_token('mallory', 'lost-hook', '200 ms');
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'lost'}, 'failed'),
	'a lost lease with its budget spent fails the task');
is(sql(q{SELECT cu || '/' || su FROM hook_log WHERE what = 'expiry hook'}), 'mallory/mallory',
	'its on_failure hook ran as the owner in the background worker');
store_task('doomed', 'd', 'd1', 'doomed-hook',
	q{policy => '{"max_attempts": 1}', on_failure => $$INSERT INTO public.hook_log SELECT current_user, session_user, 'dropped owner'$$});
my $doomed_tok = claim_token('doomed', 'doomed-hook', '1 s');
sql('DROP ROLE doomed');
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || error_code FROM ds_steps WHERE step_id = 'd1'},
		'blocked 42704'), 'a dropped owner\'s lost task fails closed (42704)');
is(sql(q{SELECT count(*) FROM hook_log WHERE what = 'dropped owner'}), '0',
	'its hook never ran, as nobody and as the worker\'s role');
is(psql_as_ok($node, 'bob', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['doomed-hook'])}), '0',
	'nobody claims a dropped owner\'s tasks');

# ---------------------------------------------------------------------------------------------
# 3. The fence
# ---------------------------------------------------------------------------------------------
# 3a. released, then claimed again: the old token is refused even with the same attempt number
store_task('alice', 'f', 'rel', 'fence-rel');
my $t1 = claim_token('alice', 'fence-rel');
is(psql_as_ok($node, 'alice', "SELECT ds_release_task('$t1')"), 't', 'a claim is given back');
is(psql_as_ok($node, 'alice', "SELECT ds_release_task('$t1')"), 'f', 'only once');
is(psql_as_ok($node, 'alice', "SELECT held::text || cancelled::text FROM ds_heartbeat('$t1')"), 'falsefalse',
	'a released token\'s heartbeat is not held');
my $t2 = claim_token('alice', 'fence-rel');
isnt($t2, $t1, 'the next claim of the same attempt number has another token');
is(state_as('alice', "BEGIN; INSERT INTO effects VALUES ('released'); SELECT ds_complete_task('$t1'); COMMIT;"),
	'DS410', 'the released token completes nothing (DS410)');
is(sql(q{SELECT count(*) FROM effects WHERE k = 'released'}), '0', 'and its writes roll back');
# cancelled: the heartbeat says so, the outcome is refused, the step is not re-armed
is(psql_as_ok($node, 'alice', q{SELECT status FROM ds_cancel_step('f', 'rel')}), 'cancelled',
	'the running task is cancelled');
is(psql_as_ok($node, 'alice', "SELECT held::text || cancelled::text FROM ds_heartbeat('$t2')"),
	'falsetrue', 'its worker\'s heartbeat says cancelled');
is(state_as('alice', "BEGIN; INSERT INTO effects VALUES ('cancelled'); SELECT ds_fail_task('$t2', 'c', 'm'); COMMIT;"),
	'DS410', 'its outcome is refused');
is(sql(q{SELECT count(*) FROM effects WHERE k = 'cancelled'}), '0', 'with its writes');
is(state_as('alice', q{SELECT ds_retry_step('f', 'rel')}), 'DS103', 'a cancelled task is not re-armed');
is(psql_as_ok($node, 'alice', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['fence-rel'])}), '0',
	'nor claimed again');

# 3b. two workers complete one attempt at once: the second waits, then is refused
store_task('alice', 'f', 'twice', 'fence-twice');
my $tt = claim_token('alice', 'fence-twice');
my $wa = DurableSteps::Session->new($node, 'wa');
my $wb = DurableSteps::Session->new($node, 'wb');
$wa->query_ok('SET ROLE alice;');
$wb->query_ok('SET ROLE alice;');
$wa->query_ok("BEGIN; INSERT INTO effects VALUES ('twice-a'); SELECT status FROM ds_complete_task('$tt');");
my $ticket = $wb->send("BEGIN; INSERT INTO effects VALUES ('twice-b'); SELECT status FROM ds_complete_task('$tt'); COMMIT;");
my $wbpid = $wb->pid;
ok(poll_until($node, 'postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $wbpid", 'Lock'),
	'the second completion waits for the first');
$wa->query_ok('COMMIT;');
my (undef, $werr) = $wb->wait($ticket);
like($werr, qr/DS410/, 'then is refused (DS410)');
is(sql(q{SELECT string_agg(k, ',' ORDER BY k) FROM effects WHERE k LIKE 'twice-%'}), 'twice-a',
	'only the first completion\'s writes are kept');
is(sql(q{SELECT count(*) FROM ds_attempts WHERE step_id = 'twice'}), '1', 'one attempt recorded');

# 3c. an outcome in flight while the lease runs out: the background worker waits for it
store_task('alice', 'f', 'flight', 'fence-flight');
my $tf = claim_token('alice', 'fence-flight', '1 s');
$wa->query_ok("BEGIN; INSERT INTO effects VALUES ('flight'); SELECT status FROM ds_complete_task('$tf');");
ok(poll_until($node, 'postgres',
		q{SELECT clock_timestamp() > lease_expires_at + interval '1 s' FROM durable_steps.steps WHERE step_id = 'flight'}, 't'),
	'the lease ran out while the completion was in flight');
$wa->query_ok('COMMIT;');
is(step_status('f', 'flight'), 'succeeded', 'the outcome recorded in time is kept');
is(sql(q{SELECT string_agg(attempt || ':' || class, ',') FROM ds_attempts WHERE step_id = 'flight'}),
	'1:completed', 'and the attempt was not also recorded lost');

# 3d. the same race, many times, against the background worker: never both, never neither
my $bad = 0;
for my $i (1 .. 12)
{
	store_task('alice', 'race', "r$i", "race-$i", q{policy => '{"initial_delay": "1 hour", "max_delay": "1 hour"}'});
	my $t = claim_token('alice', "race-$i", '300 ms');
	Time::HiRes::usleep(int(rand(600_000)));
	my $st = state_as('alice', "BEGIN; INSERT INTO effects VALUES ('race-$i'); SELECT ds_complete_task('$t'); COMMIT;");
	ok(poll_until($node, 'postgres',
			"SELECT status IN ('succeeded', 'retrying') FROM ds_steps WHERE step_id = 'r$i'", 't'),
		"race $i settles") or next;
	my $kept = sql("SELECT count(*) FROM effects WHERE k = 'race-$i'");
	my $recorded = sql("SELECT string_agg(class, ',') FROM ds_attempts WHERE step_id = 'r$i'");
	$bad++ unless ($st eq 'ok' && $kept eq '1' && $recorded eq 'completed')
	  || ($st eq 'DS410' && $kept eq '0' && $recorded eq 'retryable');
}
is($bad, 0, 'a completion racing the lease\'s end is either kept and alone, or refused with its writes');

# 3e. concurrent claimers never claim one task twice
psql_as_ok($node, 'alice', q{SELECT count(ds_task_step('cc', 'c' || i, 'claim-race')) FROM generate_series(1, 60) i});
my @tickets;
for my $s ($wa, $wb)
{
	push @tickets, $s->send(join "\n",
		map { q{SELECT string_agg(step_id, ',') FROM ds_claim_tasks(ARRAY['claim-race'], 3);} } 1 .. 15);
}
my @claimed;
for my $i (0, 1)
{
	my ($o) = ($i == 0 ? $wa : $wb)->wait($tickets[$i]);
	push @claimed, grep { $_ ne '' } map { split /,/ } split /\n/, $o;
}
my %seen;
$seen{$_}++ for @claimed;
is(scalar(grep { $seen{$_} > 1 } keys %seen), 0, 'no task is claimed twice by concurrent claimers');
is(scalar(keys %seen), 60, 'and every task is claimed once');
is(sql(q{SELECT count(*) FROM ds_steps WHERE run_id = 'cc' AND attempt = 1 AND status = 'running'}), '60',
	'each at attempt 1');

# 3f. a lease that ran out before a restart stays refused after it
store_task('alice', 'f', 'restart', 'fence-restart', q{policy => '{"initial_delay": "1 hour", "max_delay": "1 hour"}'});
my $tr = claim_token('alice', 'fence-restart', '1 s');
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'restart'}, 'retrying'),
	'the lease ran out and was recorded');
$wa->quit;
$wb->quit;
$node->restart;
is(state_as('alice', "SELECT ds_complete_task('$tr')"), 'DS410', 'after a restart the stale token is still refused');

# ---------------------------------------------------------------------------------------------
# 4. Bad input: each refused with its SQLSTATE, nothing stored or changed
# ---------------------------------------------------------------------------------------------
store_task('alice', 'bad', 'held', 'bad-input');
my $th = claim_token('alice', 'bad-input');
my $steps_before = sql('SELECT count(*) FROM durable_steps.steps');
my $big = 'x' x 300;
my @bad = (
	# ds_task_step
	[ q{SELECT ds_task_step('bad', 's', repeat('t', 201))}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', NULL)}, '22004' ],
	[ q{SELECT ds_task_step('bad', 's', 't', timeout => '1 mon')}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', 't', timeout => '-1 s')}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', 't', run_at => '-infinity')}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', 't', on_lost => 'RETRY')}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', 't', nowait => NULL)}, '22004' ],
	[ q{SELECT ds_task_step('bad', 's', 't', notify => repeat('n', 64))}, '22023' ],
	[ q{SELECT ds_task_step('bad', 's', 't', jsonb_build_object('x', repeat('x', 4000)))}, '54000' ],
	# ds_claim_tasks
	[ q{SELECT * FROM ds_claim_tasks('{{a},{b}}')}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a', NULL])}, '22004' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY[''])}, '22023' ],
	[ qq{SELECT * FROM ds_claim_tasks(ARRAY['a', repeat('t', 201)])}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], NULL)}, '22004' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], -1)}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 2147483647)}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 1, '-1 s')}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 1, '1 mon')}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 1, '24 hours 1 us')}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 1, '1 mon -30 days')}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], 1, '30 s', repeat('w', 201))}, '22023' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], queues => '{NULL}')}, '22004' ],
	[ q{SELECT * FROM ds_claim_tasks(ARRAY['a'], queues => '{{q}}')}, '22023' ],
	[ q{BEGIN; SELECT * FROM ds_claim_tasks(ARRAY['bad-input'])}, '25001' ],
	# ds_wait_for_tasks
	[ q{CALL ds_wait_for_tasks(NULL, '1 s')}, '22004' ],
	[ q{CALL ds_wait_for_tasks(ARRAY['a'], NULL)}, '22004' ],
	[ q{CALL ds_wait_for_tasks(ARRAY['a'], '25 hours')}, '22023' ],
	[ q{CALL ds_wait_for_tasks(ARRAY['a'], '1000000 years')}, '22023' ],
	[ q{CALL ds_wait_for_tasks(ARRAY['a'], '-1 s')}, '22023' ],
	[ q{CALL ds_wait_for_tasks(ARRAY['a'], '0')}, '22023' ],
	# tokens
	[ q{SELECT * FROM ds_heartbeat('')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('...')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('-1.1.1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('2147483648.1.1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('99999999999999999999.1.1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.99999999999999999999.1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.-5.1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.0.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.-1.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.18446744073709551617.ab')}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.2.ab')}, '22023' ],
	[ qq{SELECT * FROM ds_heartbeat('1.1.256.$big')}, '22023' ],
	[ qq{SELECT * FROM ds_heartbeat('1.1.1.a' || repeat('b', 256))}, '22023' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.1.éx')}, 'DS404' ],
	[ q{SELECT * FROM ds_heartbeat('1.1.2.éx')}, 'DS404' ],
	[ q{SELECT * FROM ds_heartbeat(NULL)}, '22004' ],
	[ qq{SELECT * FROM ds_heartbeat('$th', '0')}, '22023' ],
	[ qq{SELECT * FROM ds_heartbeat('$th', '-1 s')}, '22023' ],
	[ qq{SELECT * FROM ds_heartbeat('$th', '25 hours')}, '22023' ],
	[ qq{SELECT * FROM ds_heartbeat('$th', '1 mon')}, '22023' ],
	[ q{SELECT ds_release_task(NULL)}, '22004' ],
	[ q{SELECT ds_complete_task(NULL)}, '22004' ],
	# outcomes
	[ qq{SELECT ds_fail_task('$th', NULL, 'm')}, '22004' ],
	[ qq{SELECT ds_fail_task('$th', 'c', NULL)}, '22004' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', class => NULL)}, '22004' ],
	[ qq{SELECT ds_fail_task('$th', '', 'm')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', repeat('é', 33), 'm')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', class => 'Retryable')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', retry_after => '0')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', retry_after => '-1 s')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', retry_after => '2 days')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', class => 'permanent', retry_after => '1 s')}, '22023' ],
	[ qq{SELECT ds_fail_task('$th', 'c', 'm', class => 'permanent', remediation => 'x')}, '22023' ],
	[ qq{SELECT ds_complete_task('$th', jsonb_build_object('x', repeat('x', 4000)))}, 'DS005' ],
);
# as alice, under small size limits (settings only a superuser may change)
for my $b (@bad)
{
	my ($call, $want) = @$b;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET durable_steps.max_input_size = 1024; SET durable_steps.max_result_size = 1024;"
		  . " SET ROLE alice;\n$call",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	my $got = $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : $rc == 0 ? 'ok' : "rc $rc: $err";
	is($got, $want, "$call: $want");
}
is(sql('SELECT count(*) FROM durable_steps.steps'), $steps_before, 'no bad call stored a step');
is(psql_as_ok($node, 'alice', "SELECT held FROM ds_heartbeat('$th')"), 't',
	'no bad call took the held task\'s lease');
is(psql_as_ok($node, 'alice', q{SELECT count(*) FROM ds_claim_tasks(
	(SELECT array_agg('n' || i) FROM generate_series(1, 20000) i), 1000)}), '0',
	'a claim of 20000 names answers');
# long texts are cut to 8 kB on a character boundary, and stored as valid text
is(psql_as_ok($node, 'alice',
		"SELECT status FROM ds_fail_task('$th', 'big', repeat('é', 100000), repeat('ü', 100000))"),
	'retrying', 'a failure with huge texts is recorded');
is(sql(q{SELECT octet_length(error_message) <= 8192 AND octet_length(error_detail) <= 8192
	AND error_message = repeat('é', char_length(error_message)) FROM ds_steps WHERE step_id = 'held'}), 't',
	'its message and detail are cut to 8 kB on a character boundary');

# ---------------------------------------------------------------------------------------------
# 5. Waiting
# ---------------------------------------------------------------------------------------------
my $waiter = DurableSteps::Session->new($node, 'waiter');
$waiter->query_ok('SET ROLE alice;');
my $wpid = $waiter->pid;
$ticket = $waiter->send(q{CALL ds_wait_for_tasks(ARRAY['never'], '24 hours');});
ok(poll_until($node, 'postgres',
		"SELECT wait_event_type = 'Extension' AND backend_xmin IS NULL AND backend_xid IS NULL FROM pg_stat_activity WHERE pid = $wpid", 't'),
	'a long wait sleeps holding no snapshot and no transaction id');
sql("SELECT pg_cancel_backend($wpid)");
my (undef, $cerr) = $waiter->wait($ticket);
like($cerr, qr/57014/, 'a cancel ends the wait (57014)');
is($waiter->query_ok('SELECT 1;'), '1', 'and the session goes on');
$ticket = $waiter->send(q{CALL ds_wait_for_tasks(ARRAY['never'], '24 hours');});
ok(poll_until($node, 'postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $wpid", 'Extension'),
	'waiting again');
sql("SELECT pg_terminate_backend($wpid)");
ok(poll_until($node, 'postgres', "SELECT count(*) FROM pg_stat_activity WHERE pid = $wpid", '0'),
	'a terminate ends the waiting backend');
$waiter->abandon;
# inside a REPEATABLE READ transaction block, a task committed later still ends the wait
$waiter = DurableSteps::Session->new($node, 'waiter2');
$waiter->query_ok('SET ROLE alice; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;');
$wpid = $waiter->pid;
$ticket = $waiter->send(q{CALL ds_wait_for_tasks(ARRAY['rr-wake'], '60 s');});
ok(poll_until($node, 'postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $wpid", 'Extension'),
	'a wait in a transaction block sleeps');
store_task('alice', 'w', 'rr', 'rr-wake');
my ($rrdue) = $waiter->wait($ticket);
is($rrdue, 't', 'and a task committed after its snapshot ends it');
$waiter->query_ok('COMMIT;');
$waiter->quit;

# a paused queue, and the operator's pause: the claim comes back empty, so the wait must not say due
sql(q{SELECT ds_set_queue('paused', 0)});
store_task('alice', 'w', 'p1', 'paused-task', q{queue => 'paused'});
is(psql_as_ok($node, 'alice', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['paused-task'])}), '0',
	'a paused queue\'s task is not claimed');
TODO:
{
	# BUG: ds_store_next_task_time ignores queue limits (and durable_steps.paused): the wait
	# answers due at once while the claim stays empty, so a worker following the documented
	# wait/claim loop spins.
	local $TODO = 'BUG: ds_wait_for_tasks says due for a task no claim may take (paused or full queue)';
	is(psql_as_ok($node, 'alice', q{CALL ds_wait_for_tasks(ARRAY['paused-task'], '300 ms')}), 'f',
		'the wait does not say due for a task of a paused queue');
}

# ---------------------------------------------------------------------------------------------
# 6. Queue limits under concurrent claims
# ---------------------------------------------------------------------------------------------
# Claimers queue on the queue's row, held here so that both have read the due tasks first.
for my $iso ('read committed', 'repeatable read')
{
	(my $q = "lim_$iso") =~ s/ /_/g;
	sql("SELECT ds_set_queue('$q', 1)");
	psql_as_ok($node, 'alice',
		"SELECT count(ds_task_step('$q', 'q' || i, 'limited-$q', queue => '$q')) FROM generate_series(1, 4) i");
	my $holder = DurableSteps::Session->new($node, 'holder');
	$holder->query_ok("BEGIN; SELECT name FROM durable_steps.queues WHERE name = '$q' FOR UPDATE;");
	my @c = map { DurableSteps::Session->new($node, "claimer$_") } 1 .. 2;
	my @tk;
	for my $c (@c)
	{
		$c->query_ok("SET default_transaction_isolation = '$iso'; SET ROLE alice;");
		push @tk, $c->send("SELECT count(*) FROM ds_claim_tasks(ARRAY['limited-$q'], 2);");
	}
	my $pids = join ',', map { $_->pid } @c;
	ok(poll_until($node, 'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE pid IN ($pids) AND wait_event_type = 'Lock'", '2'),
		"$iso: both claimers wait for the queue");
	$holder->query_ok('COMMIT;');
	$c[$_]->wait($tk[$_]) for 0, 1;
	$_->quit for @c, $holder;
	my $running = sql("SELECT count(*) FROM ds_steps WHERE run_id = '$q' AND status = 'running'");
	if ($iso eq 'read committed')
	{
		is($running, '1', "$iso: concurrent claims keep a queue to its limit");
		next;
	}
	TODO:
	{
		# BUG: ds_store_task_queue_room counts the running steps with the claim's transaction
		# snapshot: under REPEATABLE READ or SERIALIZABLE (default_transaction_isolation), a
		# claimer that waited for the queue's row does not see the claims committed meanwhile.
		local $TODO = 'BUG: claims under REPEATABLE READ exceed a queue\'s limit';
		is($running, '1', "$iso: concurrent claims keep a queue to its limit");
	}
}

# ---------------------------------------------------------------------------------------------
# 7. One role's flood of tasks does not slow another role's claims
# ---------------------------------------------------------------------------------------------
for my $b (0 .. 3)
{
	psql_as_ok($node, 'flood', "SELECT count(ds_task_step('flood', 'f' || i, 'shared-name'))"
		  . " FROM generate_series($b * 5000 + 1, ($b + 1) * 5000) i");
}
store_task('alice', 'v', 'v1', 'shared-name');
my $reads = $node->safe_psql('postgres', q{
SET stats_fetch_consistency = none;
SELECT pg_stat_force_next_flush();
SELECT idx_tup_read FROM pg_stat_all_indexes WHERE indexrelname = 'steps_task_due_idx';
SET ROLE alice;
SELECT count(*) FROM ds_claim_tasks(ARRAY['shared-name']);
SELECT pg_stat_force_next_flush();
SELECT idx_tup_read FROM pg_stat_all_indexes WHERE indexrelname = 'steps_task_due_idx';
});
my (undef, $before, $claimed, undef, $after) = split /\n/, $reads;
is($claimed, '1', 'alice claims her one task among 20000 of another role');
TODO:
{
	# BUG: steps_task_due_idx is (task, priority, next_attempt_at), and the owner is checked
	# row by row (pg_has_role): a claim reads past every due task of the same name that other
	# roles stored before its own, so one role's backlog slows every other role's claims and
	# waits, linearly.
	local $TODO = 'BUG: a claim reads every other role\'s due task of the same name';
	cmp_ok($after - $before, '<', 1000, 'her claim reads few index entries (read ' . ($after - $before) . ')');
}

# ---------------------------------------------------------------------------------------------
# 8. A dump and restore of a database with a running task keeps its lease as it was
# ---------------------------------------------------------------------------------------------
store_task('alice', 'dump', 'running', 'dumped');
my $td = claim_token('alice', 'dumped', '1 hour');
my $lease = sql(q{SELECT lease_expires_at FROM durable_steps.steps WHERE step_id = 'running' AND run_id = 'dump'});
my $dump = $node->basedir . '/tasks.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
sql('CREATE DATABASE copy');
$node->command_ok([ 'pg_restore', '--single-transaction', '-d', $node->connstr('copy'), $dump ],
	'pg_restore');
is($node->safe_psql('copy', q{SELECT status || ' ' || lease_expires_at FROM durable_steps.steps WHERE run_id = 'dump'}),
	"running $lease", 'the restored task runs under the same lease, not a longer one');
is($node->safe_psql('copy', q{SET ROLE alice; SELECT count(*) FROM ds_claim_tasks(ARRAY['dumped'])}), '0',
	'and is not claimed again in the copy');
is($node->safe_psql('copy', q{SET ROLE bob; SELECT count(*) FROM ds_steps WHERE run_id = 'dump'}), '0',
	'nor seen by another role there');
(undef, undef, $err) = $node->psql('copy', qq{SET ROLE bob; SELECT ds_release_task('$td')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/DS404/, 'whose token another role cannot use there either');

ok(log_since($node, 0) !~ $crash_re, 'no server process crashed');
$node->stop;
done_testing();
