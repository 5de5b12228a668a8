# Where an HTTP step may connect (docs/http.md, "Security model"): every connection is
# checked at the address its host resolved to, before it is opened. A name that resolves to a
# denied address reaches nothing (durable_steps.http_denied_addresses); http_allowed_hosts takes
# ports and address ranges, and an address range decides at the connection for a host it does
# not name. Refused steps are blocked with nothing sent.
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
my $node = http_node('http_addresses');
my $port = $p->port;

# Sets the two settings for the whole server and waits until a new session sees them.
sub settings
{
	my ($allowed, $denied) = @_;
	$node->safe_psql('postgres', qq{
ALTER SYSTEM SET durable_steps.http_allowed_hosts = '$allowed';
ALTER SYSTEM SET durable_steps.http_denied_addresses = '$denied';
SELECT pg_reload_conf();});
	return poll_until($node, 'postgres',
		q{SELECT current_setting('durable_steps.http_allowed_hosts') || '|' || current_setting('durable_steps.http_denied_addresses')},
		"$allowed|$denied");
}

# A step to `url` due a second from now (after the HTTP worker read the settings); its status
# once settled, or the error of the call.
sub step_to
{
	my ($step, $url) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', qq{SET ROLE app;
SELECT status FROM ds_http_step('addr', '$step', '{"method": "POST", "url": "$url"}',
                                run_at => now() + interval '1 s')});
	return $err if $rc != 0;
	return settle_http($node, 'addr', $step);
}

# 1. denied addresses: a name and a literal that resolve to loopback reach nothing
ok(settings('', "127.0.0.0/8, ::1/128"), 'denied: loopback');
is(step_to('by-name', "http://localhost:$port/charge/by-name"), 'blocked',
	'denied: a name resolving to loopback is blocked');
like(step_field($node, 'addr', 'by-name', "error_code || ' ' || error_message"),
	qr/^42501 host "localhost" resolved to (127\.0\.0\.1|::1), an address HTTP steps may not reach$/,
	'denied: 42501, naming the host and the address');
is(step_to('by-literal', $p->url('by-literal')), 'blocked', 'denied: a loopback literal is blocked');
is(step_to('mapped', "http://[::ffff:127.0.0.1]:$port/charge/mapped"), 'blocked',
	'denied: an IPv4-mapped IPv6 literal counts as its IPv4 address');
is($p->requests('by-name') + $p->requests('by-literal') + $p->requests('mapped'), 0,
	'denied: nothing was sent');

# 2. the allowed hosts take a port
ok(settings("127.0.0.1:$port", ''), 'allowed: one address and port');
is(step_to('right-port', $p->url('right-port')), 'succeeded', 'allowed: the address on its port is sent');
my $other = $port == 65535 ? $port - 1 : $port + 1;
like(step_to('other-port', "http://127.0.0.1:$other/charge/x"), qr/host "127.0.0.1" is not allowed/,
	'allowed: another port of the address is refused at the call');
ok(settings("localhost:$port", ''), 'allowed: a name and port');
like(step_to('name-other-port', "http://localhost:$other/charge/x"), qr/is not allowed/,
	'allowed: the name on another port is refused at the call');

# 3. an address range: a name it does not list is decided at the connection
ok(settings('127.0.0.0/8', ''), 'allowed: a loopback range');
is(step_to('in-range', "http://localhost:$port/charge/in-range"), 'succeeded',
	'range: a name resolving into the range is sent');
ok(settings('10.0.0.0/8', ''), 'allowed: a range the provider is not in');
is(step_to('out-of-range', "http://localhost:$port/charge/out-of-range"), 'blocked',
	'range: a name resolving outside the range is blocked');
is($p->requests('out-of-range'), 0, 'range: nothing was sent');

# 4. bad settings are refused, naming the entry
my ($rc, $out, $err) = $node->psql('postgres', q{SET durable_steps.http_denied_addresses = 'example.com'});
like($err, qr/"example.com" is not an address or CIDR range/, 'a denied entry must be an address');
($rc, $out, $err) = $node->psql('postgres', q{SET durable_steps.http_denied_addresses = '10.0.0.0/33'});
like($err, qr/is not an address or CIDR range/, 'a range must be valid');
ok(settings('[::1]:443, *.example.com:8443', '::1, 192.168.0.0/16:25'), 'brackets and ports are accepted');

ok(!($node->log_contains($crash_re)), 'no server process crashed');
$node->stop;
done_testing();
