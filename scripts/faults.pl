#!/usr/bin/perl
# scripts/faults.pl -- the trials of scripts/faults (run that wrapper: it builds and installs the
# extension and hands this script a work directory owned by the user that runs PostgreSQL).
#
# One throwaway cluster (unix socket only, in --workdir; clients reach it through a link that a
# failover moves) with durable_steps preloaded and two executors. Each trial creates --steps steps from several concurrent client sessions (two
# owning roles), each step's body scripted to write one ledger row and then succeed or fail on
# chosen attempt numbers; duplicate calls of the same identity race each other and the worker.
# While the clients run and the worker drains the steps, faults are injected at random: kill -9
# of an executor, immediate stop and start, fast restart, pg_terminate_backend and
# pg_cancel_backend of an executor, reloads that change batch_size and poll_interval, and fences
# of a partition. When no step is pending, retrying or running any more (polled, with a bound),
# the invariants are checked against ds_steps, ds_attempts and the ledger; every violation is
# printed with its rows.
#
# Partitions: the cluster has durable_steps.partition_count = 2 and owns both ('0,1'). The fault
# `fence` (fence) fences one partition p (ALTER SYSTEM SET durable_steps.partitions to the other,
# a reload), holds it 0.5-2 s (0.5-1 s in --short) and opens it again; clients make a call
# refused with DS201 again later, as after a lost connection, and the trial's line counts those
# refusals. The fencing session polls ds_partition_workers_behind() every 20 ms: from its first
# empty answer to the reopen's ALTER SYSTEM (server clock_timestamp()s) every worker process had
# taken the fence, and no worker attempt of p may have been claimed then (fenced run; a batch
# claimed before the fence finishes after it, its claimed_at before the window). Each poll first
# puts the session's partitions in force for every process (ds_partitions_in_force_publish(), as
# ds_partition_export does), so that from the window's start every transaction that begins is
# refused p, whatever settings its session began with. Every partition is opened again at a
# trial's start, after a failover and before the trial settles.
#
# The procedure (proc_main): one more session, of one role, stores --short 48 (else 120) plain SQL
# steps, scripted like the others, through CALL fh_proc(steps), a procedure that loops: ds_run_step
# (attempt 1 runs there as the caller and writes its ledger row, unless deferred) and a row in
# fh_proc_log with the answer, now() (the transaction's start) and the step's created_at; COMMIT;
# a pause of 30-150 ms in a transaction of its own; COMMIT. The steps' runs alternate between the
# two partitions. A backend reads the configuration file only between client statements, so a
# CALL keeps the partitions its session began with across every fence meanwhile: its next step of
# the fenced partition must be refused (DS201), which ends the CALL. The session counts those
# among the fenced refusals, pauses, and CALLs again with the steps fh_proc_log does not show
# committed (the procedure passes over those that are), as it does after a lost connection (kill
# -9, stops, restarts, the failover). The steps get every check of the plain steps, and: no step
# of a fenced partition was created by a caller in a fence window (fenced write) -- exact, by the
# transaction's start: ds_run_step checks the partition before it makes the step, whose
# created_at is the clock then (not the transaction's start); a transaction begun at or after
# the window's start (fh_proc_log.xact_at, or for any caller's step whose attempt 1 committed its
# ledger row, fh_ledger.xact_at) that created the step before the window's end was checked in the
# window. One begun before may pass the check before the window and commit inside it.
#
# A share of each trial's steps are HTTP steps (ds_http_step, sent by the HTTP worker) against
# test/fake_provider.py, started here on 127.0.0.1 (a free port) and stopped at the end: a POST
# that charges its tag, with provider faults (500 or 503 before charging, 429 with Retry-After,
# a delay past the step's timeout after charging, a dropped connection after charging), most with
# the step's idempotency key and some without (a repeat is then unsafe: uncertain). The HTTP
# worker is among the processes the faults kill, terminate and cancel. After each trial the
# provider's ledger (GET /counts) is checked too: at most one charge per step, exactly one for a
# succeeded step whose stored response is that charge's, uncertain steps never sent again.
#
# Each trial also starts --runs runs of the workflow fh_workflow (check_run): scripted ds_step
# calls whose failures the workflow catches or not, a ds_sleep, an event wait answered by
# ds_emit_event from a client session (before or after the wait), some runs cancelled with
# ds_cancel_run at a random moment. Each run must end as its script says (its output exactly what
# its steps returned), its steps in workflow order, nothing of a cancelled run after the cancel.
#
# A hostile role, fh_hog (the rights of the other two), floods every trial (hog_main): from the
# clients' start until the other roles' steps have settled it keeps 3 (--short; else 4) slow SQL
# steps unfinished -- deferred, at priority 0 (the best a role may ask; a negative one must be
# refused, 42501), bodies sleeping 0.6-1.2 s (else 1-2.5 s), in queues of its own naming, in
# default and in fh_serial (concurrency 1, shared with the others) -- and 4 (else 5) HTTP steps
# that the provider charges and answers 1.2-2 s (else 2-4 s) late, within their timeout: more
# than durable_steps.http_max_inflight_per_role (3 here; http_max_inflight 8). A sampler reads
# every 100 ms how many steps of each role an HTTP worker holds (running, claimed_by that live
# process, no kept outcome: requests in flight, and finished ones it records with its next
# claim in one transaction). Checks: the other roles' steps settle within the settle timeout
# while the hog still floods (starvation); the hog never holds more than its share, no role
# does, all together no more than http_max_inflight (in flight); the hog's own steps end as
# their scripts say and are checked like every other step (lost, end state, ledger, charges).
#
# Stubborn code: a few steps have a body that, at one attempt, ignores its cancellation in the
# worker ('ig' in fh_body), and a few (pick_stubborn; one at most in a --short trial) an outcome
# hook that does (fh_hook): on_success or on_failure of a deferred SQL step at one attempt, whose
# loss is retried; on_success of an HTTP step, which ends blocked by its lost hook (DS007). Their
# timeout of 1 s bounds the hook too: the executor is ended 5 s past it. Checks: the outcome the
# hook was given did not commit in the worker (its row in fh_hooks neither), the step then ends as
# its script says (stubborn hook, end state); the executor's end charged no other step an attempt
# (batch charged); the summary counts the executors stubborn code ended.
#
# Tasks (make_task, TASK_WORKER): each trial also stores --tasks tasks (--short 6, else 24) with
# ds_task_step from the client sessions, scripted like the SQL steps (succeed; fail retryably once
# or twice, then succeed; fail permanently; block, then re-armed by rearm_main), a fifth of those
# that succeed stored with on_lost => 'uncertain'. Two task workers run them: clients/python's
# Worker, each a python3 child process of ours, as fh_tasker (a member of both owners), with a
# lease of 1.5 s. The handler logs each execution (fh_task_runs, autocommit), then writes the
# attempt's effect with its keys (fh_task_effects) inside ctx.transaction(), so that the effect
# commits with the outcome or not at all. Their faults, in the same rounds as the others: kill -9
# of a task worker (and a new one started), SIGSTOP of one past its lease (SIGCONT later: its late
# outcomes are refused, DS410) and pg_terminate_backend of all its connections; the server's
# restarts, crashes and the failover cut them too. Checks: a succeeded task has exactly one
# effect, of the attempt recorded as completed, with its keys, and a task that did not succeed has
# none (task effect); no attempt number was handed to two executions (task attempt); the attempts
# of a killed or stopped worker were recorded lost, DS007 (lease); an on_lost => 'uncertain' task
# runs nothing after a lost lease and ends uncertain (uncertain task); every task settles, each
# attempt ends as its script says or lost (end state), with the other checks of a step.
#
# Workflows in application code (FLOW, docs/app-workflows.md): the task workers also run the
# workflow fh_appflow, and each trial with tasks starts --flows runs of it (--short 2, else 6) as
# the owners, before the faults. Each run has 2-4 steps run with transaction=True: a step logs its
# execution (fh_flow_log 'run', autocommit), writes its effect (fh_flow_log 'effect') in the step's
# transaction, sleeps 20-900 ms there, and fails retryably at the attempts its script says; half
# the runs sleep (ctx.sleep) after a step. The task workers' faults strike their segments and
# steps as they strike tasks. Checks: every run succeeds, its output the attempt numbers of its
# steps; each step has exactly one effect, of its last attempt, recorded completed, with the
# step's idempotency key; no attempt number was handed to two executions (flow effect, flow
# attempt).
#
# --standby (and trial 2 of --short): the primary has a synchronous streaming standby
# (pg_basebackup -R, synchronous_standby_names, synchronous_commit on), and once in the trial the
# fault `failover` (preferably while an HTTP request without a key is in flight) kills the
# primary's postmaster and every process of it with SIGKILL, promotes the standby (pg_ctl
# promote) and points the clients' socket (a link) and the checks at it; the trial goes on, and
# later trials run, on the promoted server without a standby (a --standby trial makes a new one
# first). Checks, in every trial: what a client saw committed is there (a call's answered status
# and attempt: a finished step is still so, no step is behind an attempt a client saw --
# committed state); no keyed request reached the provider that its step has no recorded attempt
# for (request without attempt: a claim sent before it was replicated; without a key the
# uncertain check holds), no tag was asked for or charged that no step of the trial has (unknown
# charge); and all the usual checks, on the new primary.
#
# Options: --trials N --steps N --runs N --tasks N --flows N --seed S --clients N --short --verbose
#          --standby (every trial) / --no-standby (none; --short: trial 2), --no-hog
#          --tamper: a check of the checks -- after trial 1 settles, corrupt its rows in eleven
#          known ways (see tamper()); the run must then fail with exactly those violations
#          (and committed state too when a client saw the step it marks failed succeed)
#          --workdir DIR --runner USER --bindir DIR (given by scripts/faults)
# Exit status: 0 all invariants held, 1 an invariant was violated, 2 the harness could not run.

use strict;
use warnings;

use FindBin ();
use Getopt::Long qw(GetOptions);
use HTTP::Tiny ();
use IPC::Run ();
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time usleep);

$| = 1;
# a psql that ends early (its connection lost) must not kill us by SIGPIPE while IPC::Run writes
# its stdin: IPC::Run then fails, and run_cmd says so
$SIG{PIPE} = 'IGNORE';

my %opt = (short => 0, verbose => 0);
GetOptions(
	\%opt, 'trials=i', 'steps=i', 'runs=i', 'tasks=i', 'flows=i', 'seed=i', 'clients=i', 'short', 'verbose',
	'tamper', 'workdir=s', 'runner=s', 'bindir=s', 'standby!', 'hog!')
  or die "usage: scripts/faults [--short] [--trials N] [--steps N] [--runs N] [--tasks N] [--flows N] [--seed S] [--clients N] "
  . "[--standby | --no-standby] [--no-hog]\n";
for my $k (qw(workdir runner bindir))
{
	die "faults.pl: --$k is required (run scripts/faults, not this helper)\n" unless $opt{$k};
}

# Sizes and bounds: --short stays well under a minute on a 2-CPU machine.
my %cfg = $opt{short}
  ? (trials => 3, steps => 40, clients => 4, gap_min => 0.15, gap_max => 0.5,
	fault_window => 6, calls_deadline => 40, settle_timeout => 40, http_share => 0.25, runs => 5,
	idem_keys => 6, waited => 4)
  : (trials => 20, steps => 150, clients => 6, gap_min => 0.2, gap_max => 0.9,
	fault_window => 25, calls_deadline => 120, settle_timeout => 120, http_share => 0.25, runs => 20,
	idem_keys => 12, waited => 8);
$cfg{trials}  = $opt{trials}  if defined $opt{trials};
$cfg{runs}    = $opt{runs}    if defined $opt{runs};
# tasks (make_task): how many a trial stores, and the lease, concurrency and number of the
# application workers (clients/python's Worker, task_worker_start) that run them
$cfg{tasks}   = $opt{short} ? 6 : 24;
$cfg{tasks}   = $opt{tasks}   if defined $opt{tasks};
%cfg = (%cfg, task_lease => 1.5, task_workers => 2, task_concurrency => 3);
# runs of the application workflow fh_appflow (FLOW), run by the same task workers
$cfg{flows}   = $cfg{tasks} ? ($opt{short} ? 2 : 6) : 0;
$cfg{flows}   = $opt{flows}   if defined $opt{flows};
$cfg{steps}   = $opt{steps}   if defined $opt{steps};
$cfg{clients} = $opt{clients} if defined $opt{clients};
$cfg{clients} = 2 if $cfg{clients} < 2;
# the hog (hog_main): how many slow SQL steps (bodies sleeping hog_sleep ms) and hanging HTTP steps
# (answered hang s after the charge) it keeps unfinished while it floods
%cfg = (%cfg, $opt{short}
	? (hog_sql => 3, hog_http => 4, hog_sleep => [ 600, 1200 ], hog_hang => [ 1.2, 2 ])
	: (hog_sql => 4, hog_http => 5, hog_sleep => [ 1000, 2500 ], hog_hang => [ 2, 4 ]));
# how long the fault `fence` keeps its partition fenced, in seconds
$cfg{fence_hold} = $opt{short} ? [ 0.5, 1 ] : [ 0.5, 2 ];
# the procedure's client (proc_main): how many steps its CALLs store, and the pause after each
# (ms), so that a CALL spans most of the fault window and the fences in it
$cfg{proc_steps} = $opt{short} ? 48 : 120;
$cfg{proc_pause} = [ 30, 150 ];
$cfg{hog} = defined $opt{hog} ? $opt{hog} : 1;
# Which trials run with a synchronous standby and fail over to it: --standby every one,
# --no-standby none, else trial 2 of --short (the one after it then runs on the promoted server).
sub standby_trial
{
	my ($t) = @_;
	return $opt{standby} ? 1 : 0 if defined $opt{standby};
	return $opt{short} && $t == ($cfg{trials} < 2 ? 1 : 2) ? 1 : 0;
}
my $seed = defined $opt{seed} ? $opt{seed} : (int(time() * 1000) ^ $$) % 1_000_000_000;

my $WORK   = $opt{workdir};
my $RUNNER = $opt{runner};
my $BINDIR = $opt{bindir};
my $CDIR   = "$WORK/cluster";
# The clients' socket directory holds a link, .s.PGSQL.$PORT, to the socket of the server that is
# the primary now: a failover points it at the promoted standby, and every session opened after
# that (clients, checks) reaches the new primary without knowing of the change.
my $SOCK   = "$CDIR/sock";
my $PORT   = 5432;                 # names the link in our private directory only
# The clusters: cluster 0 is initdb's, the others standbys made with pg_basebackup. Each has its
# data directory, log, socket directory and port (5440 + its number).
my @CLUSTERS;
my ($PRIMARY, $STANDBY);           # the current primary and standby (or undef)
my ($DATA, $LOG);                  # the current primary's data directory and log
# the HTTP worker's slots (durable_steps.http_max_inflight) and one role's share of them
my ($HTTP_MAX_INFLIGHT, $HTTP_PER_ROLE) = (8, 3);
my $HOG    = 'fh_hog';             # the hostile role (hog_main)
my $TASKER = 'fh_tasker';          # the task workers' login role, a member of both owners
my $TASK   = 'fh_task';            # the name of every task of the trials (its handler: TASK_WORKER)
# The trial's task workers (task_worker_start): {n => the last number given, dir => their logs'
# directory, w => [worker, ...], by_pid => {pid => worker}}, each worker {name, pid, log,
# stopped_until (the end of a SIGSTOP), stop (its record), gone (our kill -9), exit (its status)}.
my %TW = (w => [], n => 0);
# the python3 of the Debian packages (python3-psycopg2), as clients/python/test picks it
my $PYTHON = $ENV{DS_PYTHON} || (-x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3');
my @TRIAL_LOGS;                    # [log, offset] of the servers the trial ran on (log_since)
my $SU     = 'postgres';           # the bootstrap superuser (initdb -U)
my @ROLES  = qw(fh_alice fh_bob);  # the steps' owners
my $US     = "\x1f";               # field separator of psql's unaligned output
(my $PRIVLIB = $BINDIR) =~ s{/bin$}{/lib};   # the lib directory of the PostgreSQL in --bindir

$ENV{PGCONNECT_TIMEOUT} = 5;
delete @ENV{qw(PGHOST PGPORT PGUSER PGDATABASE PGOPTIONS PGSERVICE)};
chdir $WORK or die "cannot chdir to $WORK: $!\n";

my $json = JSON::PP->new->canonical;
# whether the library publishes the partitions in force for every process
# (durable_steps.ds_partitions_in_force_publish(), as ds_partition_export calls it): set up by
# setup_database, used by fence
my $HAVE_IN_FORCE = 0;
my $parent_pid = $$;
my $PROVIDER = "$FindBin::RealBin/../test/fake_provider.py";
my ($provider_pid, $provider_port);

sub note { print @_, "\n" if $opt{verbose} }

# ---- processes ----------------------------------------------------------------------------------

# A command as the user that owns the cluster (initdb and pg_ctl refuse root).
sub as_runner
{
	my @cmd = @_;
	return @cmd if $> != 0;
	return ('runuser', '-u', $RUNNER, '--', 'env', "HOME=$WORK", "TMPDIR=$WORK/tmp", @cmd);
}

# Runs a command; returns (exit code, stdout, stderr). A timeout kills it and returns 124.
sub run_cmd
{
	my ($cmd, %o) = @_;
	my ($out, $err) = ('', '');
	my $in = defined $o{stdin} ? $o{stdin} : '';
	my $rc;
	my $ok = eval {
		IPC::Run::run($cmd, '<', \$in, '>', \$out, '2>', \$err,
			IPC::Run::timeout($o{timeout} || 120));
		$rc = $? >> 8;
		1;
	};
	if (!$ok)
	{
		$err .= "\n[harness: " . ($@ =~ /timeout/i ? 'timed out' : "failed: $@") . "]";
		$rc = 124;
	}
	return ($rc, $out, $err);
}

sub psql_cmd
{
	my ($user) = @_;
	return [ "$BINDIR/psql", '-X', '-q', '-A', '-t', '-F', $US, '-v', 'ON_ERROR_STOP=1',
		'-v', 'VERBOSITY=verbose', '-h', $SOCK, '-p', $PORT, '-U', $user, '-d', 'postgres' ];
}

# psql as $user with $sql on stdin: (exit code, stdout, stderr)
sub psql
{
	my ($user, $sql, %o) = @_;
	return run_cmd(psql_cmd($user), stdin => $sql, timeout => $o{timeout} || 60);
}

# A connection-level failure (server restarting, session killed) rather than an SQL error.
# (under /x a bare space is ignored: the spaces of every alternative are escaped)
my $transient_re = qr/could\ not\ connect|connection\ to\ server|server\ closed\ the\ connection|
	terminating\ connection|no\ connection\ to\ the\ server|the\ database\ system\ is|
	FATAL|57P0[1-4]|Connection\ refused|No\ such\ file\ or\ directory|\[harness:\ /x;
# A call refused because its run's (or key's) partition is fenced (the fault `fence`): it changed
# nothing, and the client makes it again later, as after a lost connection.
my $fenced_re = qr/ERROR:\s+DS201:/;

# Rows of a superuser query, retried while the server is coming back (bounded).
sub rows
{
	my ($sql, $timeout) = @_;
	my $deadline = time() + ($timeout || 60);
	while (1)
	{
		my ($rc, $out, $err) = psql($SU, $sql);
		return [ map { [ split /$US/, $_, -1 ] } grep { $_ ne '' } split /\n/, $out ] if $rc == 0;
		die "query failed:\n$sql\n$err\n" if $err !~ $transient_re || time() > $deadline;
		usleep(100_000);
	}
}

sub value { my $r = rows(@_); return @$r ? $r->[0][0] : undef }

sub pg_ctl
{
	my @args = @_;
	return pg_ctl_on($PRIMARY, @args);
}

# pg_ctl on one cluster (a standby's start and promotion, the END block's stops)
sub pg_ctl_on
{
	my ($c, @args) = @_;
	return run_cmd([ as_runner("$BINDIR/pg_ctl", '-D', $c->{data}, @args) ], timeout => 120);
}

# Polls until the server answers a query (bounded); dies with the log's tail otherwise.
sub wait_ready
{
	my ($timeout) = @_;
	my $deadline = time() + ($timeout || 60);
	while (time() < $deadline)
	{
		my ($rc) = psql($SU, 'SELECT 1', timeout => 10);
		return 1 if $rc == 0;
		usleep(50_000);
	}
	die "the server did not accept connections within ${\ ($timeout || 60)} s\n" . log_tail(40);
}

sub log_tail
{
	my ($n) = @_;
	open my $fh, '<', $LOG or return "(no log at $LOG)\n";
	my @l = <$fh>;
	close $fh;
	@l = @l[ -$n .. -1 ] if @l > $n;
	return "----- tail of $LOG -----\n" . join('', @l) . "----- end of log -----\n";
}

sub log_size { return -s $LOG || 0 }

# What the logs say from where each of [[file, offset], ...] was when the trial began (a failover
# adds the promoted server's log).
sub log_since
{
	my ($logs) = @_;
	my $all = '';
	for my $l (@$logs)
	{
		open my $fh, '<', $l->[0] or next;
		seek $fh, $l->[1], 0;
		local $/;
		my $t = <$fh>;
		close $fh;
		$all .= $t if defined $t;
	}
	return $all;
}

# ---- the cluster --------------------------------------------------------------------------------

# Cluster $k's places: data directory, log, socket directory, port.
sub cluster_new
{
	my ($k) = @_;
	my $c = { id => $k, data => $k ? "$CDIR/data$k" : "$CDIR/data",
		log => $k ? "$CDIR/postgres$k.log" : "$CDIR/postgres.log",
		sock => "$CDIR/sock$k", port => 5440 + $k, live => 0 };
	push @CLUSTERS, $c;
	my ($rc, $out, $err) = run_cmd([ as_runner('mkdir', '-p', $c->{sock}) ]);
	die "mkdir $c->{sock}: $err\n" if $rc;
	return $c;
}

# Points the clients' link at cluster $c's socket (a new link renamed over the old one: a session
# that connects meanwhile finds one or the other).
sub point_clients
{
	my ($c) = @_;
	my $link = "$SOCK/.s.PGSQL.$PORT";
	unlink "$link.new";
	symlink("$c->{sock}/.s.PGSQL.$c->{port}", "$link.new") or die "symlink $link.new: $!\n";
	rename("$link.new", $link) or die "rename $link.new: $!\n";
}

sub cluster_create
{
	my ($rc, $out, $err) = run_cmd([ as_runner('mkdir', '-p', $CDIR, $SOCK, "$WORK/tmp") ]);
	die "mkdir: $err\n" if $rc;
	$PRIMARY = cluster_new(0);
	($DATA, $LOG) = ($PRIMARY->{data}, $PRIMARY->{log});
	($rc, $out, $err) = run_cmd(
		[ as_runner("$BINDIR/initdb", '-D', $DATA, '-U', $SU, '-A', 'trust', '-E', 'UTF8',
			'--no-sync') ],
		timeout => 300);
	die "initdb failed:\n$out$err\n" if $rc;
	my $conf = <<"EOF";

# ---- scripts/faults ----
listen_addresses = ''
unix_socket_directories = '$PRIMARY->{sock}'
port = $PRIMARY->{port}
max_connections = 100
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'postgres'
durable_steps.max_workers = 2
durable_steps.poll_interval = '50ms'
durable_steps.http_allowed_hosts = '127.0.0.1'
# few slots, so that the hog (hog_main) fills its share
durable_steps.http_max_inflight = $HTTP_MAX_INFLIGHT
durable_steps.http_max_inflight_per_role = $HTTP_PER_ROLE
restart_after_crash = on
# kill -9 and immediate stops end processes, not the machine: the kernel keeps written WAL
fsync = off
log_line_prefix = '%m [%p] %b '
# a standby (--standby) connects again at once after its primary restarts: the synchronous
# commits wait for it meanwhile
wal_retrieve_retry_interval = '200ms'
# two partitions, both owned: everything runs as unpartitioned, but the fault `fence` can fence one
durable_steps.partition_count = 2
durable_steps.partitions = '0,1'
EOF
	($rc, $out, $err) = run_cmd([ as_runner('sh', '-c', 'cat >> "$1"', 'sh', "$DATA/postgresql.conf") ],
		stdin => $conf);
	die "cannot write postgresql.conf: $err\n" if $rc;
	point_clients($PRIMARY);
	cluster_start();
}

sub cluster_start
{
	my ($rc, $out, $err) = pg_ctl('-l', $LOG, '-w', '-t', '60', 'start');
	die "pg_ctl start failed:\n$out$err\n" . log_tail(40) if $rc;
	$PRIMARY->{live} = 1;
	wait_ready(60);
	check_library();
}

# A new postmaster must have loaded the private copy of the library, not another one.
sub check_library
{
	my $lib = loaded_library();
	die "the postmaster loaded $lib, not the private copy under $PRIVLIB\n"
	  unless index($lib, "$PRIVLIB/") == 0 && $lib !~ /\(deleted\)$/;
}

# Line $n (from 1) of a cluster's postmaster.pid: 1 the pid, 7 the shared memory key and id.
sub pid_file_line
{
	my ($c, $n) = @_;
	open my $pf, '<', "$c->{data}/postmaster.pid" or die "$c->{data}/postmaster.pid: $!\n";
	my @l = <$pf>;
	close $pf;
	my $v = $l[ $n - 1 ] // '';
	chomp $v;
	return $v;
}

# The durable_steps.so the running postmaster has mapped (from /proc), with " (deleted)" when
# the file was replaced after it was loaded.
sub loaded_library
{
	my $pid = pid_file_line($PRIMARY, 1);
	open my $mf, '<', "/proc/$pid/maps" or die "/proc/$pid/maps: $!\n";
	my ($lib) = map { m{(/\S*durable_steps\.so(?: \(deleted\))?)$} ? $1 : () } <$mf>;
	close $mf;
	die "the postmaster (pid $pid) has no durable_steps.so mapped\n" unless $lib;
	return $lib;
}

sub cluster_stop
{
	my ($mode) = @_;
	my ($rc, $out, $err) = pg_ctl('-m', $mode, '-w', '-t', '60', 'stop');
	die "pg_ctl stop -m $mode failed:\n$out$err\n" . log_tail(40) if $rc;
}

# ---- the standby and the failover ----------------------------------------------------------------

# A synchronous standby of the primary: pg_basebackup -R into a new cluster, which listens on its
# own socket and port and, once promoted, waits for no standby; then the primary's
# synchronous_standby_names names it (synchronous_commit is on), and we wait until it is the
# synchronous one. Returns the seconds it took.
sub standby_create
{
	my $t0 = time();
	my $c = cluster_new(scalar @CLUSTERS);
	my ($rc, $out, $err) = run_cmd(
		[ as_runner("$BINDIR/pg_basebackup", '-D', $c->{data}, '-R', '-X', 'stream', '-c', 'fast', '-N',
			'-h', $PRIMARY->{sock}, '-p', $PRIMARY->{port}, '-U', $SU) ],
		timeout => 300);
	die "pg_basebackup failed:\n$out$err\n" if $rc;
	my $conf = <<"EOF";
# ---- scripts/faults: standby $c->{id} of cluster $PRIMARY->{id} (later lines win) ----
port = $c->{port}
unix_socket_directories = '$c->{sock}'
primary_conninfo = 'host=$PRIMARY->{sock} port=$PRIMARY->{port} user=$SU application_name=fh_standby'
synchronous_standby_names = ''
EOF
	($rc, $out, $err) = run_cmd([ as_runner('sh', '-c', 'cat >> "$1"', 'sh', "$c->{data}/postgresql.auto.conf") ],
		stdin => $conf);
	die "cannot write the standby's postgresql.auto.conf: $err\n" if $rc;
	($rc, $out, $err) = pg_ctl_on($c, '-l', $c->{log}, '-w', '-t', '60', 'start');
	die "pg_ctl start of the standby failed:\n$out$err\n" if $rc;
	$c->{live} = 1;
	$STANDBY = $c;
	($rc, $out, $err) = psql($SU, "ALTER SYSTEM SET synchronous_standby_names = 'fh_standby';\n"
		  . "SELECT pg_reload_conf();\n", timeout => 20);
	die "cannot set synchronous_standby_names: $err\n" if $rc;
	my $deadline = time() + 60;
	while (1)
	{
		my $st = value("SELECT state || '/' || sync_state FROM pg_stat_replication "
			  . "WHERE application_name = 'fh_standby'") // '';
		last if $st eq 'streaming/sync';
		die "the standby is not the synchronous one within 60 s (pg_stat_replication: '$st')\n"
		  if time() > $deadline;
		usleep(50_000);
	}
	return time() - $t0;
}

# The pids of $pid's children (from /proc).
sub child_pids
{
	my ($pid) = @_;
	my @kids;
	for my $f (glob '/proc/[0-9]*/stat')
	{
		open my $fh, '<', $f or next;
		my $l = <$fh>;
		close $fh;
		next unless defined $l && $l =~ /^(\d+) .*\) \S+ (\d+) /s;
		push @kids, $1 if $2 == $pid;
	}
	return @kids;
}

# Whether a process is gone (or a zombie).
sub gone
{
	my ($pid) = @_;
	open my $fh, '<', "/proc/$pid/stat" or return 1;
	my $l = <$fh>;
	close $fh;
	return !defined $l || $l =~ /\) Z /;
}

# The fault `failover`, at a moment with an HTTP request without a key claimed when there is
# one within 2 s (as a kill of an executor prefers one running an attempt): the primary's
# postmaster and every process it started die at once (SIGSTOP first, so that it forks nothing
# more; then SIGKILL to all: a machine lost, nothing flushed or sent after it), its shared memory
# is removed, the standby is promoted and the clients' link points at it. The old primary's data
# directory is removed: it is never started again (its WAL may hold commits the standby never
# confirmed, which no client saw).
sub failover
{
	my ($count) = @_;
	my $old = $PRIMARY;
	my $new = $STANDBY or return undef;
	# the HTTP requests claimed at the moment, and those without a key: a failover must send none
	# of them again. Waits up to 2 s for one without a key (the hog's hang for seconds).
	my $inflight;
	my $until = time() + 2;
	while (1)
	{
		$inflight = rows("SELECT count(*), count(*) FILTER (WHERE idempotency_header IS NULL) "
			  . "FROM durable_steps.steps WHERE kind = 'http' AND status = 'running' AND kept_outcome IS NULL")->[0];
		last if $inflight->[1] > 0 || time() > $until;
		usleep(50_000);
	}
	my $pm = pid_file_line($old, 1);
	my ($shmid) = (pid_file_line($old, 7) =~ /^\s*\d+\s+(\d+)/);
	kill 'STOP', $pm;
	my @kids = child_pids($pm);
	kill 'KILL', $pm, @kids;
	my $deadline = time() + 20;
	while (grep { !gone($_) } $pm, @kids)
	{
		die "the old primary's processes did not end within 20 s\n" if time() > $deadline;
		usleep(20_000);
	}
	$old->{live} = 0;
	run_cmd([ as_runner('ipcrm', '-m', $shmid) ]) if defined $shmid && $shmid > 0;
	my $t0 = time();
	push @TRIAL_LOGS, [ $new->{log}, -s $new->{log} || 0 ];
	my ($rc, $out, $err) = pg_ctl_on($new, 'promote', '-w', '-t', '60');
	die "pg_ctl promote failed:\n$out$err\n" if $rc;
	$PRIMARY = $new;
	$STANDBY = undef;
	($DATA, $LOG) = ($new->{data}, $new->{log});
	point_clients($new);
	wait_ready(60);
	check_library();
	run_cmd([ as_runner('rm', '-rf', $old->{data}) ]);
	$count->{failover_http} += $inflight->[0];
	$count->{failover_keyless} += $inflight->[1];
	return sprintf('failover: killed the primary (cluster %d: postmaster %d and %d processes) with %d HTTP requests '
		  . 'claimed (%d without a key), promoted cluster %d in %.2f s',
		$old->{id}, $pm, scalar @kids, @$inflight, $new->{id}, time() - $t0);
}

END
{
	# the exit status is ours: the stop's and the provider's wait statuses must not replace it
	local $?;
	if ($$ == $parent_pid)
	{
		# task workers left by a harness error (a stopped one too)
		for my $w (grep { !defined $_->{exit} } @{ $TW{w} }) { kill 'CONT', $w->{pid}; kill 'KILL', $w->{pid}; }
		pg_ctl_on($_, '-m', 'immediate', '-w', 'stop') for grep { $_->{live} } @CLUSTERS;
	}
	provider_stop() if $$ == $parent_pid;
}

# ---- task workers (clients/python's Worker) ------------------------------------------------------

# The application worker of the trials' tasks: the real Worker of clients/python, run by python3
# with PYTHONPATH at this tree's clients/python, one process each, as $TASKER through the
# clients' socket (its application_name is its name, fhw<N>, so that the fault task_cut finds
# its connections). Its handler of $TASK first logs the execution on its own (fh_task_runs,
# autocommit), then, in ctx.transaction(), writes the attempt's effect (fh_task_effects, with
# the attempt's keys), sleeps input.sleep ms and ends as input.p scripts attempt n (missing:
# succeed, returning the attempt number): rx a plain exception (retryable, code ScriptedRetry),
# ra RetryAfterError (retryable, fh_ra, input.ra ms later), nr NonRetriableError (permanent,
# fh_nr), bk BlockedError (correctable, fh_bk). Succeeding returns from inside the block: the
# effect commits with ds_complete_task, or neither does; failing raises inside it: the effect
# rolls back. Its log (INFO) says when an outcome was refused because the lease was gone.
my $TASK_WORKER_PY = <<'PYEOF';
import logging
import os
import sys
import threading
import time

import psycopg2
from durable_steps_client.worker import Worker
from durable_steps_client.errors import BlockedError, NonRetriableError, RetryAfterError
from durable_steps_client.workflows import workflow

dsn, name, lease, concurrency = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                    format="%(asctime)s " + name + " %(levelname)s %(message)s")


class ScriptedRetry(Exception):
    pass


def connect():
    return psycopg2.connect(dsn)


local = threading.local()


def log_autocommit(statement, params):
    """Logs an execution on this thread's own connection, committed before it acts (bounded: a
    fault may keep the server away; the log is then a lower bound)."""
    for _ in range(3):
        try:
            conn = getattr(local, "conn", None)
            if conn is None or conn.closed:
                conn = local.conn = connect()
                conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(statement, params)
            return
        except Exception:
            try:
                local.conn.close()
            except Exception:
                pass
            local.conn = None
            time.sleep(0.05)


def log_run(ctx):
    """Logs this execution of the handler."""
    log_autocommit("INSERT INTO fh_task_runs (run_id, step_id, attempt, idem_key, attempt_key, "
                   "worker, os_pid) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                   (ctx.run_id, ctx.step_id, ctx.attempt, ctx.idempotency_key,
                    ctx.attempt_key, name, os.getpid()))


def handler(input, ctx):
    log_run(ctx)
    plan = input.get("p") or []
    act = plan[ctx.attempt - 1] if ctx.attempt <= len(plan) else "ok"
    with ctx.transaction() as cur:
        cur.execute("INSERT INTO fh_task_effects (run_id, step_id, attempt, kind, idem_key, attempt_key, "
                    "worker, os_pid) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (ctx.run_id, ctx.step_id, ctx.attempt,
                     "success effect" if act == "ok" else "failed attempt effect",
                     ctx.idempotency_key, ctx.attempt_key, name, os.getpid()))
        if input.get("sleep"):
            time.sleep(input["sleep"] / 1000.0)
        what = "scripted %s at attempt %d" % (act, ctx.attempt)
        if act == "ok":
            return ctx.attempt
        if act == "rx":
            raise ScriptedRetry(what)
        if act == "ra":
            raise RetryAfterError(what, input.get("ra", 0) / 1000.0, code="fh_ra")
        if act == "nr":
            raise NonRetriableError(what, code="fh_nr")
        if act == "bk":
            raise BlockedError(what, "correct the input", code="fh_bk")
        raise NonRetriableError("unknown action " + act, code="fh_unknown")


def log_flow_run(run_id, step_id, sc):
    """Logs this execution of a flow step."""
    log_autocommit("INSERT INTO fh_flow_log (kind, run_id, step_id, attempt, idem_key, worker, "
                   "os_pid) VALUES ('run', %s, %s, %s, %s, %s, %s)",
                   (run_id, step_id, sc.attempt, sc.idempotency_key, name, os.getpid()))


# FLOW: the workflow of the trials' flows (declared by setup_database, as the superuser)
@workflow("fh_appflow")
def appflow(ctx, input):
    done = []
    for i, st in enumerate(input["steps"]):
        def body(sc, i=i, st=st):
            log_flow_run(ctx.run_id, "s%d" % i, sc)
            sc.cursor.execute("INSERT INTO fh_flow_log (kind, run_id, step_id, attempt, idem_key, worker, "
                              "os_pid) VALUES ('effect', %s, %s, %s, %s, %s, %s)",
                              (ctx.run_id, "s%d" % i, sc.attempt, sc.idempotency_key, name, os.getpid()))
            time.sleep(st["sleep"] / 1000.0)
            if sc.attempt <= st["fail"]:
                raise ScriptedRetry("scripted failure at attempt %d" % sc.attempt)
            return sc.attempt
        done.append(ctx.step("s%d" % i, body, transaction=True,
                             retry={"max_attempts": 20, "initial_ms": 20, "max_ms": 200}))
        if input.get("nap_after") == i:
            ctx.sleep("nap", input["nap_ms"] / 1000.0)
    return done


worker = Worker(connect, concurrency=concurrency, lease=lease, worker=name, grace=1.0,
                wait_timeout=5.0, tasks={sys.argv[5]: handler}, workflows=[appflow],
                define_workflows=False)
worker.run()
print("stopped", flush=True)
PYEOF


sub task_dsn
{
	my ($name) = @_;
	return "host=$SOCK port=$PORT dbname=postgres user=$TASKER application_name=$name connect_timeout=5";
}

# Starts one more task worker process.
sub task_worker_start
{
	my $n = ++$TW{n};
	my $name = "fhw$n";
	my $log = "$TW{dir}/$name.log";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDIN, '<', '/dev/null';
		open STDOUT, '>', $log or POSIX::_exit(127);
		open STDERR, '>&', \*STDOUT;
		$ENV{PYTHONPATH} = "$FindBin::RealBin/../clients/python";
		$ENV{PYTHONDONTWRITEBYTECODE} = 1;
		exec $PYTHON, "$WORK/fh_task_worker.py", task_dsn($name), $name, $cfg{task_lease},
		  $cfg{task_concurrency}, $TASK or POSIX::_exit(127);
	}
	my $w = { name => $name, pid => $pid, log => $log, started => time() };
	push @{ $TW{w} }, $w;
	$TW{by_pid}{$pid} = $w;
	return $w;
}

# The live task workers (not killed, not exited).
sub task_workers_live { return grep { !$_->{gone} && !defined $_->{exit} } @{ $TW{w} } }

# A task worker process ended ($? its wait status); one we did not kill is a harness error.
sub task_worker_ended
{
	my ($pid, $errs) = @_;
	my $w = $TW{by_pid}{$pid} or return 0;
	$w->{exit} = $?;
	push @$errs, "task worker $w->{name} (pid $pid) ended by itself with "
	  . (($? & 127) ? 'signal ' . ($? & 127) : 'exit code ' . ($? >> 8)) . " (log: $w->{log})"
	  unless $w->{gone} || $w->{stopping};
	return 1;
}

# Keeps $cfg{task_workers} workers alive: a replacement for each one that ended (a kill -9, or
# by itself), and SIGCONT for each stopped one whose stop is due to end (or all of them, $all).
sub task_workers_tend
{
	my ($all) = @_;
	for my $w (task_workers_live())
	{
		next unless defined $w->{stopped_until};
		next if !$all && time() < $w->{stopped_until};
		my $left = $w->{stopped_until} - time();
		usleep(1e6 * $left) if $left > 0;
		kill 'CONT', $w->{pid};
		$w->{stop}[3] = time();
		undef $w->{stopped_until};
	}
	my $live = () = task_workers_live();
	task_worker_start() for $live .. $cfg{task_workers} - 1;
}

# Stops every task worker at the end of a trial: SIGCONT, SIGTERM (the Worker's graceful stop),
# SIGKILL after 10 s.
sub task_workers_stop
{
	my ($errs) = @_;
	task_workers_tend(1) if @{ $TW{w} };
	my @live = task_workers_live();
	for my $w (@live) { $w->{stopping} = 1; kill 'TERM', $w->{pid}; }
	my $deadline = time() + 10;
	for my $w (@live)
	{
		while (!defined $w->{exit})
		{
			my $r = waitpid($w->{pid}, POSIX::WNOHANG());
			if ($r == $w->{pid}) { $w->{exit} = $?; last }
			if (time() > $deadline)
			{
				push @$errs, "task worker $w->{name} (pid $w->{pid}) did not stop within 10 s of SIGTERM";
				kill 'KILL', $w->{pid};
				waitpid($w->{pid}, 0);
				$w->{exit} = $?;
				last;
			}
			usleep(50_000);
		}
	}
}

# A task worker to strike, not a stopped one: preferably one with a handler inside its
# transaction now (a session of the worker idle in transaction: the effect written, the outcome
# not yet), waiting up to 1 s for one; else one running a task of the trial (ds_steps.worker).
# Returns the worker, and whether it was running a task, or ().
sub pick_task_worker
{
	my ($prefix) = @_;
	my @live = grep { !defined $_->{stopped_until} } task_workers_live();
	return () unless @live;
	my %by = map { ($_->{name} => $_) } @live;
	my $deadline = time() + 1;
	my @running;
	while (1)
	{
		my ($rc, $out) = psql($SU, "SELECT application_name, 2 FROM pg_stat_activity WHERE application_name LIKE 'fhw%' "
			  . "AND state = 'idle in transaction' UNION SELECT worker, 1 FROM ds_steps WHERE kind = 'task' "
			  . "AND status = 'running' AND run_id LIKE '$prefix%'", timeout => 10);
		my @r = $rc == 0 ? grep { $by{ $_->[0] } } map { [ split /$US/ ] } grep { $_ ne '' } split /\n/, $out : ();
		my @in = grep { $_->[1] == 2 } @r;
		return ($by{ $in[ int rand @in ][0] }, 1) if @in;
		@running = grep { $_->[1] == 1 } @r;
		last if time() > $deadline;
		usleep(20_000);
	}
	return ($by{ $running[ int rand @running ][0] }, 1) if @running;
	return ($live[ int rand @live ], 0);
}

# The faults of the task workers: task_kill9 (kill -9 of one, and a new one started), task_stop
# (SIGSTOP of one for its lease plus 1-2 s; task_workers_tend sends SIGCONT), task_cut
# (pg_terminate_backend of every connection of one: its claims, heartbeats, outcomes and the
# handlers' transactions). Each records [worker, pid, from, to] in @{$count->{task_<f>s}}.
sub inject_task
{
	my ($f, $count, $prefix) = @_;
	my ($w, $busy) = pick_task_worker($prefix);
	return undef unless $w;
	$count->{"${f}_busy"}++ if $busy;
	my $t = time();
	if ($f eq 'task_kill9')
	{
		kill 'KILL', $w->{pid};
		waitpid($w->{pid}, 0);
		$w->{gone} = 1;
		$w->{exit} = $?;
		push @{ $count->{task_kills} }, [ $w->{name}, $w->{pid}, $t, $t ];
		my $new = task_worker_start();
		return "kill -9 task worker $w->{name} pid $w->{pid}" . ($busy ? ' (running a task)' : '')
		  . ", started $new->{name}";
	}
	if ($f eq 'task_stop')
	{
		my $hold = $cfg{task_lease} + 1 + rand(1);
		kill 'STOP', $w->{pid};
		$w->{stopped_until} = $t + $hold;
		$w->{stop} = [ $w->{name}, $w->{pid}, $t, undef ];
		push @{ $count->{task_stops} }, $w->{stop};
		return sprintf('SIGSTOP task worker %s pid %d for %.1f s%s', $w->{name}, $w->{pid}, $hold,
			$busy ? ' (running a task)' : '');
	}
	if ($f eq 'task_cut')
	{
		my ($rc, $out) = psql($SU, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
			  . "WHERE application_name = '$w->{name}'", timeout => 10);
		return undef if $rc;
		chomp $out;
		push @{ $count->{task_cuts} }, [ $w->{name}, $w->{pid}, $t, time() ];
		return "pg_terminate_backend of task worker $w->{name}'s $out connection(s)" . ($busy ? ' (running a task)' : '');
	}
	die "unknown task fault $f";
}

# ---- the fake provider (test/fake_provider.py) ----------------------------------------------------

# Starts it on 127.0.0.1, a free port it picks and writes to a file (polled, bounded).
sub provider_start
{
	my $portfile = "$WORK/provider.port";
	unlink $portfile;
	$provider_pid = fork();
	die "fork: $!" unless defined $provider_pid;
	if ($provider_pid == 0)
	{
		open STDOUT, '>', '/dev/null';
		open STDERR, '>', "$WORK/provider.log";
		exec 'python3', $PROVIDER, $portfile or POSIX::_exit(127);
	}
	my $deadline = time() + 20;
	while (!-s $portfile)
	{
		die "test/fake_provider.py did not start within 20 s\n"
		  if time() > $deadline || waitpid($provider_pid, POSIX::WNOHANG()) == $provider_pid;
		usleep(20_000);
	}
	open my $fh, '<', $portfile or die "$portfile: $!";
	$provider_port = <$fh>;
	close $fh;
	chomp $provider_port;
	die "test/fake_provider.py wrote no port\n" unless $provider_port =~ /^\d+$/;
}

sub provider_stop
{
	return unless $provider_pid;
	kill 'TERM', $provider_pid;
	waitpid($provider_pid, 0);
	$provider_pid = undef;
}

# The provider's ledger: {charges => {tag => n}, requests => {tag => n}, keys => {tag => [key]}}
sub provider_counts
{
	my $r = HTTP::Tiny->new(timeout => 20)->get("http://127.0.0.1:$provider_port/counts");
	die "GET /counts of the fake provider: $r->{status} $r->{reason}\n" unless $r->{success};
	return $json->decode($r->{content});
}

sub setup_database
{
	# the hog has the other roles' rights, no more
	my $roles = join '', map { "CREATE ROLE $_ LOGIN;\nGRANT durable_steps_http TO $_;\n" } @ROLES, $HOG;
	my ($rc, $out, $err) = psql($SU, <<"EOF");
CREATE EXTENSION durable_steps;
SELECT ds_set_queue('fh_serial', 1);
SELECT ds_set_concurrency_limit('fh_key', 1);
SELECT ds_set_rate_limit('fh_key', 50, interval '1 second', 5);
$roles
-- the task workers' own login role: a member of both owners, so that it may run their tasks
-- (docs/tasks.md, "Who may do what")
CREATE ROLE $TASKER LOGIN;
GRANT ${\ join(', ', @ROLES)} TO $TASKER;

-- What the task handlers (TASK_WORKER) write, in the transaction that records their attempt's
-- outcome (ctx.transaction()): one row per attempt whose transaction committed -- 'success
-- effect' on an attempt scripted to succeed, 'failed attempt effect' otherwise (that row must
-- roll back with the failure) -- with the keys the attempt was handed and the worker (its name
-- and process) that ran it. No unique constraint, so that a duplicated effect shows.
CREATE TABLE fh_task_effects (
    id          bigserial PRIMARY KEY,
    run_id      text NOT NULL,
    step_id     text NOT NULL,
    attempt     integer NOT NULL,
    kind        text NOT NULL,
    idem_key    text NOT NULL,
    attempt_key text NOT NULL,
    worker      text NOT NULL,
    os_pid      integer NOT NULL,
    who         text NOT NULL DEFAULT current_user,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON fh_task_effects TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_task_effects_id_seq TO PUBLIC;

-- FLOW: the application workflow the task workers run, startable by the owners; every execution
-- of its steps, logged first in autocommit ('run'), and what they write in their transactions
-- ('effect': one row per attempt whose transaction committed; no unique constraint, so that a
-- duplicated effect shows)
SET search_path = public;
SELECT ds_define_workflow('fh_appflow', '{"max_attempts": 50, "initial_delay": 50, "max_delay": 500}');
GRANT EXECUTE ON FUNCTION fh_appflow(text, jsonb) TO ${\ join(', ', @ROLES)};
CREATE TABLE fh_flow_log (
    id          bigserial PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('run', 'effect')),
    run_id      text NOT NULL,
    step_id     text NOT NULL,
    attempt     integer NOT NULL,
    idem_key    text NOT NULL,
    worker      text NOT NULL,
    os_pid      integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON fh_flow_log TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_flow_log_id_seq TO PUBLIC;

-- Every execution of a task handler, committed on its own (autocommit) as the handler begins,
-- before it writes anything: which attempt ran, in which worker process, when.
CREATE TABLE fh_task_runs (
    id          bigserial PRIMARY KEY,
    run_id      text NOT NULL,
    step_id     text NOT NULL,
    attempt     integer NOT NULL,
    idem_key    text NOT NULL,
    attempt_key text NOT NULL,
    worker      text NOT NULL,
    os_pid      integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON fh_task_runs TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_task_runs_id_seq TO PUBLIC;
-- The effect ledger: no unique constraint, so that a duplicated effect shows.
CREATE TABLE fh_ledger (
    id       bigserial PRIMARY KEY,
    run_id   text NOT NULL,
    step_id  text NOT NULL,
    attempt  integer NOT NULL,
    kind     text NOT NULL,
    who      text NOT NULL DEFAULT current_user,
    pid      integer NOT NULL DEFAULT pg_backend_pid(),
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the start of the writing transaction: a caller's, for an attempt in ds_run_step (the
    -- check 'fenced write')
    xact_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON fh_ledger TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_ledger_id_seq TO PUBLIC;

-- What the procedure fh_proc stored (proc_main): one row per step it called, written in the
-- transaction that called it, so that it commits exactly when the call did. xact_at is that
-- transaction's start (now(): in a procedure, each transaction after a COMMIT has its own),
-- created_at the step's as ds_steps shows it then (the step was created by this transaction
-- when it is not before xact_at).
CREATE TABLE fh_proc_log (
    id         bigserial PRIMARY KEY,
    idx        integer NOT NULL,
    run_id     text NOT NULL,
    step_id    text NOT NULL,
    status     text NOT NULL,
    attempt    integer NOT NULL,
    replayed   boolean NOT NULL,
    xact_at    timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL,
    who        text NOT NULL DEFAULT current_user,
    pid        integer NOT NULL DEFAULT pg_backend_pid()
);
GRANT SELECT, INSERT ON fh_proc_log TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_proc_log_id_seq TO PUBLIC;

-- A procedure that commits in a loop (proc_main): a backend reads the configuration file only
-- between client statements, so a CALL keeps the partitions of the settings it began with for
-- as long as it runs, across every fence meanwhile. steps lists its steps in order, each
-- {idx, run, step, input, policy, defer, queue, timeout, on_success, on_failure, pause}; a step
-- whose row in fh_proc_log committed (an earlier CALL's) is passed over, so that a CALL made
-- again after a lost connection or a refusal (DS201) finishes the rest. Each step is stored by
-- ds_run_step (its attempt 1 runs here, as the caller, unless it is deferred) with its log row,
-- in a transaction that begins right before it; COMMIT; a pause of its own (pause ms, in a
-- transaction of its own); COMMIT. An error ends the CALL.
CREATE PROCEDURE fh_proc(steps jsonb) LANGUAGE plpgsql AS \$\$
DECLARE
    s jsonb;
    r record;
BEGIN
    FOR i IN 0 .. jsonb_array_length(steps) - 1 LOOP
        s := steps->i;
        CONTINUE WHEN EXISTS (SELECT FROM fh_proc_log l WHERE l.run_id = s->>'run' AND l.step_id = s->>'step');
        SELECT * INTO r
          FROM ds_run_step(s->>'run', s->>'step', 'SELECT fh_body(\$1)', s->'input', s->'policy',
                           defer => (s->>'defer')::boolean, on_success => s->>'on_success',
                           on_failure => s->>'on_failure', queue => s->>'queue',
                           timeout => (s->>'timeout')::interval);
        INSERT INTO fh_proc_log (idx, run_id, step_id, status, attempt, replayed, created_at)
        SELECT (s->>'idx')::integer, s->>'run', s->>'step', r.status, r.attempt, r.replayed, d.created_at
          FROM ds_steps d WHERE d.run_id = s->>'run' AND d.step_id = s->>'step';
        COMMIT;
        PERFORM pg_sleep((s->>'pause')::integer / 1000.0);
        COMMIT;
    END LOOP;
END
\$\$;

-- What every step's outcome hooks (on_success, on_failure) write, in the outcome's transaction:
-- one row per outcome that ended the step, no unique constraint so that a duplicate shows.
CREATE TABLE fh_hooks (
    id       bigserial PRIMARY KEY,
    run_id   text NOT NULL,
    step_id  text NOT NULL,
    hook     text NOT NULL,
    status   text NOT NULL,
    attempt  integer NOT NULL,
    who      text NOT NULL DEFAULT current_user
);
GRANT SELECT, INSERT ON fh_hooks TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_hooks_id_seq TO PUBLIC;

-- A stubborn step's outcome hook (pick_stubborn): writes its fh_hooks row like every hook; then,
-- in an executor (whose session has no application_name; a caller's psql has one) and at
-- attempt stubborn_at (0: any), catches every cancellation until its executor is ended (the
-- hook's deadline, the step's timeout, cancels it every second and ends the process 5 s past it).
-- Its row then rolls back with the outcome's transaction.
CREATE FUNCTION fh_hook(o jsonb, hook text, stubborn_at integer) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
    INSERT INTO fh_hooks(run_id, step_id, hook, status, attempt)
    VALUES (o->>'run_id', o->>'step_id', hook, o->>'status', (o->>'attempt')::integer);
    IF current_setting('application_name') = ''
       AND (stubborn_at = 0 OR (o->>'attempt')::integer = stubborn_at) THEN
        LOOP
            BEGIN
                PERFORM pg_sleep(0.2);
            EXCEPTION WHEN query_canceled THEN
                NULL;
            END;
        END LOOP;
    END IF;
END
\$\$;

-- What the handlers of idempotent requests (ds_idempotent, idem_main) did: one row per
-- execution that committed, no unique constraint so that a duplicate shows.
CREATE TABLE fh_idem_effects (
    id       bigserial PRIMARY KEY,
    scope    text NOT NULL,
    key      text NOT NULL,
    who      text NOT NULL DEFAULT current_user
);
GRANT SELECT, INSERT ON fh_idem_effects TO PUBLIC;
GRANT USAGE ON SEQUENCE fh_idem_effects_id_seq TO PUBLIC;

-- The hog's stop sign: a row for its trial's prefix once the other roles' steps have settled.
CREATE TABLE fh_hog_stop (prefix text PRIMARY KEY);
GRANT SELECT ON fh_hog_stop TO PUBLIC;

-- A step's body. plan->'p' scripts attempt n by its element n-1 (missing: succeed):
--   ra ds_retry_after (DS002)     rx RAISE EXCEPTION (P0001)    -- retryable
--   nr ds_non_retriable (DS001)   ix RAISE ... XX000            -- permanent
--   bk ds_blocked (DS003)         dz division by zero (22012)   -- correctable
--   ig in the worker: catches every cancellation until its executor is ended (recorded lost,
--      DS007); in a caller, RAISE EXCEPTION (P0001)
-- Every attempt first writes its ledger row: 'success effect' on an attempt scripted to succeed,
-- 'failed attempt effect' otherwise (that row must roll back with the failure). The attempt
-- then sleeps plan->>'sleep' ms (a window for faults) and returns its attempt number.
CREATE FUNCTION fh_body(plan jsonb) RETURNS integer LANGUAGE plpgsql AS \$\$
DECLARE
    a   integer := ds_attempt_number();
    act text := coalesce(plan->'p'->>(a - 1), 'ok');
BEGIN
    INSERT INTO fh_ledger(run_id, step_id, attempt, kind)
    VALUES (ds_run_id(), ds_step_id(), a,
            CASE WHEN act = 'ok' THEN 'success effect' ELSE 'failed attempt effect' END);
    IF coalesce((plan->>'sleep')::integer, 0) > 0 THEN
        PERFORM pg_sleep((plan->>'sleep')::integer / 1000.0);
    END IF;
    CASE act
        WHEN 'ok' THEN NULL;
        WHEN 'ra' THEN PERFORM ds_retry_after('scripted retry_after at attempt ' || a,
                                              make_interval(secs => (plan->>'ra')::integer / 1000.0));
        WHEN 'rx' THEN RAISE EXCEPTION 'scripted raise at attempt %', a;
        WHEN 'nr' THEN PERFORM ds_non_retriable('scripted non_retriable at attempt ' || a);
        WHEN 'ix' THEN RAISE EXCEPTION 'scripted internal error at attempt %', a USING ERRCODE = 'XX000';
        WHEN 'bk' THEN PERFORM ds_blocked('scripted block at attempt ' || a, 'correct the input');
        WHEN 'dz' THEN PERFORM 1 / (a - a);
        WHEN 'ig' THEN
            -- a caller's session (psql) has an application_name, the worker's has none
            IF current_setting('application_name') <> '' THEN
                RAISE EXCEPTION 'scripted raise at attempt % (ig, in a caller)', a;
            END IF;
            LOOP
                BEGIN
                    PERFORM pg_sleep(0.2);
                EXCEPTION WHEN query_canceled THEN
                    NULL;
                END;
            END LOOP;
        ELSE RAISE EXCEPTION 'fh_body: unknown action %', act USING ERRCODE = 'XX001';
    END CASE;
    RETURN a;
END
\$\$;

-- The runs' workflow. input->'steps' lists its SQL steps in order, each {id, in (fh_body's
-- plan), policy, catch}: a step that failed for good raises DS102 here, which the workflow catches
-- (and records as "caught") when the step says so, and otherwise lets fail the run. After the
-- step at index input->'sleep'->'after' it sleeps input->'sleep'->'ms' ms (ds_sleep 'nap'); after
-- the step at index input->'event'->'after' it awaits event input->'event'->'name' (step 'ev').
-- Its output maps each step id to its result (the attempt number) or "caught", and 'event' to
-- the event's payload.
-- FAN: each trial's fan-out run (check_fanout): a map of 8 items at most 2 at once, and a
-- child run, joined; every item's and the child's effect is a row here
CREATE TABLE fh_fan_effects (run_id text NOT NULL, n integer NOT NULL);
CREATE FUNCTION fh_fan_item(run text, n integer) RETURNS integer LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM pg_sleep(0.02 + random() * 0.05);
    INSERT INTO fh_fan_effects VALUES (run, n);
    RETURN n * 2;
END
\$\$;
CREATE FUNCTION fh_kid(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM ds_step('kid', 'SELECT fh_fan_item(\$1->>''parent'', 0)', input);
    RETURN '"kid"';
END
\$\$;
CREATE FUNCTION fh_fanout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE
    m jsonb;
BEGIN
    PERFORM ds_start_child_run('kid', 'fh_kid', jsonb_build_object('parent', run_id));
    m := ds_map('fan', 'SELECT fh_fan_item(\$1->>''run'', (\$1->>''n'')::int)', input->'items',
                concurrency => 2);
    RETURN jsonb_build_object('map', m, 'kid', ds_join_child('kid'));
END
\$\$;

CREATE FUNCTION fh_workflow(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE
    out jsonb := '{}';
    s   jsonb;
    r   jsonb;
    i   integer;
BEGIN
    FOR i IN 0 .. jsonb_array_length(input->'steps') - 1 LOOP
        s := input->'steps'->i;
        BEGIN
            r := ds_step(s->>'id', 'SELECT fh_body(\$1)', s->'in', s->'policy');
        EXCEPTION WHEN SQLSTATE 'DS102' THEN
            IF NOT (s->>'catch')::boolean THEN
                RAISE;
            END IF;
            r := '"caught"';
        END;
        out := out || jsonb_build_object(s->>'id', r);
        IF (input->'sleep'->>'after')::integer = i THEN
            PERFORM ds_sleep('nap', make_interval(secs => (input->'sleep'->>'ms')::integer / 1000.0));
        END IF;
        IF (input->'event'->>'after')::integer = i THEN
            out := out || jsonb_build_object('event', ds_await_event('ev', input->'event'->>'name'));
        END IF;
    END LOOP;
    RETURN out;
END
\$\$;
EOF
	die "setting up the database failed:\n$err\n" if $rc;
	$HAVE_IN_FORCE = value("SELECT to_regprocedure('durable_steps.ds_partitions_in_force_publish()') IS NOT NULL") eq 't' ? 1 : 0;
}

# FAN: the trial's fan-out run succeeded with its map's results in order and its child's
# answer; each item's effect and the child's is there once (kill -9, restarts and the failover
# included); no more than 2 of the map's items ran at once (its concurrency: from a claim's
# commit to the outcome, as the queue limit); the child was started once, linked to its step.
sub check_fanout
{
	my ($run) = @_;
	my @v;
	# settled with the clients' work, it ends soon after: polled, bounded
	my $deadline = time() + $cfg{settle_timeout};
	while (time() < $deadline
		&& (value("SELECT count(*) FROM ds_runs WHERE run_id = " . lit($run)
			  . " AND status IN ('pending', 'running', 'waiting')") // 1) > 0)
	{
		usleep(100_000);
	}
	my $r = rows("SELECT status, output, coalesce(error_code, '') || ' ' || coalesce(error_message, '') "
		  . "FROM ds_runs WHERE run_id = " . lit($run));
	my $want = $json->encode({ map => [ map { 2 * $_ } 1 .. 8 ], kid => 'kid' });
	if (!@$r) { push @v, [ 'fan-out', "run $run does not exist" ]; return @v; }
	my $got = $r->[0][0] eq 'succeeded' ? eval { $json->encode($json->decode($r->[0][1])) } // '' : '';
	push @v, [ 'fan-out', "run $run is $r->[0][0] ($r->[0][2]) with output $r->[0][1]; its map and child make it $want" ]
	  if $got ne $want;
	my $e = rows("SELECT n, count(*) FROM fh_fan_effects WHERE run_id = " . lit($run) . " GROUP BY n ORDER BY n");
	my %seen = map { ($_->[0] => $_->[1]) } @$e;
	for my $n (0 .. 8)
	{
		my $c = $seen{$n} // 0;
		push @v, [ 'fan-out', "run $run: the effect of " . ($n ? "item $n" : 'its child') . " is there $c times" ]
		  if $c != 1;
	}
	push @v, [ 'fan-out', "run $run: ${\ scalar @$e} effects, of items it never had" ] if grep { $_->[0] > 8 } @$e;
	my $over = rows(
		"WITH w AS (SELECT a.step_id, a.attempt, a.claimed_at, a.finished_at FROM ds_attempts a "
		  . "WHERE a.run_id = " . lit($run) . " AND a.step_id LIKE 'fan/%' AND a.executor = 'worker') "
		  . "SELECT x.step_id || ' attempt ' || x.attempt, count(*) FROM w x JOIN w y "
		  . "ON y.claimed_at <= x.claimed_at AND y.finished_at > x.claimed_at GROUP BY 1 HAVING count(*) > 2");
	push @v, [ 'fan-out', "run $run: $_->[0] began while $_->[1] items of its map ran (concurrency 2)" ] for @$over;
	my $kids = value("SELECT count(*) || ' ' || coalesce(string_agg(parent_run_id || ':' || parent_step, ','), '') "
		  . "FROM durable_steps.runs WHERE run_id LIKE " . lit("$run/%"));
	push @v, [ 'fan-out', "run $run: its children are '$kids', not its one child of step kid" ]
	  if $kids ne "1 $run:kid";
	return @v;
}

# ---- step plans ---------------------------------------------------------------------------------

# The expected outcome of each scripted action: class and SQLSTATE.
my %ACTION = (
	ok => [ 'completed',   '' ],
	ra => [ 'retryable',   'DS002' ],
	rx => [ 'retryable',   'P0001' ],
	nr => [ 'permanent',   'DS001' ],
	ix => [ 'permanent',   'XX000' ],
	bk => [ 'correctable', 'DS003' ],
	dz => [ 'correctable', '22012' ],
	# in the worker it ends its executor, which records it as lost (DS007), as the walk allows
	ig => [ 'retryable',   'P0001' ],
);

# A task's scripted actions (TASK_WORKER's handler) and what each records: class and error_code
my %TASK_ACTION = (
	ok => [ 'completed',   '' ],
	rx => [ 'retryable',   'ScriptedRetry' ],
	ra => [ 'retryable',   'fh_ra' ],
	nr => [ 'permanent',   'fh_nr' ],
	bk => [ 'correctable', 'fh_bk' ],
);
# The failures a task's worker records when a fault cut its handler's connection (the class of
# psycopg2's exception: the connection lost, the server shutting down or starting, the old
# primary of a failover): retryable, like a lost lease
my $TASK_CUT_RE = qr/^(?:OperationalError|InterfaceError|DatabaseError|AdminShutdown|CrashShutdown|CannotConnectNow|ReadOnlySqlTransaction)$/;

sub pick { return $_[ int rand @_ ] }

# One step's script: its kind, plan (input), policy and whether it is re-armed once it stops.
# $sql_only: never an HTTP step (the procedure's, proc_main).
sub make_step
{
	my ($sql_only) = @_;
	return make_http_step() if !$sql_only && rand() < $cfg{http_share};
	my $r = rand();
	my $fail = sub { return map { pick('ra', 'rx') } 1 .. $_[0] };
	my ($kind, @p, $m);
	if ($r < 0.20) { $kind = 'ok'; $m = 1 + int rand 3; }
	elsif ($r < 0.55)
	{
		$kind = 'retry';
		my $k = 1 + int rand 3;
		@p = $fail->($k);
		$m = $k + 1 + int rand 3;
	}
	elsif ($r < 0.65) { $kind = 'exhaust'; $m = 1 + int rand 3; @p = $fail->($m + 3); }
	elsif ($r < 0.75)
	{
		$kind = 'permanent';
		my $j = int rand 3;
		@p = ($fail->($j), pick('nr', 'ix'));
		$m = $j + 1 + int rand 3;
	}
	else
	{
		$kind = $r < 0.88 ? 'blocked' : 'rearm';
		my $j = int rand 3;
		@p = ($fail->($j), pick('bk', 'dz'));
		$m = $j + 1 + int rand 3;
	}
	# a third of the bodies are slow (a window for faults); a fifth of the steps wait a while
	# between attempts, so that the worker still has work after the clients are done
	my $sleep = rand() < 0.3 ? 20 + int rand 100 : int rand 6;
	my $slow = rand() < 0.2;
	my $ra = $slow ? 100 + int rand 500 : int rand 30;
	# a tenth are cancelled with ds_cancel_step (not the re-arm steps: their re-arming client needs
	# them blocked or failed): half at a random moment of the trial's first 3 s, half as soon as
	# an attempt of theirs runs in the worker; the bodies of those sleep 150-300 ms
	my $cancel_at = ($kind ne 'rearm' && rand() < 0.1) ? rand(3) : undef;
	my $cancel_running = defined $cancel_at && rand() < 0.5;
	if ($cancel_running) { $sleep = 150 + int rand 150; $cancel_at = 0; }
	# one in twenty sleeps 1.2-2 s at each attempt: two of them at once make both executors busy,
	# and the launcher starts an extra executor (README, "Fair share between roles") that the
	# faults can hit too
	$sleep = 1200 + int rand 800 if !defined $cancel_at && rand() < 0.05;
	# one step in twenty-five has a retryable failure whose body ignores its cancellation in the
	# worker ('ig'): its 1 s timeout cancels it, the executor ends 5 s later, and the claims of
	# its batch that had not started must get their attempt back (nothing lost, nothing charged).
	# Its other attempts must end as scripted within that 1 s: never one of the 1.2-2 s sleepers.
	my $timeout;
	if (($kind eq 'retry' || $kind eq 'exhaust') && rand() < 0.04 && !defined $cancel_at && $sleep < 1000)
	{
		$p[ int rand @p ] = 'ig';
		$timeout = '1 s';
	}
	my $input = { k => $kind, p => \@p, sleep => $sleep, ra => $ra };
	my $delay = $slow ? 50 + int rand 150 : int rand 30;
	my $backoff = pick('fixed', 'exponential');
	my $policy = { max_attempts => $m, initial_delay => $delay, max_delay => 200,
		backoff => $backoff, multiplier => 2 };
	# a quarter of the steps are deferred: every call only stores them, the worker runs attempt 1
	my $defer = rand() < 0.25 ? 1 : 0;
	# a quarter of the steps are in queue fh_serial, whose concurrency is 1: the worker never runs
	# two of its attempts at once, across both executors (the check "queue limit")
	my $queue = rand() < 0.25 ? 'fh_serial' : 'default';
	# a fifth of the deferred steps are of limit fh_key (concurrency 1 and 50 a second per key):
	# held, admitted and let go across the faults, never two of one key at once (the check
	# "limit key"); a synchronous step may not name a limit
	if ($defer && rand() < 0.2)
	{
		$policy->{limit} = 'fh_key';
		$policy->{limit_key} = pick('k1', 'k2', 'k3');
	}
	return {
		kind => $kind, plan => \@p, max => $m, sleep => $sleep, ra => $ra, defer => $defer,
		cancel_at => $cancel_at, cancel_running => $cancel_running, queue => $queue,
		delay => $delay, backoff => $backoff, timeout => $timeout,
		input => $json->encode($input), policy => $json->encode($policy),
		fixed_input => $json->encode({ %$input, p => [], fixed => JSON::PP::true }),
	};
}

# An HTTP step's script: a POST to /charge/TAG of the fake provider with a fault (or none), with
# the step's idempotency key or (a fifth of them) without one. Kinds:
#   h_ok      no fault: succeeds at attempt 1
#   h_5xx     500 or 503 before charging on the first `times` requests (fewer than max_attempts:
#             succeeds at attempt times+1; h_exhaust: more, fails exhausted, never charged)
#   h_429     429 with Retry-After: 1 on the first request, then charged: succeeds at attempt 2,
#             at least 1 s after attempt 1
#   h_delay   charged, then answered 3 s later, past the step's timeout of 1 s (DS012)
#   h_drop    charged, then the connection closed without an answer (DS012)
# With the key the provider answers a repeat from its record: h_delay and h_drop succeed at
# attempt 2 with the one charge. Without it they end uncertain at attempt 1 (never sent again).
sub make_http_step
{
	my $r = rand();
	my $keyed = rand() < 0.8 ? 1 : 0;
	my ($kind, $fault, $m, $times) = ('', '', 1 + int rand 3, 0);
	if ($r < 0.25) { $kind = 'h_ok' }
	elsif ($r < 0.45)
	{
		$kind = 'h_5xx';
		$fault = pick('500', '503');
		$times = 1 + int rand 2;
		$m = $times + 1 + int rand 2;
	}
	elsif ($r < 0.52)
	{
		$kind = 'h_exhaust';
		$fault = pick('500', '503');
		$m = 1 + int rand 2;
		$times = $m + 3;
	}
	elsif ($r < 0.65) { $kind = 'h_429'; $fault = '429s'; $m = 2 + int rand 2; }
	elsif ($r < 0.83) { $kind = 'h_delay'; $fault = 'delay'; $m = 2 + int rand 2; }
	else { $kind = 'h_drop'; $fault = 'drop'; $m = 2 + int rand 2; }
	my $delay = int rand 30;
	my $backoff = pick('fixed', 'exponential');
	my $policy = { max_attempts => $m, initial_delay => $delay, max_delay => 200,
		backoff => $backoff, multiplier => 2 };
	return {
		http => 1, kind => $kind, keyed => $keyed, fault => $fault, times => $times, max => $m,
		timeout => $fault eq 'delay' ? '1 s' : '10 s', delay => $delay, backoff => $backoff,
		policy => $json->encode($policy), plan => [], defer => 0, queue => 'default',
		body => { amount => 100 + int rand 9900, currency => pick('EUR', 'USD') },
	};
}

# Makes a step (one in ten of those that qualify, while the trial's budget lasts) a stubborn
# one: its on_success or on_failure hook, in an executor, ignores its cancellation until the
# executor is ended (fh_hook). Its timeout, which bounds the hook too, is 1 s: the executor ends
# about 6 s after the hook began (the grace is 5 s). Returns 1 when it did.
#   SQL: a step that succeeds at attempt K (kind ok or retry: on_success) or fails permanently at
#     K (kind permanent: on_failure, max_attempts made more than K), deferred so that attempt K
#     runs in the worker, its hook stubborn at attempt K only. The outcome's transaction ends with
#     its executor: attempt K is lost (DS007) and retried by the policy (docs/worker.md, "Lost
#     attempts"), the body's effect and the hook's row rolled back; attempt K+1 ends as scripted
#     beyond the plan (succeeds) with a hook that returns. When K is the step's last attempt
#     (on_success), the loss fails it for good (failed/exhausted) and on_failure runs: a lost
#     on_success is not a hook the loss would run again. on_failure is never stubborn at an
#     attempt that may be a step's last (whoever records that loss blocks the step instead:
#     TAP 065 shows it).
#   HTTP: h_ok, h_5xx, h_429, on_success stubborn at every attempt: the answered step ends blocked
#     by its lost hook (DS007), the response kept, the hook never run again by itself
#     (docs/http.md, "Outcome hooks").
sub pick_stubborn
{
	my ($st, $budget) = @_;
	return 0 if $$budget <= 0 || rand() >= 0.1;
	if ($st->{http})
	{
		return 0 unless $st->{kind} =~ /^h_(?:ok|5xx|429)$/;
		$st->{stubborn} = { hook => 'on_success', at => 0 };
		$st->{timeout} = '1 s';
	}
	else
	{
		return 0 if defined $st->{cancel_at} || $st->{sleep} >= 1000 || grep { $_ eq 'ig' } @{ $st->{plan} };
		my $k = @{ $st->{plan} };
		if ($st->{kind} eq 'ok' || $st->{kind} eq 'retry') { $st->{stubborn} = { hook => 'on_success', at => $k + 1 }; }
		elsif ($st->{kind} eq 'permanent')
		{
			$st->{stubborn} = { hook => 'on_failure', at => $k };
			if ($st->{max} <= $k)
			{
				$st->{max} = $k + 1;
				my $pol = $json->decode($st->{policy});
				$pol->{max_attempts} = $st->{max};
				$st->{policy} = $json->encode($pol);
			}
		}
		else { return 0 }
		$st->{defer} = 1;
		$st->{timeout} = '1 s';
	}
	$$budget--;
	return 1;
}

# The provider's tag of an HTTP step (its URL's last segment), and its request.
sub http_tag { my ($st) = @_; return "$st->{run}-" . ($st->{tag_step} // $st->{step}) }

# The key a step sends (README, "Keys"): ':' and '\' of each part escaped with '\', the parts
# joined by ':', then every byte that is not visible ASCII, and '%', written %XX.
sub wire_key
{
	my ($run, $step) = @_;
	my $id = join ':', map { (my $p = $_) =~ s/([:\\])/\\$1/g; $p } $run, $step;
	$id =~ s/([^\x21-\x7e]|%)/sprintf('%%%02X', ord $1)/ge;
	return $id;
}

sub http_request
{
	my ($st) = @_;
	my $q = $st->{fault} eq '' ? ''
	  : "?fault=$st->{fault}" . ($st->{times} ? "&times=$st->{times}" : '')
	  . ($st->{fault} eq 'delay' ? '&secs=' . ($st->{secs} // 3) : '');
	return { method => 'POST', url => "http://127.0.0.1:$provider_port/charge/" . http_tag($st) . $q,
		expect => 'json', json => $st->{body} };
}

# The hog's slow SQL step (hog_main): deferred (the worker runs every attempt), at priority 0 (the
# best a role without durable_steps_admin may ask for), in a queue of its own naming, in default or
# (a third) in fh_serial, whose one slot the others' steps share; its body sleeps hog_sleep ms at
# every attempt. 60 % succeed at attempt 1, the others fail retryably (a plain RAISE) at attempt 1
# and succeed at 2; max_attempts 4.
sub make_hog_step
{
	my @p = rand() < 0.4 ? ('rx') : ();
	my $kind = @p ? 'retry' : 'ok';
	my $sleep = $cfg{hog_sleep}[0] + int rand($cfg{hog_sleep}[1] - $cfg{hog_sleep}[0]);
	my $input = { k => $kind, p => \@p, sleep => $sleep, ra => 0 };
	my $delay = int rand 30;
	my $policy = { max_attempts => 4, initial_delay => $delay, max_delay => 200, backoff => 'fixed',
		multiplier => 2 };
	return {
		hog => 1, kind => $kind, plan => \@p, max => 4, sleep => $sleep, ra => 0, defer => 1,
		queue => pick('fh_hog_a', 'fh_hog_b', 'fh_hog_c', 'default', 'fh_serial', 'fh_serial'),
		priority => 0, delay => $delay, backoff => 'fixed', timeout => undef,
		input => $json->encode($input), policy => $json->encode($policy),
	};
}

# The hog's hanging HTTP step: a POST the provider charges and answers only hog_hang s later
# (fault=delay&secs=...), within the step's timeout of 10 s: in flight for seconds, it succeeds at
# attempt 1 (kind h_hang). Half carry the step's key, half none: a request without a key that a
# fault (the failover above all) catches in flight ends uncertain and is never sent again.
sub make_hog_http_step
{
	my $secs = $cfg{hog_hang}[0] + rand($cfg{hog_hang}[1] - $cfg{hog_hang}[0]);
	my $delay = int rand 30;
	my $policy = { max_attempts => 3, initial_delay => $delay, max_delay => 200, backoff => 'fixed',
		multiplier => 2 };
	return {
		hog => 1, http => 1, kind => 'h_hang', keyed => rand() < 0.5 ? 1 : 0, fault => 'delay',
		secs => sprintf('%.1f', $secs), times => 0, max => 3, timeout => '10 s', delay => $delay,
		backoff => 'fixed', policy => $json->encode($policy), plan => [], defer => 0, queue => 'default',
		body => { amount => 100 + int rand 9900, currency => pick('EUR', 'USD') },
	};
}

# A task's script (ds_task_step, run by TASK_WORKER's handler in a task worker), its policy, and
# what a lost lease does to it. Kinds:
#   ok         succeeds at attempt 1 (30 %)
#   retry      fails retryably 1-2 times (rx, or ra: RetryAfterError), then succeeds
#              (max_attempts above that; 35 %)
#   permanent  fails retryably 0-1 times, then NonRetriableError (15 %)
#   rearm      fails retryably 0-1 times, then BlockedError; rearm_main re-arms it with a
#              corrected input (ds_retry_step) once it has stopped, and it succeeds (20 %)
# A fifth of the ok and retry tasks are stored with on_lost => 'uncertain': a lost lease makes
# them uncertain, never run again by themselves ($uncertain: one of those, ok or retry, whatever
# the draw). Handlers sleep in their transaction, after their effect: 20-150 ms, a third
# 300-900 ms, one in eight 1.8-2.5 s (past the lease: heartbeats keep it), a window for the faults.
sub make_task
{
	my ($uncertain) = @_;
	my $r = $uncertain ? rand(0.65) : rand();
	my $fail = sub { return map { pick('ra', 'rx') } 1 .. $_[0] };
	my ($kind, @p, $m);
	if ($r < 0.30) { $kind = 'ok'; $m = 1 + int rand 3; }
	elsif ($r < 0.65)
	{
		$kind = 'retry';
		my $k = 1 + int rand 2;
		@p = $fail->($k);
		$m = $k + 1 + int rand 3;
	}
	elsif ($r < 0.80)
	{
		$kind = 'permanent';
		my $j = int rand 2;
		@p = ($fail->($j), 'nr');
		$m = $j + 1 + int rand 3;
	}
	else
	{
		$kind = 'rearm';
		my $j = int rand 2;
		@p = ($fail->($j), 'bk');
		$m = $j + 1 + int rand 3;
	}
	$uncertain = 1 if ($kind eq 'ok' || $kind eq 'retry') && rand() < 0.2;
	my $s = rand();
	my $sleep = $s < 0.125 ? 1800 + int rand 700 : $s < 0.45 ? 300 + int rand 600 : 20 + int rand 130;
	my $ra = 100 + int rand 300;
	my $delay = 10 + int rand 40;
	my $backoff = pick('fixed', 'exponential');
	my $input = { k => $kind, p => \@p, sleep => $sleep, ra => $ra };
	my $policy = { max_attempts => $m, initial_delay => $delay, max_delay => 200,
		backoff => $backoff, multiplier => 2 };
	return {
		task => 1, kind => $kind, plan => \@p, max => $m, sleep => $sleep, ra => $ra,
		uncertain => $uncertain ? 1 : 0, defer => 0, queue => 'default', delay => $delay, backoff => $backoff,
		input => $json->encode($input), policy => $json->encode($policy),
		fixed_input => $json->encode({ %$input, p => [], fixed => JSON::PP::true }),
	};
}

# A run's SQL step (ds_step in fh_workflow), scripted like a plain step by fh_body's plan:
#   ok         succeeds at attempt 1 (35 %)
#   retry      fails retryably 1-2 times, then succeeds (max_attempts above that; 47 %)
#   exhaust    fails retryably more often than max_attempts (1-2): DS102 in the workflow (12 %)
#   permanent  fails retryably 0-1 times, then ds_non_retriable: DS102 in the workflow (6 %)
# 60 % of the exhausted and permanent ones are caught by the workflow, the others fail the run.
sub make_run_step
{
	my $r = rand();
	my $fail = sub { return map { pick('ra', 'rx') } 1 .. $_[0] };
	my ($kind, @p, $m);
	if ($r < 0.35) { $kind = 'ok'; $m = 1 + int rand 2; }
	elsif ($r < 0.82)
	{
		$kind = 'retry';
		my $k = 1 + int rand 2;
		@p = $fail->($k);
		$m = $k + 1 + int rand 2;
	}
	elsif ($r < 0.94) { $kind = 'exhaust'; $m = 1 + int rand 2; @p = $fail->($m + 3); }
	else
	{
		$kind = 'permanent';
		my $j = int rand 2;
		@p = ($fail->($j), 'nr');
		$m = $j + 1 + int rand 2;
	}
	my $catch = ($kind eq 'exhaust' || $kind eq 'permanent') && rand() < 0.6 ? 1 : 0;
	# a third of the bodies are slow: a window for the faults and for ds_cancel_run
	my $sleep = rand() < 0.3 ? 20 + int rand 100 : int rand 6;
	my $ra = int rand 30;
	my $delay = int rand 30;
	my $backoff = pick('fixed', 'exponential');
	return {
		run_step => 1, kind => $kind, plan => \@p, max => $m, sleep => $sleep, ra => $ra,
		delay => $delay, backoff => $backoff, catch => $catch, defer => 0, queue => 'default',
		in => { k => $kind, p => \@p, sleep => $sleep, ra => $ra },
		pol => { max_attempts => $m, initial_delay => $delay, max_delay => 200, backoff => $backoff,
			multiplier => 2 },
	};
}

# A run of fh_workflow: 2-4 SQL steps (make_run_step), half of the runs a ds_sleep of 50-450 ms
# after one of them, 60 % an event wait after one of them, the event emitted by a client
# session of the owner anywhere in its queue (before the run starts, before the wait, or after).
# A fifth are cancelled with ds_cancel_run at a random moment of the trial's first 3 s.
sub make_run
{
	my ($id) = @_;
	my $n = 2 + int rand 3;
	my @st = map { make_run_step() } 1 .. $n;
	for my $j (0 .. $#st) { $st[$j]{run} = $id; $st[$j]{step} = 's' . ($j + 1); $st[$j]{pos} = $j; }
	my $run = { id => $id, steps => \@st };
	$run->{sleep} = { after => int rand $n, ms => 50 + int rand 400 } if rand() < 0.5;
	$run->{event} = { after => int rand $n, name => "$id:ev", payload => { v => int rand 1_000_000 } }
	  if rand() < 0.6;
	$run->{cancel_at} = rand(3) if rand() < 0.2;
	my $input = { steps => [ map { { id => $_->{step}, in => $_->{in}, policy => $_->{pol},
		catch => $_->{catch} ? JSON::PP::true : JSON::PP::false } } @st ] };
	$input->{sleep} = $run->{sleep} if $run->{sleep};
	$input->{event} = { after => $run->{event}{after}, name => $run->{event}{name} } if $run->{event};
	$run->{input} = $json->encode($input);
	return $run;
}

# Fisher-Yates with rand(), so that --seed reproduces the order
sub shuffled
{
	my @l = @_;
	for (my $i = $#l; $i > 0; $i--)
	{
		my $j = int rand($i + 1);
		@l[ $i, $j ] = @l[ $j, $i ];
	}
	return \@l;
}

sub lit { my ($s) = @_; $s =~ s/'/''/g; return "'$s'" }

# The outcome hooks every step is called with: each records the outcome it was given. A
# stubborn step's (pick_stubborn) records it too, through fh_hook, and then, in an executor at
# its attempt, ignores its cancellation until the executor is ended.
sub hook_sql
{
	my ($hook, $st) = @_;
	my $sb = $st->{stubborn};
	return "SELECT fh_hook(\$1, '$hook', $sb->{at})" if $sb && $sb->{hook} eq $hook;
	return "INSERT INTO fh_hooks(run_id, step_id, hook, status, attempt) "
	  . "SELECT \$1->>'run_id', \$1->>'step_id', '$hook', \$1->>'status', (\$1->>'attempt')::integer";
}

sub call_sql
{
	my ($idx, $st, $nowait, $pause_ms) = @_;
	my $sql = '';
	# (not part of the step's definition: every call of the step passes the same)
	my $run_at = defined $st->{run_at} ? sprintf(', run_at => to_timestamp(%.3f)', $st->{run_at}) : '';
	$sql .= sprintf("SELECT pg_sleep(%.3f);\n", $pause_ms / 1000) if $pause_ms;
	if ($st->{task})
	{
		return $sql . sprintf(
			"SELECT 'ack', %d, status, coalesce(attempt, 0), replayed FROM ds_task_step(%s, %s, '$TASK', %s::jsonb, %s::jsonb, on_success => %s, on_failure => %s, on_lost => %s);\n",
			$idx, lit($st->{run}), lit($st->{step}), lit($st->{input}), lit($st->{policy}),
			lit(hook_sql('on_success', $st)), lit(hook_sql('on_failure', $st)),
			$st->{uncertain} ? "'uncertain'" : "'retry'");
	}
	if ($st->{http})
	{
		return $sql . sprintf(
			"SELECT 'ack', %d, status, attempt, replayed FROM ds_http_step(%s, %s, %s::jsonb, %s::jsonb, idempotency_header => %s, timeout => %s, nowait => %s, on_success => %s, on_failure => %s%s);\n",
			$idx, lit($st->{run}), lit($st->{step}), lit($json->encode(http_request($st))), lit($st->{policy}),
			$st->{keyed} ? "'Idempotency-Key'" : 'NULL', lit($st->{timeout}), $nowait ? 'true' : 'false',
			lit(hook_sql('on_success', $st)), lit(hook_sql('on_failure', $st)), $run_at);
	}
	$sql .= sprintf(
		"SELECT 'ack', %d, status, attempt, replayed FROM ds_run_step(%s, %s, 'SELECT fh_body(\$1)', %s::jsonb, %s::jsonb, nowait => %s, defer => %s, on_success => %s, on_failure => %s, queue => %s, timeout => %s%s%s);\n",
		$idx, lit($st->{run}), lit($st->{step}), lit($st->{input}), lit($st->{policy}),
		$nowait ? 'true' : 'false', $st->{defer} ? 'true' : 'false',
		lit(hook_sql('on_success', $st)), lit(hook_sql('on_failure', $st)), lit($st->{queue}),
		defined $st->{timeout} ? lit($st->{timeout}) . '::interval' : 'NULL',
		defined $st->{priority} ? ", priority => $st->{priority}" : '', $run_at);
	return $sql;
}

# ---- client sessions (forked children) ----------------------------------------------------------

# Runs its calls in order, one psql per stretch of calls (ON_ERROR_STOP): the calls acknowledged
# by a printed row committed; after a connection failure the rest run again in a new session (a
# call is an idempotent ds_run_step), and after a call refused by a fenced partition (DS201) too;
# another SQL error is recorded against the first unanswered call.
# Writes "ack idx status attempt replayed", "err idx sqlstate message" and "stat reconnects
# fenced" (fenced: the calls refused with DS201).
sub client_main
{
	my ($role, $calls, $outfile, $deadline, $start_delay) = @_;
	usleep($start_delay * 1e6) if $start_delay;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my @queue = @$calls;
	my ($reconnects, $fenced, $unknown, $round) = (0, 0, 0, 0);
	while (@queue)
	{
		if (time() > $deadline)
		{
			print $fh "err\t$_->{idx}\tTIMEOUT\tnot answered before the clients' deadline\n"
			  for @queue;
			last;
		}
		my $left = $deadline - time();
		# a file, not stdin: a psql that stops early (lost connection, ON_ERROR_STOP) must not
		# leave IPC::Run writing into a closed pipe
		$round++;
		open my $sf, '>', "$outfile.$round.sql" or die "$outfile.$round.sql: $!";
		print $sf map { $_->{sql} } @queue;
		close $sf;
		my ($rc, $out, $err) = run_cmd([ @{ psql_cmd($role) }, '-f', "$outfile.$round.sql" ],
			timeout => $left < 5 ? 5 : $left);
		unlink "$outfile.$round.sql";
		my %acked;
		for my $line (split /\n/, $out)
		{
			my @f = split /$US/, $line, -1;
			next unless @f >= 5 && $f[0] eq 'ack';
			$acked{ $f[1] } = 1;
			print $fh join("\t", 'ack', @f[ 1 .. 4 ]), "\n";
		}
		@queue = grep { !$acked{ $_->{idx} } } @queue;
		last unless @queue;
		my $what = round_error($fh, \@queue, $err, $rc, \$unknown);
		if ($what eq 'fenced')
		{
			$fenced++;
			usleep(50_000 + int rand 150_000);
			next;
		}
		if ($what eq 'transient')
		{
			$reconnects++;
			usleep(50_000 + int rand 150_000);
			next;
		}
		next if $what eq 'charged';
		usleep(100_000);
	}
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# What a client does after a round whose calls @$queue are still unanswered, by its error:
# 'fenced' (a partition was fenced, DS201) and 'transient' (the server went away) are the
# caller's to count and pause for; an error with a SQLSTATE is charged to the first queued call
# ('charged'); an error of another kind is charged after 20 rounds of it (*$unknown counts them).
sub round_error
{
	my ($fh, $queue, $err, $rc, $unknown) = @_;
	return 'fenced'    if $err =~ $fenced_re;
	return 'transient' if $err =~ $transient_re;
	if ($err =~ /ERROR:\s+([0-9A-Z]{5}):\s*([^\n]*)/)
	{
		my $c = shift @$queue;
		print $fh "err\t$c->{idx}\t$1\t$2\n";
		$$unknown = 0;
		return 'charged';
	}
	if (++$$unknown > 20)
	{
		my $c = shift @$queue;
		(my $e = $err) =~ s/\s+/ /g;
		print $fh "err\t$c->{idx}\tUNKNOWN\tpsql exit $rc: $e\n";
		$$unknown = 0;
	}
	return '';
}

# The procedure's client: CALLs fh_proc (setup_database) as $role with its steps, a procedure
# that stores each step with ds_run_step, COMMITs and pauses, in a loop: the session keeps the
# settings it began with for the whole CALL, across the fences meanwhile. After each CALL (or its
# end by an error, a lost connection) it reads fh_proc_log: the steps whose rows committed are
# answered ("ack", as client_main writes it: the status and attempt ds_run_step returned in that
# committed transaction). A CALL refused with DS201 (a step of a fenced partition) is counted as
# a fenced refusal, and, after a pause, the procedure is CALLed again with the rest, as after a
# lost connection (each step's identity is fixed: a step stored before is passed over, one whose
# transaction did not commit is stored again); another SQL error is recorded against the step the
# procedure was at (the first not logged) and that step dropped.
# Writes "ack idx status attempt replayed", "err idx sqlstate message", "proc calls refused"
# (CALLs made, and ended by DS201) and "stat reconnects fenced".
sub proc_main
{
	my ($role, $calls, $outfile, $deadline, $start_delay) = @_;
	usleep($start_delay * 1e6) if $start_delay;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my @queue = @$calls;
	my ($reconnects, $fenced, $ncalls, $unknown, $round) = (0, 0, 0, 0, 0);
	my $spec = sub {
		my ($c) = @_;
		my $st = $c->{st};
		return { idx => $c->{idx}, run => $st->{run}, step => $st->{step}, input => $json->decode($st->{input}),
			policy => $json->decode($st->{policy}), defer => $st->{defer} ? JSON::PP::true : JSON::PP::false,
			queue => $st->{queue}, timeout => $st->{timeout}, on_success => hook_sql('on_success', $st),
			on_failure => hook_sql('on_failure', $st), pause => $st->{pause} };
	};
	while (@queue)
	{
		if (time() > $deadline)
		{
			print $fh "err\t$_->{idx}\tTIMEOUT\tnot answered before the clients' deadline\n" for @queue;
			last;
		}
		my $left = $deadline - time();
		$round++;
		$ncalls++;
		open my $sf, '>', "$outfile.$round.sql" or die "$outfile.$round.sql: $!";
		print $sf "CALL fh_proc(" . lit($json->encode([ map { $spec->($_) } @queue ])) . "::jsonb);\n";
		close $sf;
		my ($rc, $out, $err) = run_cmd([ @{ psql_cmd($role) }, '-f', "$outfile.$round.sql" ],
			timeout => $left < 5 ? 5 : $left);
		unlink "$outfile.$round.sql";
		# what committed: the log rows of its steps (read again while the server comes back)
		my $list = join ', ', map { '(' . lit($_->{st}{run}) . ', ' . lit($_->{st}{step}) . ')' } @queue;
		my %logged;
		while (1)
		{
			my ($lrc, $lout, $lerr) = psql($role,
				"SELECT 'log', idx, status, attempt, replayed FROM fh_proc_log WHERE (run_id, step_id) IN ($list);\n",
				timeout => 30);
			if ($lrc == 0)
			{
				for my $line (split /\n/, $lout)
				{
					my @f = split /$US/, $line, -1;
					next unless @f >= 5 && $f[0] eq 'log';
					$logged{ $f[1] } = 1;
					print $fh join("\t", 'ack', @f[ 1 .. 4 ]), "\n";
				}
				last;
			}
			die "proc_main: reading fh_proc_log failed: $lerr\n" if $lerr !~ $transient_re || time() > $deadline + 30;
			$reconnects++;
			usleep(100_000);
		}
		@queue = grep { !$logged{ $_->{idx} } } @queue;
		last unless @queue;
		my $what = round_error($fh, \@queue, $err, $rc, \$unknown);
		if ($what eq 'fenced')
		{
			$fenced++;
			usleep(100_000 + int rand 200_000);
			next;
		}
		if ($what eq 'transient')
		{
			$reconnects++;
			usleep(50_000 + int rand 150_000);
			next;
		}
		next if $what eq 'charged';
		usleep(100_000);
	}
	print $fh "proc\t$ncalls\t$fenced\n";
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Re-arms each of its steps once with corrected input (ds_retry_step as the owner) as soon as
# it has stopped (blocked, or failed); a step counts as re-armed when ds_steps shows that input,
# and needs none when it succeeded without (see check_step).
sub rearm_main
{
	my ($steps, $outfile, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my %todo = map { ("$_->{run}/$_->{step}" => $_) } @$steps;
	my $list = join ', ', map { '(' . lit($_->{run}) . ', ' . lit($_->{step}) . ')' } @$steps;
	my ($reconnects, $fenced) = (0, 0);
	while (%todo && time() < $deadline)
	{
		my ($rc, $out, $err) = psql($SU,
			"SELECT run_id, step_id, status, coalesce(input->>'fixed', '') FROM ds_steps "
			  . "WHERE (run_id, step_id) IN ($list)");
		if ($rc != 0) { $reconnects++; usleep(100_000); next; }
		for my $line (split /\n/, $out)
		{
			my ($run, $step, $status, $fixed) = split /$US/, $line, -1;
			my $st = $todo{"$run/$step"} or next;
			# a lost attempt can use up the number scripted to block: then the step succeeds
			if ($fixed eq 'true' || $status eq 'succeeded') { delete $todo{"$run/$step"}; next; }
			next unless $status eq 'failed' || $status eq 'blocked';
			my ($rc2, $out2, $err2) = psql($st->{role},
				sprintf("SELECT 'ack', status FROM ds_retry_step(%s, %s, %s::jsonb);\n",
					lit($run), lit($step), lit($st->{fixed_input})));
			if ($out2 =~ /^ack$US(\w+)/m) { print $fh "rearm\t$run\t$step\t$1\n"; }
			elsif ($err2 =~ $fenced_re) { $fenced++; }
			elsif ($err2 =~ $transient_re) { $reconnects++; }
			elsif ($err2 =~ /ERROR:\s+([0-9A-Z]{5}):\s*([^\n]*)/ && $1 ne 'DS103')
			{
				print $fh "err\t$run\t$step\t$1\t$2\n";
				delete $todo{"$run/$step"};
			}
		}
		usleep(50_000);
	}
	print $fh "left\t$_\n" for sort keys %todo;
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Cancels each of its steps with ds_cancel_step, as the owner, $st->{cancel_at} seconds after the
# clients started: whatever the step is doing then (not created yet, running in a caller or in the
# worker, waiting to retry, finished). Writes "cancel run step status calls" when the call
# answered (calls: how many it took, counting those whose connection was lost and not those a
# fence refused with DS201), "done run step" when the step had already succeeded or failed
# (DS103), "err ..." otherwise.
sub cancel_main
{
	my ($steps, $outfile, $start, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my ($reconnects, $fenced) = (0, 0);
	for my $st (sort { $a->{cancel_at} <=> $b->{cancel_at} } @$steps)
	{
		my $wait = $start + $st->{cancel_at} - time();
		my $calls = 0;
		usleep($wait * 1e6) if $wait > 0;
		while (1)
		{
			$calls++;
			if (time() > $deadline)
			{
				print $fh "err\t$st->{run}\t$st->{step}\tTIMEOUT\tnot cancelled before the deadline\n";
				last;
			}
			# half of them first wait (up to 3 s, in the server) for an attempt of the step to
			# be running in the worker (or for the step to stop), so that the cancellation stops
			# a running attempt; their bodies are slow (make_step)
			my $wait_sql = !$st->{cancel_running} ? '' : sprintf(
				"DO \$\$ BEGIN FOR i IN 1 .. 600 LOOP EXIT WHEN EXISTS (SELECT FROM ds_steps WHERE run_id = %s "
				  . "AND step_id = %s AND status NOT IN ('pending', 'retrying')); PERFORM pg_sleep(0.005); "
				  . "END LOOP; END \$\$;\n",
				lit($st->{run}), lit($st->{step}));
			my ($rc, $out, $err) = psql($st->{role},
				$wait_sql . sprintf("SELECT 'ack', status FROM ds_cancel_step(%s, %s);\n", lit($st->{run}), lit($st->{step})),
				timeout => 60);
			if ($out =~ /^ack$US(\w+)/m) { print $fh "cancel\t$st->{run}\t$st->{step}\t$1\t$calls\n"; last }
			if ($err =~ /ERROR:\s+DS103:/) { print $fh "done\t$st->{run}\t$st->{step}\n"; last }
			# not created yet (its client has not called), or the server is restarting: a call
			# whose connection was lost may or may not have committed, and repeating it is safe
			# (cancelling a cancelled step returns it); or its partition is fenced: that call
			# changed nothing, and counts as none
			if ($err =~ $fenced_re) { $fenced++; $calls--; usleep(50_000); next }
			if ($err =~ /ERROR:\s+DS404:/ || $err =~ $transient_re || $err !~ /ERROR:/)
			{
				$reconnects++ unless $err =~ /DS404/;
				usleep(50_000);
				next;
			}
			(my $e = $err) =~ s/\s+/ /g;
			print $fh "err\t$st->{run}\t$st->{step}\t$e\n";
			last;
		}
	}
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Idempotent requests (docs/idempotent-requests.md): calls ds_idempotent for each of its keys,
# in its own order, as $role; the other idempotent sessions call the same keys with the same
# request, so that duplicates arrive together, in flight and after. The handler inserts its
# effect and answers its id. A call whose connection was lost is made again (the same request
# under the same key is idempotent). Writes "ack key status effect replayed" for an answer,
# "err key sqlstate message" for an error, and "stat reconnects".
sub idem_main
{
	my ($role, $scope, $keys, $outfile, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my ($reconnects, $fenced) = (0, 0);
	my $handler = "WITH e AS (INSERT INTO fh_idem_effects (scope, key) VALUES (" . lit($scope)
	  . ", \$1->>'key') RETURNING id) SELECT 201, jsonb_build_object('effect', id) FROM e";
	for my $key (@$keys)
	{
		while (1)
		{
			if (time() > $deadline)
			{
				print $fh "err\t$key\tTIMEOUT\tnot answered before the clients' deadline\n";
				last;
			}
			my ($rc, $out, $err) = psql($role,
				sprintf("SELECT 'ack', status, body->>'effect', replayed FROM ds_idempotent(%s, %s, %s, %s, wait => '20 s');\n",
					lit($scope), lit($key), lit(qq({"key": "$key", "amount": 100})), lit($handler)),
				timeout => 60);
			if ($out =~ /^ack$US(\d+)$US(\d+)$US([tf])/m) { print $fh "ack\t$key\t$1\t$2\t$3\n"; last }
			if ($err =~ $fenced_re)
			{
				$fenced++;
				usleep(50_000 + int rand 150_000);
				next;
			}
			if ($err =~ /ERROR:\s+([0-9A-Z]{5}):\s*([^\n]*)/ && $err !~ $transient_re)
			{
				print $fh "err\t$key\t$1\t$2\n";
				last;
			}
			$reconnects++;
			usleep(50_000 + int rand 150_000);
		}
	}
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Waits for steps to stop (docs/steps.md, "Waiting for an outcome"): ds_wait_step on each of its
# steps, with a 3 s timeout, again and again until an answer says it stopped. A step not created
# yet, or a lost connection, is asked again. Writes "wait run step status attempt seconds" for
# every answer, with the seconds the call took in the server, and "stat reconnects".
sub waiter_main
{
	my ($role, $steps, $outfile, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my ($reconnects, $fenced) = (0, 0);
	for my $st (@$steps)
	{
		while (time() < $deadline)
		{
			my ($rc, $out, $err) = psql($role,
				sprintf("SELECT clock_timestamp() AS t0 \\gset\nSELECT 'ack', status, attempt, "
					  . "extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) FROM ds_wait_step(%s, %s, '3 s');\n",
					lit($st->{run}), lit($st->{step})),
				timeout => 60);
			if ($out =~ /^ack$US(\w+)$US(\d+)$US([0-9.]+)/m)
			{
				print $fh "wait\t$st->{run}\t$st->{step}\t$1\t$2\t$3\n";
				last if $1 =~ /^(?:succeeded|failed|blocked|uncertain|cancelled)$/;
				next;
			}
			if ($err =~ $fenced_re) { $fenced++ }
			elsif ($err !~ /DS404/) { $reconnects++ }
			usleep(100_000);
		}
	}
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Cancels each of its runs with ds_cancel_run, as the owner, $run->{cancel_at} seconds after the
# clients started, whatever the run is doing then (not started yet: repeated until it is;
# pending, running a turn, waiting, finished). Writes "cancel run status" when the call
# answered, "done run" when the run had already finished (DS103), "err ..." otherwise.
sub run_cancel_main
{
	my ($runs, $outfile, $start, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my ($reconnects, $fenced) = (0, 0);
	for my $run (sort { $a->{cancel_at} <=> $b->{cancel_at} } @$runs)
	{
		my $wait = $start + $run->{cancel_at} - time();
		usleep($wait * 1e6) if $wait > 0;
		while (1)
		{
			if (time() > $deadline)
			{
				print $fh "err\t$run->{id}\tTIMEOUT\tnot cancelled before the deadline\n";
				last;
			}
			my ($rc, $out, $err) = psql($run->{role},
				sprintf("SELECT 'ack', ds_cancel_run(%s);\n", lit($run->{id})), timeout => 60);
			if ($out =~ /^ack$US(\w+)/m) { print $fh "cancel\t$run->{id}\t$1\n"; last }
			if ($err =~ /ERROR:\s+DS103:/) { print $fh "done\t$run->{id}\n"; last }
			# not started yet, or the server is restarting (cancelling a cancelled run returns it),
			# or its partition is fenced
			if ($err =~ $fenced_re) { $fenced++; usleep(50_000); next }
			if ($err =~ /ERROR:\s+DS404:/ || $err =~ $transient_re || $err !~ /ERROR:/)
			{
				$reconnects++ unless $err =~ /DS404/;
				usleep(50_000);
				next;
			}
			(my $e = $err) =~ s/\s+/ /g;
			print $fh "err\t$run->{id}\t$e\n";
			last;
		}
	}
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# The hog (fh_hog): first asks once for a priority before everybody's (-100, in a transaction it
# rolls back: it must be refused, 42501), then makes its steps in order, each as soon as fewer
# than $backlog of its steps of that kind ($kind: 'sql' or 'http') are unfinished -- a wait in
# the server, polling ds_steps -- until the harness puts its stop sign (fh_hog_stop) up. One
# session per kind, so that each backlog stays full. Like client_main, it runs its calls through
# psql -f and runs the unanswered ones again in a new session after a connection failure.
# Writes "prio SQLSTATE|ok", "ack idx status attempt replayed", "err idx sqlstate message",
# "stop" (the sign seen) and "stat reconnects".
sub hog_main
{
	my ($kind, $calls, $hprefix, $backlog, $outfile, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my ($reconnects, $fenced) = (0, 0);
	while ($kind eq 'sql' && time() < $deadline)
	{
		my ($rc, $out, $err) = psql($HOG,
			"BEGIN;\nSELECT 'prio', status FROM ds_run_step(" . lit("${hprefix}prio") . ", 'p', 'SELECT 1', "
			  . "defer => true, priority => -100);\nROLLBACK;\n", timeout => 30);
		if ($out =~ /^prio$US/m) { print $fh "prio\tok\n"; last }
		if ($err =~ $fenced_re) { $fenced++; usleep(100_000); next }
		if ($err =~ /ERROR:\s+([0-9A-Z]{5}):/) { print $fh "prio\t$1\n"; last }
		$reconnects++;
		usleep(100_000);
	}
	my $wait = sprintf(
		"DO \$\$BEGIN LOOP IF EXISTS (SELECT FROM fh_hog_stop WHERE prefix = %s) THEN "
		  . "RAISE EXCEPTION 'the hog stops' USING ERRCODE = 'FH001'; END IF; "
		  . "EXIT WHEN (SELECT count(*) FROM ds_steps WHERE run_id LIKE %s AND kind %s 'http' "
		  . "AND status IN ('pending', 'retrying', 'running')) < %d; PERFORM pg_sleep(0.1); END LOOP; END\$\$;\n",
		lit($hprefix), lit("$hprefix%"), $kind eq 'http' ? '=' : '<>', $backlog);
	my @queue = @$calls;
	my ($round, $stopped) = (0, 0);
	while (@queue && !$stopped)
	{
		last if time() > $deadline;
		my $left = $deadline - time();
		$round++;
		open my $sf, '>', "$outfile.$round.sql" or die "$outfile.$round.sql: $!";
		print $sf map { $wait . $_->{sql} } @queue;
		close $sf;
		my ($rc, $out, $err) = run_cmd([ @{ psql_cmd($HOG) }, '-f', "$outfile.$round.sql" ],
			timeout => $left < 5 ? 5 : $left);
		unlink "$outfile.$round.sql";
		my %acked;
		for my $line (split /\n/, $out)
		{
			my @f = split /$US/, $line, -1;
			next unless @f >= 5 && $f[0] eq 'ack';
			$acked{ $f[1] } = 1;
			print $fh join("\t", 'ack', @f[ 1 .. 4 ]), "\n";
		}
		@queue = grep { !$acked{ $_->{idx} } } @queue;
		if ($err =~ /ERROR:\s+FH001:/) { $stopped = 1; last }
		if ($err =~ $fenced_re)
		{
			$fenced++;
			usleep(50_000 + int rand 150_000);
			next;
		}
		if ($err =~ $transient_re)
		{
			$reconnects++;
			usleep(50_000 + int rand 150_000);
			next;
		}
		if ($err =~ /ERROR:\s+([0-9A-Z]{5}):\s*([^\n]*)/)
		{
			my $c = shift @queue;
			print $fh "err\t$c->{idx}\t$1\t$2\n";
			next;
		}
		usleep(100_000) if @queue;
	}
	print $fh "stop\n" if $stopped;
	print $fh "stat\t$reconnects\t$fenced\n";
	close $fh;
	POSIX::_exit(0);
}

# Holds the xmin horizon until $stopfile exists: a REPEATABLE READ transaction with an xid stays
# open for 20 s at a time (a new one at once after it, or after its connection was lost to a
# fault), so that VACUUM removes no row version the trial's steps leave dead and the claims read
# past them from their floors (docs/internals.md, "Claims under a held horizon"). Its sessions are
# named fh_hold (application_name), so that the harness can end the one open when it puts
# $stopfile up. Writes "hold held reconnects" at the end.
sub hold_main
{
	my ($outfile, $stopfile, $deadline) = @_;
	$ENV{PGAPPNAME} = 'fh_hold';
	open my $fh, '>', $outfile or die "$outfile: $!";
	my ($held, $reconnects) = (0, 0);
	while (!-e $stopfile && time() < $deadline)
	{
		my ($rc, $out, $err) = psql($SU,
			"BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 'held', txid_current();
"
			  . "SELECT pg_sleep(20);
COMMIT;
", timeout => 40);
		$held++ if $out =~ /^held/m;
		if ($rc) { $reconnects++; usleep(100_000); }
	}
	print $fh "hold\t$held\t$reconnects\n";
	close $fh;
	POSIX::_exit(0);
}

# Samples, every 100 ms until $stopfile exists, what the HTTP worker holds of each role: the
# steps claimed by an HTTP worker process (claimed_by, as pg_stat_activity shows it now) and not
# recorded yet -- its requests in flight and those just finished, whose outcomes it records with
# its next claim, in one transaction; an outcome kept for an executor's hook (kept_outcome) has
# left it. At every committed state, one role's are at most http_max_inflight_per_role of them
# and all roles' at most http_max_inflight (src/http_worker.c, src/http_claims.c). A step that a
# killed HTTP worker left running names that dead process, not the live one. Writes
# "sample epoch hog others total detail": the most one process holds of the hog's, of another
# single role's, of all roles'.
sub sampler_main
{
	my ($outfile, $stopfile, $deadline) = @_;
	open my $fh, '>', $outfile or die "$outfile: $!";
	$fh->autoflush(1);
	my $q = "WITH c AS (SELECT owner, claimed_by, count(*) AS n FROM durable_steps.steps "
	  . "WHERE kind = 'http' AND status = 'running' AND kept_outcome IS NULL AND claimed_by IN "
	  . "(SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps http') GROUP BY owner, claimed_by) "
	  . "SELECT 'sample', extract(epoch FROM clock_timestamp()), "
	  . "coalesce((SELECT max(n) FROM c WHERE owner = '$HOG'::regrole), 0), "
	  . "coalesce((SELECT max(n) FROM c WHERE owner <> '$HOG'::regrole), 0), "
	  . "coalesce((SELECT max(t) FROM (SELECT sum(n) AS t FROM c GROUP BY claimed_by) x), 0), "
	  . "coalesce((SELECT string_agg(owner::text || '\@' || claimed_by || '=' || n, ' ') FROM c), '');\n"
	  . "SELECT pg_sleep(0.1);\n";
	while (!-e $stopfile && time() < $deadline)
	{
		my ($rc, $out, $err) = psql($SU, $q x 5, timeout => 30);
		for my $line (split /\n/, $out)
		{
			my @f = split /$US/, $line, -1;
			print $fh join("\t", @f), "\n" if @f >= 6 && $f[0] eq 'sample';
		}
		if ($rc && $err !~ $transient_re)
		{
			(my $e = $err) =~ s/\s+/ /g;
			print $fh "err\t$e\n";
		}
		usleep(100_000) if $rc;
	}
	close $fh;
	POSIX::_exit(0);
}

# A client process ended: anything but exit 0 means its calls' fate is unknown to the harness.
sub child_ended
{
	my ($pid, $child, $errs) = @_;
	return if task_worker_ended($pid, $errs);
	my $name = delete $child->{$pid};
	return unless defined $name;
	push @$errs, "$name ended with " . (($? & 127) ? 'signal ' . ($? & 127) : 'exit code ' . ($? >> 8))
	  if $?;
}

# The children that are not the hog's sessions or the sampler: those the trial waits for.
sub fg_children
{
	my ($child) = @_;
	return grep { $child->{$_} !~ /^(?:hog_|sampler|hold)/ } keys %$child;
}

sub spawn
{
	my ($code) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# not inside an eval: run_cmd's eval catches IPC::Run's die of a broken pipe (a psql that
		# lost its connection while its stdin was written) and reports it as a failed command
		$SIG{__DIE__} = sub { return if $^S; print STDERR "child $$: @_"; POSIX::_exit(3) };
		$code->();
		POSIX::_exit(0);
	}
	return $pid;
}

# ---- faults -------------------------------------------------------------------------------------

my @FAULTS = qw(kill9 immediate fast_restart terminate cancel reload fence task_kill9 task_stop task_cut);
my @fault_bag;
# and the kinds a trial may have once: the hog's flood (hog_main), the failover to the standby
my @KINDS = (@FAULTS, qw(failover hog));

# Every kind of fault comes once in each round of ten (seven without tasks: --tasks 0), in a random
# order; the rounds run on from trial to trial, so that a run of ten faults or more has had every kind.
sub next_fault
{
	@fault_bag = grep { $cfg{tasks} || !/^task_/ } @FAULTS unless @fault_bag;
	my $i = int rand @fault_bag;
	return splice(@fault_bag, $i, 1);
}

# An executor's pid (one of the database's own, or an extra one: README, "Fair share between
# roles"), preferring one that is running an attempt (waits up to 0.5 s for that).
# Returns (pid, running an attempt?) or () when there is no executor.
sub pick_executor
{
	my $deadline = time() + 0.5;
	my @any;
	while (1)
	{
		my ($rc, $out) = psql($SU,
			"SELECT pid, (query LIKE 'durable_steps: running %')::int FROM pg_stat_activity "
			  . "WHERE backend_type IN ('durable_steps worker', 'durable_steps extra worker')",
			timeout => 10);
		if ($rc == 0)
		{
			my @ex = map { [ split /$US/ ] } grep { $_ ne '' } split /\n/, $out;
			my @busy = grep { $_->[1] } @ex;
			return ($busy[ int rand @busy ][0], 1) if @busy;
			@any = @ex;
		}
		last if time() > $deadline;
		usleep(20_000);
	}
	return @any ? ($any[ int rand @any ][0], 0) : ();
}

# The HTTP worker's pid, and whether an HTTP step is running (its request in flight), or ().
# Waits up to 0.5 s for a request in flight, as pick_executor does for a running attempt.
sub pick_http_worker
{
	my $deadline = time() + 0.5;
	my @found;
	while (1)
	{
		my ($rc, $out) = psql($SU,
			"SELECT pid, (SELECT count(*) FROM ds_steps WHERE kind = 'http' AND status = 'running') > 0 "
			  . "FROM pg_stat_activity WHERE backend_type = 'durable_steps http'", timeout => 10);
		if ($rc == 0 && $out =~ /^(\d+)$US(\w)/m)
		{
			return ($1, 1) if $2 eq 't';
			@found = ($1, 0);
		}
		return @found if time() > $deadline;
		usleep(20_000);
	}
}

# Injects one fault; returns a short description, or undef when it could not be placed. A third
# of the kills, terminations and cancellations strike the HTTP worker instead of an executor.
# The faults that end every process of the server (a kill -9 makes the postmaster restart them
# all; a stop; a failover) leave their span [from, to] in @{$count->{restarts}}: what the
# executors said in shared memory as they ended does not survive them (the check 'batch charged').
sub inject
{
	my ($f, $count) = @_;
	my $from = time();
	my $what = inject_one($f, $count);
	push @{ $count->{restarts} }, [ $from, time() ]
	  if defined $what && ($f eq 'kill9' || $f eq 'immediate' || $f eq 'fast_restart' || $f eq 'failover');
	# the promoted server has its own postgresql.auto.conf: every partition open there too
	unfence() if defined $what && $f eq 'failover';
	return $what;
}

sub inject_one
{
	my ($f, $count) = @_;
	if ($f eq 'kill9' || $f eq 'terminate' || $f eq 'cancel')
	{
		my $http = rand() < 1 / 3;
		my ($pid, $busy) = $http ? pick_http_worker() : pick_executor();
		return undef unless $pid;
		$count->{"${f}_mid_attempt"}++ if $busy && !$http;
		$count->{"${f}_http"}++ if $http;
		$count->{"${f}_http_inflight"}++ if $http && $busy;
		if ($f eq 'kill9')
		{
			kill 'KILL', $pid;
			# the postmaster restarts every process after a crash; wait until it answers again
			usleep(100_000);
			wait_ready(60);
		}
		else
		{
			my $fn = $f eq 'terminate' ? 'pg_terminate_backend' : 'pg_cancel_backend';
			psql($SU, "SELECT $fn($pid)", timeout => 10);
		}
		return "$f " . ($http ? 'HTTP worker ' : '') . "pid $pid" . ($busy ? ' (mid-attempt)' : '');
	}
	if ($f eq 'immediate')
	{
		cluster_stop('immediate');
		usleep(int rand 300_000);
		cluster_start();
		return 'immediate stop/start';
	}
	if ($f eq 'fast_restart')
	{
		my ($rc, $out, $err) = pg_ctl('-l', $LOG, '-m', 'fast', '-w', '-t', '60', 'restart');
		die "pg_ctl restart failed:\n$out$err\n" . log_tail(40) if $rc;
		wait_ready(60);
		check_library();
		return 'fast restart';
	}
	return failover($count) if $f eq 'failover';
	if ($f eq 'reload')
	{
		my $batch = pick(1, 2, 5, 10, 50, 100);
		my $poll = pick('10ms', '50ms', '100ms', '250ms');
		my ($rc, $out, $err) = psql($SU,
			"ALTER SYSTEM SET durable_steps.batch_size = $batch;\n"
			  . "ALTER SYSTEM SET durable_steps.poll_interval = '$poll';\n"
			  . "SELECT pg_reload_conf();\n", timeout => 20);
		return undef if $rc;
		return "reload batch_size=$batch poll_interval=$poll";
	}
	return fence($count) if $f eq 'fence';
	return inject_task($f, $count, $TW{prefix}) if $f =~ /^task_/;
	die "unknown fault $f";
}

# The fault `fence`: fences one partition p (durable_steps.partitions names only the other one, a
# reload), holds it for a random while (fence_hold) and opens it again (unfence). Meanwhile every
# call naming a run or key of p is refused (DS201, retried by the clients), and once every worker
# process of the database has taken the reload, no worker claims anything of p. The session that
# fences polls ds_partition_workers_behind() every 20 ms through the hold; the first empty answer
# from a session that has itself taken the reload (current_setting shows the fence: the function
# compares the workers with the caller's settings) starts the window in which the fence is in force
# everywhere, up to the reopen's ALTER SYSTEM. Each poll first publishes the session's partitions
# in force for every process (durable_steps.ds_partitions_in_force_publish(), as
# ds_partition_export does; when the library has it), so that from the window's start a caller's
# transaction that begins is refused p whatever settings its session began with -- a procedure
# that commits in a loop above all. Both ends are the server's clock_timestamp(), so that they
# compare with ds_attempts, ds_steps and the transaction starts the clients record; [p, from, to]
# goes to @{$count->{fence_windows}} (no window when the workers never all took the fence during
# the hold) for the checks 'fenced run' and 'fenced write'.
sub fence
{
	my ($count) = @_;
	my $p = int rand 2;
	my $other = 1 - $p;
	my $hold = $cfg{fence_hold}[0] + rand($cfg{fence_hold}[1] - $cfg{fence_hold}[0]);
	my $t0 = time();
	# the hold ends at fh.until, on the server's clock; polls past it answer nothing and do not
	# sleep (a loaded machine makes fewer polls than the script has)
	my $until = "current_setting('fh.until')::timestamptz";
	# each poll also puts this session's settings in force for every process, as
	# ds_partition_export does first (when the library has it): from then on a transaction that
	# begins is refused p whatever settings its session began with (the check 'fenced write')
	my $publish = $HAVE_IN_FORCE ? 'durable_steps.ds_partitions_in_force_publish()' : "'-infinity'::timestamptz";
	my $poll = "SELECT 'poll', current_setting('durable_steps.partitions'), cardinality(w.b), greatest(w.pub, clock_timestamp()) "
	  . "FROM (SELECT $publish AS pub, durable_steps.ds_partition_workers_behind() AS b OFFSET 0) w "
	  . "WHERE clock_timestamp() < $until;\n"
	  . "SELECT pg_sleep(greatest(0, least(0.02, extract(epoch FROM $until - clock_timestamp()))));\n";
	my ($rc, $out, $err) = psql($SU,
		"ALTER SYSTEM SET durable_steps.partitions = '$other';\nSELECT 'fenced';\nSELECT pg_reload_conf();\n"
		  . sprintf("SELECT set_config('fh.until', (clock_timestamp() + interval '%.3f s')::text, false);\n", $hold)
		  . ($poll x (int($hold / 0.02) + 1)), timeout => 30);
	my $fenced = $out =~ /^fenced$/m;
	my $from;
	for my $line (split /\n/, $out)
	{
		my @f = split /$US/, $line, -1;
		next unless @f == 4 && $f[0] eq 'poll' && $f[1] eq "$other" && $f[2] eq '0';
		$from = $f[3];
		last;
	}
	# open it again whatever happened: an ALTER SYSTEM that went through stays
	my $to = unfence();
	return undef unless $fenced;
	push @{ $count->{fence_windows} }, [ $p, $from, $to ] if defined $from;
	return sprintf('fence partition %d for %.2f s (%s)', $p, time() - $t0,
		defined $from ? "in force everywhere from $from to $to" : 'workers never all took it: no window');
}

# Opens every partition (durable_steps.partitions = '0,1', a reload): the end of a fence, and the
# state each trial starts, settles and is checked in (a partition left fenced would never settle;
# ALTER SYSTEM outlives restarts, and a standby has its own copy of it). Retried while the server
# is coming back (bounded). Returns the server's clock_timestamp() just before the first
# ALTER SYSTEM sent: the end of the fence's window.
sub unfence
{
	my $deadline = time() + 60;
	my $at;
	while (1)
	{
		my ($rc, $out, $err) = psql($SU,
			"SELECT 'at', clock_timestamp();\nALTER SYSTEM SET durable_steps.partitions = '0,1';\n"
			  . "SELECT pg_reload_conf();\n", timeout => 20);
		$at //= $1 if $out =~ /^at$US(.+)$/m;
		return $at if $rc == 0;
		die "could not open the partitions again:\n$err\n" if time() > $deadline;
		usleep(100_000);
	}
}

# ---- checks -------------------------------------------------------------------------------------

# Delay in seconds the policy puts after failed attempt $n (counted from the last re-arm).
sub backoff_s
{
	my ($st, $n) = @_;
	my $d = $st->{backoff} eq 'fixed' ? $st->{delay} : $st->{delay} * 2**($n - 1);
	$d = 200 if $d > 200;
	return $d / 1000;
}

# Walks a step's recorded attempts against its script and returns the violations found. An
# attempt recorded as lost (DS007 invocation_lost) or cancelled (57014, the harness's
# pg_cancel_backend() of an executor) stands for a retryable failure that used up its attempt
# number; every other attempt must end as its number's script says. The walk stops
# where the script and the budget end the step (switching to the corrected input, with a fresh
# budget, when the step was re-armed), and the step row must agree with that end.
sub check_step
{
	my ($st, $row, $atts) = @_;
	my @v;
	my $id = "$st->{run}/$st->{step}";
	my ($status, $attempt, $max, $eclass, $ecode, $result, $owner, $input) = @$row[ 2 .. 9 ];
	my $fixed = eval { $json->decode($input)->{fixed} } ? 1 : 0;
	push @v, "step $id is marked re-armed but is not a re-arm step" if $fixed && $st->{kind} ne 'rearm';
	push @v, "step $id is owned by $owner, created by $st->{role}" if $owner ne $st->{role};
	my @plan = @{ $st->{plan} };
	my $actions = $st->{task} ? \%TASK_ACTION : \%ACTION;
	my ($base, $limit, $switched) = (0, $st->{max}, 0);
	my ($n, $end_status, $end_class, $end_code) = (0);
	my $lost = 0;
	while (1)
	{
		$n++;
		my $rec = $atts->{$n};
		my $act = $switched ? 'ok' : (defined $plan[ $n - 1 ] ? $plan[ $n - 1 ] : 'ok');
		if (!$rec)
		{
			push @v, "step $id: attempt $n should exist by its script (step says $status at $attempt)";
			last if $n >= $attempt;
			# a hole in the history: walk on as if it had ended as scripted
			$rec = [ ('') x 3, @{ $actions->{$act} }, 'missing', 'worker' ];
		}
		my ($cls, $code, $msg, $executor) = @$rec[ 3 .. 6 ];
		my $outcome;
		if ($st->{task} && ($code eq 'DS007' || $code =~ $TASK_CUT_RE))
		{
			# a task's lease that ran out (its worker killed, stopped, cut off, the server gone),
			# recorded by the background worker: retryable, or uncertain for a person when the
			# task says so; or a handler whose connection a fault cut, its failure recorded as
			# retryable by its worker
			$lost++;
			my $lost_cls = $code eq 'DS007' && $st->{uncertain} ? 'uncertain' : 'retryable';
			push @v, "task $id attempt $n: lost or cut attempt recorded as $cls/$code/$msg by $executor, not $lost_cls"
			  unless $cls eq $lost_cls && $executor eq 'worker' && ($code ne 'DS007' || $msg eq 'invocation_lost');
			$outcome = $lost_cls;
		}
		elsif ($code eq 'DS007' || $code eq '57014')
		{
			# lost with its executor, or stopped by the harness's pg_cancel_backend(): a
			# retryable failure of the worker's, whatever the script said -- or, for a run's step,
			# of the turn that was running it, which the run's next turn records (executor
			# 'caller', as the turn's ds_run_step; docs/runs.md, "lost with its turn")
			$lost++;
			push @v, "step $id attempt $n: lost or cancelled attempt recorded as $cls/$code/$msg by $executor"
			  unless $cls eq 'retryable' && ($executor eq 'worker' || ($st->{run_step} && $executor eq 'caller'))
			  && ($code eq 'DS007' ? $msg eq 'invocation_lost' : $msg =~ /^canceling statement/);
			$outcome = 'retryable';
		}
		else
		{
			my ($want_cls, $want_code) = @{ $actions->{$act} };
			push @v, "step $id attempt $n: scripted '$act' ($want_cls $want_code), recorded $cls $code ($msg)"
			  unless $cls eq $want_cls && $code eq $want_code;
			$outcome = $cls;
		}
		($end_code) = $code;
		if ($outcome eq 'completed') { $end_status = 'succeeded'; $end_class = ''; }
		elsif ($outcome eq 'uncertain') { ($end_status, $end_class) = ('uncertain', 'uncertain'); last; }
		elsif ($outcome eq 'retryable')
		{
			next if $n < $base + $limit;
			($end_status, $end_class) = ('failed', 'exhausted');
		}
		elsif ($outcome eq 'correctable') { ($end_status, $end_class) = ('blocked', 'correctable'); }
		else { ($end_status, $end_class) = ('failed', 'permanent'); }
		if ($fixed && !$switched && $end_status ne 'succeeded')
		{
			# re-armed here with the corrected input: a fresh budget from this attempt on
			($base, $switched) = ($n, 1);
			next;
		}
		last;
	}
	my $want_max = $base + $limit;
	push @v, "step $id: its script (with $lost lost attempt(s)) ends $end_status/$end_class at attempt $n "
	  . "of $want_max; the step is $status/$eclass at attempt $attempt of $max (error $ecode)"
	  if defined $end_status
	  && ($status ne $end_status || $eclass ne $end_class || $attempt != $n || $max != $want_max
		|| ($end_status ne 'succeeded' && $ecode ne $end_code));
	push @v, "step $id: succeeded with result $result, not its attempt number $attempt"
	  if $status eq 'succeeded' && $result ne $attempt;
	push @v, "step $id: re-arm step ended $status without being re-armed" if $st->{kind} eq 'rearm'
	  && !$fixed && $status ne 'succeeded';
	return (\@v, $lost);
}

# A task's effects and the executions of its handler (TASK_WORKER: fh_task_effects,
# fh_task_runs) against its recorded attempts ($at: ds_attempts rows by number). Returns
# ([check, line], ...):
#   task effect     a succeeded task has exactly one effect, 'success effect', written by the
#                   attempt the step records as completed (its number, and the idempotency and
#                   attempt keys ds_attempts shows for it), in the worker process whose handler
#                   ran that attempt; a task that did not succeed has none; no 'failed attempt
#                   effect' committed
#   task attempt    no attempt number was handed to two executions of the handler; each execution
#                   is of an attempt ds_attempts records, with its keys (the idempotency key the
#                   step's, the same for every attempt)
#   uncertain task  a task stored with on_lost => 'uncertain' that lost an attempt's lease (DS007)
#                   is uncertain, with no attempt recorded or run after that one
sub check_task_effects
{
	my ($st, $row, $at, $eff, $runs) = @_;
	my @v;
	my $k = "$st->{run}/$st->{step}";
	my ($status, $attempt) = @$row[ 2, 3 ];
	my @e = @{ $eff || [] };
	my @r = @{ $runs || [] };
	my $f = sub { return join ' | ', @{ $_[0] } };
	push @v, [ 'task effect', "task $k: the effect of a failed attempt committed: " . $f->($_) ]
	  for grep { $_->[3] ne 'success effect' } @e;
	my @ok = grep { $_->[3] eq 'success effect' } @e;
	if ($status eq 'succeeded')
	{
		my $rec = $at->{$attempt};
		if (@ok != 1)
		{
			push @v, [ 'task effect', "task $k succeeded at attempt $attempt with " . scalar(@ok) . " effect(s): "
				  . join(' ; ', map { $f->($_) } @ok) ];
		}
		else
		{
			my $x = $ok[0];
			push @v, [ 'task effect', "task $k succeeded at attempt $attempt ("
				  . ($rec ? "recorded $rec->[3], keys $rec->[13] $rec->[14]" : 'no such attempt recorded')
				  . "); its effect is not that attempt's: " . $f->($x) ]
			  unless $rec && $rec->[3] eq 'completed' && $x->[2] == $attempt && $x->[4] eq $rec->[13]
			  && $x->[5] eq $rec->[14];
			my @by = grep { $_->[2] == $x->[2] } @r;
			push @v, [ 'task effect', "task $k: its effect was written by $x->[6] (pid $x->[7]), its attempt $x->[2] "
				  . "ran in " . join(', ', map { "$_->[5] (pid $_->[6])" } @by) ]
			  if @by && !grep { $_->[5] eq $x->[6] && $_->[6] == $x->[7] } @by;
		}
	}
	else
	{
		push @v, [ 'task effect', "task $k is $status at attempt $attempt, yet has an effect: " . $f->($_) ] for @ok;
	}
	my %n;
	$n{ $_->[2] }++ for @r;
	for my $a (sort { $a <=> $b } keys %n)
	{
		my @these = grep { $_->[2] == $a } @r;
		push @v, [ 'task attempt', "task $k: attempt $a was handed to $n{$a} executions of the handler: "
			  . join(' ; ', map { $f->($_) } @these) ]
		  if $n{$a} > 1;
		my $rec = $at->{$a};
		if (!$rec)
		{
			push @v, [ 'task attempt', "task $k: the handler ran attempt $a, which ds_attempts does not record "
				  . "(the step is at attempt $attempt)" ];
			next;
		}
		push @v, [ 'task attempt', "task $k: the handler ran attempt $a with keys $_->[3] $_->[4], "
			  . "ds_attempts shows $rec->[13] $rec->[14]" ]
		  for grep { $_->[3] ne $rec->[13] || $_->[4] ne $rec->[14] } @these;
	}
	if ($st->{uncertain})
	{
		my ($lost) = grep { $at->{$_}[4] eq 'DS007' } sort { $a <=> $b } keys %$at;
		if (defined $lost)
		{
			push @v, [ 'uncertain task', "task $k (on_lost => 'uncertain') lost attempt $lost, yet attempt $_ was "
				  . "recorded after it: " . $f->($at->{$_}) ]
			  for grep { $_ > $lost } sort { $a <=> $b } keys %$at;
			push @v, [ 'uncertain task', "task $k (on_lost => 'uncertain') lost attempt $lost, yet the handler "
				  . "ran attempt $_->[2] after it: " . $f->($_) ]
			  for grep { $_->[2] > $lost } @r;
			push @v, [ 'uncertain task', "task $k (on_lost => 'uncertain') lost attempt $lost and is $status, "
				  . "not uncertain" ]
			  if $status ne 'uncertain';
		}
	}
	return @v;
}

# An HTTP step, against its script and the provider's ledger ($pc, GET /counts). Returns
# ([[check, line], ...], lost attempts, charges). Each attempt must be one its script allows:
# completed (the last only); retryable DS010 with the scripted 500/503/429 (no more of them than
# the provider was told to answer); retryable DS012 (a keyed delay or drop step); lost (DS007, or
# 57014 of a cancelled HTTP worker): retryable with a key, uncertain without; uncertain (DS012 or
# DS007, the last only, a step without a key). Without a lost attempt (or an unscripted timeout,
# counted as one) the path is exact.
sub check_http_step
{
	my ($st, $row, $atts, $pc) = @_;
	my @v;
	my $id = "$st->{run}/$st->{step}";
	my $tag = http_tag($st);
	my $what = "$id ($st->{kind}" . ($st->{fault} ne '' ? " fault=$st->{fault}" : '')
	  . ($st->{times} ? " times=$st->{times}" : '') . ', ' . ($st->{keyed} ? 'keyed' : 'no key') . ')';
	my ($status, $attempt, $max, $eclass, $ecode, $result, $owner) = @$row[ 2 .. 8 ];
	my $charges = $pc->{charges}{$tag} || 0;
	my $requests = $pc->{requests}{$tag} || 0;
	my @keys = @{ $pc->{keys}{$tag} || [] };
	my $key = wire_key($st->{run}, $st->{step});
	push @v, [ 'duplicate charge', "step $what is $status at attempt $attempt: charged $charges times at the provider ($requests requests)" ]
	  if $charges > 1;
	my @badkeys = grep { $st->{keyed} ? !defined $_ || $_ ne $key : defined $_ } @keys;
	push @v, [ 'idempotency key', "step $what: the provider saw keys ("
		  . join(', ', map { defined $_ ? $_ : 'none' } @keys) . "), not " . ($st->{keyed} ? $key : 'none') ]
	  if @badkeys;
	push @v, [ 'end state', "step $what is owned by $owner, created by $st->{role}" ] if $owner ne $st->{role};
	my ($lost, $n5xx, $n429, $nto, $maybe_sent) = (0, 0, 0, 0, 0);
	my @seq;
	my $last_cls = '';
	for my $n (1 .. $attempt)
	{
		my $rec = $atts->{$n} or next;    # a hole is reported by the attempt-number check
		my ($cls, $code, $msg, $executor) = @$rec[ 3 .. 6 ];
		my $detail = $rec->[12];
		my $desc = "step $what attempt $n: $cls $code ($msg) by $executor";
		$last_cls = $cls;
		push @v, [ 'end state', "$desc: not the HTTP worker's" ] if $executor ne 'worker';
		push @v, [ 'end state', "$desc: not its last attempt ($attempt)" ]
		  if $n < $attempt && $cls ne 'retryable';
		if ($code eq 'DS007' || $code eq '57014')
		{
			$lost++;
			$maybe_sent++;
			push @v, [ 'uncertain', "$desc: a request without a key lost in flight must be uncertain" ]
			  if !$st->{keyed} && $cls ne 'uncertain';
			push @v, [ 'uncertain', "$desc: a request with a key lost in flight is retryable" ]
			  if $st->{keyed} && $cls ne 'retryable';
			push @seq, 'lost';
			next;
		}
		if ($cls eq 'completed') { push @seq, 'ok'; next }
		if ($cls eq 'retryable' && $code eq 'DS010' && $detail =~ /"status": ?(\d+)/)
		{
			my $http = $1;
			$http == 429 ? $n429++ : $n5xx++;
			push @v, [ 'end state', "$desc: HTTP $http, the script has " . ($st->{fault} || 'no fault') ]
			  unless ($st->{fault} eq '429s' && $http == 429) || $st->{fault} eq $http;
			push @seq, 'DS010';
			next;
		}
		if ($code eq 'DS012')
		{
			# the scripted delay or drop strikes once; any other timeout is the provider answering
			# slower than the step's timeout on a loaded machine: legitimate, and like a lost
			# attempt it makes the exact path unpredictable (the charge checks still hold)
			# (the hog's hanging answer comes within its timeout: any timeout of it is unscripted)
			$lost++ if ++$nto > 1 || ($st->{fault} ne 'delay' && $st->{fault} ne 'drop') || $st->{kind} eq 'h_hang';
			$maybe_sent++;
			push @v, [ 'uncertain', "$desc: " . ($st->{keyed} ? 'a keyed request is retryable' : 'a request without a key must be uncertain') ]
			  if $cls ne ($st->{keyed} ? 'retryable' : 'uncertain');
			push @seq, $cls eq 'uncertain' ? 'unc' : 'DS012';
			next;
		}
		push @v, [ 'end state', "$desc: not an outcome its script allows (detail: $detail)" ];
		push @seq, "$cls/$code";
	}
	push @v, [ 'end state', "step $what: $n5xx 5xx answers, the provider was told to give $st->{times}" ]
	  if $n5xx > $st->{times};
	push @v, [ 'end state', "step $what: $n429 429 answers, the provider gives one" ] if $n429 > 1;
	# an outcome an executor was recording with its hook when that executor ended (a fault, or a
	# stubborn hook that ignored its cancellation): the hook is not run again by itself, and
	# blocks the step (DS007; docs/http.md, "Outcome hooks") -- an answer (on_success), or a
	# retryable failure at max_attempts (on_failure)
	my $hooked_end = $last_cls eq 'completed' || ($last_cls eq 'retryable' && $attempt >= $max);
	my $hook_lost = $status eq 'blocked' && $ecode eq 'DS007' && $hooked_end;
	# a stubborn on_success hook (pick_stubborn) never returns in an executor: an answer blocks
	# its step so, always
	my $stubborn_lost = $st->{stubborn} && $last_cls eq 'completed';
	# where the history ends, the step ends
	my $want = $hook_lost || $stubborn_lost ? 'blocked'
	  : $last_cls eq 'completed' ? 'succeeded' : $last_cls eq 'uncertain' ? 'uncertain'
	  : $last_cls eq 'retryable' && $attempt >= $max ? 'failed' : '(going on)';
	push @v, [ 'end state', "step $what is $status/$eclass at attempt $attempt of $max ($ecode); its attempts ("
		  . join(' ', @seq) . ") end it $want" ]
	  if $status ne $want || ($want eq 'failed' && $eclass ne 'exhausted');
	push @v, [ 'stubborn hook', "step $what answered at attempt $attempt: its $st->{stubborn}{hook} hook ignores its "
		  . "cancellation, so the step must be blocked with DS007 (the hook lost), not $status/$eclass ($ecode)" ]
	  if $stubborn_lost && ($status ne 'blocked' || $ecode ne 'DS007');
	push @v, [ 'uncertain', "step $what is uncertain with a retry scheduled" ] if $status eq 'uncertain' && $row->[10] ne 't';
	# without a lost attempt the path is exactly the script's
	if (!$lost)
	{
		my $k = $st->{kind};
		my @exp = $k eq 'h_ok' || $k eq 'h_hang' ? ('ok')
		  : $k eq 'h_5xx' ? ((('DS010') x $st->{times}), 'ok')
		  : $k eq 'h_exhaust' ? (('DS010') x $st->{max})
		  : $k eq 'h_429' ? ('DS010', 'ok')
		  : $st->{keyed} ? ('DS012', 'ok') : ('unc');
		# a keyed request whose kept-alive connection the provider drops is sent again by libcurl
		# itself (README, "HTTP steps"), within the same attempt: the provider replays the charge
		my $alt = $k eq 'h_drop' && $st->{keyed} ? 'ok' : '';
		push @v, [ 'end state', "step $what: attempts (" . join(' ', @seq) . "), its script says (" . join(' ', @exp) . ")" ]
		  if join(' ', @seq) ne join(' ', @exp) && join(' ', @seq) ne $alt;
	}
	# the provider's ledger
	# a succeeded step, or one blocked by its lost on_success hook (the response kept)
	my $answered = $status eq 'succeeded' || ($hook_lost && $last_cls eq 'completed');
	if ($answered)
	{
		my $res = eval { $json->decode($result) } || {};
		my $b = ref $res->{body} eq 'HASH' ? $res->{body} : {};
		my $recv = eval { $json->encode($json->decode($b->{received} // '')) } // '';
		my $how = $status eq 'succeeded' ? 'succeeded' : 'is blocked by its lost hook after its answer';
		push @v, [ 'charge', "step $what $how, charged $charges times at the provider" ] if $charges != 1;
		push @v, [ 'stored response', "step $what $how with result $result, not the provider's answer to its one charge" ]
		  unless ($res->{status} // 0) == 200 && ($b->{charged} // '') eq $tag && ($b->{charge} // 0) == 1
		  && ($b->{method} // '') eq 'POST' && $recv eq $json->encode($st->{body});
	}
	push @v, [ 'charge', "step $what is $status, charged $charges times though no request of it may have been sent without an answer" ]
	  if !$answered && !$maybe_sent && $charges;
	# a request without a key is never sent again by itself: one request per attempt at most
	push @v, [ 'uncertain', "step $what: $requests requests reached the provider for $attempt attempt(s)" ]
	  if !$st->{keyed} && $requests > $attempt;
	return (\@v, $lost, $charges);
}

# A cancelled step: every attempt before the cancellation ended as its script says (or was lost),
# none of them ended the step, and only the last may be the running attempt that ds_cancel_step
# stopped (cancelled, 57014, by the worker, rolled back: the ledger checks see no effect of it).
# An earlier attempt may have been stopped too by a call that then did not commit (its
# connection was lost to a fault, and the client called again): the step went on (README,
# "Cancelling a step"). So a step has at most as many stopped attempts as its cancellation took
# calls, and only the last may be stopped when it took one. $calls: how many it took.
sub check_cancelled_step
{
	my ($st, $row, $atts, $calls) = @_;
	my @v;
	my $id = "$st->{run}/$st->{step}";
	my ($status, $attempt, $max) = @$row[ 2 .. 4 ];
	my @plan = @{ $st->{plan} };
	my $lost = 0;
	my $stopped = 0;
	for my $n (1 .. $attempt)
	{
		my $rec = $atts->{$n} or next;		# a hole is reported by the attempt-number check
		my ($cls, $code, $msg, $executor) = @$rec[ 3 .. 6 ];
		if ($cls eq 'cancelled')
		{
			$stopped++;
			push @v, "step $id: cancelled attempt $n is not its last ($attempt), and its cancellation took one call"
			  if $n != $attempt && ($calls // 1) <= 1;
			push @v, "step $id attempt $n: stopped attempt recorded as $cls/$code/$msg by $executor"
			  unless $code eq '57014' && $executor eq 'worker' && $msg =~ /ds_cancel_step/;
			next;
		}
		my $outcome;
		if ($code eq 'DS007' || $code eq '57014')
		{
			$lost++;
			push @v, "step $id attempt $n: lost or cancelled attempt recorded as $cls/$code/$msg by $executor"
			  unless $cls eq 'retryable' && ($executor eq 'worker' || ($st->{run_step} && $executor eq 'caller'));
			$outcome = 'retryable';
		}
		else
		{
			my $act = defined $plan[ $n - 1 ] ? $plan[ $n - 1 ] : 'ok';
			my ($want_cls, $want_code) = @{ $ACTION{$act} };
			push @v, "step $id attempt $n: scripted '$act' ($want_cls $want_code), recorded $cls $code ($msg)"
			  unless $cls eq $want_cls && $code eq $want_code;
			$outcome = $cls;
		}
		push @v, "step $id: attempt $n ended as $outcome, yet the step went on to attempt $attempt"
		  if $n < $attempt && $outcome ne 'retryable';
		# a step that had failed (exhausted or permanent) or succeeded cannot be cancelled (DS103)
		push @v, "step $id: attempt $n used up max_attempts $max, yet the step is cancelled, not failed"
		  if $outcome eq 'retryable' && $n == $attempt && $n >= $max;
		push @v, "step $id: attempt $n ended as $outcome, yet the step is cancelled"
		  if $n == $attempt && ($outcome eq 'permanent' || $outcome eq 'completed');
	}
	push @v, "step $id: attempt $attempt exceeds max_attempts $max" if $attempt > $max;
	push @v, "step $id: $stopped attempts stopped by a cancellation that took " . ($calls // 1) . " call(s)"
	  if $stopped > ($calls // 1);
	return (\@v, $lost);
}

# The first attempt of a run's step runs in the executor's turn, through ds_run_step.
use constant RUNSTEP_FIRST => 'caller';

# A run against its script: ([check, line], ...). Its workflow visits, in order, its steps, with
# the sleep ('nap') and the event wait ('ev') after the step at their index. Walking them: a
# succeeded step gives its result to the output, a failed one "caught" when the workflow
# catches it and otherwise ends the run (failed, DS102 naming the step); nothing after the end
# exists. A run not cancelled reached every step up to its end and ends as the walk says, with
# exactly the output the walk builds (the event's payload included); a cancelled run may stop
# short anywhere, and executed nothing after its cancellation: no attempt of its steps started,
# and no effect committed, after ds_cancel_run's time (runs.finished_at). Each element began
# after the one before it ended, and the one after the sleep no earlier than the sleep's end.
sub check_run
{
	my ($run, $rr, $srow, $att, $ledger, $cack) = @_;
	my @v;
	my $id = $run->{id};
	return ([ 'lost', "run $id does not exist" ]) unless $rr;
	my ($status, $output, $ecode, $emsg, $fin, $turns, $owner, $reason) = @$rr[ 1 .. 8 ];
	my $fmt = sub { return join ' | ', @{ $_[0] } };
	$cack //= '';
	push @v, [ 'run end state', "run $id is owned by $owner, started by $run->{role}" ] if $owner ne $run->{role};
	push @v, [ 'run not terminal', "run $id is $status: $reason" ] unless $status =~ /^(succeeded|failed|cancelled)$/;
	push @v, [ 'run cancel', "run $id is cancelled, but ds_cancel_run " . ($cack eq '' ? 'was not called' : "answered $cack") ]
	  if $status eq 'cancelled' && $cack ne 'cancelled';
	push @v, [ 'run cancel', "ds_cancel_run answered cancelled, run $id is $status ($reason)" ]
	  if $cack eq 'cancelled' && $status ne 'cancelled';
	push @v, [ 'run cancel', "ds_cancel_run answered DS103 (finished), run $id is $status ($reason)" ]
	  if $cack eq 'done' && $status !~ /^(succeeded|failed)$/;
	my %st_of = map { ($_->{step} => $_) } @{ $run->{steps} };
	my @order;
	for my $st (@{ $run->{steps} })
	{
		push @order, $st->{step};
		push @order, 'nap' if $run->{sleep} && $run->{sleep}{after} == $st->{pos};
		push @order, 'ev' if $run->{event} && $run->{event}{after} == $st->{pos};
	}
	my (%out, $fail_step);
	my $reached = 1;
	for my $e (@order)
	{
		my $row = $srow->{"$id/$e"};
		if (!$reached)
		{
			push @v, [ 'run order', "run $id: $e exists, though its workflow cannot have reached it: " . $fmt->($row) ]
			  if $row;
			next;
		}
		if (!$row)
		{
			push @v, [ 'run end state', "run $id is $status, yet $e of its workflow does not exist" ]
			  unless $status eq 'cancelled';
			$reached = 0;
			next;
		}
		my $s = $row->[2];
		if ($s eq 'cancelled' || $s eq 'pending' || $s eq 'retrying' || $s eq 'running')
		{
			push @v, [ 'run end state', "run $id is $status, yet its $e is $s" ] unless $status eq 'cancelled';
			$reached = 0;
			next;
		}
		if ($e eq 'nap')
		{
			push @v, [ 'run end state', "run $id: its sleep is $s" ] if $s ne 'succeeded';
			next;
		}
		if ($e eq 'ev')
		{
			my $got = $s eq 'succeeded' ? eval { $json->encode($json->decode($row->[7])) } // '' : '';
			my $want = $json->encode($run->{event}{payload});
			push @v, [ 'run end state', "run $id: its event wait is $s with $row->[7], the event's payload is $want" ]
			  if $got ne $want;
			$out{event} = $run->{event}{payload};
			next;
		}
		if ($s eq 'succeeded') { $out{$e} = 0 + $row->[7]; }
		elsif ($s eq 'failed' && $st_of{$e}{catch}) { $out{$e} = 'caught'; }
		elsif ($s eq 'failed') { $fail_step = $e; $reached = 0; }
		else
		{
			push @v, [ 'run end state', "run $id: its $e is $s" ];
			$reached = 0;
		}
	}
	if ($status eq 'succeeded')
	{
		my $got = eval { $json->encode($json->decode($output)) } // "(not JSON: $output)";
		my $want = $json->encode(\%out);
		push @v, [ 'run end state', "run $id succeeded with output $got; its steps make it $want"
			  . ($fail_step ? " and its $fail_step failed uncaught" : '') ]
		  if $got ne $want || $fail_step;
	}
	elsif ($status eq 'failed')
	{
		push @v, [ 'run end state', "run $id failed ($ecode: $emsg), "
			  . ($fail_step ? "not with DS102 of its step $fail_step" : 'though its workflow handled every step') ]
		  unless $fail_step && $ecode eq 'DS102' && $emsg =~ /^step \Q$fail_step\E of run /;
	}
	# each element began after the one before it ended (a sleep: after the time it recorded)
	my $prev;
	for my $e (@order)
	{
		my $row = $srow->{"$id/$e"} or last;
		my ($first, $last);
		if ($e eq 'nap' || $e eq 'ev')
		{
			($first, $last) = ($row->[12], $e eq 'nap' ? $row->[14] : $row->[13]);
		}
		else
		{
			my $ats = $att->{"$id/$e"} || {};
			for my $n (keys %$ats)
			{
				$first = $ats->{$n}[10] if !defined $first || $ats->{$n}[10] < $first;
				$last = $ats->{$n}[11] if $ats->{$n}[11] ne '' && (!defined $last || $ats->{$n}[11] > $last);
			}
		}
		push @v, [ 'run order', sprintf("run %s: %s began at %.6f, before %s ended at %.6f", $id, $e, $first,
				$prev->[0], $prev->[1]) ]
		  if $prev && defined $first && defined $prev->[1] && $prev->[1] ne '' && $first < $prev->[1];
		$prev = [ $e, $last ];
	}
	# nothing of a cancelled run after its cancellation
	if ($status eq 'cancelled' && $fin ne '')
	{
		for my $st (@{ $run->{steps} })
		{
			my $ats = $att->{"$id/$st->{step}"} || {};
			for my $n (sort { $a <=> $b } keys %$ats)
			{
				my $r = $ats->{$n};
				push @v, [ 'run cancel', sprintf("run %s cancelled at %.6f: attempt %d of %s started at %.6f (%s)",
						$id, $fin, $n, $st->{step}, $r->[10], $fmt->($r)) ]
				  if $r->[10] > $fin;
				push @v, [ 'run cancel', sprintf("run %s cancelled at %.6f: attempt %d of %s completed at %s (%s)",
						$id, $fin, $n, $st->{step}, $r->[11], $fmt->($r)) ]
				  if $r->[3] eq 'completed' && $r->[11] ne '' && $r->[11] > $fin;
			}
			for my $l (@{ $ledger->{"$id/$st->{step}"} || [] })
			{
				push @v, [ 'run cancel', sprintf("run %s cancelled at %.6f: effect committed at %.6f (%s)",
						$id, $fin, $l->[7], $fmt->($l)) ]
				  if $l->[3] eq 'success effect' && $l->[7] > $fin;
			}
		}
	}
	return @v;
}

# --tamper: what a broken extension could leave behind, written by hand into trial 1's rows.
sub tamper
{
	my ($prefix, $fc) = @_;
	(my $aprefix = $prefix) =~ s/^f/a/;    # the trial's flows (FLOW)
	# a window of the fault `fence` to move an attempt into: the trial's first, or one made now
	fence($fc) unless @{ $fc->{fence_windows} || [] };
	my $w = ($fc->{fence_windows} || [])->[0] or die "tampering failed: no fence window to move an attempt into\n";
	my ($p, $from, $to) = ($w->[0], lit($w->[1]) . '::timestamptz', lit($w->[2]) . '::timestamptz');
	my ($rc, $out, $err) = psql($SU, <<"EOF");
-- a worker attempt of partition $p claimed and begun while it was fenced everywhere: [fenced run]
-- (the last attempt of a plain SQL step outside fh_serial, neither lost nor cancelled: the times
-- of those, of an attempt before a retry and of the serial queue's are read by other checks)
UPDATE durable_steps.attempts
   SET claimed_at = $from + ($to - $from) / 2, started_at = $from + ($to - $from) / 2,
       finished_at = greatest(finished_at, $from + ($to - $from) / 2)
 WHERE (run_id, step_id, attempt) IN
       (SELECT a.run_id, a.step_id, a.attempt FROM durable_steps.attempts a JOIN durable_steps.steps s USING (run_id, step_id)
         WHERE a.run_id LIKE '$prefix%' AND a.executor = 'worker' AND ds_partition_of(a.run_id) = $p
         ORDER BY (a.attempt = s.attempts AND s.kind = 'sql' AND s.queue <> 'fh_serial'
                   AND a.run_id ~ '^${prefix}r[0-9]+\$' AND a.error_code NOT IN ('DS007', '57014')) DESC NULLS LAST,
                  a.run_id DESC, a.step_id DESC, a.attempt DESC LIMIT 1)
RETURNING 'moved', run_id, step_id, attempt;
-- a second ledger row for one succeeded attempt: [duplicate effect]
INSERT INTO fh_ledger(run_id, step_id, attempt, kind, who, pid)
SELECT run_id, step_id, attempt, kind, who, pid FROM fh_ledger
 WHERE run_id LIKE '$prefix%' ORDER BY id LIMIT 1;
-- the effect of a failed attempt committed: [effect of a failed attempt]
INSERT INTO fh_ledger(run_id, step_id, attempt, kind)
SELECT run_id, step_id, attempt, 'failed attempt effect' FROM durable_steps.attempts
 WHERE run_id LIKE '$prefix%' AND class = 'retryable' ORDER BY run_id, step_id, attempt LIMIT 1;
-- a hole in a step's attempt numbers: [attempt numbers]
DELETE FROM durable_steps.attempts a
 WHERE (run_id, step_id, attempt) IN (SELECT run_id, step_id, 1 FROM durable_steps.steps
                                        WHERE run_id LIKE '$prefix%' AND attempts >= 3
                                        ORDER BY run_id, step_id LIMIT 1);
-- a succeeded step recorded as exhausted: [end state], [success effect count]
UPDATE durable_steps.steps SET status = 'failed', error_class = 'exhausted', error_code = 'P0001'
 WHERE (run_id, step_id) IN (SELECT run_id, step_id FROM durable_steps.steps
                              WHERE run_id LIKE '$prefix%' AND status = 'succeeded' AND attempts = 1 AND kind = 'sql'
                              ORDER BY run_id, step_id LIMIT 1);
-- an outcome hook run twice: [outcome hook]
INSERT INTO fh_hooks(run_id, step_id, hook, status, attempt, who)
SELECT run_id, step_id, hook, status, attempt, who FROM fh_hooks
 WHERE run_id LIKE '$prefix%' AND hook = 'on_success' ORDER BY id LIMIT 1;
-- a scripted failure passed off as a lost attempt: [end state]
UPDATE durable_steps.attempts SET error_code = 'DS007'
 WHERE (run_id, step_id, attempt) IN (SELECT run_id, step_id, attempt FROM durable_steps.attempts
                                       WHERE run_id LIKE '$prefix%' AND error_code = 'DS003'
                                       ORDER BY run_id, step_id LIMIT 1);
-- a succeeded HTTP step whose stored response is not the provider's answer: [stored response]
UPDATE durable_steps.steps SET result = jsonb_set(result, '{body,charge}', '2')
 WHERE (run_id, step_id) IN (SELECT run_id, step_id FROM durable_steps.steps
                              WHERE run_id LIKE '$prefix%' AND status = 'succeeded' AND kind = 'http'
                              ORDER BY run_id, step_id LIMIT 1);
-- a succeeded task's effect committed twice: [task effect]
INSERT INTO fh_task_effects(run_id, step_id, attempt, kind, idem_key, attempt_key, worker, os_pid)
SELECT run_id, step_id, attempt, kind, idem_key, attempt_key, worker, os_pid FROM fh_task_effects
 WHERE run_id LIKE '$prefix%' AND kind = 'success effect' ORDER BY id LIMIT 1;
-- a flow step's effect committed twice: [flow effect]
INSERT INTO fh_flow_log(kind, run_id, step_id, attempt, idem_key, worker, os_pid)
SELECT kind, run_id, step_id, attempt, idem_key, worker, os_pid FROM fh_flow_log
 WHERE run_id LIKE '$aprefix%' AND kind = 'effect' ORDER BY id LIMIT 1;
-- a run that succeeded with an output its steps did not make: [run end state]
UPDATE durable_steps.runs SET output = output || '{"s1": 99}'
 WHERE run_id IN (SELECT run_id FROM durable_steps.runs
                   WHERE run_id LIKE '$prefix%' AND status = 'succeeded' ORDER BY run_id LIMIT 1);
EOF
	die "tampering failed: $err\n" if $rc;
	die "tampering failed: no worker attempt of partition $p to move into its fence\n" unless $out =~ /^moved$US/m;
	print "  (--tamper: trial 1's rows were corrupted by hand in eleven ways)\n";
}

sub run_trial
{
	my ($t, $tseed, $tot) = @_;
	# a standby trial: the primary gets a synchronous standby first (a new one after a failover)
	my $standby = standby_trial($t);
	# every partition open (and so in a standby made now)
	unfence();
	my $standby_time = $standby && !$STANDBY ? standby_create() : 0;
	srand($tseed);
	my $t0 = time();
	my $prefix = "f$tseed-";
	my $hprefix = "h$tseed-";    # the hog's steps
	my $dir = "$WORK/tmp/trial$t";
	mkdir $dir;
	my $nc = $cfg{clients};
	my @client_role = map { $ROLES[ $_ % @ROLES ] } 0 .. $nc - 1;

	# the steps, a primary call each from a client of its owner, and duplicate calls; a few of
	# them stubborn (pick_stubborn): one at most in --short, else one per 40 steps
	my (@steps, @calls_of, @calls);
	my $stub_left = $opt{short} ? 1 : int($cfg{steps} / 40) || 1;
	for my $i (1 .. $cfg{steps})
	{
		my $st = make_step();
		# a stubborn step's hook waits for the end of the fault window (run_at) in --short, and
		# in half of the cases otherwise: its 6 s then strike without a fault, whose crashes and
		# stops would most often end its executor first
		$st->{run_at} = $t0 + $cfg{fault_window}
		  if pick_stubborn($st, \$stub_left) && ($opt{short} || rand() < 0.5);
		$st->{run}  = $prefix . 'r' . ($i % 5);
		$st->{step} = "s$i";
		$st->{tag_step} = "s$i";
		# a third of the HTTP steps have identities that a raw header would mangle: a CR and a
		# header line after it, a trailing space, a tab and a '%', the key part separator
		$st->{step} .= pick("\rX-Evil: 1", ' ', "\t%41", '\\:x') if $st->{http} && rand() < 1 / 3;
		my $c = int rand $nc;
		$st->{role} = $client_role[$c];
		push @steps, $st;
		my @mine = grep { $client_role[$_] eq $st->{role} } 0 .. $nc - 1;
		my @targets = ([ $c, 0, 0 ]);
		my $dups = rand() < 0.4 ? 1 + (rand() < 0.3 ? 1 : 0) : 0;
		for (1 .. $dups)
		{
			my $nowait = rand() < 0.25 ? 1 : 0;
			my $pause = rand() < 0.4 ? 20 + int rand 200 : 0;
			push @targets, [ pick(@mine), $nowait, $pause ];
		}
		for my $tg (@targets)
		{
			my $idx = scalar @calls;
			my $call = { idx => $idx, st => $st, nowait => $tg->[1], dup => ($tg != $targets[0]) };
			$call->{sql} = call_sql($idx, $st, $tg->[1], $tg->[2]);
			push @calls, $call;
			push @{ $calls_of[ $tg->[0] ] }, $call;
		}
	}
	# the runs: a start call each (a third of them started twice: the same run key answers the
	# same run), and the emits of their events (a third emitted twice: the first emit wins), from
	# client sessions of the owner; their steps are checked with the plain steps
	my @runs;
	for my $i (1 .. $cfg{runs})
	{
		my $run = make_run($prefix . "w$i");
		my $c = int rand $nc;
		$run->{role} = $client_role[$c];
		$_->{role} = $run->{role} for @{ $run->{steps} };
		push @runs, $run;
		my @mine = grep { $client_role[$_] eq $run->{role} } 0 .. $nc - 1;
		my @targets = ([ $c, 'start', 0 ]);
		push @targets, [ pick(@mine), 'start', rand() < 0.5 ? 20 + int rand 500 : 0 ] if rand() < 1 / 3;
		if ($run->{event})
		{
			push @targets, [ pick(@mine), 'emit', rand() < 0.5 ? int rand 1500 : 0 ];
			push @targets, [ pick(@mine), 'emit', int rand 1500 ] if rand() < 1 / 3;
		}
		for my $tg (@targets)
		{
			my $idx = scalar @calls;
			my $call = { idx => $idx, st => $run, runcall => $tg->[1], dup => 0 };
			my $sql = $tg->[2] ? sprintf("SELECT pg_sleep(%.3f);\n", $tg->[2] / 1000) : '';
			if ($tg->[1] eq 'start')
			{
				$sql .= sprintf("SELECT 'ack', %d, status, 0, created FROM ds_start_run('fh_workflow', %s::jsonb, "
					  . "run_key => %s, policy => '{\"max_attempts\": 20}');\n",
					$idx, lit($run->{input}), lit($run->{id}));
			}
			else
			{
				$sql .= sprintf("SELECT 'ack', %d, ds_emit_event(%s, %s::jsonb), 0, 0;\n",
					$idx, lit($run->{event}{name}), lit($json->encode($run->{event}{payload})));
			}
			$call->{sql} = $sql;
			push @calls, $call;
			push @{ $calls_of[ $tg->[0] ] }, $call;
		}
		push @steps, @{ $run->{steps} };
	}
	# the procedure's steps (proc_main): plain SQL steps scripted like the others (no duplicate
	# calls, no stubborn hook), each with a pause after it, stored by one CALL after another of
	# fh_proc as one role; their runs alternate between the two partitions, so that whichever a
	# fence takes, the CALL running meanwhile has steps of it left to store
	my $proc_role = $ROLES[ $t % @ROLES ];
	my @proc_runs;
	{
		my %by_p;
		push @{ $by_p{ $_->[1] } }, "${prefix}c$_->[0]"
		  for @{ rows("SELECT i, ds_partition_of('${prefix}c' || i) FROM generate_series(0, 63) i ORDER BY i") };
		for my $k (0 .. 1)
		{
			push @proc_runs, grep { defined } ($by_p{0} || [])->[$k], ($by_p{1} || [])->[$k];
		}
	}
	my @proc_calls;
	for my $i (1 .. $cfg{proc_steps})
	{
		my $st = make_step(1);
		$st->{run}  = $proc_runs[ ($i - 1) % @proc_runs ];
		$st->{step} = "p$i";
		$st->{tag_step} = "p$i";
		$st->{role} = $proc_role;
		$st->{proc} = 1;
		$st->{pause} = $cfg{proc_pause}[0] + int rand($cfg{proc_pause}[1] - $cfg{proc_pause}[0]);
		push @steps, $st;
		my $call = { idx => scalar @calls, st => $st, nowait => 0, dup => 0, proc => 1 };
		push @calls, $call;
		push @proc_calls, $call;
	}

	note("  trial $t: stubborn $_->{stubborn}{hook} hook" . ($_->{stubborn}{at} ? " at attempt $_->{stubborn}{at}" : '')
		  . " on " . ($_->{http} ? "HTTP step ($_->{kind})" : "step ($_->{kind}, max_attempts $_->{max})")
		  . " $_->{run}/$_->{step}" . (defined $_->{run_at} ? sprintf(' (run_at +%.1fs)', $_->{run_at} - $t0) : ''))
	  for grep { $_->{stubborn} } @steps;
	# shuffle each client's queue: a duplicate may come before, or long after, its primary
	for my $q (@calls_of) { $q = shuffled(@{ $q || [] }) }

	# the hog's steps (after the others', which a seed thus makes as before), made by its two
	# sessions (hog_main) as their backlogs let them: those made (answered, or found in
	# ds_steps) are checked like every other step
	my (@hog_plans, %hog_calls);
	if ($cfg{hog})
	{
		for my $i (1 .. ($opt{short} ? 60 : 150))
		{
			for my $kind ('sql', 'http')
			{
				my $st = $kind eq 'sql' ? make_hog_step() : make_hog_http_step();
				$st->{run} = $hprefix . ($kind eq 'sql' ? 'q' : 'w') . ($i % 3);
				$st->{step} = $st->{tag_step} = ($kind eq 'sql' ? 'hs' : 'hh') . $i;
				$st->{role} = $HOG;
				push @hog_plans, $st;
				my $idx = scalar @calls;
				my $call = { idx => $idx, st => $st, nowait => 0, dup => 0, hog => 1 };
				$call->{sql} = call_sql($idx, $st, 0, 0);
				push @calls, $call;
				push @{ $hog_calls{$kind} }, $call;
			}
		}
	}
	# the failover, at a random moment of the fault window's first 60 % (at least 1 s in)
	my $fw = $cfg{fault_window} * 0.6 - 1;
	my $failover_at = $standby && $STANDBY ? $t0 + 1 + rand($fw > 0.5 ? $fw : 0.5) : undef;
	# the tasks (make_task; after everything else, which a seed thus makes as before): a call
	# each from a client of its owner, 40 % one or two duplicate calls (answered with the stored
	# state), each placed at a random moment of that client's queue; the last one stored with
	# on_lost => 'uncertain' when no other is
	my @tasks;
	for my $i (1 .. $cfg{tasks})
	{
		my $st = make_task($i == $cfg{tasks} && !grep { $_->{uncertain} } @tasks);
		$st->{run}  = $prefix . 't' . ($i % 3);
		$st->{step} = $st->{tag_step} = "k$i";
		my $c = int rand $nc;
		$st->{role} = $client_role[$c];
		push @tasks, $st;
		my @mine = grep { $client_role[$_] eq $st->{role} } 0 .. $nc - 1;
		my @targets = ([ $c, 0 ]);
		push @targets, [ pick(@mine), rand() < 0.4 ? 20 + int rand 200 : 0 ] for 1 .. (rand() < 0.4 ? 1 + (rand() < 0.3 ? 1 : 0) : 0);
		for my $tg (@targets)
		{
			my $idx = scalar @calls;
			my $call = { idx => $idx, st => $st, nowait => 0, dup => ($tg != $targets[0]) };
			$call->{sql} = call_sql($idx, $st, 0, $tg->[1]);
			push @calls, $call;
			my $q = $calls_of[ $tg->[0] ] ||= [];
			splice @$q, int rand(@$q + 1), 0, $call;
		}
	}
	push @steps, @tasks;
	# the flows (FLOW; after the tasks, which a seed thus makes as before): runs of fh_appflow,
	# 2-4 steps each failing retryably 0-2 times, half of them with a nap after a step
	my $aprefix = "a$tseed-";
	my @flows;
	for my $i (1 .. ($cfg{tasks} ? $cfg{flows} : 0))
	{
		my @fst = map {
			{ fail => rand() < 0.6 ? 0 : 1 + int rand 2,
			  sleep => rand() < 0.2 ? 300 + int rand 600 : 20 + int rand 130 }
		} 1 .. 2 + int rand 3;
		my $input = { steps => \@fst };
		if (rand() < 0.5) { $input->{nap_after} = int rand @fst; $input->{nap_ms} = 50 + int rand 350; }
		push @flows, { id => "$aprefix$i", role => pick(@ROLES), steps => \@fst, input => $json->encode($input) };
	}

	@TRIAL_LOGS = ([ $LOG, log_size() ]);
	my %child;
	my @harness_errs;
	%TW = (w => [], n => $TW{n}, dir => $dir, prefix => $prefix);
	task_workers_tend() if @tasks;
	for my $f (@flows)
	{
		my ($rc, $out, $err) = psql($SU, sprintf("SET ROLE %s;\nSELECT created FROM ds_start_run('fh_appflow', %s::jsonb, "
			  . "run_key => %s);\n", $f->{role}, lit($f->{input}), lit($f->{id})));
		die "starting flow $f->{id} failed: $err\n" if $rc != 0;
	}
	my $deadline = time() + $cfg{calls_deadline};
	for my $c (0 .. $nc - 1)
	{
		my $delay = rand() < 0.5 ? 0 : rand(0.4);
		my $pid = spawn(sub { client_main($client_role[$c], $calls_of[$c], "$dir/client$c", $deadline, $delay) });
		$child{$pid} = "client$c";
	}
	if (@proc_calls)
	{
		my $delay = rand(0.4);
		my $pid = spawn(sub { proc_main($proc_role, \@proc_calls, "$dir/proc", $deadline, $delay) });
		$child{$pid} = 'proc';
	}
	my @rearm = grep { $_->{kind} eq 'rearm' } @steps;
	if (@rearm)
	{
		my $pid = spawn(sub { rearm_main(\@rearm, "$dir/rearm", $deadline) });
		$child{$pid} = 'rearm';
	}
	# idempotent requests: three sessions of the first role call the same keys with the same
	# request, in their own orders, and one of the second role calls them too (its own keys)
	my @idem_keys = map { "${prefix}k$_" } 1 .. $cfg{idem_keys};
	my @idem_sessions = ((map { $ROLES[0] } 1 .. 3), $ROLES[1]);
	for my $i (0 .. $#idem_sessions)
	{
		my @mine = @{ shuffled(@idem_keys) };
		my $pid = spawn(sub { idem_main($idem_sessions[$i], 'fh', \@mine, "$dir/idem$i", $deadline) });
		$child{$pid} = "idem$i";
	}
	# waits: a session of each role waits for a few of its steps to stop
	my @waited;
	for my $r (0 .. $#ROLES)
	{
		# (an identity with a tab or a CR, which some HTTP steps have, would not fit a line; a
		# run's step exists only if its run gets that far, and a wait for one that never does
		# would last until the clients' deadline)
		my @theirs = grep { $_->{role} eq $ROLES[$r] && !$_->{run_step} && "$_->{run}/$_->{step}" =~ m{^[\w/-]+$} } @steps;
		my @pick = @{ shuffled(@theirs) }[ 0 .. ($cfg{waited} < @theirs ? $cfg{waited} : scalar @theirs) - 1 ];
		push @waited, [ $ROLES[$r], \@pick ];
	}
	for my $w (0 .. $#waited)
	{
		my $pid = spawn(sub { waiter_main(@{ $waited[$w] }, "$dir/waiter$w", $deadline) });
		$child{$pid} = "waiter$w";
	}
	my @to_cancel = grep { defined $_->{cancel_at} } @steps;
	# the timed cancels in one session, in order; each wait for a running attempt in its own
	my @cancel_groups = ([ grep { !$_->{cancel_running} } @to_cancel ],
		map { [$_] } grep { $_->{cancel_running} } @to_cancel);
	@cancel_groups = grep { @$_ } @cancel_groups;
	for my $g (0 .. $#cancel_groups)
	{
		my $start = time();
		my $pid = spawn(sub { cancel_main($cancel_groups[$g], "$dir/cancel$g", $start, $deadline) });
		$child{$pid} = "cancel$g";
	}
	# FAN: the trial's fan-out run, started as the faults begin (check_fanout); its id is not
	# under the trial's prefix, so that the checks of the clients' steps and runs pass it by
	my $fan_run = "fan:$prefix";
	{
		my $items = $json->encode([ map { { run => $fan_run, n => $_ } } 1 .. 8 ]);
		my ($rc, $out, $err) = psql($SU, "SELECT ds_start_run('fh_fanout', "
			  . lit(qq({"items": $items})) . "::jsonb, run_key => " . lit($fan_run) . ")");
		die "starting the fan-out run failed:\n$err\n" if $rc;
	}
	my @runs_to_cancel = grep { defined $_->{cancel_at} } @runs;
	if (@runs_to_cancel)
	{
		my $start = time();
		my $pid = spawn(sub { run_cancel_main(\@runs_to_cancel, "$dir/runcancel", $start, $deadline) });
		$child{$pid} = 'runcancel';
	}
	# the hog's two sessions and the sampler of the HTTP worker's slots: they go on after the
	# clients, until the other roles' steps have settled (the hog) and its own have (the sampler)
	my %fc;
	my $nfaults = 0;
	my $stopfile = "$dir/sampler.stop";
	if ($cfg{hog})
	{
		my $hog_deadline = time() + $cfg{calls_deadline} + $cfg{settle_timeout};
		for my $kind ('sql', 'http')
		{
			my $pid = spawn(sub { hog_main($kind, $hog_calls{$kind}, $hprefix, $cfg{"hog_$kind"}, "$dir/hog_$kind",
				$hog_deadline) });
			$child{$pid} = "hog_$kind";
		}
		my $pid = spawn(sub { sampler_main("$dir/sampler", $stopfile, $hog_deadline + $cfg{settle_timeout}) });
		$child{$pid} = 'sampler';
		$pid = spawn(sub { hold_main("$dir/hold", $stopfile, $hog_deadline + $cfg{settle_timeout}) });
		$child{$pid} = 'hold';
		$fc{hog} = 1;
		$nfaults++;
	}

	# faults while the clients run and the worker drains
	my $fault_end = $t0 + $cfg{fault_window};
	# (an event wait is a pending step that no executor claims: its run is what waits)
	my $busy_sql = "SELECT (SELECT count(*) FROM ds_steps WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$aprefix%') "
	  . "AND status IN ('pending', 'retrying', 'running') AND kind <> 'event') "
	  . "+ (SELECT count(*) FROM ds_runs WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$aprefix%') "
	  . "AND status IN ('pending', 'running', 'waiting'))";
	while (time() < $fault_end || defined $failover_at)
	{
		while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0) { child_ended($pid, \%child, \@harness_errs) }
		task_workers_tend() if @tasks;
		if (!fg_children(\%child) && !defined $failover_at)
		{
			my ($rc, $out) = psql($SU, $busy_sql, timeout => 10);
			last if $rc == 0 && $out =~ /^0$/m;
		}
		usleep(1e6 * ($cfg{gap_min} + rand($cfg{gap_max} - $cfg{gap_min})));
		my $f = defined $failover_at && time() >= $failover_at ? 'failover' : next_fault();
		undef $failover_at if $f eq 'failover';
		my $what = inject($f, \%fc);
		next unless defined $what;
		$fc{$f}++;
		$nfaults++;
		note("  trial $t +" . sprintf('%.2f', time() - $t0) . "s: $what");
	}
	my $fault_time = time() - $t0;
	# no partition stays fenced into the settle and the checks (a fence ends within its fault)
	unfence();
	# no task worker stays stopped into the settle (each gets its SIGCONT when its stop ends)
	task_workers_tend(1) if @tasks;

	# the clients end by their deadline; a child still there well after it is a harness fault
	my $reap_deadline = $deadline + 30;
	while (fg_children(\%child) && time() < $reap_deadline)
	{
		my $pid = waitpid(-1, POSIX::WNOHANG());
		if ($pid > 0) { child_ended($pid, \%child, \@harness_errs); next }
		usleep(50_000);
	}
	if (my @fg = fg_children(\%child))
	{
		kill 'KILL', keys %child;
		die "client processes did not end: " . join(', ', map { $child{$_} } @fg) . "\n";
	}
	note(sprintf("  trial %d +%.2fs: the clients are done (faults until +%.2fs)", $t, time() - $t0, $fault_time));
	wait_ready(60);

	# settle: nothing pending, retrying or running (polled, bounded)
	my $settle_start = time();
	my $settled = 0;
	while (time() - $settle_start < $cfg{settle_timeout})
	{
		if (value($busy_sql) == 0) { $settled = 1; last }
		while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0) { child_ended($pid, \%child, \@harness_errs) }
		task_workers_tend() if @tasks;
		usleep(100_000);
	}
	my $settle_time = time() - $settle_start;
	note(sprintf("  trial %d +%.2fs: settled in %.2fs", $t, time() - $t0, $settle_time));

	# the hog flooded until now: what of its work was unfinished as the others settled (or did
	# not), then its stop sign, the end of its sessions, its steps settling, and the sampler's end
	my $hog_busy_sql = "SELECT count(*) FROM ds_steps WHERE run_id LIKE '$hprefix%' "
	  . "AND status IN ('pending', 'retrying', 'running')";
	my ($hog_pending, $hog_settle_time, $hog_settled, $unsettled) = (0, 0, 1, []);
	if ($cfg{hog})
	{
		$hog_pending = value($hog_busy_sql);
		$unsettled = rows("SELECT run_id || '/' || step_id || ' ' || status || ' at attempt ' || attempt "
			  . "|| ' (' || owner::text || ', queue ' || queue || ')' FROM ds_steps WHERE run_id LIKE '$prefix%' "
			  . "AND status IN ('pending', 'retrying', 'running') AND kind <> 'event' ORDER BY 1 LIMIT 10")
		  unless $settled;
		rows("INSERT INTO fh_hog_stop VALUES (" . lit($hprefix) . ") ON CONFLICT DO NOTHING RETURNING 1");
		my $hog_reap = time() + 60;
		while ((grep { /^hog_/ } values %child) && time() < $hog_reap)
		{
			my $pid = waitpid(-1, POSIX::WNOHANG());
			if ($pid > 0) { child_ended($pid, \%child, \@harness_errs); next }
			usleep(50_000);
		}
		if (my @left = grep { $child{$_} =~ /^hog_/ } keys %child)
		{
			kill 'KILL', @left;
			die "the hog's sessions did not end within 60 s of its stop sign\n";
		}
		my $hog_settle_start = time();
		$hog_settled = 0;
		while (time() - $hog_settle_start < $cfg{settle_timeout})
		{
			if (value($hog_busy_sql) == 0) { $hog_settled = 1; last }
			usleep(100_000);
		}
		$hog_settle_time = time() - $hog_settle_start;
		open my $sf, '>', $stopfile or die "$stopfile: $!";
		close $sf;
		my $sampler_reap = time() + 30;
		my $hold_ended = 0;
		while (%child && time() < $sampler_reap)
		{
			my $pid = waitpid(-1, POSIX::WNOHANG());
			if ($pid > 0) { child_ended($pid, \%child, \@harness_errs); next }
			# the horizon's session sleeps 20 s at a time: end it (again, should a new one have
			# begun as the stop sign went up)
			if ((grep { $_ eq 'hold' } values %child) && time() > $hold_ended + 0.5)
			{
				psql($SU, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'fh_hold'",
					timeout => 10);
				$hold_ended = time();
			}
			usleep(50_000);
		}
		if (%child)
		{
			kill 'KILL', keys %child;
			die "the sampler did not end within 30 s\n";
		}
	}
	# the task workers stop gracefully (their logs are read below)
	if (@tasks)
	{
		my $t1 = time();
		task_workers_stop(\@harness_errs);
		note(sprintf("  trial %d +%.2fs: the task workers stopped in %.2fs", $t, time() - $t0, time() - $t1));
	}
	tamper($prefix, \%fc) if $opt{tamper} && $t == 1;
	my $pc = provider_counts();

	# ---- what the clients saw
	# (%seen: each step's answered calls, [status, attempt, call index], for the committed state)
	my (%acks, %seen, @client_errs, $reconnects, $hog_prio, $hog_stops);
	$reconnects = 0;
	my $ds201 = 0;    # calls refused with DS201 while a partition was fenced (and made again)
	$hog_stops = 0;
	my ($proc_calls_n, $proc_refused) = (0, 0);    # the procedure's CALLs, those ended by DS201
	for my $f ((map { "$dir/client$_" } 0 .. $nc - 1), @proc_calls ? "$dir/proc" : (),
		$cfg{hog} ? map { "$dir/hog_$_" } 'sql', 'http' : ())
	{
		open my $fh, '<', $f or die "$f: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			if ($f[0] eq 'ack')
			{
				my $c = $calls[ $f[1] ];
				$acks{ $c->{st} }++;
				push @{ $seen{ $c->{st} } }, [ $f[2], $f[3], $f[1] ] unless $c->{runcall};
			}
			elsif ($f[0] eq 'err') { push @client_errs, [ $calls[ $f[1] ], $f[2], $f[3] ] }
			elsif ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
			elsif ($f[0] eq 'prio') { $hog_prio = $f[1] }
			elsif ($f[0] eq 'proc') { ($proc_calls_n, $proc_refused) = @f[ 1, 2 ] }
			elsif ($f[0] eq 'stop') { $hog_stops++ }
		}
		close $fh;
	}
	my (@rearm_left, @rearm_errs);
	if (@rearm)
	{
		open my $fh, '<', "$dir/rearm" or die "$dir/rearm: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			push @rearm_left, $f[1] if $f[0] eq 'left';
			push @rearm_errs, "@f[1..4]" if $f[0] eq 'err';
			if ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
		}
		close $fh;
	}

	my (%cancel_ack, %cancel_calls, @cancel_errs);
	for my $g (0 .. $#cancel_groups)
	{
		open my $fh, '<', "$dir/cancel$g" or die "$dir/cancel$g: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			$cancel_ack{"$f[1]/$f[2]"} = $f[3] if $f[0] eq 'cancel';
			$cancel_calls{"$f[1]/$f[2]"} = $f[4] if $f[0] eq 'cancel';
			$cancel_ack{"$f[1]/$f[2]"} = 'done' if $f[0] eq 'done';
			push @cancel_errs, "@f[1..$#f]" if $f[0] eq 'err';
			if ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
		}
		close $fh;
	}

	# idempotent requests: the answers by (role, key), and the calls that got an error
	my (%idem_acks, @idem_errs);
	for my $i (0 .. $#idem_sessions)
	{
		open my $fh, '<', "$dir/idem$i" or die "$dir/idem$i: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			push @{ $idem_acks{"$idem_sessions[$i]/$f[1]"} }, [ @f[ 2 .. 4 ] ] if $f[0] eq 'ack';
			push @idem_errs, "$idem_sessions[$i] $f[1]: $f[2] $f[3]" if $f[0] eq 'err';
			if ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
		}
		close $fh;
	}
	# waits: every answer, in order, by step
	my %wait_answers;
	for my $w (0 .. $#waited)
	{
		open my $fh, '<', "$dir/waiter$w" or die "$dir/waiter$w: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			push @{ $wait_answers{"$f[1]/$f[2]"} }, [ @f[ 3 .. 5 ] ] if $f[0] eq 'wait';
			if ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
		}
		close $fh;
	}

	my (%run_cancel_ack, @run_cancel_errs);
	if (@runs_to_cancel)
	{
		open my $fh, '<', "$dir/runcancel" or die "$dir/runcancel: $!";
		while (<$fh>)
		{
			chomp;
			my @f = split /\t/;
			$run_cancel_ack{ $f[1] } = $f[2] if $f[0] eq 'cancel';
			$run_cancel_ack{ $f[1] } = 'done' if $f[0] eq 'done';
			push @run_cancel_errs, "@f[1..$#f]" if $f[0] eq 'err';
			if ($f[0] eq 'stat') { $reconnects += $f[1]; $ds201 += $f[2] || 0 }
		}
		close $fh;
	}

	# ---- the database's view
	my $steps_rows = rows(
		"SELECT s.run_id, s.step_id, s.status, s.attempt, s.max_attempts, coalesce(s.error_class, ''), "
		  . "coalesce(s.error_code, ''), coalesce(s.result::text, ''), s.owner::text, coalesce(s.input::text, ''), "
		  . "(s.next_attempt_at IS NULL), s.kind, extract(epoch FROM s.created_at), "
		  . "coalesce(extract(epoch FROM s.finished_at)::text, ''), "
		  . "CASE WHEN s.kind = 'sleep' THEN extract(epoch FROM (s.result->>'until')::timestamptz)::text ELSE '' END "
		  . "FROM ds_steps s WHERE (s.run_id LIKE '$prefix%' OR s.run_id LIKE '$hprefix%')");
	my $run_rows = rows(
		"SELECT run_id, status, coalesce(output::text, ''), coalesce(error_code, ''), "
		  . "coalesce(error_message, ''), coalesce(extract(epoch FROM finished_at)::text, ''), turns, "
		  . "owner::text, coalesce(wait_reason, '') FROM ds_runs WHERE run_id LIKE '$prefix%'");
	my $att_rows = rows(
		"SELECT run_id, step_id, attempt, coalesce(class, ''), coalesce(error_code, ''), "
		  # a message may hold a line break (a driver's error text ends with one): on one line
		  . "regexp_replace(coalesce(error_message, ''), '[\\r\\n]+', ' ', 'g'), executor, coalesce(backend_pid, 0), coalesce(role::text, ''), "
		  . "extract(epoch FROM claimed_at), extract(epoch FROM started_at), "
		  . "coalesce(extract(epoch FROM finished_at)::text, ''), "
		  . "regexp_replace(coalesce(error_detail, ''), '\\s+', ' ', 'g'), idempotency_key, attempt_key "
		  . "FROM ds_attempts WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$hprefix%') ORDER BY run_id, step_id, attempt");
	my $ledger_rows = rows(
		"SELECT run_id, step_id, attempt, kind, who, pid, id, extract(epoch FROM at) FROM fh_ledger "
		  . "WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$hprefix%') ORDER BY run_id, step_id, attempt, id");

	my %srow = map { ("$_->[0]/$_->[1]" => $_) } @$steps_rows;
	my (%att, %att_count);
	for my $r (@$att_rows)
	{
		my $k = "$r->[0]/$r->[1]";
		$att_count{$k}{ $r->[2] }++;
		$att{$k}{ $r->[2] } = $r;
	}
	my %ledger;
	push @{ $ledger{"$_->[0]/$_->[1]"} }, $_ for @$ledger_rows;
	# the task handlers' effects, and every execution of a handler (TASK_WORKER)
	my (%task_eff, %task_runs);
	push @{ $task_eff{"$_->[0]/$_->[1]"} }, $_ for @{ rows(
		"SELECT run_id, step_id, attempt, kind, idem_key, attempt_key, worker, os_pid, who, id FROM fh_task_effects "
		  . "WHERE run_id LIKE '$prefix%' ORDER BY run_id, step_id, attempt, id") };
	my $task_run_rows = rows(
		"SELECT run_id, step_id, attempt, idem_key, attempt_key, worker, os_pid, extract(epoch FROM at), id "
		  . "FROM fh_task_runs WHERE run_id LIKE '$prefix%' ORDER BY run_id, step_id, attempt, id");
	push @{ $task_runs{"$_->[0]/$_->[1]"} }, $_ for @$task_run_rows;
	my $hook_rows = rows(
		"SELECT run_id, step_id, hook, status, attempt, who FROM fh_hooks "
		  . "WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$hprefix%') ORDER BY run_id, step_id, attempt, id");
	my %hooks;
	push @{ $hooks{"$_->[0]/$_->[1]"} }, $_ for @$hook_rows;
	my %hog_acked = map { ($_->{st} => 1) } grep { $_->{hog} && $acks{ $_->{st} } } @calls;
	my @hog_steps = grep { $hog_acked{$_} || $srow{"$_->{run}/$_->{step}"} } @hog_plans;
	push @steps, @hog_steps;
	my %planned = map { ("$_->{run}/$_->{step}" => $_) } @steps;
	my %run_cancelled = map { ($_->{id} => ($run_cancel_ack{ $_->{id} } // '') eq 'cancelled') } @runs;
	for my $run (@runs)
	{
		$planned{"$run->{id}/nap"} = { run_wait => 'sleep', run => $run->{id}, step => 'nap' } if $run->{sleep};
		$planned{"$run->{id}/ev"} = { run_wait => 'event', run => $run->{id}, step => 'ev' } if $run->{event};
	}

	my %viol;    # check => [ lines ]
	my $v = sub { push @{ $viol{ $_[0] } }, $_[1] };
	my $fmt = sub { return join ' | ', @{ $_[0] } };

	# fenced run: no worker attempt of a fenced partition started while the fence was in force in
	# every worker process (a window of the fault `fence`: from the first empty
	# ds_partition_workers_behind() after its reload to its reopen's ALTER SYSTEM), unless it was
	# claimed before. A worker process takes a reload only between claims (src/worker/executor.c),
	# so what it claimed before (a batch whose attempts it starts one after another, turns it
	# takes for up to 250 ms) finishes after the reload, and the process shows behind meanwhile:
	# such a claim's time, taken in its transaction, is before the window. ds_attempts records it
	# (claimed_at; a lost attempt's started_at is when it was found lost, its claimed_at the
	# claim's), so the check is exact, without a tolerance: a worker attempt claimed at or after
	# the window's start and before its end is a violation -- every one that started in the
	# window and was not claimed before it (started_at >= claimed_at), and a claim made in the
	# window whose attempt started later.
	for my $w (@{ $fc{fence_windows} || [] })
	{
		my ($p, $from, $to) = @$w;
		my $r = rows("SELECT run_id || '/' || step_id, attempt, coalesce(class, 'running'), backend_pid, "
			  . "claimed_at, started_at FROM ds_attempts WHERE (run_id LIKE '$prefix%' OR run_id LIKE '$hprefix%') "
			  . "AND executor = 'worker' AND ds_partition_of(run_id) = $p "
			  . "AND claimed_at >= " . lit($from) . "::timestamptz AND claimed_at < " . lit($to) . "::timestamptz "
			  . "ORDER BY 1, 2");
		$v->('fenced run', "step $_->[0] attempt $_->[1] ($_->[2], pid $_->[3]) of partition $p claimed at $_->[4], "
			  . "started at $_->[5], while the partition was fenced everywhere from $from to $to")
		  for @$r;
	}

	# fenced write: no step of a fenced partition was created by a caller inside a window of a
	# fence -- whatever settings the caller's session began with: a procedure that commits in a
	# loop (proc_main) keeps those of its CALL's start. ds_run_step checks the run's partition
	# first, before it reads or writes anything, and then makes the step: the step's created_at
	# is the clock as it did (GetCurrentTimestamp(), not the transaction's start), after the
	# check, which in turn came after the transaction's start. A transaction that began before
	# the window may have passed the check before it and create or commit the step inside it:
	# no violation. One that began at or after the window's start and created the step before its
	# end (the step's created_at) was checked inside the window, and must have been refused (DS201):
	# exact, without a tolerance. The transaction's start is known for every step the procedure
	# stored (fh_proc_log.xact_at, now() in the transaction that stored it; the step created by
	# that transaction when its created_at is not before), and for every step whose attempt 1
	# ran in the caller's ds_run_step and committed its ledger row (fh_ledger.xact_at; not a run's
	# step, which a worker's turn makes: 'fenced run').
	for my $w (@{ $fc{fence_windows} || [] })
	{
		my ($p, $from, $to) = @$w;
		my ($f, $e) = (lit($from) . '::timestamptz', lit($to) . '::timestamptz');
		my $r = rows("SELECT 'the procedure (pid ' || l.pid || ', as ' || l.who || ')', l.run_id || '/' || l.step_id, "
			  . "l.xact_at, s.created_at FROM fh_proc_log l JOIN ds_steps s USING (run_id, step_id) "
			  . "WHERE l.run_id LIKE '$prefix%' AND ds_partition_of(l.run_id) = $p "
			  . "AND l.xact_at >= $f AND s.created_at >= l.xact_at AND s.created_at < $e "
			  . "UNION ALL "
			  . "SELECT 'a caller (pid ' || g.pid || ', as ' || g.who || ')', g.run_id || '/' || g.step_id, "
			  . "g.xact_at, s.created_at FROM fh_ledger g JOIN ds_steps s USING (run_id, step_id) "
			  . "JOIN ds_attempts a ON a.run_id = g.run_id AND a.step_id = g.step_id AND a.attempt = 1 "
			  . "AND a.executor = 'caller' AND a.backend_pid = g.pid "
			  . "WHERE (g.run_id LIKE '$prefix%' OR g.run_id LIKE '$hprefix%') AND g.attempt = 1 "
			  . "AND NOT EXISTS (SELECT FROM ds_runs x WHERE x.run_id = g.run_id) "
			  . "AND NOT EXISTS (SELECT FROM fh_proc_log l WHERE l.run_id = g.run_id AND l.step_id = g.step_id) "
			  . "AND ds_partition_of(g.run_id) = $p "
			  . "AND g.xact_at >= $f AND s.created_at >= g.xact_at AND s.created_at < $e ORDER BY 2");
		$v->('fenced write', "step $_->[1] of partition $p was created by $_->[0] at $_->[3], in a transaction "
			  . "begun at $_->[2], while the partition was fenced everywhere from $from to $to")
		  for @$r;
	}

	# nothing lost: every planned step exists; an acknowledged one above all
	for my $st (@steps)
	{
		my $k = "$st->{run}/$st->{step}";
		# whether a run reached its step is the run's check
		next if $srow{$k} || $st->{run_step};
		$v->('lost', "step $k (acknowledged " . ($acks{$st} || 0) . " time(s)) does not exist");
	}
	for my $k (sort keys %srow)
	{
		$v->('unknown step', "step $k exists but no client created it") unless $planned{$k};
	}
	# client errors: only DS409 on a nowait duplicate and DS422 on a re-armed step are answers
	for my $e (@client_errs)
	{
		my ($call, $code, $msg) = @$e;
		if ($call->{runcall})
		{
			$v->('client error', "$call->{runcall} call #$call->{idx} of run $call->{st}{id} (role $call->{st}{role}): $code $msg");
			next;
		}
		my $k = "$call->{st}{run}/$call->{st}{step}";
		next if $code eq 'DS409' && $call->{nowait};
		next if $code eq 'DS422' && $call->{st}{kind} eq 'rearm';
		$v->('client error', "call #$call->{idx} of $k (role $call->{st}{role}"
			  . ($call->{nowait} ? ', nowait' : '') . "): $code $msg");
	}
	$v->('rearm', "ds_retry_step error: $_") for @rearm_errs;
	$v->('rearm', "step $_ was never re-armed") for @rearm_left;
	$v->('cancel', "ds_cancel_step error: $_") for @cancel_errs;
	$v->('run cancel', "ds_cancel_run error: $_") for @run_cancel_errs;
	$v->('settle', "steps still pending, retrying or running after $cfg{settle_timeout} s") unless $settled;

	my (%status_n, %http_status, %run_step_n, %task_status);
	my $task_att = 0;
	my ($http_lost, $http_charges) = (0, 0);
	my ($lost_n, $n_att, $n_caller, $n_worker, $n_caller_retry, $n_stopped) = (0, 0, 0, 0, 0, 0);
	my %hog_status;
	my ($hog_att, $hog_lost, $hog_charges) = (0, 0, 0);
	for my $k (sort keys %srow)
	{
		my $row = $srow{$k};
		my $st = $planned{$k} or next;
		my $status = $row->[2];
		if ($st->{run_step} || $st->{run_wait})
		{
			# a run's steps end succeeded or failed (a sleep succeeded), or cancelled with their run
			$run_step_n{$status}++ if $st->{run_step};
			$v->('not terminal', "step of a run: " . $fmt->($row))
			  unless ($st->{run_wait} ? $status eq 'succeeded' : $status =~ /^(succeeded|failed)$/)
			  || ($status eq 'cancelled' && $run_cancelled{ $st->{run} });
			next if $st->{run_wait};
		}
		elsif ($st->{hog}) { $hog_status{ ($st->{http} ? 'http ' : '') . $status }++; }
		elsif ($st->{task}) { $task_status{$status}++; }
		else { $status_n{$status}++; }
		# terminal, and nothing running; cancelled only when ds_cancel_step said so
		$v->('not terminal', "step: " . $fmt->($row))
		  unless $status =~ /^(succeeded|failed|blocked)$/
		  || ($status eq 'uncertain' && ($st->{http} || $st->{uncertain}))
		  || ($status eq 'cancelled' && ($cancel_ack{$k} // '') eq 'cancelled')
		  || ($st->{run_step} && $status eq 'cancelled' && $run_cancelled{ $st->{run} });
		$v->('cancel', "ds_cancel_step answered cancelled, the step is $status: " . $fmt->($row))
		  if ($cancel_ack{$k} // '') eq 'cancelled' && $status ne 'cancelled';
		$v->('cancel', "ds_cancel_step answered DS103 (finished), the step is $status: " . $fmt->($row))
		  if ($cancel_ack{$k} // '') eq 'done' && $status !~ /^(succeeded|failed)$/;
		my $at = $att{$k} || {};
		# contiguous attempt numbers 1..attempt, each recorded once, each with an outcome
		my @nums = sort { $a <=> $b } keys %$at;
		my $want = join ',', 1 .. $row->[3];
		$v->('attempt numbers', "step $k is at attempt $row->[3]; ds_attempts has attempts "
			  . join(',', map { $_ . ($att_count{$k}{$_} > 1 ? "(x$att_count{$k}{$_})" : '') } @nums))
		  if join(',', @nums) ne $want || grep { $att_count{$k}{$_} > 1 } @nums;
		for my $n (@nums)
		{
			if ($st->{hog}) { $hog_att++; }
			elsif ($st->{task}) { $task_att++; }
			else
			{
				$n_att++;
				$at->{$n}[6] eq 'caller' ? $n_caller++ : $n_worker++;
				$n_stopped++ if $at->{$n}[3] eq 'cancelled';
				$n_caller_retry++ if $n > 1 && $at->{$n}[6] eq 'caller';
			}
			$v->('attempt without outcome', "attempt: " . $fmt->($at->{$n})) if $at->{$n}[3] eq '';
			# attempt 1 runs in the caller, or for a deferred step in the worker
			# (a run's step: in the turn's ds_run_step, RUNSTEP_FIRST)
			$v->('first attempt not where it belongs', "attempt: " . $fmt->($at->{$n}))
			  if $n == 1 && $at->{$n}[6] ne ($st->{run_step} ? RUNSTEP_FIRST
				: $st->{defer} || $st->{http} || $st->{task} ? 'worker' : 'caller');
			$v->('attempt role', "attempt run as $at->{$n}[8], step owned by $row->[8]: " . $fmt->($at->{$n}))
			  if $at->{$n}[8] ne $row->[8];
		}
		# the ledger: only completed attempts' rows, one each; one per succeeded step
		my @l = @{ $ledger{$k} || [] };
		my %per;
		$per{ $_->[2] }++ for @l;
		for my $n (sort { $a <=> $b } keys %per)
		{
			$v->('duplicate effect', "ledger has $per{$n} rows for $k attempt $n: "
				  . join(' ; ', map { $fmt->($_) } grep { $_->[2] == $n } @l))
			  if $per{$n} > 1;
		}
		for my $l (@l)
		{
			my $rec = $at->{ $l->[2] };
			if ($l->[3] ne 'success effect')
			{
				$v->('effect of a failed attempt', "ledger: " . $fmt->($l)
					  . " / attempt: " . ($rec ? $fmt->($rec) : 'none'));
			}
			elsif (!$rec || $rec->[3] ne 'completed')
			{
				$v->('effect without a completed attempt', "ledger: " . $fmt->($l)
					  . " / attempt: " . ($rec ? $fmt->($rec) : 'none'));
			}
			elsif ($rec->[7] != $l->[5] || $l->[4] ne $row->[8])
			{
				$v->('effect by another process or role', "ledger: " . $fmt->($l)
					  . " / attempt: " . $fmt->($rec) . " / owner $row->[8]");
			}
		}
		my $success_rows = grep { $_->[3] eq 'success effect' } @l;
		$v->('success effect count', "step $k is $status with $success_rows success effect row(s)")
		  if $success_rows != ($status eq 'succeeded' && !$st->{http} && !$st->{task} ? 1 : 0);
		$v->(@$_) for $st->{task} ? check_task_effects($st, $row, $at, $task_eff{$k}, $task_runs{$k}) : ();
		for my $n (@nums)
		{
			next unless $at->{$n}[3] eq 'completed' && !$st->{http} && !$st->{task};
			$v->('completed attempt without effect', "attempt: " . $fmt->($at->{$n})) unless $per{$n};
		}
		# outcome hooks: on_success once for a succeeded step, with its attempt; on_failure once
		# for each time the step failed for good (a re-armed step may have failed before), the
		# last one with the step's attempt if it is failed; nothing for any other outcome
		my @h = @{ $hooks{$k} || [] };
		$v->('outcome hook', "step $k of a run has no hooks, yet: " . join(' ; ', map { $fmt->($_) } @h))
		  if $st->{run_step} && @h;
		@h = () if $st->{run_step};
		my @ok = $st->{run_step} ? () : grep { $_->[2] eq 'on_success' } @h;
		my @fail = grep { $_->[2] eq 'on_failure' } @h;
		if (!$st->{run_step})
		{
			$v->('outcome hook', "step $k is $status at attempt $row->[3]; on_success rows: "
				  . join(' ; ', map { $fmt->($_) } @ok))
			  if ($status eq 'succeeded' ? 1 : 0) != @ok
			  || (@ok && ($ok[0][3] ne 'succeeded' || $ok[0][4] != $row->[3]));
			$v->('outcome hook', "step $k is $status at attempt $row->[3]; on_failure rows: "
				  . join(' ; ', map { $fmt->($_) } @fail))
			  if ($status eq 'failed' && (!@fail || $fail[-1][4] != $row->[3]))
			  || ($st->{kind} ne 'rearm' && @fail > ($status eq 'failed' ? 1 : 0))
			  || grep { $_->[3] ne 'failed' || !$at->{ $_->[4] } || $at->{ $_->[4] }[3] eq 'completed' } @fail;
			$v->('outcome hook', "hook row written as $_->[5], step owned by $row->[8]: " . $fmt->($_))
			  for grep { $_->[5] ne $row->[8] } @h;
		}
		# the end state as the script, the policy and the lost attempts predict
		if ($st->{http})
		{
			my ($hv, $lost, $charges) = check_http_step($st, $row, $at, $pc);
			if ($st->{hog}) { $hog_lost += $lost; $hog_charges += $charges; }
			else
			{
				$lost_n += $lost;
				$http_lost += $lost;
				$http_charges += $charges;
				$http_status{$status}++;
			}
			$v->(@$_) for @$hv;
			$v->($hv->[0][0], "  attempts of $k: " . join(' ; ', map { join(' ', @{ $at->{$_} }[ 2 .. 7 ]) } @nums))
			  if @$hv && @nums;
		}
		my ($pv, $lost) = $st->{http} ? ([], 0)
		  : $status eq 'cancelled' ? check_cancelled_step($st, $row, $at, $cancel_calls{"$st->{run}/$st->{step}"}) : check_step($st, $row, $at);
		$st->{hog} ? ($hog_lost += $lost) : ($lost_n += $lost);
		if (@$pv)
		{
			$v->('end state', $_) for @$pv;
			$v->('end state', "  attempts of $k: " . join(' ; ',
					map { join(' ', @{ $at->{$_} }[ 2 .. 7 ]) } @nums))
			  if @nums;
		}
		# no attempt earlier than its schedule: started >= previous finished + delay
		if ($st->{kind} ne 'rearm')
		{
			for my $n (@nums)
			{
				next if $n == 1 || !$at->{ $n - 1 } || $at->{ $n - 1 }[11] eq '';
				my $prev = $at->{ $n - 1 };
				next unless $prev->[3] eq 'retryable';
				# an HTTP 429 answered Retry-After: 1; the HTTP worker computes a delay from the
				# answer's arrival, which its batched recording may put a few ms before finished_at
				my $d = $prev->[4] eq ($st->{task} ? 'fh_ra' : 'DS002') ? $st->{ra} / 1000
				  : $st->{http} && $prev->[12] =~ /"status": ?429/ ? 1 : backoff_s($st, $n - 1);
				my $due = $prev->[11] + $d - ($st->{http} ? 0.05 : 0);
				$v->('early attempt', sprintf("step %s attempt %d claimed %.6f / started %.6f by %s pid %d, due at %.6f "
						  . "(attempt %d %s finished %.6f + %.3f s, by %s pid %d: %s)", $k, $n, $at->{$n}[9], $at->{$n}[10],
						$at->{$n}[6], $at->{$n}[7], $due, $n - 1, $prev->[4], $prev->[11], $d, $prev->[6], $prev->[7],
						$prev->[12]))
				  if $at->{$n}[9] < $due - 0.001 || $at->{$n}[10] < $due - 0.001;
			}
		}
	}

	# leases lost to a fault of a task worker: an attempt whose handler began in a worker before we
	# killed it (kill -9) or stopped it past its lease (SIGSTOP, then SIGCONT) and that did not end
	# within 1 s of the fault (an outcome already sent) was recorded lost by the background worker
	# (DS007, invocation_lost): never an outcome of that worker, dead, or back too late -- its late
	# outcomes must have been refused (DS410), their transactions with them
	my $leases_checked = 0;
	for my $f ((map { [ 'kill -9', @$_ ] } @{ $fc{task_kills} || [] }),
		(map { [ 'SIGSTOP', @$_ ] } @{ $fc{task_stops} || [] }))
	{
		my ($what, $name, $pid, $from, $to) = @$f;
		for my $r (grep { $_->[5] eq $name && $_->[6] == $pid && $_->[7] < $from } @$task_run_rows)
		{
			my $rec = $att{"$r->[0]/$r->[1]"}{ $r->[2] } or next;    # (task attempt)
			next if $rec->[11] ne '' && $rec->[11] < $from + 1;
			$leases_checked++;
			$v->('lease', sprintf("task %s/%s attempt %d, run by %s (pid %d) from %.3f, which a %s at %.3f%s struck, "
					  . "was recorded %s/%s (%s) at %s, not lost (DS007): %s", $r->[0], $r->[1], $r->[2], $name, $pid,
					$r->[7], $what, $from, defined $to && $to > $from ? sprintf(' (until %.3f)', $to) : '',
					$rec->[3], $rec->[4], $rec->[5], $rec->[11] eq '' ? 'no time' : $rec->[11], $fmt->($rec)))
			  unless $rec->[4] eq 'DS007' && $rec->[5] eq 'invocation_lost' && $rec->[3] =~ /^(?:retryable|uncertain)$/;
		}
	}

	# the runs, against their scripts
	my %rrow = map { ($_->[0] => $_) } @$run_rows;
	my (%run_n, $run_turns);
	$run_turns = 0;
	for my $run (@runs)
	{
		my $rr = $rrow{ $run->{id} };
		$run_n{ $rr ? $rr->[1] : 'missing' }++;
		$run_turns += $rr->[6] if $rr;
		$v->(@$_) for check_run($run, $rr, \%srow, \%att, \%ledger, $run_cancel_ack{ $run->{id} });
	}
	my %planned_run = map { ($_->{id} => 1) } @runs;
	$v->('unknown run', "run $_->[0] exists but no client started it") for grep { !$planned_run{ $_->[0] } } @$run_rows;
	$v->(@$_) for check_fanout($fan_run);

	my ($flow_ok, $flow_attempts, $flow_lost, $segments_lost) = (0, 0, 0, 0);
	# the flows (FLOW): every run succeeded with the attempt numbers of its steps as its output;
	# each step has exactly one effect, of its last attempt, which ds_attempts records completed,
	# with the step's idempotency key (flow effect); no attempt of a step ran twice (flow attempt)
	if (@flows)
	{
		my %fr = map { ($_->[0] => $_) } @{ rows("SELECT run_id, status, coalesce(output::text, '') FROM ds_runs "
			  . "WHERE run_id LIKE '$aprefix%'") };
		my %fs = map { ("$_->[0]/$_->[1]" => $_) } @{ rows(
			"SELECT s.run_id, s.step_id, s.status, s.attempt, coalesce(a.class, ''), coalesce(a.idempotency_key, '') "
			  . "FROM ds_steps s LEFT JOIN ds_attempts a ON a.run_id = s.run_id AND a.step_id = s.step_id "
			  . "AND a.attempt = s.attempt WHERE s.run_id LIKE '$aprefix%' AND s.step_id ~ '^s[0-9]+\$'") };
		my %fe;
		push @{ $fe{"$_->[0]/$_->[1]"} }, $_ for @{ rows(
			"SELECT run_id, step_id, attempt, idem_key, worker, os_pid FROM fh_flow_log "
			  . "WHERE run_id LIKE '$aprefix%' AND kind = 'effect' ORDER BY id") };
		($flow_attempts, $flow_lost, $segments_lost) = @{ rows(
			"SELECT count(*) FILTER (WHERE step_id !~ '^ds[.]'), "
			  . "count(*) FILTER (WHERE step_id !~ '^ds[.]' AND error_code = 'DS007'), "
			  . "count(*) FILTER (WHERE step_id ~ '^ds[.]segment' AND error_code = 'DS007') "
			  . "FROM ds_attempts WHERE run_id LIKE '$aprefix%'")->[0] };
		$flow_ok = grep { $_->[1] eq 'succeeded' } values %fr;
		$v->('flow attempt', "flow step $_->[0]/$_->[1]: attempt $_->[2] ran $_->[3] times")
		  for @{ rows("SELECT run_id, step_id, attempt, count(*) FROM fh_flow_log WHERE run_id LIKE '$aprefix%' AND kind = 'run' "
			  . "GROUP BY 1, 2, 3 HAVING count(*) > 1") };
		for my $f (@flows)
		{
			my $r = $fr{ $f->{id} };
			if (!$r || $r->[1] ne 'succeeded')
			{
				$v->('flow effect', "flow $f->{id} is " . ($r ? "$r->[1] ($r->[2])" : 'missing') . ", not succeeded");
				next;
			}
			my @attempts;
			for my $i (0 .. $#{ $f->{steps} })
			{
				my $k = "$f->{id}/s$i";
				my $st = $fs{$k};
				my @e = @{ $fe{$k} || [] };
				if (!$st || $st->[2] ne 'succeeded')
				{
					$v->('flow effect', "flow step $k is " . ($st ? $st->[2] : 'missing') . " in a succeeded run");
					next;
				}
				push @attempts, $st->[3];
				$v->('flow effect', "flow step $k succeeded at attempt $st->[3] with " . scalar(@e) . " effect(s): "
					  . join(' ; ', map { $fmt->($_) } @e))
				  unless @e == 1;
				$v->('flow effect', "flow step $k: its effect is of attempt $_->[2] with key $_->[3]; the step "
					  . "succeeded at attempt $st->[3] ($st->[4]) with key $st->[5]")
				  for grep { $_->[2] != $st->[3] || $_->[3] ne $st->[5] || $st->[4] ne 'completed' } @e;
				$v->('flow effect', "flow step $k succeeded at attempt $st->[3], which its script fails "
					  . "(its first $f->{steps}[$i]{fail})")
				  if $st->[3] <= $f->{steps}[$i]{fail};
			}
			$v->('flow effect', "flow $f->{id} answered $r->[2], its steps succeeded at attempts @attempts")
			  if @attempts == @{ $f->{steps} } && $r->[2] ne '[' . join(', ', @attempts) . ']';
		}
	}
	my $n_run_steps = grep { $_->{run_step} && $srow{"$_->{run}/$_->{step}"} } @steps;

	# queue fh_serial (concurrency 1): no two worker attempts of it overlap, from the claim's commit
	# to the outcome (a lost attempt's step stays running, and counted, until it is recorded)
	my $overlaps = rows(
		"WITH w AS (SELECT a.run_id, a.step_id, a.attempt, a.claimed_at, a.finished_at "
		  . "FROM ds_attempts a JOIN ds_steps s USING (run_id, step_id) "
		  . "WHERE s.queue = 'fh_serial' AND a.executor = 'worker' AND (a.run_id LIKE '$prefix%' OR a.run_id LIKE '$hprefix%')) "
		  . "SELECT x.run_id || '/' || x.step_id || ' attempt ' || x.attempt || ' claimed ' || x.claimed_at, "
		  . "y.run_id || '/' || y.step_id || ' attempt ' || y.attempt || ' ran ' || y.claimed_at || ' .. ' || y.finished_at "
		  . "FROM w x JOIN w y ON (y.run_id, y.step_id, y.attempt) <> (x.run_id, x.step_id, x.attempt) "
		  . "AND y.claimed_at <= x.claimed_at AND y.finished_at > x.claimed_at");
	$v->('queue limit', "$_->[0] while $_->[1] of the same queue (concurrency 1)") for @$overlaps;

	# limit fh_key (concurrency 1 per key): no two worker attempts of one key overlap, from the
	# claim's commit to the outcome (an admitted step counts against its key until its attempt's
	# outcome is recorded, a lost one's too)
	$overlaps = rows(
		"WITH w AS (SELECT a.run_id, a.step_id, a.attempt, a.claimed_at, a.finished_at, s.limit_key "
		  . "FROM ds_attempts a JOIN ds_steps s USING (run_id, step_id) "
		  . "WHERE s.\"limit\" = 'fh_key' AND a.executor = 'worker' AND a.run_id LIKE '$prefix%') "
		  . "SELECT x.run_id || '/' || x.step_id || ' attempt ' || x.attempt || ' claimed ' || x.claimed_at, "
		  . "y.run_id || '/' || y.step_id || ' attempt ' || y.attempt || ' ran ' || y.claimed_at || ' .. ' || y.finished_at, x.limit_key "
		  . "FROM w x JOIN w y ON (y.run_id, y.step_id, y.attempt) <> (x.run_id, x.step_id, x.attempt) "
		  . "AND y.limit_key = x.limit_key AND y.claimed_at <= x.claimed_at AND y.finished_at > x.claimed_at");
	$v->('limit key', "$_->[0] while $_->[1] of the same key $_->[2] of limit fh_key (concurrency 1)")
	  for @$overlaps;
	$v->('limit key', "$_->[0] of limit fh_key is still held or admitted after the trial settled")
	  for @{ rows("SELECT run_id || '/' || step_id FROM durable_steps.steps WHERE run_id LIKE '$prefix%' "
		  . "AND (limit_not_before IS NOT NULL OR limit_admitted IS NOT NULL) "
		  . "AND status NOT IN ('pending', 'retrying', 'running')") };

	# what a client saw committed is there (across a failover above all: a synchronous standby has
	# every commit a client was answered after): a step a call answered finished -- succeeded,
	# failed, uncertain, cancelled, or blocked, unless re-armed or cancelled later -- is still so at
	# that attempt, and no step is behind an attempt a call answered (the attempt-number check then
	# finds each of 1..attempt recorded)
	for my $st (@steps)
	{
		my $k = "$st->{run}/$st->{step}";
		my $row = $srow{$k} or next;    # a missing one is 'lost'
		for my $a (@{ $seen{$st} || [] })
		{
			my ($status, $attempt, $idx) = @$a;
			my $final = $status =~ /^(succeeded|uncertain|cancelled)$/
			  || ($status eq 'failed' && $st->{kind} ne 'rearm')
			  || ($status eq 'blocked' && $st->{kind} ne 'rearm' && !defined $st->{cancel_at});
			$v->('committed state', "call #$idx of $k (role $st->{role}) was answered $status at attempt $attempt; "
				  . "the step is $row->[2] at attempt $row->[3]: " . $fmt->($row))
			  if $row->[3] < $attempt || ($final && ($row->[2] ne $status || $row->[3] != $attempt));
		}
	}

	# the provider's ledger against the steps: no tag asked for or charged that no step of the
	# trial has, and no keyed request that its step has no recorded attempt for (an attempt's
	# request leaves only once its claim is committed -- and, with a synchronous standby, replicated:
	# the new primary of a failover has every attempt the old one sent). A keyed request the
	# provider dropped may be sent again by libcurl within its attempt (h_drop). Without a key,
	# the 'uncertain' check holds: no more requests than attempts.
	my %tag_of = map { (http_tag($_) => $_) } grep { $_->{http} } @steps;
	for my $tag (sort keys %{ $pc->{requests} || {} })
	{
		next unless index($tag, $prefix) == 0 || index($tag, $hprefix) == 0;
		my ($n, $c) = ($pc->{requests}{$tag}, $pc->{charges}{$tag} || 0);
		my $st = $tag_of{$tag};
		if (!$st)
		{
			$v->('unknown charge', "the provider saw $n request(s) and $c charge(s) of tag $tag, which no step of the trial has");
			next;
		}
		my $row = $srow{"$st->{run}/$st->{step}"} or next;
		my $allowed = $row->[3] + ($st->{kind} eq 'h_drop' ? 1 : 0);
		$v->('request without attempt', "step $st->{run}/$st->{step} ($st->{kind}, keyed): the provider saw $n request(s) "
			  . "($c charge(s)), the step has $row->[3] attempt(s): " . $fmt->($row))
		  if $st->{keyed} && $n > $allowed;
	}

	# the HTTP worker's slots (sampler_main): the hog never held more than its share, nobody did,
	# and all roles together no more than http_max_inflight
	my ($samples, $hog_max, $other_max, $total_max, $hog_full) = (0, 0, 0, 0, 0);
	# (reported, not checked: how long the other roles' deferred SQL steps and HTTP steps waited
	# for their first claim, from their creation, while the hog flooded -- faults add to it)
	my %first_wait = (sql => 0, http => 0);
	for my $st (grep { !$_->{hog} && !$_->{run_step} && !defined $_->{run_at} && ($_->{http} || $_->{defer}) } @steps)
	{
		my $k = "$st->{run}/$st->{step}";
		my ($row, $a1) = ($srow{$k}, $att{$k} && $att{$k}{1});
		next unless $row && $a1 && $a1->[6] eq 'worker';
		my $w = $a1->[9] - $row->[12];
		my $kind = $st->{http} ? 'http' : 'sql';
		$first_wait{$kind} = $w if $w > $first_wait{$kind};
	}
	if ($cfg{hog})
	{
		open my $fh, '<', "$dir/sampler" or die "$dir/sampler: $!";
		while (<$fh>)
		{
			chomp;
			if (/^err\t(.*)/) { push @harness_errs, "sampler: $1"; next }
			my (undef, $at, $hog, $other, $total, $detail) = split /\t/, $_, -1;
			$samples++;
			$hog_max = $hog if $hog > $hog_max;
			$other_max = $other if $other > $other_max;
			$total_max = $total if $total > $total_max;
			$hog_full++ if $hog >= $HTTP_PER_ROLE;
			$v->('in flight', sprintf("at %.3f an HTTP worker held %d of %s's requests, %d of another role's, %d in all "
					  . "(http_max_inflight_per_role %d, http_max_inflight %d): %s",
					$at, $hog, $HOG, $other, $total, $HTTP_PER_ROLE, $HTTP_MAX_INFLIGHT, $detail))
			  if $hog > $HTTP_PER_ROLE || $other > $HTTP_PER_ROLE || $total > $HTTP_MAX_INFLIGHT;
		}
		close $fh;
		# nobody starves: the other roles' steps settled while the hog still flooded
		$v->('starvation', "the other roles' steps did not settle within $cfg{settle_timeout} s while $HOG had "
			  . "$hog_pending step(s) unfinished; among them: " . join(' ; ', map { $_->[0] } @$unsettled))
		  unless $settled;
		$v->('settle', "$HOG\'s steps still pending, retrying or running $cfg{settle_timeout} s after its stop sign")
		  unless $hog_settled;
		$v->('hog priority', "$HOG\'s ds_run_step with priority => -100 answered " . ($hog_prio // 'nothing')
			  . ", not 42501 (a priority before everybody's is for durable_steps_admin)")
		  unless ($hog_prio // '') eq '42501';
	}

	# the server log: nothing died of a signal but our kill -9s, no PANIC, the lost attempts logged
	my $log = log_since(\@TRIAL_LOGS);
	for my $line ($log =~ /^(.*(?:terminated by signal (?!9:)\d+|PANIC:|TRAP:|server process .* exited with exit code [^01]).*)$/mg)
	{
		$v->('server crash', $line);
	}
	my $lost_logged = () = $log =~ /durable_steps: attempt \d+ of step \Q$prefix\E\S+ was lost/g;
	my $executor_exits = () = $log =~ /"durable_steps worker" \(PID \d+\) exited with exit code 1/g;
	# bodies that ignored their cancellation ('ig'), and the claims their executors' ends gave back
	my $ignored = () = $log =~ /a step body ignored its cancellation/g;
	my $given_back = () = $log =~ /durable_steps: attempt \d+ of step \Q$prefix\E\S+ (?:never started before its executor ended|rolled back when another step's code ended its executor)/g;
	# extra executors started while every executor was busy (README, "Fair share between roles")
	my $extras = () = $log =~ /durable_steps: extra worker \d+ started/g;

	# ---- stubborn code: the executors it ended, and what those ends charged
	# the executors a stubborn hook ended (its FATAL, whose context is fh_hook: past the grace,
	# or a harness termination while it looped), and those a body that ignored its cancellation
	# ('ig') ended (its log line)
	my (%hook_ended, %body_ended);
	$hook_ended{$1} = 1 while $log =~ /^[^\n]*\[(\d+)\] durable_steps[^\n\]]*worker FATAL:  terminating background worker[^\n]*\n(?:[^\n]*\[\1\][^\n]*CONTEXT:[^\n]*\n)(?:\t[^\n]*\n)*?\t[^\n]*fh_hook\(/mg;
	$body_ended{$1} = 1 while $log =~ /^[^\n]*\[(\d+)\] [^\n]*a step body ignored its cancellation/mg;
	my ($n_stub_sql, $n_stub_http, $stub_struck) = (0, 0, 0);
	for my $st (grep { $_->{stubborn} } @steps)
	{
		my $k = "$st->{run}/$st->{step}";
		my $row = $srow{$k} or next;
		my ($hook, $at_n) = @{ $st->{stubborn} }{qw(hook at)};
		if ($st->{http})
		{
			$n_stub_http++;
			# (check_http_step: an answered step is blocked by its lost hook)
			$stub_struck++ if $row->[2] eq 'blocked' && $row->[6] eq 'DS007';
			next;
		}
		$n_stub_sql++;
		my $rec = $att{$k} && $att{$k}{$at_n} or next;
		my ($cls, $code, $executor, $pid) = @$rec[ 3, 4, 6, 7 ];
		# the outcome of attempt K runs the hook: recorded by the worker, the hook returned there
		$v->('stubborn hook', "step $k: attempt $at_n ended $cls ($code) in the worker, with its $hook hook, which "
			  . "ignores its cancellation there, returned: " . $fmt->($rec))
		  if $executor eq 'worker' && $cls eq ($hook eq 'on_success' ? 'completed' : 'permanent');
		next unless $code eq 'DS007';
		$stub_struck++ if $hook_ended{$pid};
		# the outcome's transaction ended with the executor: the hook's row with it (a lost last
		# attempt fails the step, whose on_failure then runs where the loss is recorded)
		$v->('stubborn hook', "step $k: attempt $at_n was lost (its $hook hook ignored its cancellation), yet the hook's "
			  . "row committed: " . $fmt->($_))
		  for grep { $_->[2] eq $hook && $_->[4] == $at_n } @{ $hooks{$k} || [] };
	}
	# an executor ended by stubborn code charges no other step an attempt: the claims of its batch
	# it had not started get their attempt back -- unless a fault that ended every process came
	# between the claim and the recording (what the executor said as it ended was lost with it)
	my %own_lost;    # the attempts the stubborn code itself lost: "run/step/attempt"
	for my $st (@steps)
	{
		my $k = "$st->{run}/$st->{step}";
		$own_lost{"$k/$st->{stubborn}{at}"} = 1 if $st->{stubborn} && !$st->{http};
		my @p = @{ $st->{plan} || [] };
		$own_lost{"$k/" . ($_ + 1)} = 1 for grep { $p[$_] eq 'ig' } 0 .. $#p;
	}
	for my $r (@$att_rows)
	{
		next unless $r->[4] eq 'DS007' && ($hook_ended{ $r->[7] } || $body_ended{ $r->[7] });
		next if $own_lost{"$r->[0]/$r->[1]/$r->[2]"};
		my ($from, $to) = ($r->[9], $r->[11] eq '' ? time() : $r->[11]);
		next if grep { $_->[0] <= $to + 0.5 && $_->[1] >= $from - 0.5 } @{ $fc{restarts} || [] };
		$v->('batch charged', "executor $r->[7], ended by a " . ($hook_ended{ $r->[7] } ? 'hook' : 'body')
			  . " that ignored its cancellation, charged another step's attempt: " . $fmt->($r));
	}
	my $hook_exits = keys %hook_ended;

	# ---- idempotent requests: per role and key, at most one handler execution committed; when
	# any call was answered, exactly one, and every answer is its response, one of them (at most)
	# not a replay
	my $effects = rows("SELECT who, key, string_agg(id::text, ',' ORDER BY id) FROM fh_idem_effects "
		  . "WHERE scope = 'fh' AND key LIKE '$prefix%' GROUP BY who, key");
	my %effect_ids = map { ("$_->[0]/$_->[1]" => $_->[2]) } @$effects;
	my ($n_idem_acks, $n_idem_replays) = (0, 0);
	for my $rk (sort keys %effect_ids)
	{
		$v->('idempotent effect', "$rk: the handler's effect committed more than once (ids $effect_ids{$rk})")
		  if $effect_ids{$rk} =~ /,/;
	}
	for my $rk (sort keys %idem_acks)
	{
		my @a = @{ $idem_acks{$rk} };
		$n_idem_acks += @a;
		$n_idem_replays += grep { $_->[2] eq 't' } @a;
		my $id = $effect_ids{$rk};
		if (!defined $id)
		{
			$v->('idempotent effect', "$rk: answered " . scalar(@a) . " time(s), but no effect of its handler committed");
			next;
		}
		$v->('idempotent answer', "$rk: answered status $_->[0], effect $_->[1], not the stored response (201, effect $id)")
		  for grep { $_->[0] != 201 || $_->[1] ne $id } @a;
		my $fresh = grep { $_->[2] eq 'f' } @a;
		$v->('idempotent answer', "$rk: $fresh answers say they ran the handler") if $fresh > 1;
	}
	# a repeat in flight for longer than the wait (20 s) may be told so (DS409); nothing else
	$v->('idempotent error', $_) for grep { !/: DS409 / } @idem_errs;

	# ---- waits: an answer before the timeout says the step stopped; a stopped step's answer
	# matches what it ended as (a succeeded step never changes; another may be re-armed, never
	# back to an earlier attempt)
	my %final = map { ("$_->[0]/$_->[1]" => [ $_->[2], $_->[3] ]) } @$steps_rows;
	my $n_wait_answers = 0;
	my $stopped_re = qr/^(?:succeeded|failed|blocked|uncertain|cancelled)$/;
	for my $k (sort keys %wait_answers)
	{
		my ($fs, $fa) = @{ $final{$k} || [ '', 0 ] };
		for my $a (@{ $wait_answers{$k} })
		{
			my ($status, $attempt, $secs) = @$a;
			$n_wait_answers++;
			$v->('wait', "step $k: ds_wait_step answered $status (attempt $attempt) after ${secs}s, before its 3 s timeout")
			  if $status !~ $stopped_re && $secs < 2.9;
			$v->('wait', "step $k: ds_wait_step answered succeeded at attempt $attempt; it ended $fs at attempt $fa")
			  if $status eq 'succeeded' && ($fs ne 'succeeded' || $fa != $attempt);
			$v->('wait', "step $k: ds_wait_step answered $status at attempt $attempt; it ended at attempt $fa")
			  if $status =~ $stopped_re && $fa < $attempt;
		}
	}

	# a client that died, or left no closing line: its calls' fate is unknown to the harness
	for my $c ((map { "client$_" } 0 .. $nc - 1), @proc_calls ? 'proc' : ())
	{
		push @harness_errs, "$c left no closing line in $dir/$c"
		  unless -s "$dir/$c" && `tail -n 1 $dir/$c` =~ /^stat\t/;
	}
	my $nviol = 0;
	$nviol += @$_ for values %viol;
	my $calls_n = grep { !$_->{hog} } @calls;
	my $dups = grep { $_->{dup} } @calls;
	my $fdesc = join(' ', map { "$_=" . ($fc{$_} || 0) } @KINDS);
	my $n_http = grep { $_->{http} && !$_->{hog} } @steps;
	my $n_plain = grep { !$_->{run_step} && !$_->{hog} && !$_->{task} } @steps;
	my $n_hog_sql = grep { !$_->{http} } @hog_steps;
	my $n_hog_http = grep { $_->{http} } @hog_steps;
	my $hst = sub {
		my ($http) = @_;
		my @k = grep { ($http ? /^http / : !/^http /) } sort keys %hog_status;
		return join(' ', map { (my $n = $_) =~ s/^http //; "$n $hog_status{$_}" } @k) || 'none';
	};
	my $hogdesc = !$cfg{hog} ? ''
	  : sprintf("hog: %d sql (%s), %d http (%s), %d attempts, %d lost, "
		  . "%d charges; %d unfinished as the others settled; in flight max %d/%d (at its share in %d of %d samples), "
		  . "others max %d, all max %d/%d; settle %.1fs; others' longest wait for a first claim: sql %.1fs, http %.1fs | ",
		$n_hog_sql, $hst->(0), $n_hog_http, $hst->(1),
		$hog_att, $hog_lost, $hog_charges, $hog_pending, $hog_max, $HTTP_PER_ROLE, $hog_full, $samples,
		$other_max, $total_max, $HTTP_MAX_INFLIGHT, $hog_settle_time, $first_wait{sql}, $first_wait{http});
	# the tasks: their ends, attempts lost and cut, the task workers' faults, and the late outcomes
	# their logs say were refused (DS410: LeaseLost)
	my ($task_lost, $task_cut, $late) = (0, 0, 0);
	for my $st (@tasks)
	{
		for my $r (values %{ $att{"$st->{run}/$st->{step}"} || {} })
		{
			$task_lost++ if $r->[4] eq 'DS007';
			$task_cut++ if $r->[4] =~ $TASK_CUT_RE;
		}
	}
	for my $w (@{ $TW{w} })
	{
		open my $lf, '<', $w->{log} or next;
		while (<$lf>) { $late++ if /lost its lease; its outcome|after losing its lease/ }
		close $lf;
	}
	my $n_task_workers = @{ $TW{w} };
	my $n_uncertain = grep { $_->{uncertain} } @tasks;
	my $taskdesc = !@tasks ? ''
	  : sprintf("tasks %d (%d on_lost uncertain): succeeded %d failed %d blocked %d uncertain %d, %d attempts (lost %d, cut %d); "
		  . "%d task workers: kill9 %d, stop %d, cut %d (%d running a task); %d lost lease(s) checked; %d late outcome(s) refused | ",
		scalar @tasks, $n_uncertain, map({ $task_status{$_} || 0 } qw(succeeded failed blocked uncertain)),
		$task_att, $task_lost, $task_cut, $n_task_workers, map({ scalar @{ $fc{$_} || [] } } qw(task_kills task_stops task_cuts)),
		($fc{task_kill9_busy} || 0) + ($fc{task_stop_busy} || 0) + ($fc{task_cut_busy} || 0), $leases_checked, $late)
	  . (!@flows ? '' : sprintf("flows %d: succeeded %d, %d step attempts (%d lost), %d segments lost | ",
		scalar @flows, $flow_ok, $flow_attempts, $flow_lost, $segments_lost));
	my $sbdesc = !$standby ? ''
	  : sprintf('standby %.1fs, failover with %d HTTP requests claimed (%d without a key), ', $standby_time,
		$fc{failover_http} || 0, $fc{failover_keyless} || 0);
	my $http_hits = 0;
	$http_hits += $fc{"${_}_http"} || 0 for qw(kill9 terminate cancel);
	my $http_inflight = 0;
	$http_inflight += $fc{"${_}_http_inflight"} || 0 for qw(kill9 terminate cancel);
	my $mid = ($fc{kill9_mid_attempt} || 0) + ($fc{terminate_mid_attempt} || 0) + ($fc{cancel_mid_attempt} || 0);
	printf "trial %2d/%d seed %d: %d steps (%d by a procedure: %d CALLs, %d ended by DS201), %d runs, %d calls (%d dup), %d faults [%s; %d mid-attempt] | "
	  . "succeeded %d failed %d blocked %d cancelled %d/%d (%d running) | attempts %d (caller %d, worker %d, lost %d) | "
	  . "http %d: succeeded %d failed %d uncertain %d blocked %d, %d charges, %d lost; HTTP worker hit %d (%d in flight) | "
	  . "stubborn hooks %d (sql %d, http %d): %d struck, %d executor(s) ended in a hook | "
	  . "runs %d: succeeded %d failed %d cancelled %d/%d, %d turns, %d run steps (succeeded %d failed %d cancelled %d) | "
	  . "idempotent %d keys x %d sessions: %d answers (%d replayed), %d effects | waits %d answers on %d steps | "
	  . "%s%sreconnects %d, DS201 %d (fences %d; %d window(s) checked) | %s%.1fs (settle %.1fs) | %s\n",
	  $t, $cfg{trials}, $tseed, $n_plain, scalar @proc_calls, $proc_calls_n, $proc_refused,
	  scalar @runs, $calls_n, $dups, $nfaults, $fdesc, $mid,
	  $status_n{succeeded} || 0, $status_n{failed} || 0, $status_n{blocked} || 0,
	  $status_n{cancelled} || 0, scalar @to_cancel, $n_stopped,
	  $n_att, $n_caller, $n_worker, $lost_n, $n_http, $http_status{succeeded} || 0, $http_status{failed} || 0,
	  $http_status{uncertain} || 0, $http_status{blocked} || 0, $http_charges, $http_lost, $http_hits, $http_inflight,
	  $n_stub_sql + $n_stub_http, $n_stub_sql, $n_stub_http, $stub_struck, $hook_exits,
	  scalar @runs, $run_n{succeeded} || 0, $run_n{failed} || 0, $run_n{cancelled} || 0, scalar @runs_to_cancel,
	  $run_turns, $n_run_steps, $run_step_n{succeeded} || 0, $run_step_n{failed} || 0, $run_step_n{cancelled} || 0,
	  scalar @idem_keys, scalar @idem_sessions, $n_idem_acks, $n_idem_replays, scalar keys %effect_ids,
	  $n_wait_answers, scalar keys %wait_answers,
	  $taskdesc, $hogdesc, $reconnects, $ds201, $fc{fence} || 0, scalar @{ $fc{fence_windows} || [] }, $sbdesc,
	  time() - $t0, $settle_time,
	  $nviol ? "$nviol VIOLATION(S)" : 'ok';
	for my $check (sort keys %viol)
	{
		my @l = @{ $viol{$check} };
		print "  VIOLATION [$check] (" . scalar(@l) . ")\n";
		print "    $_\n" for @l[ 0 .. ($#l < 29 ? $#l : 29) ];
		print "    ... and " . (@l - 30) . " more\n" if @l > 30;
		# told again with the verdict, the last lines a shortened log shows
		push @{ $tot->{violation_lines} }, "trial $t seed $tseed [$check] $l[0]" . (@l > 1 ? " (and " . (@l - 1) . " more)" : '');
	}
	# a lost attempt found by a caller's ds_run_step (run_step.c) is recorded without a log line
	print "  HARNESS ERROR: $_\n" for @harness_errs;
	$tot->{harness_errors} += @harness_errs;
	print "  note: $lost_n lost attempt(s) recorded, $lost_logged logged by the worker\n"
	  if $opt{verbose};

	$tot->{trials}++;
	$tot->{violations} += $nviol;
	$tot->{bad_trials}++ if $nviol;
	$tot->{steps} += $n_plain;
	$tot->{proc_steps} += @proc_calls;
	$tot->{proc_calls} += $proc_calls_n;
	$tot->{proc_refused} += $proc_refused;
	$tot->{runs} += @runs;
	$tot->{tasks} += @tasks;
	$tot->{tasks_uncertain_on_lost} += $n_uncertain;
	$tot->{"tasks_$_"} += $task_status{$_} || 0 for qw(succeeded failed blocked uncertain);
	$tot->{task_attempts} += $task_att;
	$tot->{task_lost} += $task_lost;
	$tot->{task_cut} += $task_cut;
	$tot->{task_workers} += $n_task_workers;
	$tot->{task_busy} += ($fc{task_kill9_busy} || 0) + ($fc{task_stop_busy} || 0) + ($fc{task_cut_busy} || 0);
	$tot->{task_leases_checked} += $leases_checked;
	$tot->{task_late} += $late;
	$tot->{flows} += @flows;
	$tot->{flows_succeeded} += $flow_ok;
	$tot->{flow_lost} += $flow_lost + $segments_lost;
	$tot->{"runs_$_"} += $run_n{$_} || 0 for qw(succeeded failed cancelled);
	$tot->{run_cancels} += @runs_to_cancel;
	$tot->{run_turns} += $run_turns;
	$tot->{run_steps} += $n_run_steps;
	$tot->{"run_steps_$_"} += $run_step_n{$_} || 0 for qw(succeeded failed cancelled);
	$tot->{calls} += $calls_n;
	$tot->{dups} += $dups;
	$tot->{faults} += $nfaults;
	$tot->{fault}{$_} += $fc{$_} || 0 for @KINDS;
	$tot->{standby_trials}++ if $standby;
	$tot->{failover_http} += $fc{failover_http} || 0;
	$tot->{failover_keyless} += $fc{failover_keyless} || 0;
	$tot->{hog_sql} += $n_hog_sql;
	$tot->{hog_http} += $n_hog_http;
	$tot->{hog_ok} += ($hog_status{succeeded} || 0) + ($hog_status{'http succeeded'} || 0);
	$tot->{hog_attempts} += $hog_att;
	$tot->{hog_lost} += $hog_lost;
	$tot->{hog_charges} += $hog_charges;
	$tot->{hog_pending} += $hog_pending;
	$tot->{hog_idle}++ if $cfg{hog} && !$hog_pending;
	$tot->{samples} += $samples;
	$tot->{hog_full} += $hog_full;
	$tot->{hog_max} = $hog_max if $hog_max > ($tot->{hog_max} || 0);
	$tot->{total_max} = $total_max if $total_max > ($tot->{total_max} || 0);
	for my $k ('sql', 'http')
	{
		$tot->{"first_wait_$k"} = $first_wait{$k} if $first_wait{$k} > ($tot->{"first_wait_$k"} || 0);
	}
	$tot->{mid} += $mid;
	$tot->{$_} += $status_n{$_} || 0 for qw(succeeded failed blocked cancelled);
	$tot->{stopped} += $n_stopped;
	$tot->{attempts} += $n_att;
	$tot->{caller} += $n_caller;
	$tot->{worker} += $n_worker;
	$tot->{caller_retry} += $n_caller_retry;
	$tot->{"${_}_mid"} += $fc{"${_}_mid_attempt"} || 0 for qw(kill9 terminate cancel);
	$tot->{lost} += $lost_n;
	$tot->{http} += $n_http;
	$tot->{"http_$_"} += $http_status{$_} || 0 for qw(succeeded failed uncertain blocked);
	$tot->{http_charges} += $http_charges;
	$tot->{http_lost} += $http_lost;
	$tot->{"${_}_http"} += $fc{"${_}_http"} || 0 for qw(kill9 terminate cancel);
	$tot->{http_inflight} += $http_inflight;
	$tot->{lost_logged} += $lost_logged;
	$tot->{reconnects} += $reconnects;
	$tot->{ds201} += $ds201;
	$tot->{fence_windows} += @{ $fc{fence_windows} || [] };
	$tot->{executor_exits} += $executor_exits;
	$tot->{ignored} += $ignored;
	$tot->{hook_exits} += $hook_exits;
	$tot->{stub_sql} += $n_stub_sql;
	$tot->{stub_http} += $n_stub_http;
	$tot->{stub_struck} += $stub_struck;
	$tot->{given_back} += $given_back;
	$tot->{extras} += $extras;
	$tot->{rearmed} += grep { my $r = $srow{"$_->{run}/$_->{step}"}; $r && $r->[9] =~ /"fixed": true/ } @rearm;
	$tot->{max_settle} = $settle_time if $settle_time > ($tot->{max_settle} || 0);
	return $nviol;
}

# ---- main ---------------------------------------------------------------------------------------

my $start = time();
my @sb_trials = grep { standby_trial($_) } 1 .. $cfg{trials};
print "faults: seed $seed, $cfg{trials} trial(s) of $cfg{steps} steps and $cfg{tasks} tasks, $cfg{clients} clients"
  . ($opt{short} ? ' (short)' : '') . ", hog " . ($cfg{hog} ? 'on' : 'off')
  . ", synchronous standby and failover in " . (@sb_trials ? 'trial(s) ' . join(',', @sb_trials) : 'no trial') . "\n";
my %tot;
my $rc = 0;
my $ok = eval {
	provider_start();
	cluster_create();
	setup_database();
	# the task workers' program, and whether python3 can run it (python3-psycopg2, clients/python)
	open my $pf, '>', "$WORK/fh_task_worker.py" or die "$WORK/fh_task_worker.py: $!\n";
	print $pf $TASK_WORKER_PY;
	close $pf;
	my ($prc, undef, $perr) = run_cmd([ 'env', "PYTHONPATH=$FindBin::RealBin/../clients/python", $PYTHON, '-c',
		'import psycopg2, durable_steps_client.worker' ]);
	die "$PYTHON cannot run the task workers (python3-psycopg2, clients/python):\n$perr\n" if $prc;
	my $v = rows("SELECT extversion FROM pg_extension WHERE extname = 'durable_steps'");
	print "faults: durable_steps $v->[0][0] from " . loaded_library() . ", cluster in $DATA, "
	  . "fake provider on 127.0.0.1:$provider_port\n";
	for my $t (1 .. $cfg{trials})
	{
		run_trial($t, $seed + $t - 1, \%tot);
	}
	1;
};
if (!$ok)
{
	print "faults: HARNESS ERROR: $@";
	print log_tail(60);
	$rc = 2;
}
my $elapsed = time() - $start;
printf "faults summary: %d trial(s), seed %d, %.1f s | %d steps (%d by a procedure in %d CALLs, %d ended by DS201), %d calls (%d duplicate) | "
  . "%d faults (%s; mid-attempt: kill9 %d, terminate %d, cancel %d) | succeeded %d, failed %d, "
  . "blocked %d (%d re-armed), cancelled %d by ds_cancel_step (%d while running in the worker) | %d attempts (caller %d, of them %d retries run by a duplicate call; "
  . "worker %d), %d lost (DS007; %d logged by the worker) | "
  . "%d HTTP steps: succeeded %d, failed %d, uncertain %d, blocked %d; %d charges, %d lost; HTTP worker hit by kill9 %d, terminate %d, cancel %d (%d with requests in flight) | "
  . "%d runs: succeeded %d, failed %d, cancelled %d (ds_cancel_run called on %d); %d turns; %d run steps: succeeded %d, failed %d, cancelled %d | "
  . "%d tasks (%d on_lost uncertain): succeeded %d, failed %d, blocked %d, uncertain %d; %d attempts, %d lost (DS007), %d cut; "
  . "%d task workers started, %d struck while running a task, %d lost lease(s) checked, %d late outcome(s) refused (DS410) | "
  . "%d flows: succeeded %d, %d attempts of their steps and segments lost | "
  . "%d executor exit(s) (%d ended by a body that ignored its cancellation, %d by a hook that did; %d claims given back), "
  . "stubborn hooks: %d on SQL steps, %d on HTTP steps, %d struck, "
  . "%d extra executor(s) started, "
  . "%d client reconnects, %d calls refused with DS201 by a fence (%d fence window(s) checked) | longest settle %.1f s | "
  . "hog: %d slow SQL and %d hanging HTTP steps (%d succeeded), %d attempts, %d lost, %d charges, %d steps unfinished as the others settled "
  . "(idle in %d trial(s)), in flight max %d of %d per role (at its share in %d of %d samples), all roles max %d of %d; "
  . "the others' longest wait for a first claim: sql %.1f s, http %.1f s | "
  . "%d trial(s) with a synchronous standby, %d failover(s) with %d HTTP requests claimed (%d without a key) | "
  . "%d invariant violation(s) in %d trial(s)"
  . ($tot{harness_errors} ? ", $tot{harness_errors} HARNESS ERROR(S)" : '') . "\n",
  $tot{trials} || 0, $seed, $elapsed, $tot{steps} || 0, $tot{proc_steps} || 0, $tot{proc_calls} || 0,
  $tot{proc_refused} || 0, $tot{calls} || 0, $tot{dups} || 0,
  $tot{faults} || 0, join(' ', map { "$_ " . ($tot{fault}{$_} || 0) } @KINDS),
  map({ $tot{"${_}_mid"} || 0 } qw(kill9 terminate cancel)),
  $tot{succeeded} || 0, $tot{failed} || 0, $tot{blocked} || 0, $tot{rearmed} || 0, $tot{cancelled} || 0, $tot{stopped} || 0,
  $tot{attempts} || 0, $tot{caller} || 0, $tot{caller_retry} || 0, $tot{worker} || 0, $tot{lost} || 0, $tot{lost_logged} || 0,
  $tot{http} || 0, $tot{http_succeeded} || 0, $tot{http_failed} || 0, $tot{http_uncertain} || 0, $tot{http_blocked} || 0,
  $tot{http_charges} || 0, $tot{http_lost} || 0, map({ $tot{"${_}_http"} || 0 } qw(kill9 terminate cancel)), $tot{http_inflight} || 0,
  $tot{runs} || 0, map({ $tot{"runs_$_"} || 0 } qw(succeeded failed cancelled)), $tot{run_cancels} || 0, $tot{run_turns} || 0,
  $tot{run_steps} || 0, map({ $tot{"run_steps_$_"} || 0 } qw(succeeded failed cancelled)),
  map({ $tot{$_} || 0 } qw(tasks tasks_uncertain_on_lost tasks_succeeded tasks_failed tasks_blocked tasks_uncertain
	task_attempts task_lost task_cut task_workers task_busy task_leases_checked task_late flows flows_succeeded flow_lost)),
  $tot{executor_exits} || 0, $tot{ignored} || 0, $tot{hook_exits} || 0, $tot{given_back} || 0,
  $tot{stub_sql} || 0, $tot{stub_http} || 0, $tot{stub_struck} || 0, $tot{extras} || 0,
  $tot{reconnects} || 0, $tot{ds201} || 0, $tot{fence_windows} || 0, $tot{max_settle} || 0,
  map({ $tot{$_} || 0 } qw(hog_sql hog_http hog_ok hog_attempts hog_lost hog_charges hog_pending hog_idle hog_max)),
  $HTTP_PER_ROLE, $tot{hog_full} || 0, $tot{samples} || 0, $tot{total_max} || 0, $HTTP_MAX_INFLIGHT,
  $tot{first_wait_sql} || 0, $tot{first_wait_http} || 0,
  $tot{standby_trials} || 0, $tot{fault}{failover} || 0, $tot{failover_http} || 0, $tot{failover_keyless} || 0,
  $tot{violations} || 0, $tot{bad_trials} || 0;
$rc = 1 if !$rc && $tot{violations};
$rc = 2 if !$rc && $tot{harness_errors};
print "faults: " . ($rc == 0 ? 'PASS' : $rc == 1 ? 'FAIL (invariants violated)' : 'ERROR') . "\n";
print "faults: violated: $_\n" for @{ $tot{violation_lines} || [] };
exit $rc;
