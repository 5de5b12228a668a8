# HTTP status codes the step decides (docs/http.md, "Status codes the step decides"):
# retry_on_status and fail_on_status override the default table of statuses for the statuses
# they name; an exact status beats a class, fail_on_status wins a tie. A status failed on is a
# failed step (its on_failure runs, its response is kept), not a blocked one.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start();
my $node = http_node('http_status_rules');
$node->safe_psql('postgres', q{
CREATE TABLE dead_letters (step_id text, status int);
GRANT INSERT ON dead_letters TO app;
});

# $query: the provider's fault; $args: ds_http_step's further arguments
sub step
{
	my ($step, $query, $args) = @_;
	$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('st', '$step', '{"method": "POST", "url": "@{[$p->url($step, $query)]}"}',
    policy => '{"initial_delay": "10 ms", "max_attempts": 3}',
    on_failure => \$h\$INSERT INTO dead_letters SELECT \$1->>'step_id', substring(\$1->>'error_message' FROM '\\d+')::int\$h\$
    $args)});
}

# a card declined: by default 402 blocks the step for an operator; failed on, it fails for good
step('declined-default', 'fault=status&code=402&times=9', '');
step('declined', 'fault=status&code=402&times=9', ", fail_on_status => '{402}'");
# a conflict the receiver clears by itself: retried as the policy says, then succeeded
step('conflict', 'fault=status&code=409&times=2', ", retry_on_status => '{4xx}'");
# an exact status beats a class: 404 retried although 4xx fails
step('exact', 'fault=status&code=404&times=1', ", retry_on_status => '{404}', fail_on_status => '{4xx}'");
# fail_on_status wins a tie; a class overrides the default table (503 is retried by default)
step('tie', 'fault=status&code=503&times=9', ", retry_on_status => '{503}', fail_on_status => '{503}'");
step('class', 'fault=status&code=503&times=9', ", fail_on_status => '{5xx}'");
# the lists as fields of the request
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('st', 'in-request', '{"method": "POST", "url": "@{[$p->url('in-request', 'fault=status&code=402&times=9')]}",
    "fail_on_status": [402]}')});

is(settle_http($node, 'st', 'declined-default'), 'blocked', '402 by default: blocked');
is_deeply(attempts_of($node, 'st', 'declined-default'), [ { attempt => 1, class => 'correctable', error_code => 'DS010', executor => 'worker' } ], 'declined-default: one correctable attempt');

is(settle_http($node, 'st', 'declined'), 'failed', 'fail_on_status 402: failed');
is_deeply(attempts_of($node, 'st', 'declined'), [ { attempt => 1, class => 'permanent', error_code => 'DS010', executor => 'worker' } ], 'declined: one permanent attempt, not retried');
like(step_field($node, 'st', 'declined', 'error_detail'),
	qr/^The step's fail_on_status names this status\. Response: \{.*"status": 402/,
	"declined: the receiver's response is kept in error_detail, saying why it failed");
ok(poll_until($node, 'postgres', "SELECT string_agg(step_id || ' ' || status, ',' ORDER BY step_id) FROM dead_letters WHERE step_id LIKE 'declined%'",
		'declined 402'),
	'declined: its on_failure hook ran (and not the blocked one\'s)');

is(settle_http($node, 'st', 'conflict'), 'succeeded', 'retry_on_status 4xx: 409 retried, then succeeded');
is_deeply(attempts_of($node, 'st', 'conflict'), [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 3, class => 'completed', error_code => undef, executor => 'worker' } ],
	'conflict: two retryable attempts, then completed');
is($p->charges('conflict'), 1, 'conflict: charged once');

is(settle_http($node, 'st', 'exact'), 'succeeded', 'an exact retry_on_status beats a fail_on_status class');
is_deeply(attempts_of($node, 'st', 'exact'), [ { attempt => 1, class => 'retryable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ], 'exact: retried once');

is(settle_http($node, 'st', 'tie'), 'failed', 'fail_on_status wins a tie');
is_deeply(attempts_of($node, 'st', 'tie'), [ { attempt => 1, class => 'permanent', error_code => 'DS010', executor => 'worker' } ], 'tie: one permanent attempt');
is(settle_http($node, 'st', 'class'), 'failed', 'fail_on_status 5xx overrides the retried 503');
is_deeply(attempts_of($node, 'st', 'class'), [ { attempt => 1, class => 'permanent', error_code => 'DS010', executor => 'worker' } ], 'class: one permanent attempt');
is($p->requests('tie') . ' ' . $p->requests('class'), '1 1', 'each sent once');

is(settle_http($node, 'st', 'in-request'), 'failed', 'the lists work as fields of the request too');

$node->stop;
done_testing();
