# An HTTP step is sent only while its owner may send it (docs/security.md): the owner's
# existence and its privileges of durable_steps_http are checked before every send, as the host
# allow-list is. A step whose owner was dropped, or lost the membership, fails closed -- blocked,
# nothing sent -- and re-arming it sends nothing until the right is back.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start;
my $node = http_node('http_rights');
$node->safe_psql('postgres', q{
CREATE ROLE revoked LOGIN IN ROLE durable_steps_http;
CREATE ROLE dropped LOGIN IN ROLE durable_steps_http;
});

# a step stored while its owner may send, due in an hour: the HTTP worker cannot send it before
# the test has changed the owner's rights
sub later_step
{
	my ($role, $step) = @_;
	my $url = $p->url($step);
	return $node->safe_psql('postgres', qq{SET ROLE $role;
SELECT status FROM ds_http_step('rights', '$step', '{"method": "POST", "url": "$url"}',
                                run_at => now() + interval '1 hour')});
}

# then it is made due now (superuser back-dating)
sub make_due
{
	my ($step) = @_;
	$node->safe_psql('postgres',
		qq{UPDATE durable_steps.steps SET next_attempt_at = now() WHERE run_id = 'rights' AND step_id = '$step'});
}

# 1. the membership is revoked before the send
is(later_step('revoked', 'after-revoke'), 'pending', 'revoke: stored while a member');
$node->safe_psql('postgres', 'REVOKE durable_steps_http FROM revoked');
make_due('after-revoke');
is(settle_http($node, 'rights', 'after-revoke'), 'blocked', 'revoke: the step is blocked when due');
is($p->requests('after-revoke'), 0, 'revoke: nothing was sent');
is(step_field($node, 'rights', 'after-revoke', "error_code || ' ' || error_message"),
	'42501 role revoked may no longer send HTTP steps', 'revoke: 42501, naming the role');
like(step_field($node, 'rights', 'after-revoke', 'remediation'), qr/GRANT durable_steps_http/,
	'revoke: the remediation says what gives the right back');

# the owner re-arms it: still nothing leaves
is($node->safe_psql('postgres',
		q{SET ROLE revoked; SELECT status FROM ds_retry_step('rights', 'after-revoke')}),
	'pending', 'revoke: the owner re-arms the step');
is(settle_http($node, 'rights', 'after-revoke'), 'blocked', 'revoke: blocked again');
is($p->requests('after-revoke'), 0, 'revoke: the re-armed step sent nothing');

# the right given back, the re-armed step is sent once
$node->safe_psql('postgres', 'GRANT durable_steps_http TO revoked');
$node->safe_psql('postgres', q{SET ROLE revoked; SELECT ds_retry_step('rights', 'after-revoke')});
is(settle_http($node, 'rights', 'after-revoke'), 'succeeded', 'granted again: the step succeeded');
is($p->charges('after-revoke'), 1, 'granted again: sent once');

# 2. the owner is dropped before the send
is(later_step('dropped', 'after-drop'), 'pending', 'drop: stored while the role existed');
$node->safe_psql('postgres', 'DROP ROLE dropped');
make_due('after-drop');
is(settle_http($node, 'rights', 'after-drop'), 'blocked', 'drop: the step is blocked when due');
is($p->requests('after-drop'), 0, 'drop: nothing was sent');
is(step_field($node, 'rights', 'after-drop', "error_code || ' ' || error_message"),
	'42501 the role that created the step no longer exists', 'drop: 42501, saying why');

done_testing();
