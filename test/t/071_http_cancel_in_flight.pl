# ds_cancel_step of an HTTP step whose request is in flight (docs/http.md, "The HTTP worker"):
# it waits for the request to end, at most until its timeout; an HTTP worker that has not
# recorded the outcome by then (here: stopped with SIGSTOP) is not waited for without end: the
# call answers DS409, changes nothing, and the cancel succeeds once the outcome is recorded.
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

my $p = DurableSteps::Http::Provider->start();
my $node = http_node('http_cancel_in_flight');

# the HTTP worker is stopped as soon as the request reaches the provider, long before the request's
# timeout: nothing is recorded until it is resumed
my $http_pid = http_worker_pid($node);

# charged, then answered 60 s later: the 5 s timeout ends the attempt (retryable: it has a key)
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('c', 'slow', '{"method": "POST", "url": "@{[$p->url('slow', 'fault=delay&secs=60')]}"}',
    timeout => '5 s', policy => '{"initial_delay": "1 hour", "max_delay": "1 hour"}')});

my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
usleep(20_000) while $p->requests('slow') < 1 && time() < $deadline;
kill 'STOP', $http_pid;
is($p->requests('slow'), 1, 'the request is in flight');
is(step_field($node, 'c', 'slow', 'status'), 'running', 'the step is running');

# without a bound the call would wait for the stopped worker until statement_timeout (57014)
my ($stdout, $stderr);
$node->psql('postgres', q{SET statement_timeout = '30 s'; SET ROLE app;
SELECT ds_cancel_step('c', 'slow')}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/step c\/slow is in progress: its HTTP request is in flight/,
	'the cancel answers DS409 once the request\'s timeout has passed');
unlike($stderr, qr/statement timeout/, 'it did not wait for the stopped worker');
is(step_field($node, 'c', 'slow', 'status'), 'running', 'and changed nothing');

kill 'CONT', $http_pid;
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE step_id = 'slow'}, 'retrying'),
	'the resumed HTTP worker records the timed-out attempt');
is($node->safe_psql('postgres', q{SET ROLE app; SELECT status FROM ds_cancel_step('c', 'slow')}),
	'cancelled', 'then the cancel succeeds');
is($p->charges('slow'), 1, 'charged once');

$node->stop;
done_testing();
