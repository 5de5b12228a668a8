# The HTTP worker killed while a request is in flight (docs/http.md): the attempt is
# recorded as lost (DS007) by the executors' recovery and sent again with the same idempotency
# key, so the provider charges once; a request without a key and with a non-idempotent method is
# not sent again: its step ends uncertain.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start(close => 1);
my $node = http_node('http_killed');

$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('kill', 'keyed', '{"method": "POST", "expect": "json", "url": "@{[$p->url('keyed', 'fault=delay&secs=60')]}"}',
                    timeout => '2 min', policy => '{"initial_delay": "10 ms"}');
SELECT ds_http_step('kill', 'unkeyed', '{"method": "POST", "url": "@{[$p->url('unkeyed', 'fault=delay&secs=60')]}"}',
                    timeout => '2 min', idempotency_header => NULL);
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 2 FROM ds_steps WHERE run_id = 'kill' AND status = 'running'"),
	'both attempts are running');
for (1 .. 100)
{
	last if $p->requests('keyed') == 1 && $p->requests('unkeyed') == 1;
	Time::HiRes::usleep(100_000);
}
is($p->charges('keyed') . ' ' . $p->charges('unkeyed'), '1 1', 'the provider charged both and holds the responses');

my $pid = http_worker_pid($node);
kill 'KILL', $pid;
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps http' AND pid <> $pid"),
	'a new HTTP worker runs after the crash restart');

is(settle_http($node, 'kill', 'keyed'), 'succeeded', 'keyed: succeeded after the kill');
is_deeply(attempts_of($node, 'kill', 'keyed'), [ { attempt => 1, class => 'retryable', error_code => 'DS007', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'keyed: attempt 1 lost, attempt 2 completed');
is($p->charges('keyed'), 1, 'keyed: charged once');
is($p->keys_seen('keyed'), 'kill:keyed,kill:keyed', 'keyed: both sends carried the same key');
is(step_field($node, 'kill', 'keyed', "result->'body'->>'charge'"), '1',
	'keyed: the result is the one charge');

is(settle_http($node, 'kill', 'unkeyed'), 'uncertain', 'unkeyed: uncertain after the kill');
is_deeply(attempts_of($node, 'kill', 'unkeyed'), [ { attempt => 1, class => 'uncertain', error_code => 'DS007', executor => 'worker' } ], 'unkeyed: attempt 1 lost, uncertain');
is($p->requests('unkeyed'), 1, 'unkeyed: not sent again');

# The HTTP worker terminated (it exits; no crash restart, so the executors go on) while a request
# is in flight, with an hour's poll interval: the worker says on its way out that attempts may be
# lost, which wakes the executors to record it at once (docs/worker.md, step 1).
ok(reload_executors($node, "ALTER SYSTEM SET durable_steps.poll_interval = '1h'"),
	'the executors reloaded: they look again in an hour');
my @executors = split /,/, $node->safe_psql('postgres',
	"SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'");
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('term', 'keyed', '{"method": "POST", "expect": "json", "url": "@{[$p->url('term-keyed', 'fault=delay&secs=60')]}"}',
                    timeout => '2 min', policy => '{"initial_delay": "10 ms"}');
});
ok(poll_until($node, 'postgres',
		"SELECT status = 'running' FROM ds_steps WHERE run_id = 'term' AND step_id = 'keyed'"),
	'terminated: the attempt is running');
for (1 .. 100)
{
	last if $p->requests('term-keyed') == 1;
	Time::HiRes::usleep(100_000);
}
is($p->charges('term-keyed'), 1, 'terminated: the provider charged and holds the response');
$pid = http_worker_pid($node);
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"), 't', 'the HTTP worker is terminated');
is(settle_http($node, 'term', 'keyed'), 'succeeded', 'terminated: the step succeeded');
is_deeply(attempts_of($node, 'term', 'keyed'), [ { attempt => 1, class => 'retryable', error_code => 'DS007', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'terminated: attempt 1 recorded as lost by an executor, attempt 2 completed');
is($p->charges('term-keyed'), 1, 'terminated: charged once');
is($node->safe_psql('postgres',
		"SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"),
	join(',', @executors), 'terminated: the same executors, none restarted');

done_testing();
