# Adversary: tasks (docs/tasks.md) against hostile roles and broken workers. Every attack below is
# asserted to fail: another role's tasks are neither claimed, waited for, kept, completed, failed,
# released nor read; no hook and no store statement runs code as a more privileged role; a token
# that no longer holds its lease commits nothing, whatever races it; bad arguments are refused
# with their documented SQLSTATE and change nothing; a wait holds no snapshot and yields to a
# cancel; queue limits hold under concurrent claims, and a claim above READ COMMITTED is refused;
# one role's backlog is not read by another role's claims; a dump and restore keeps the leases as
# they were.
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
# every operator of the statements run as the tables' owner is qualified (task_store.c)
is(sql(q{SELECT string_agg(DISTINCT who, ',') FROM evil.log WHERE who <> 'mallory'}), '',
	'mallory\'s operator never runs as another role (the tables\' owner)');
is(psql_as_ok($node, 'alice', q{SELECT count(*) FROM ds_claim_tasks(ARRAY['paused-task'])}), '0',
	'a paused queue\'s task is not claimed');
is(psql_as_ok($node, 'alice', q{CALL ds_wait_for_tasks(ARRAY['paused-task'], '300 ms')}), 'f',
	'the wait does not say due for a task of a paused queue');

# ---------------------------------------------------------------------------------------------
# 6. Queue limits under concurrent claims
# ---------------------------------------------------------------------------------------------
# Claimers queue on the queue's row, held here so that both have read the due tasks first.
{
	my $q = 'lim_rc';
	sql("SELECT ds_set_queue('$q', 1)");
	psql_as_ok($node, 'alice',
		"SELECT count(ds_task_step('$q', 'q' || i, 'limited-$q', queue => '$q')) FROM generate_series(1, 4) i");
	my $holder = DurableSteps::Session->new($node, 'holder');
	$holder->query_ok("BEGIN; SELECT name FROM durable_steps.queues WHERE name = '$q' FOR UPDATE;");
	my @c = map { DurableSteps::Session->new($node, "claimer$_") } 1 .. 2;
	my @tk;
	for my $c (@c)
	{
		$c->query_ok("SET ROLE alice;");
		push @tk, $c->send("SELECT count(*) FROM ds_claim_tasks(ARRAY['limited-$q'], 2);");
	}
	my $pids = join ',', map { $_->pid } @c;
	ok(poll_until($node, 'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE pid IN ($pids) AND wait_event_type = 'Lock'", '2'),
		'both claimers wait for the queue');
	$holder->query_ok('COMMIT;');
	$c[$_]->wait($tk[$_]) for 0, 1;
	$_->quit for @c, $holder;
	is(sql("SELECT count(*) FROM ds_steps WHERE run_id = '$q' AND status = 'running'"), '1',
		'concurrent claims keep a queue to its limit');
}
# Under a transaction-wide snapshot a claim would count a queue's running steps as they were
# before it waited: refused (25000), nothing claimed.
for my $iso ('repeatable read', 'serializable')
{
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET default_transaction_isolation = '$iso'; SET ROLE alice;"
		  . " SELECT count(*) FROM ds_claim_tasks(ARRAY['limited-lim_rc'], 2);",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/25000/, "$iso: a claim is refused (25000)");
}
is(sql("SELECT count(*) FROM ds_steps WHERE run_id = 'lim_rc' AND status = 'running'"), '1',
	'and took nothing');

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
# each owner is a range of steps_task_due_idx of its own (task, owner, priority, next_attempt_at)
cmp_ok($after - $before, '<', 1000, 'her claim reads few index entries (read ' . ($after - $before) . ')');

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
