# Prometheus (docs/operations.md, "Prometheus"): Debian's prometheus-postgres-exporter, run with
# the query file shipped in monitoring/, connected as a role in pg_monitor, serves the
# durable_steps_* metrics on its /metrics page: counters of attempts, outcomes, lost attempts and
# HTTP responses, the steps in flight and due, runs, workers -- each with the figures ds_stats()
# gives for a known mix of steps, and a counter that moves when more steps run. The Grafana
# dashboard beside the query file graphs only metrics the exporter serves.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $exporter = '/usr/bin/prometheus-postgres-exporter';
my $queries = "$FindBin::RealBin/../../monitoring/postgres_exporter_queries.yaml";
# CI installs the package (scripts/lib.sh); its absence is a broken set-up, not a reason to pass
ok(-x $exporter, "the exporter is installed ($exporter)") or BAIL_OUT("$exporter is missing");
ok(-r $queries, 'the query file is shipped');

my $p = DurableSteps::Http::Provider->start();
my $node = http_node('exporter');
$node->safe_psql('postgres', q{
CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
SELECT ds_set_queue('paused', 0);
SET ROLE app;
SELECT ds_run_step('mix', 'ok-' || i, 'SELECT ' || i) FROM generate_series(1, 3) i;
SELECT ds_run_step('mix', 'broken', $q$DO $b$ BEGIN RAISE EXCEPTION 'broken' USING ERRCODE = 'XX000'; END $b$$q$);
SELECT ds_run_step('mix', 'parked', 'SELECT 1', queue => 'paused', run_at => now() - interval '1 minute');
});
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('web', 'ok', '{"method": "POST", "url": "@{[$p->url('ok')]}"}');
});
is(settle_http($node, 'web', 'ok'), 'succeeded', 'the HTTP step succeeded');
# and a run waiting for an event
$node->safe_psql('postgres', q{
CREATE FUNCTION waits(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('wait', 'go');
END $$;
SELECT ds_start_run('waits', '{}', 'waiter');
});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'waiter'}, 'waiting'),
	'the run waits for its event');

# a free loopback port for the exporter
my $port = do
{
	my $sock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1) or die $!;
	my $n = $sock->sockport;
	close $sock;
	$n;
};
my $dsn = sprintf('host=%s port=%d user=watcher dbname=postgres sslmode=disable', $node->host, $node->port);
my $log = $node->basedir . '/exporter.log';
my $pid = fork();
die "fork: $!" unless defined $pid;
if ($pid == 0)
{
	$ENV{DATA_SOURCE_NAME} = $dsn;
	open(STDOUT, '>', $log) or die $!;
	open(STDERR, '>&', \*STDOUT) or die $!;
	# only the metrics of the query file: the exporter's own collectors of this version do not
	# know every PostgreSQL major of the matrix (its bgwriter collector fails on 17)
	exec($exporter, "--web.listen-address=127.0.0.1:$port", "--extend.query-path=$queries",
		'--disable-default-metrics', '--disable-settings-metrics', '--no-collector.bgwriter',
		'--no-collector.database')
	  or die "exec: $!";
}

# The metrics page, as "name{labels}" => value for the durable_steps_* series, once the
# exporter answers and a scrape reports $want
my $http = HTTP::Tiny->new(timeout => 10);

sub scrape
{
	my ($want) = @_;
	my %m;
	my $deadline = time() + 60;
	while (time() < $deadline)
	{
		my $res = $http->get("http://127.0.0.1:$port/metrics");
		if ($res->{success})
		{
			%m = ();
			for my $line (split /\n/, $res->{content})
			{
				next unless $line =~ /^(durable_steps_\S+)\s+(\S+)$/;
				my ($name, $value) = ($1, $2);
				# the exporter adds the label server="host:port" to every series
				$name =~ s/,?server="[^"]*"//;
				$name =~ s/\{,/{/;
				$name =~ s/\{\}$//;
				$m{$name} = $value;
			}
			return \%m if !defined $want || (defined $m{ $want->[0] } && $m{ $want->[0] } == $want->[1]);
		}
		select(undef, undef, undef, 0.2);
	}
	diag("the exporter said:\n" . slurp_file($log)) if -e $log;
	return \%m;
}

my $m = scrape([ 'durable_steps_attempts_total{class="completed",kind="sql"}', 3 ]);
is($m->{'durable_steps_attempts_total{class="completed",kind="sql"}'}, 3, 'attempts_total: the three completed SQL attempts');
is($m->{'durable_steps_attempts_total{class="permanent",kind="sql"}'}, 1, 'attempts_total: the permanent one');
is($m->{'durable_steps_attempts_total{class="completed",kind="http"}'}, 1, 'attempts_total: the HTTP one');
is($m->{'durable_steps_outcomes_total{kind="sql",status="succeeded"}'}, 3, 'outcomes_total: three succeeded');
is($m->{'durable_steps_outcomes_total{kind="sql",status="failed"}'}, 1, 'outcomes_total: one failed');
is($m->{'durable_steps_lost_attempts_total{kind="sql"}'}, 0, 'lost_attempts_total: none');
is($m->{'durable_steps_http_responses_total{class="2xx"}'}, 1, 'http_responses_total: one 2xx');
is($m->{'durable_steps_recent_attempts{class="completed",kind="sql"}'}, 3, 'the attempts of the last minute');
is($m->{'durable_steps_steps_in_flight{database="postgres",kind="sql",queue="paused",status="pending"}'}, 1, 'steps_in_flight: the parked step');
is($m->{'durable_steps_due_steps{database="postgres",kind="sql",queue="paused"}'}, 1, 'due_steps: it is due');
cmp_ok($m->{'durable_steps_due_oldest_seconds{database="postgres",kind="sql",queue="paused"}'} // 0, '>=', 60, 'due_oldest_seconds: for a minute');
is($m->{'durable_steps_workers_executors{database="postgres"}'}, 1, 'workers_executors: one executor');
is($m->{'durable_steps_workers_http_workers{database="postgres"}'}, 1, 'workers_http_workers: the HTTP worker');
is($m->{'durable_steps_runs_in_flight{database="postgres",status="waiting"}'}, 1, 'runs_in_flight: the waiting run');
is($m->{'durable_steps_runs_waiting_runs{database="postgres",reason="event"}'}, 1, 'runs_waiting_runs: it waits for an event');
is($m->{'durable_steps_attention_steps{database="postgres",status="failed"}'}, 1, 'attention_steps: the failed step needs a person');
is($m->{'durable_steps_attention_steps{database="postgres",status="blocked"}'}, 0, 'attention_steps: none blocked (0, not absent)');

# the alert rules shipped beside the query file watch only metrics the exporter serves
my @alerted = slurp_file("$FindBin::RealBin/../../monitoring/alerts.yaml") =~ /\b(durable_steps_[a-z_]+)/g;
ok(@alerted >= 3, 'the alert rules watch the metrics (' . scalar(@alerted) . ' of them)');

# the Grafana dashboard shipped beside the query file graphs only metrics the exporter serves
my $dashboard = decode_json(slurp_file("$FindBin::RealBin/../../monitoring/grafana-dashboard.json"));
my %served = map { /^([a-z_]+)/ ? ($1 => 1) : () } keys %$m;
my @queried = map { $_->{expr} =~ /\b(durable_steps_[a-z_]+)/g } map { @{ $_->{targets} } } @{ $dashboard->{panels} };
ok(@queried >= 9, 'the dashboard queries the metrics (' . scalar(@queried) . ' of them)');
is(join(', ', grep { !$served{$_} } @queried), '', 'every metric the dashboard queries is served');
is(join(', ', grep { !$served{$_} } @alerted), '', 'every metric the alert rules watch is served');

# more steps: the counter moves at the next scrape
$node->safe_psql('postgres', q{SET ROLE app; SELECT ds_run_step('mix', 'more-' || i, 'SELECT 1') FROM generate_series(1, 5) i});
$m = scrape([ 'durable_steps_attempts_total{class="completed",kind="sql"}', 8 ]);
is($m->{'durable_steps_attempts_total{class="completed",kind="sql"}'}, 8, 'the counter moved to 8 with five more steps');

kill 'TERM', $pid;
waitpid($pid, 0);
$node->stop;
done_testing();
