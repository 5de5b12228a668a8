# HTTP faults (docs/http.md, classification): for every fault the provider injects, each
# step is charged at most once, ends with one accepted fact, and its attempts say what happened.
# The provider closes every connection, so libcurl never repeats a request on its own.
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
my $node = http_node('http_faults');

# every step at once: [step, query, extra arguments]
my @faults = (
	[ 'ok',      '',                        '' ],
	[ '500',     'fault=500&times=2',       '' ],
	[ '503',     'fault=503',               '' ],
	[ '429s',    'fault=429s',              '' ],
	[ '429d',    'fault=429d',              '' ],
	[ '400',     'fault=400',               '' ],
	[ 'badjson', 'fault=badjson',           '' ],
	[ 'big',     'fault=big&size=2000000',  '' ],
	[ 'delay',   'fault=delay&secs=4',      ", timeout => '1 s'" ],
	[ 'drop',    'fault=drop',              '' ],
);
my $sql = "SET ROLE app; BEGIN;\n";
for my $f (@faults)
{
	my ($step, $query, $extra) = @$f;
	$sql .= "SELECT ds_http_step('f', '$step', '{\"method\": \"POST\", \"expect\": \"json\", "
	  . "\"url\": \"@{[$p->url($step, $query)]}\", \"json\": {\"step\": \"$step\"}}', "
	  . "policy => '{\"initial_delay\": \"50 ms\"}'$extra);\n";
}
# a port nobody listens on: never connected, never sent
$sql .= "SELECT ds_http_step('f', 'refused', '{\"method\": \"POST\", \"url\": \"http://127.0.0.1:1/x\"}', "
  . "policy => '{\"initial_delay\": \"50 ms\", \"max_attempts\": 2}');\nCOMMIT;\n";
$node->safe_psql('postgres', $sql);

# [step, status, charges, attempts]
my @expect = (
	[ 'ok',      'succeeded', 1, [ { attempt => 1, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ '500',     'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 3, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ '503',     'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ '429s',    'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ '429d',    'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ '400',     'blocked',   0, [ { attempt => 1, class => 'correctable', error_code => 'DS010', executor => 'worker' } ] ],
	[ 'badjson', 'failed',    1, [ { attempt => 1, class => 'permanent', error_code => 'DS013', executor => 'worker' } ] ],
	[ 'big',     'failed',    1, [ { attempt => 1, class => 'permanent', error_code => 'DS013', executor => 'worker' } ] ],
	[ 'delay',   'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS012', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ] ],
	[ 'drop',    'succeeded', 1, [ { attempt => 1, class => 'retryable', error_code => 'DS012', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ] ],
);
for my $e (@expect)
{
	my ($step, $status, $charges, $attempts) = @$e;
	is(settle_http($node, 'f', $step), $status, "$step: $status");
	is($p->charges($step), $charges, "$step: charged $charges time(s)");
	is_deeply(attempts_of($node, 'f', $step), $attempts, "$step: its attempts");
}

# one accepted fact: the succeeded steps' results are the provider's one charge
is($node->safe_psql('postgres', q{
SELECT string_agg(step_id || '=' || (result->'body'->>'charge'), ',' ORDER BY step_id)
  FROM ds_steps WHERE run_id = 'f' AND status = 'succeeded'}),
	'429d=1,429s=1,500=1,503=1,delay=1,drop=1,ok=1', 'each succeeded step holds its one charge');
# retries carried the same key
is($p->keys_seen('delay'), 'f:delay,f:delay', 'delay: the retry carried the same key');
is($p->keys_seen('drop'), 'f:drop,f:drop', 'drop: the retry carried the same key');
# Retry-After set the delay (the policy alone would have waited 50 ms)
is(started_within($node, 'f', '429s', 2, '1 s', '5 s'), 't', '429s: Retry-After: 1 delayed the retry by 1 s');
# (the date has whole seconds: 3 s ahead is more than 2 s away when the response is read)
is(started_within($node, 'f', '429d', 2, '1.5 s', '8 s'), 't', '429d: Retry-After as an HTTP-date delayed the retry');
# (the policy's delay is 50 ms; the bound leaves room for a loaded machine)
is(started_within($node, 'f', '500', 2, '0 s', '2.5 s'), 't', '500: no Retry-After, the policy\'s delay');
# blocked and failed steps keep what the provider said, in their error detail (and the attempt's)
like(step_field($node, 'f', '400', "error_class || ' ' || error_detail"),
	qr/^correctable Response: \{"body": \{"error": "bad request"\}.*"status": 400/, '400: blocked with the response kept');
like($node->safe_psql('postgres', "SELECT error_detail FROM ds_attempts WHERE step_id = '400'"),
	qr/"status": 400/, '400: the attempt holds the response too');
like(step_field($node, 'f', 'badjson', "error_class || ' ' || error_detail"),
	qr/^permanent .*Response: \{"body": "\{\\"charged\\": not json"/, 'badjson: failed closed, the body kept as text');
is(step_field($node, 'f', 'big', "coalesce(result::text, 'none') || ' ' || error_message"),
	'none HTTP response is too large', 'big: failed closed, nothing kept');
is(step_field($node, 'f', 'badjson', "coalesce(result::text, 'none')"), 'none',
	'a step that did not succeed has no result');
# never connected: retried, then exhausted
is(settle_http($node, 'f', 'refused'), 'failed', 'refused: failed');
is_deeply(attempts_of($node, 'f', 'refused'), [ { attempt => 1, class => 'retryable', error_code => 'DS011', executor => 'worker' }, { attempt => 2, class => 'retryable', error_code => 'DS011', executor => 'worker' } ],
	'refused: both attempts never sent (DS011)');
is(step_field($node, 'f', 'refused', 'error_class'), 'exhausted', 'refused: its attempts are used up');

settled_and_sound($node, 'f', 'ok', 1, 'ok');
done_testing();
