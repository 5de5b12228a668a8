# Uncertain HTTP outcomes (docs/http.md, "Uncertain steps and reconciliation"): a POST
# without an idempotency header that times out or loses its connection after sending ends
# uncertain and is never sent again by itself; ds_resolve_step records what the operator found,
# ds_retry_step sends it again; an idempotent method is retried by itself.
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
my $node = http_node('http_uncertain');

sub step
{
	my ($step, $method, $query, $extra) = @_;
	$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('unc', '$step', '{"method": "$method", "url": "@{[$p->url($step, $query)]}"}',
                    policy => '{"initial_delay": "10 ms"}'$extra)});
}

# (the first request of each is answered late, after its timeout; a request sent again is answered
# at once, well within the 2 s even on a loaded machine)
step('timeout', 'POST', 'fault=delay&secs=10', ", timeout => '2 s', idempotency_header => NULL");
step('dropped', 'POST', 'fault=drop', ", idempotency_header => NULL");
step('retried', 'POST', 'fault=delay&secs=10', ", timeout => '2 s', idempotency_header => NULL");
step('get', 'GET', 'fault=delay&secs=10', ", timeout => '2 s', idempotency_header => NULL");

is(settle_http($node, 'unc', 'timeout'), 'uncertain', 'timeout: uncertain');
is_deeply(attempts_of($node, 'unc', 'timeout'), [ { attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' } ], 'timeout: one attempt, uncertain');
is(step_field($node, 'unc', 'timeout', "error_class || ' ' || (next_attempt_at IS NULL)"),
	'uncertain true', 'timeout: nothing scheduled');
is(settle_http($node, 'unc', 'dropped'), 'uncertain', 'dropped: uncertain');
is_deeply(attempts_of($node, 'unc', 'dropped'), [ { attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' } ], 'dropped: one attempt, uncertain');
is(settle_http($node, 'unc', 'get'), 'succeeded', 'GET: retried by itself, succeeded');
is_deeply(attempts_of($node, 'unc', 'get'), [ { attempt => 1, class => 'retryable', error_code => 'DS012', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'GET: the timeout was retryable');

# not sent again: a step created afterwards is sent and done, and the uncertain ones were not
step('marker', 'POST', '', '');
is(settle_http($node, 'unc', 'marker'), 'succeeded', 'a later step was sent');
ok(wait_executor_loops($node, 'postgres', executor_pid($node), 500), 'the executors went on');
is($p->requests('timeout') . ' ' . $p->requests('dropped'), '1 1', 'the uncertain steps were sent once');
is_deeply(attempts_of($node, 'unc', 'timeout'), [ { attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' } ], 'timeout: still one attempt');

# reconciliation: the operator found the charge made, and records it
is($node->safe_psql('postgres', q{SET ROLE app;
SELECT status || ' ' || (result->'body'->>'id') || ' ' || attempt
  FROM ds_resolve_step('unc', 'timeout', 'succeeded', '{"status": 200, "body": {"id": "ch_1"}}')}),
	'succeeded ch_1 2', 'ds_resolve_step records the operator\'s finding');
is_deeply(attempts_of($node, 'unc', 'timeout'), [ { attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'operator' } ],
	'as an attempt of its own');
is($node->safe_psql('postgres',
		"SELECT error_message FROM ds_attempts WHERE step_id = 'timeout' AND attempt = 2"),
	'resolved as succeeded by role app', 'saying who resolved it');
is($node->safe_psql('postgres', q{SET ROLE app;
SELECT status FROM ds_resolve_step('unc', 'dropped', 'failed')}), 'failed', 'dropped: resolved as failed');
is($p->requests('timeout') . ' ' . $p->requests('dropped'), '1 1', 'resolving sends nothing');

# or the operator checked that nothing happened, and sends it again
is(settle_http($node, 'unc', 'retried'), 'uncertain', 'retried: uncertain');
$node->safe_psql('postgres', q{SET ROLE app; SELECT ds_retry_step('unc', 'retried')});
is(settle_http($node, 'unc', 'retried'), 'succeeded', 'retried: ds_retry_step sent it again');
is_deeply(attempts_of($node, 'unc', 'retried'), [ { attempt => 1, class => 'uncertain', error_code => 'DS012', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'retried: attempt 2 completed');
is($p->requests('retried'), 2, 'retried: sent twice, the second time by the operator\'s decision');

settled_and_sound($node, 'unc', 'timeout', 2, 'resolved');
done_testing();
