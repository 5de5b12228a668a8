# Citus coordinator mode (docs/citus.md): durable_steps on a Citus coordinator, the application's
# tables distributed over two worker nodes on 127.0.0.1. A step that writes a distributed table
# replays, rolls back with its caller, and is retried by the executor across a worker node's
# outage; the step-context functions are evaluated on the coordinator, where the step runs, in
# INSERT ... VALUES, INSERT ... SELECT, UPDATE and DELETE; a worker node lost before the caller commits
# aborts the caller's transaction and loses nothing. And a crash of the coordinator in the commit
# window -- after Citus's pre-commit work on the worker nodes, before the coordinator's commit
# record -- does not repeat the step's effect: durable_steps asks Citus for two-phase commit, the
# crash leaves a prepared transaction that Citus's recovery rolls back, and the caller's retry
# runs the step once. With the request turned off (durable_steps.citus_two_phase_commit), the
# same crash repeats the effect: the control that shows the window is real.
#
# The window is held open without a debugger: the caller's transaction has written a temporary
# table ON COMMIT DELETE ROWS whose lock another session holds, and PostgreSQL empties such a
# table after the transaction callbacks (Citus's PRE_COMMIT) and before the commit record, so the
# COMMIT waits there until the backend is killed.
#
# Skipped when Citus is not installed for this PostgreSQL (scripts/citus-build installs it for
# the majors Citus supports).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
chomp(my $pkglibdir = `$pg_config --pkglibdir`);
plan skip_all => "Citus is not installed for this PostgreSQL ($pkglibdir/citus.so is missing; "
  . 'scripts/citus-build installs it for the majors it supports)'
  unless -f "$pkglibdir/citus.so";

# Every node: reachable on 127.0.0.1 (the nodes connect to each other there), prepared
# transactions for 2PC, recovery of prepared transactions only when the test asks for it.
my $citus_conf = qq{
listen_addresses = '127.0.0.1'
max_prepared_transactions = 20
citus.node_conninfo = 'sslmode=prefer'
citus.recover_2pc_interval = -1
};

my @workers;
for my $i (1, 2)
{
	my $w = PostgreSQL::Test::Cluster->new("citus_worker$i");
	$w->init;
	$w->append_conf('postgresql.conf', "shared_preload_libraries = 'citus'\n" . $citus_conf);
	$w->start;
	$w->safe_psql('postgres', 'CREATE EXTENSION citus');
	push @workers, $w;
}

my $coord = worker_node('citus_coordinator',
	"shared_preload_libraries = 'citus,durable_steps'\n"
	  . "durable_steps.database = 'postgres'\n"
	  . $citus_conf);
my $port = $coord->port;
$coord->safe_psql('postgres', qq{
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('127.0.0.1', $port);
});
for my $w (@workers)
{
	my $wport = $w->port;
	$coord->safe_psql('postgres', "SELECT citus_add_node('127.0.0.1', $wport)");
}
# durable_steps lives on the coordinator only: its CREATE EXTENSION is not sent to the workers
$coord->safe_psql('postgres', q{
SET citus.enable_ddl_propagation = off;
CREATE EXTENSION durable_steps;
RESET citus.enable_ddl_propagation;
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
SELECT create_distributed_table('accounts', 'id', shard_count => 4);
INSERT INTO accounts SELECT g, 100 FROM generate_series(1, 8) g;
CREATE TABLE keys (id int, form text, k text, PRIMARY KEY (id, form));
SELECT create_distributed_table('keys', 'id', colocate_with => 'accounts');
});
is($coord->safe_psql('postgres', 'SELECT count(*) FROM pg_dist_node WHERE noderole = \'primary\''),
	'3', 'a coordinator and two worker nodes');

sub balance
{
	my ($id) = @_;
	return $coord->safe_psql('postgres', "SELECT balance FROM accounts WHERE id = $id");
}

sub debit_sql
{
	my ($id) = @_;
	return "'UPDATE accounts SET balance = balance - 10 WHERE id = $id RETURNING balance'";
}

# The worker node that holds account $id.
sub worker_of
{
	my ($id) = @_;
	my $p = $coord->safe_psql('postgres', qq{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
 WHERE p.shardid = get_shard_id_for_distribution_column('accounts', $id)});
	my ($w) = grep { $_->port == $p } @workers;
	die "no worker node holds account $id (port $p)" unless $w;
	return $w;
}

# ---- replay --------------------------------------------------------------------------------------
for my $call (1, 2)
{
	is($coord->safe_psql('postgres',
			"SELECT status || ' ' || replayed FROM ds_run_step('replay', 'debit', " . debit_sql(1) . ')'),
		'succeeded ' . ($call == 1 ? 'false' : 'true'), "replay: call $call");
}
is(balance(1), '90', 'replay: the distributed row was debited once');
is($coord->safe_psql('postgres', "SELECT count(*) FROM ds_attempts WHERE run_id = 'replay'"),
	'1', 'replay: one attempt');

# ---- rollback of the caller's transaction --------------------------------------------------------
$coord->safe_psql('postgres',
	"BEGIN; SELECT ds_run_step('rollback', 'debit', " . debit_sql(2) . '); ROLLBACK;');
is(balance(2), '100', 'rollback: the debit rolled back with the caller');
is($coord->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = 'rollback'"),
	'0', 'rollback: and its record');
is($coord->safe_psql('postgres',
		"SELECT status FROM ds_run_step('rollback', 'debit', " . debit_sql(2) . ')'),
	'succeeded', 'rollback: the step runs again');
is(balance(2), '90', 'rollback: and debits once');

# ---- the step context, evaluated on the coordinator -------------------------------------------------
# A shard's node has no durable_steps and runs no step: a context function sent there would fail
# the statement, and a value computed there could not be the step's.
$coord->safe_psql('postgres', q{INSERT INTO keys VALUES (5, 'update', 'none'), (6, 'delete', 'context:delete:1'), (7, 'delete', 'context:delete:2')});
my %forms = (
	'values' => q{INSERT INTO keys VALUES (3, 'values', ds_attempt_key())},
	'select' => q{INSERT INTO keys SELECT id, 'select', ds_attempt_key() FROM accounts WHERE id = 3},
	'select-all' => q{INSERT INTO keys SELECT id, 'select-all', ds_attempt_key() FROM accounts},
	'update' => q{UPDATE keys SET k = ds_attempt_key() || '/' || ds_attempt_number() || '/'
	                 || ds_max_attempts() || '/' || ds_run_id() || '/' || ds_step_id()
	               WHERE id = 5 AND form = 'update'},
	'update-all' => q{UPDATE keys SET k = k || '+' || ds_attempt_key() WHERE form = 'select-all'},
	'delete' => q{DELETE FROM keys WHERE form = 'delete' AND k = ds_attempt_key()});
for my $form ('values', 'select', 'select-all', 'update', 'update-all', 'delete')
{
	(my $sql = $forms{$form}) =~ s/'/''/g;
	is($coord->safe_psql('postgres', "SELECT status FROM ds_run_step('context', '$form', '$sql')"),
		'succeeded', "context: the step of form $form succeeded");
}
my %key = map {
	$_ => $coord->safe_psql('postgres',
		"SELECT attempt_key FROM ds_attempts WHERE run_id = 'context' AND step_id = '$_'")
} keys %forms;
is($coord->safe_psql('postgres', q{SELECT k FROM keys WHERE form = 'values'}),
	$key{values}, 'context: INSERT ... VALUES wrote the attempt key of its step');
is($coord->safe_psql('postgres', q{SELECT k FROM keys WHERE form = 'select'}),
	$key{select}, 'context: INSERT ... SELECT (one shard) wrote the attempt key of its step');
is($coord->safe_psql('postgres', q{SELECT k FROM keys WHERE id = 5 AND form = 'update'}),
	"$key{update}/1/5/context/update",
	'context: UPDATE (one shard) wrote the attempt key, number and limit, the run and the step');
is($coord->safe_psql('postgres',
		q{SELECT count(*) || ' ' || count(DISTINCT k) || ' ' || min(k) FROM keys WHERE form = 'select-all'}),
	"8 1 $key{'select-all'}+$key{'update-all'}",
	'context: INSERT ... SELECT and UPDATE over every shard wrote the keys of their steps');

is($coord->safe_psql('postgres', q{SELECT string_agg(k, ',') FROM keys WHERE form = 'delete'}),
	'context:delete:2', 'context: DELETE (every shard) compared with the attempt key of its step');

# Not evaluated on the coordinator: an expression in the target list of a SELECT over a
# distributed table, which Citus sends to the shards' nodes; there the function does not exist,
# and the step fails rather than see a value that is not its own. A MATERIALIZED CTE is
# evaluated on the coordinator and its rows sent to the shards' nodes.
is($coord->safe_psql('postgres', q{SELECT status || ' ' || error_code FROM ds_run_step('context', 'select-only',
  'SELECT id, ds_attempt_key() FROM accounts', policy => ds_retry_policy(max_attempts => 1))}),
	'failed 42883', 'context: a SELECT over a distributed table sends its target list to the shards\' nodes');
(my $cte = q{WITH c AS MATERIALIZED (SELECT ds_attempt_key() AS k)
  INSERT INTO keys SELECT a.id, 'cte', c.k FROM accounts a, c WHERE a.id = 6}) =~ s/'/''/g;
is($coord->safe_psql('postgres', "SELECT status FROM ds_run_step('context', 'cte', '$cte')"),
	'succeeded', 'context: the step with a MATERIALIZED CTE succeeded');
is($coord->safe_psql('postgres', q{SELECT k FROM keys WHERE form = 'cte'}),
	$coord->safe_psql('postgres', "SELECT attempt_key FROM ds_attempts WHERE run_id = 'context' AND step_id = 'cte'"),
	'context: the MATERIALIZED CTE was evaluated on the coordinator');

# ---- a worker node's outage: the executor retries ------------------------------------------------
my $down = worker_of(7);
$down->stop('fast');
is($coord->safe_psql('postgres',
		"SELECT status FROM ds_run_step('outage', 'debit', " . debit_sql(7)
		  . q{, defer => true, policy => ds_retry_policy(max_attempts => 100, initial_delay => '100 ms', max_delay => '300 ms'))}),
	'pending', 'outage: a deferred debit of an account on the stopped worker node');
ok(poll_until($coord, 'postgres',
		"SELECT count(*) >= 2 FROM ds_attempts WHERE run_id = 'outage' AND error_code IS NOT NULL"),
	'outage: the executor tried and failed while the node was down');
is($coord->safe_psql('postgres', "SELECT status FROM ds_steps WHERE run_id = 'outage'"),
	'retrying', 'outage: the step waits for its next attempt');
$down->start;
ok(poll_until($coord, 'postgres', "SELECT status = 'succeeded' FROM ds_steps WHERE run_id = 'outage'"),
	'outage: the step succeeded once the node was back');
is(balance(7), '90', 'outage: one debit');

# ---- a worker node lost before the caller commits --------------------------------------------------
# The step succeeded, its debit is in the worker node's open transaction; the node goes away; the
# caller's COMMIT fails, with the step's record and its effect.
{
	my $s = DurableSteps::Session->new($coord, 'lost_node');
	my $lost = worker_of(8);
	is($s->query_ok("BEGIN; SELECT status FROM ds_run_step('lost', 'debit', " . debit_sql(8) . ');'),
		'succeeded', 'lost node: the step succeeded in the open transaction');
	$lost->stop('immediate');
	my ($out, $err) = $s->query('COMMIT;');
	like($err, qr/ERROR/, 'lost node: the caller\'s COMMIT fails');
	$s->quit;
	# with the node still down, a step that writes it fails in its subtransaction; the caller goes on
	is($coord->safe_psql('postgres', "BEGIN; SELECT status FROM ds_run_step('down', 'debit', "
			  . debit_sql(8) . q{, policy => ds_retry_policy(max_attempts => 1)); }
			  . "SELECT 'the caller goes on'; COMMIT;"),
		"failed\nthe caller goes on", 'node down: the step failed, its caller committed');
	is($coord->safe_psql('postgres',
			"SELECT error_class || ' ' || left(error_code, 2) FROM ds_steps WHERE run_id = 'down'"),
		'exhausted 08', 'node down: a connection failure (SQLSTATE class 08), recorded');
	$lost->start;
	$coord->safe_psql('postgres', 'SELECT recover_prepared_transactions()');
	is(balance(8), '100', 'lost node: the debit did not happen');
	is($coord->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = 'lost'"),
		'0', 'lost node: nor was the step recorded');
	is($coord->safe_psql('postgres', "SELECT status FROM ds_run_step('lost', 'debit', " . debit_sql(8) . ')'),
		'succeeded', 'lost node: the caller\'s retry runs the step');
	is(balance(8), '90', 'lost node: once');
}

# ---- a coordinator crash in the commit window ------------------------------------------------------
# The caller's COMMIT is held after Citus's PRE_COMMIT (the worker node's transaction prepared,
# or committed in one phase) and before the coordinator's commit record; the backend is killed.
sub crash_in_commit_window
{
	my ($run, $id, $two_phase) = @_;
	my $w = worker_of($id);
	my $s = DurableSteps::Session->new($coord, "window_$run");
	$s->query_ok("SET durable_steps.citus_two_phase_commit = $two_phase;");
	$s->query_ok('CREATE TEMP TABLE gate (x int) ON COMMIT DELETE ROWS;');
	my $schema = $s->query_ok('SELECT pg_my_temp_schema()::regnamespace;');
	my $pid = $s->query_ok('SELECT pg_backend_pid();');
	my $holder = DurableSteps::Session->new($coord, "gate_$run");
	$holder->query_ok("BEGIN; LOCK TABLE $schema.gate IN ACCESS SHARE MODE;");
	$s->query_ok("BEGIN; SELECT ds_run_step('$run', 'debit', " . debit_sql($id)
		  . '); INSERT INTO gate VALUES (1);');
	$s->send('COMMIT;');
	ok(poll_until($coord, 'postgres',
			"SELECT count(*) > 0 FROM pg_locks WHERE pid = $pid AND NOT granted"),
		"$run: the caller's COMMIT waits in the window");
	my $prepared = $w->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts');
	my $on_worker = $w->safe_psql('postgres',
		"SELECT balance FROM accounts_" . $coord->safe_psql('postgres',
			"SELECT get_shard_id_for_distribution_column('accounts', $id)") . " WHERE id = $id");
	kill 'KILL', $pid;
	$s->abandon;
	$holder->abandon;
	# (poll_until: a psql that finds the server still in recovery is replaced, never written to)
	poll_until($coord, 'postgres', 'SELECT true') or die "$run: the coordinator did not come back";
	return ($prepared, $on_worker);
}

my ($prepared, $on_worker) = crash_in_commit_window('window', 3, 'on');
is($prepared, '1', 'window: the worker node\'s transaction was prepared when the coordinator crashed');
is($on_worker, '100', 'window: and not committed');
is($coord->safe_psql('postgres', 'SELECT recover_prepared_transactions()'),
	'1', 'window: Citus\'s recovery ended the prepared transaction');
is(worker_of(3)->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'0', 'window: none is left prepared');
is(balance(3), '100', 'window: rolled back, with the coordinator\'s transaction');
is($coord->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = 'window'"),
	'0', 'window: the step was not recorded');
is($coord->safe_psql('postgres', "SELECT status FROM ds_run_step('window', 'debit', " . debit_sql(3) . ')'),
	'succeeded', 'window: the caller\'s retry runs the step');
is(balance(3), '90', 'window: the step\'s effect happened once');

# The control: without the request, Citus commits the worker node's transaction in one phase
# before the coordinator's commit record, and the crash loses the record but not the effect.
($prepared, $on_worker) = crash_in_commit_window('control', 4, 'off');
is($prepared, '0', 'control: nothing was prepared');
is($on_worker, '90', 'control: the debit was already committed on the worker node');
$coord->safe_psql('postgres', 'SELECT recover_prepared_transactions()');
is($coord->safe_psql('postgres', "SELECT count(*) FROM ds_steps WHERE run_id = 'control'"),
	'0', 'control: the step was not recorded');
$coord->safe_psql('postgres', "SELECT ds_run_step('control', 'debit', " . debit_sql(4) . ')');
is(balance(4), '80', 'control: without two-phase commit the retry debits again');

$coord->stop;
$_->stop for @workers;
done_testing();
