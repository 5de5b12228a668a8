# A failover under load with the real pg_auto_failover (docs/failover.md): a monitor, a primary
# and a synchronous standby made and run by pg_autoctl on 127.0.0.1, durable_steps preloaded on
# the data nodes. Two clients create SQL steps (with effects in an application table) and HTTP
# steps (against test/fake_provider.py) through the multi-host connection string that
# `pg_autoctl show uri` gives (target_session_attrs=read-write), retrying every batch that got no
# answer. The primary's pg_autoctl, its postmaster and every process of it are killed with
# SIGKILL under that load; pg_auto_failover promotes the standby, holding it read-only until the
# old primary's demotion times out. Then:
#   - every step the clients created is on the new primary, and succeeded exactly once: the
#     application table has one row per SQL step, none twice;
#   - every HTTP step charged once at the provider, and every request of it carried its one
#     idempotency key;
#   - the kill caught attempts in flight (slow steps, slowly answered requests): the new primary
#     recorded them lost (DS007) and ran them again, the requests with the same key;
#   - the new primary's executors and HTTP worker waited through the read-only phase: one log
#     line each that they wait, none failed or was restarted, and they ran what was due within
#     two seconds of the server accepting writes.
# Runs on PostgreSQL 15 only (Debian's postgresql-15-auto-failover); skipped elsewhere or when
# pg_autoctl is missing. pg_auto_failover's timings are shortened (monitor GUCs) so that the
# failover takes seconds, not a minute; every wait polls and is bounded.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $bindir = `pg_config --bindir`;
chomp $bindir;
my ($major) = `pg_config --version` =~ /PostgreSQL (\d+)/;
plan skip_all => "pg_auto_failover is tested with Debian's postgresql-15-auto-failover; this is PostgreSQL $major"
  unless defined $major && $major == 15;
my ($autoctl) = grep { -x $_ } map { "$_/pg_autoctl" } split /:/, $ENV{PATH};
plan skip_all => 'pg_autoctl is not installed (Debian package postgresql-15-auto-failover)'
  unless defined $autoctl;
plan skip_all => "pg_auto_failover's monitor extension is not installed in $bindir"
  unless -e `pg_config --sharedir` =~ s/\s+\z//r . '/extension/pgautofailover.control';

# Bounds: the whole failover (kill to writable), and each other wait.
my $FAILOVER_BOUND = 120;
my $WAIT = $PostgreSQL::Test::Utils::timeout_default;

my $dir = PostgreSQL::Test::Utils::tempdir_short();
my $sock = $dir;
# pg_autoctl keeps its state and configuration under these
$ENV{HOME} = "$dir/home";
$ENV{XDG_CONFIG_HOME} = "$dir/config";
$ENV{XDG_DATA_HOME} = "$dir/data";
$ENV{XDG_RUNTIME_DIR} = "$dir/run";
mkdir $_ for @ENV{qw(HOME XDG_CONFIG_HOME XDG_DATA_HOME XDG_RUNTIME_DIR)};
$ENV{PGHOST} = $sock;
delete $ENV{$_} for qw(PGPORT PGDATABASE PGUSER PGDATA PGSERVICE);

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(mon n1 n2);
my %pgdata = map { $_ => "$dir/$_" } qw(mon n1 n2);
my %keeper;    # name -> IPC::Run harness of `pg_autoctl run`

# psql on one of the nodes through its socket; returns (rc, stdout, stderr).
sub psql_on
{
	my ($name, $db, $sql, $user) = @_;
	my ($out, $err) = ('', '');
	my $rc = IPC::Run::run(
		[
			"$bindir/psql", '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
			'-h', $sock, '-p', $port{$name}, '-U', $user // 'postgres', '-d', $db, '-c', $sql
		],
		'>', \$out, '2>', \$err,
		IPC::Run::timeout(60));
	chomp $out;
	return ($rc ? 0 : 1, $out, $err);
}

sub psql_ok
{
	my ($name, $db, $sql, $user) = @_;
	my ($rc, $out, $err) = psql_on($name, $db, $sql, $user);
	die "psql on $name failed: $err\n$sql\n" if $rc;
	return $out;
}

# Polls $sql on $name until it returns $want (default 't'), at most $bound seconds.
sub poll_on
{
	my ($name, $db, $sql, $want, $bound) = @_;
	$want //= 't';
	my $deadline = time() + ($bound // $WAIT);
	my ($rc, $out, $err) = (0, '', '');
	while (time() < $deadline)
	{
		($rc, $out, $err) = psql_on($name, $db, $sql);
		return 1 if !$rc && $out eq $want;
		usleep(200_000);
	}
	diag "timed out polling $name: $sql\nexpecting: $want\nlast: $out\nstderr: $err";
	return 0;
}

# Runs a pg_autoctl command to its end; dies with its output when it fails.
sub autoctl
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $autoctl, @args ], '>', \$out, '2>', \$err, IPC::Run::timeout(180))
	  or die "pg_autoctl @args failed:\n$out$err\n";
	return $out;
}

# Starts `pg_autoctl run` for node $name in the background (its output in $dir/$name.run.log).
sub keeper_start
{
	my ($name) = @_;
	$keeper{$name} = IPC::Run::start([ $autoctl, 'run', '--pgdata', $pgdata{$name} ],
		'<', \undef, '>', "$dir/$name.run.log", '2>&1');
}

# initdb with our settings: pg_autoctl uses an existing data directory as it is, and its own
# settings (postgresql-auto-failover.conf) are included before these, which win.
sub init_data
{
	my ($name, $conf) = @_;
	PostgreSQL::Test::Utils::system_or_bail("$bindir/initdb", '-D', $pgdata{$name}, '-A', 'trust',
		'-U', 'postgres', '--no-sync');
	open my $fh, '>>', "$pgdata{$name}/postgresql.conf" or die;
	# no port: pg_autoctl sets it (--pgport), and the standby's copy of this file must not name
	# the primary's
	print $fh qq{
unix_socket_directories = '$sock'
listen_addresses = '127.0.0.1'
shared_buffers = '32MB'
max_connections = 40
fsync = off
log_line_prefix = '%m [%p] %b '
$conf};
	close $fh;
}

END
{
	# stop what this test started, whatever happened: the keepers stop their Postgres
	local $?;
	for my $name (qw(n2 n1 mon))
	{
		next unless $keeper{$name};
		IPC::Run::run([ $autoctl, 'stop', '--pgdata', $pgdata{$name}, '--immediate' ],
			'>', '/dev/null', '2>', '/dev/null', IPC::Run::timeout(60));
		eval { $keeper{$name}->kill_kill(grace => 5); };
		IPC::Run::run([ "$bindir/pg_ctl", '-D', $pgdata{$name}, '-m', 'immediate', 'stop' ],
			'>', '/dev/null', '2>', '/dev/null') if -e "$pgdata{$name}/postmaster.pid";
	}
}

# ---- the formation: a monitor, a primary, a synchronous standby --------------------------------
my $t_setup = time();
init_data('mon', '');
autoctl('create', 'monitor', '--pgdata', $pgdata{mon}, '--pgport', $port{mon}, '--hostname',
	'127.0.0.1', '--auth', 'trust', '--no-ssl', '--pgctl', "$bindir/pg_ctl");
keeper_start('mon');
ok(poll_on('mon', 'pg_auto_failover', 'SELECT true'), 'the monitor runs');
# the monitor's timings, shortened: a node is failed after ~3 s without health, and a primary
# that cannot be reached has 5 s to demote before its standby opens for writes
psql_ok('mon', 'pg_auto_failover', $_) for (
	'ALTER SYSTEM SET pgautofailover.health_check_period = 1000',
	'ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000',
	'ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1',
	'ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500',
	'ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000',
	'ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 5000',
	'SELECT pg_reload_conf()');
my $monitor_uri = "postgres://autoctl_node\@127.0.0.1:$port{mon}/pg_auto_failover?sslmode=disable";

my $ds_conf = q{
shared_preload_libraries = 'pg_stat_statements,durable_steps'
durable_steps.database = 'postgres'
durable_steps.max_workers = 2
durable_steps.max_extra_workers = 0
durable_steps.poll_interval = '200ms'
};
init_data('n1', $ds_conf);
for my $name (qw(n1 n2))
{
	autoctl('create', 'postgres', '--pgdata', $pgdata{$name}, '--pgport', $port{$name},
		'--pghost', $sock, '--hostname', '127.0.0.1', '--name', $name, '--monitor', $monitor_uri,
		'--auth', 'trust', '--no-ssl', '--pgctl', "$bindir/pg_ctl");
	keeper_start($name);
	# the standby is made from the primary (pg_basebackup: our settings come along)
	ok( poll_on('mon', 'pg_auto_failover',
			"SELECT reportedstate::text FROM pgautofailover.node WHERE nodename = '$name'",
			$name eq 'n1' ? 'single' : 'secondary'),
		"$name joined the formation");
}
ok(poll_on('mon', 'pg_auto_failover',
		"SELECT string_agg(nodename || ':' || reportedstate || '/' || goalstate, ',' ORDER BY nodename) FROM pgautofailover.node",
		'n1:primary/primary,n2:secondary/secondary'),
	'n1 is the primary, n2 its standby');
ok(poll_on('n1', 'postgres', "SELECT string_agg(sync_state, ',') FROM pg_stat_replication", 'quorum'),
	'the standby is synchronous (a quorum of one)');
is(psql_ok('n2', 'postgres', 'SHOW shared_preload_libraries'), 'pg_stat_statements,durable_steps',
	'durable_steps is preloaded on the standby too');
my $uri = autoctl('show', 'uri', '--pgdata', $pgdata{mon}, '--formation', 'default');
chomp $uri;
like($uri, qr{^postgres://127\.0\.0\.1:$port{n1},127\.0\.0\.1:$port{n2}/postgres\?target_session_attrs=read-write},
	'pg_autoctl show uri: both nodes, target_session_attrs=read-write');
my $setup_secs = time() - $t_setup;

# ---- the application ---------------------------------------------------------------------------
my $p = DurableSteps::Http::Provider->start;
psql_ok('n1', 'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app LOGIN IN ROLE durable_steps_http;
CREATE TABLE effects (k text NOT NULL);
GRANT INSERT, SELECT ON effects TO app;
});
ok(poll_on('n1', 'postgres',
		"SELECT count(*) = 3 FROM pg_stat_activity WHERE backend_type IN ('durable_steps worker', 'durable_steps http')"),
	'the primary runs two executors and the HTTP worker');

# Batch files: each one transaction of 8 SQL steps due at once (the first one slow), one due in
# 4 s (due during the failover when it comes just before it) and 2 HTTP steps (the first one
# answered slowly); a short sleep keeps it open a moment, so that the kill finds some batches in
# flight.
my ($CLIENTS, $BATCHES, $SQL_STEPS, $HTTP_STEPS) = (2, 40, 9, 2);
for my $b (1 .. $CLIENTS * $BATCHES)
{
	my $sql = "BEGIN;\n";
	for my $i (1 .. $SQL_STEPS)
	{
		my $run_at = $i == $SQL_STEPS ? ", run_at => now() + interval '4 s'" : ', defer => true';
		my $effect = "INSERT INTO effects VALUES ('b$b/s$i')";
		# step 1 of each batch takes half a second: the kill finds attempts in flight
		$effect = "WITH e AS ($effect RETURNING 1) SELECT pg_sleep(0.5) FROM e" if $i == 1;
		$sql .= "SELECT replayed FROM ds_run_step('b$b', 's$i', \$\$$effect\$\$$run_at);\n";
	}
	for my $i (1 .. $HTTP_STEPS)
	{
		# the provider charges request 1 of each batch, then waits a second before it answers
		my $url = $i == 1 ? $p->url("b$b-h$i", 'fault=delay&secs=1') : $p->url("b$b-h$i");
		$sql .= "SELECT replayed FROM ds_http_step('b$b', 'h$i', '{\"method\": \"POST\", \"url\": \"$url\"}');\n";
	}
	$sql .= "SELECT pg_sleep(0.05);\nCOMMIT;\n";
	open my $fh, '>', "$dir/batch$b.sql" or die;
	print $fh $sql;
	close $fh;
}
# A client: its batches one after the other, each through a new connection with the formation's
# URI, retried until it is answered (at most 600 tries, 0.2 s apart or more).
open my $cfh, '>', "$dir/client.sh" or die;
print $cfh <<'EOS';
#!/bin/bash
# client.sh URI DIR FIRST LAST PSQL
uri=$1 dir=$2 first=$3 last=$4 psql=$5
for ((b = first; b <= last; b++)); do
    tries=0
    until PGCONNECT_TIMEOUT=2 "$psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$uri" -f "$dir/batch$b.sql" \
            >"$dir/out$b" 2>"$dir/err$b"; do
        tries=$((tries + 1))
        echo "batch $b: no answer (try $tries): $(head -c 200 "$dir/err$b" | tr '\n' ' ')" >>"$dir/client$first.log"
        [ $tries -ge 600 ] && exit 1
        sleep 0.2
    done
    echo "batch $b answered after $tries retries, replayed: $(grep -c '^t$' "$dir/out$b")" >>"$dir/client$first.log"
done
EOS
close $cfh;
$ENV{PGUSER} = 'app';
my @clients;
for my $c (0 .. $CLIENTS - 1)
{
	my ($first, $last) = ($c * $BATCHES + 1, ($c + 1) * $BATCHES);
	push @clients,
	  IPC::Run::start([ 'bash', "$dir/client.sh", $uri, $dir, $first, $last, "$bindir/psql" ],
		'<', \undef, '>', '/dev/null', '2>', "$dir/client$first.stderr");
}
delete $ENV{PGUSER};

# ---- the kill ----------------------------------------------------------------------------------
# under load: once a third of the batches were answered and the executors have work in hand
ok(poll_on('n1', 'postgres', "SELECT count(DISTINCT run_id) >= " . int($CLIENTS * $BATCHES / 3)
		  . " AND count(*) FILTER (WHERE status = 'running') > 0 FROM durable_steps.steps", 't', 60),
	'load: a third of the batches are in, and attempts are running');
my $n2_log_from = n2_log_size();
my @pids = descendants($keeper{n1}->{KIDS}[0]{PID});
my $postmaster = (split /\n/, PostgreSQL::Test::Utils::slurp_file("$pgdata{n1}/postmaster.pid"))[0];
ok((grep { $_ == $postmaster } @pids), "the primary's postmaster is one of its pg_autoctl's processes");
my $t_kill = time();
kill 'KILL', @pids;
note 'killed ' . scalar(@pids) . " processes of n1 (pg_autoctl, postmaster $postmaster and its children)";
ok(poll_gone(@pids), 'every process of the primary is gone');

# pg_auto_failover promotes the standby; it accepts writes once the old primary's demotion timed out
ok( poll_on('mon', 'pg_auto_failover',
		"SELECT reportedstate::text IN ('wait_primary', 'primary') FROM pgautofailover.node WHERE nodename = 'n2'",
		't', $FAILOVER_BOUND),
	'pg_auto_failover promoted the standby');
ok(poll_on('n2', 'postgres', 'SHOW default_transaction_read_only', 'off', 30), 'the new primary accepts writes');
my $failover_secs = time() - $t_kill;
note sprintf('failover: %.1f s from the kill to a writable new primary', $failover_secs);

# ---- after the failover ------------------------------------------------------------------------
my @answered = map { $_->finish ? 'answered' : 'gave up' } @clients;
is(join(',', @answered), join(',', ('answered') x $CLIENTS), 'every client got an answer for every batch');
my $retried = () = PostgreSQL::Test::Utils::slurp_file("$dir/client1.log") =~ /no answer/g;
$retried += () = PostgreSQL::Test::Utils::slurp_file("$dir/client" . ($BATCHES + 1) . '.log') =~ /no answer/g;
ok($retried > 0, "the clients retried batches that got no answer ($retried tries)");

my $total_sql = $CLIENTS * $BATCHES * $SQL_STEPS;
my $total_http = $CLIENTS * $BATCHES * $HTTP_STEPS;
ok(poll_on('n2', 'postgres', q{SELECT count(*) FILTER (WHERE status IN ('pending', 'running', 'retrying')) = 0
 FROM durable_steps.steps}, 't', $WAIT),
	'everything due ran after the failover');
is(psql_ok('n2', 'postgres', "SELECT status || ':' || count(*) FROM ds_steps GROUP BY status", 'app'),
	'succeeded:' . ($total_sql + $total_http), 'every step the clients created succeeded, none lost');
is(psql_ok('n2', 'postgres', q{SELECT count(*) || ',' || count(DISTINCT k) FROM effects}),
	"$total_sql,$total_sql", 'the application effects: one per SQL step, none twice');
is(psql_ok('n2', 'postgres', q{SELECT count(*) FROM ds_steps s
 WHERE s.step_id LIKE 's%' AND NOT EXISTS (SELECT FROM effects e WHERE e.k = s.run_id || '/' || s.step_id)}, 'app'),
	'0', 'every succeeded SQL step has its effect');

my $counts = $p->counts;
my (@not_once, @keys_wrong, $resent);
for my $b (1 .. $CLIENTS * $BATCHES)
{
	for my $i (1 .. $HTTP_STEPS)
	{
		my $tag = "b$b-h$i";
		push @not_once, "$tag:" . ($counts->{charges}{$tag} // 0) if ($counts->{charges}{$tag} // 0) != 1;
		my @keys = @{ $counts->{keys}{$tag} // [] };
		my %distinct = map { ($_ // '-') => 1 } @keys;
		push @keys_wrong, "$tag:" . join('|', keys %distinct)
		  if grep({ !defined $_ } @keys) || keys %distinct != 1;
		$resent++ if @keys > 1;
	}
}
is(join(',', @not_once), '', 'every HTTP step charged exactly once at the provider');
is(join(',', @keys_wrong), '', 'every request of an HTTP step carried its one idempotency key');
my $lost = psql_ok('n2', 'postgres', q{SELECT count(*) FROM durable_steps.attempts WHERE error_code = 'DS007'});
# what the checks above are about: attempts the kill caught in flight, recorded lost on the new
# primary and run again there (HTTP requests sent again)
ok($lost > 0, "the kill caught attempts in flight: $lost recorded lost (DS007) and retried, "
	  . ($resent // 0) . ' HTTP requests sent again');

# the new primary's workers through the read-only phase
my $log = n2_log_since($n2_log_from);
my $waits = qr/\[(\d+)\] durable_steps (?:worker|http) LOG:  durable_steps: the server is read-only \(default_transaction_read_only\); waiting/;
my @waiters = $log =~ /$waits/g;
my %waiter = map { $_ => 1 } @waiters;
ok(@waiters >= 1, 'the new primary\'s workers saw the read-only phase (' . scalar(@waiters) . ' said they wait)');
is(scalar(@waiters), scalar(keys %waiter), 'each said it once');
is(count_matches($log, qr/durable_steps: worker \d+ started/), 2, 'two executors started on the new primary, no more');
is(count_matches($log, qr/durable_steps: HTTP worker started/), 1, 'one HTTP worker started on the new primary, no more');
is(join("\n", $log =~ /^.*durable_steps (?:worker|http|launcher) (?:ERROR|FATAL).*$/mg), '',
	'no worker process failed on the new primary');
unlike($log, qr/background worker "durable_steps[^"]*" \(PID \d+\) exited with exit code [1-9]/,
	'no worker process exited with an error');
my ($off_at) = $log =~ /^(\S+ \S+) UTC \[\d+\] postmaster LOG:  parameter "default_transaction_read_only" changed to "off"/m;
my ($resumed_at) = $log =~ /^(\S+ \S+) UTC \[\d+\] durable_steps worker LOG:  durable_steps: the server accepts writes again/m;
ok(defined $off_at && defined $resumed_at, 'the read-only phase ended and the executors said so');
ok(defined $off_at && defined $resumed_at && seconds_of($resumed_at) - seconds_of($off_at) < 2,
	"the executors resumed within 2 s of the server accepting writes ($off_at -> " . ($resumed_at // '-') . ')');
note sprintf('test 088: formation %.0f s, failover %.1f s, whole test %.0f s', $setup_secs, $failover_secs,
	time() - $t_setup);

done_testing();

# The pids of $pid and of all its descendants.
sub descendants
{
	my ($pid) = @_;
	my %children;
	for (split /\n/, `ps -e -o pid=,ppid=`)
	{
		my ($c, $pp) = /(\d+)\s+(\d+)/ or next;
		push @{ $children{$pp} }, $c;
	}
	my @all = ($pid);
	for (my $i = 0; $i < @all; $i++)
	{
		push @all, @{ $children{ $all[$i] } // [] };
	}
	return @all;
}

sub poll_gone
{
	my (@pids) = @_;
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		# reap our own child (pg_autoctl run) so that it is not a zombie
		eval { $keeper{n1}->pump_nb if $keeper{n1}; };
		return 1 unless grep { kill(0, $_) && !zombie($_) } @pids;
		usleep(100_000);
	}
	return 0;
}

sub zombie
{
	my ($pid) = @_;
	my $stat = eval { PostgreSQL::Test::Utils::slurp_file("/proc/$pid/stat") } // '';
	return $stat =~ /^\d+ \(.*\) Z /;
}

# n2's server log (pg_autoctl turns logging_collector on: files in $PGDATA/log), all files in order
sub n2_log
{
	return join('', map { PostgreSQL::Test::Utils::slurp_file($_) } sort glob("$pgdata{n2}/log/*.log"));
}
sub n2_log_size { return length(n2_log()); }
sub n2_log_since { return substr(n2_log(), $_[0]); }

sub seconds_of
{
	my ($ts) = @_;
	my ($h, $m, $s) = $ts =~ /(\d+):(\d+):([\d.]+)$/;
	return $h * 3600 + $m * 60 + $s;
}
