# A database made read-only by its stored settings (docs/failover.md#read-only-databases):
# ALTER DATABASE ... SET default_transaction_read_only = on reaches sessions that connect later,
# and the workers, connected before, look at the stored settings every second: they wait quietly
# (no write, no error, no restart) instead of writing to a database that refuses its clients'
# writes, and resume within a second or two once the setting is gone. A worker that connected
# while the database was read-only (its value from then is never reloaded) is replaced once, by
# itself, when the setting goes, instead of waiting for ever. What came due runs exactly once.
# An HTTP worker holding an outcome when its stored settings change is never left holding it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $p = DurableSteps::Http::Provider->start;
my $node = http_node('read_only_db', "durable_steps.poll_interval = '200ms'\n");
$node->safe_psql('postgres', q{
CREATE TABLE done (step text);
GRANT INSERT ON done TO app;
});
my $workers = q{SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
 WHERE backend_type IN ('durable_steps worker', 'durable_steps http')};
my $writable = 'SET default_transaction_read_only = off; ';
my $waiting = qr/durable_steps: the database is read-only \(default_transaction_read_only of the database or role\); waiting/;
my $error = qr/ERROR|exited with exit code [1-9]|read-only transaction/;

# Steps of run $run coming due in 2 s: one SQL step and one HTTP step.
sub add_steps
{
	my ($run, $prefix) = @_;
	my $url = $p->url($run);
	$node->safe_psql('postgres', ($prefix // '') . qq{SET ROLE app;
SELECT ds_run_step('$run', 'sql', \$\$INSERT INTO done VALUES ('$run')\$\$, run_at => now() + interval '2 s');
SELECT ds_http_step('$run', 'http', '{"method": "POST", "url": "$url"}', run_at => now() + interval '2 s');});
}

# The steps of $run stay pending while they are due, and nothing of them was sent.
sub steps_wait
{
	my ($run, $what) = @_;
	ok(poll_until($node, 'postgres',
			"SELECT now() > max(next_attempt_at) + interval '3 s' FROM ds_steps WHERE run_id = '$run'"),
		"$what: the steps came due a while ago");
	is($node->safe_psql('postgres',
			"SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = '$run'"),
		'http:pending,sql:pending', "$what: neither step was claimed");
	is($p->requests($run), 0, "$what: nothing was sent");
}

# The steps of $run succeed, each exactly once.
sub steps_run_once
{
	my ($run, $what) = @_;
	ok(poll_until($node, 'postgres',
			"SELECT count(*) FILTER (WHERE status = 'succeeded') = 2 FROM ds_steps WHERE run_id = '$run'"),
		"$what: both steps succeeded");
	is($node->safe_psql('postgres', "SELECT count(*) FROM done WHERE step = '$run'"), '1',
		"$what: the SQL step ran once");
	is($p->charges($run), 1, "$what: the HTTP step was sent once");
}

# 1. the database becomes read-only while the workers run; steps come due after they said they
# wait (the workers look every second: a step due before might be run before they see it)
my $pids = $node->safe_psql('postgres', $workers);
like($pids, qr/^\d+,\d+$/, 'an executor and the HTTP worker run');
my $offset = log_offset($node);
$node->safe_psql('postgres', 'ALTER DATABASE postgres SET default_transaction_read_only = on');
is(poll_log($node, $offset, $waiting, 2), 2,
	'read-only database: the executor and the HTTP worker each said once that they wait');
add_steps('db1', $writable);
steps_wait('db1', 'read-only database');
is($node->safe_psql('postgres', $workers), $pids, 'read-only database: no worker was restarted');
is(count_matches(log_since($node, $offset), $waiting), 2, 'read-only database: said once each, not again');
unlike(log_since($node, $offset), $error, 'read-only database: no error, no process failed');

$node->safe_psql('postgres', $writable . 'ALTER DATABASE postgres RESET default_transaction_read_only');
steps_run_once('db1', 'writable again');
is($node->safe_psql('postgres', $workers), $pids, 'writable again: by the same processes');
like(log_since($node, $offset), qr/durable_steps: the server accepts writes again/,
	'writable again: the workers said so');

# 2. the workers start while the database is read-only (a restart of the server), so that
# their own default_transaction_read_only is the database's; it is then reset
$node->safe_psql('postgres', 'ALTER DATABASE postgres SET default_transaction_read_only = on');
$node->restart;
my $log_start = log_offset($node);
# (the HTTP worker too, or once an executor has seen the extension: it is counted below)
ok(poll_until($node, 'postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker'}),
	'restarted read-only: the executor runs');
add_steps('db2', $writable);
steps_wait('db2', 'restarted read-only');
$pids = $node->safe_psql('postgres', $workers);
my $n_workers = scalar(split /,/, $pids);
$log_start = log_offset($node);
$node->safe_psql('postgres', $writable . 'ALTER DATABASE postgres RESET default_transaction_read_only');
steps_run_once('db2', 'reset after a start read-only');
my $since = log_since($node, $log_start);
is( count_matches(
		$since, qr/default_transaction_read_only of the database or role changed since this process connected/),
	$n_workers,
	'reset after a start read-only: each worker process was replaced once');
unlike($since, $error, 'reset after a start read-only: no error, no process failed');
isnt($node->safe_psql('postgres', $workers), $pids, 'reset after a start read-only: by new processes');

# 3. the database becomes read-only while the HTTP worker waits for a slow answer, so that it
# holds the outcome (and its step's lock) when the answer comes; then the setting is turned off
# explicitly (not reset): the stored settings now differ from those the worker connected with,
# but its own value never said read-only, so it records the outcome before it is replaced --
# never left holding it
# (15 s: time enough for the test to make the database read-only and the workers to see it)
my $url = $p->url('db3', 'fault=delay&secs=15');
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('db3', 'slow', '{"method": "POST", "url": "$url"}', timeout => '30 s');});
my $sent;
for (1 .. 1800)
{
	last if $p->requests('db3') > 0;
	usleep(100_000);
}
is($p->requests('db3'), 1, 'slow answer: the request reached the provider, which answers in 15 s');
$sent = $node->safe_psql('postgres', 'SELECT now()');
$offset = log_offset($node);
$node->safe_psql('postgres', 'ALTER DATABASE postgres SET default_transaction_read_only = on');
is(poll_log($node, $offset, $waiting, 2), 2, 'slow answer: the database is read-only, the workers wait');
ok(poll_until($node, 'postgres', "SELECT now() > '$sent'::timestamptz + interval '17 s'"),
	'slow answer: the answer came while the database was read-only');
is($node->safe_psql('postgres', "SELECT status FROM ds_steps WHERE run_id = 'db3'"), 'running',
	'slow answer: its outcome is held, not recorded');
$node->safe_psql('postgres', $writable . 'ALTER DATABASE postgres SET default_transaction_read_only = off');
ok(poll_until($node, 'postgres', "SELECT status FROM ds_steps WHERE run_id = 'db3'", 'succeeded'),
	'turned off: the held outcome is recorded');
is($p->charges('db3'), 1, 'turned off: charged once');
is($node->safe_psql('postgres', "SELECT count(*) FROM ds_attempts WHERE run_id = 'db3'"), '1',
	'turned off: one attempt');

done_testing();
