# ds_retry_step(run_id, step_id, request => ...) (docs/steps.md, "Stuck work: find, cancel,
# re-arm"): a blocked or failed HTTP step is re-armed with a corrected request, checked as a new
# HTTP step's is; attempt numbers go on, the old attempts stay; an uncertain step's request,
# which may have reached its receiver, is never replaced.
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
my $node = http_node('http_rearm_request');
$node->safe_psql('postgres', 'CREATE ROLE other LOGIN IN ROLE durable_steps_http');

my $bad = $p->url('refused', 'fault=400');
my $good = $p->url('refused');
$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('re', 'refused', '{"method": "POST", "url": "$bad"}');
SELECT ds_http_step('re', 'unsure', '{"method": "POST", "url": "@{[$p->url('unsure', 'fault=drop')]}"}',
                    idempotency_header => NULL);
SELECT ds_run_step('re', 'sql', 'SELECT 1/0');});
is(settle_http($node, 're', 'refused'), 'blocked', 'a 400 blocks the step');
is(settle_http($node, 're', 'unsure'), 'uncertain', 'a dropped keyless POST is uncertain');

# refused re-arms change nothing
sub refused
{
	my ($role, $sql) = @_;
	my ($stdout, $stderr);
	$node->psql('postgres', "SET ROLE $role; $sql", stdout => \$stdout, stderr => \$stderr,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+(\w{5}):/ ? $1 : "no error: $stderr";
}
is(refused('app', qq{SELECT ds_retry_step('re', 'refused', request => '{"url": 5}')}), '22023',
	'a malformed request: 22023');
is(refused('app', qq{SELECT ds_retry_step('re', 'refused', request => '{"url": "file:///etc/passwd"}')}),
	'22023', 'a URL that is not http or https: 22023');
is(refused('app', qq{SELECT ds_retry_step('re', 'refused', request => '{"url": "$good", "headers": {"Idempotency-Key": "mine"}}')}),
	'22023', 'a request that sets the idempotency header: 22023');
is(refused('app', qq{SELECT ds_retry_step('re', 'refused', sql => 'SELECT 2')}), '22023',
	'sql for an HTTP step: 22023');
is(refused('app', qq{SELECT ds_retry_step('re', 'sql', request => '{"url": "$good"}')}), '22023',
	'a request for a SQL step: 22023');
is(refused('app', qq{SELECT ds_retry_step('re', 'unsure', request => '{"method": "POST", "url": "$good"}')}),
	'DS103', "an uncertain step's request is never replaced: DS103");
is(refused('other', qq{SELECT ds_retry_step('re', 'refused', request => '{"method": "POST", "url": "$good"}')}),
	'DS404', "another role's step does not exist for it: DS404");
is(step_field($node, 're', 'refused', "status || ' ' || (request->>'url' = '$bad')"), 'blocked true',
	'the refused re-arms changed nothing');

# the corrected request is sent, under the step's key, as attempt 2
is($node->safe_psql('postgres', qq{SET ROLE app;
SELECT status FROM ds_retry_step('re', 'refused', request => '{"method": "POST", "url": "$good"}')}),
	'pending', 'the owner re-arms the step with a corrected request');
is(settle_http($node, 're', 'refused'), 'succeeded', 'the corrected request succeeds');
is_deeply(attempts_of($node, 're', 'refused'), [ { attempt => 1, class => 'correctable', error_code => 'DS010', executor => 'worker' }, { attempt => 2, class => 'completed', error_code => undef, executor => 'worker' } ],
	'attempt numbers go on; the refused attempt stays in the history');
is($p->charges('refused'), 1, 'charged once');
is($p->keys_seen('refused'), 're:refused,re:refused', 'both requests carried the step\'s key');
is($node->safe_psql('postgres', qq{SET ROLE app;
SELECT replayed FROM ds_http_step('re', 'refused', '{"method": "POST", "url": "$good"}')}),
	't', 'the corrected request is the step\'s definition: calling it replays');

$node->stop;
done_testing();
