# HTTP steps go through a proxy only when a superuser's setting names one (docs/http.md):
# the http_proxy, https_proxy and all_proxy variables of the postmaster's environment, which
# libcurl would otherwise honour, send no request (nor its Authorization header) anywhere.
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
# a second fake provider plays the proxy: a proxied request reaches it with the target's path
my $proxy = DurableSteps::Http::Provider->start;
my $proxy_url = 'http://127.0.0.1:' . $proxy->port;

# The postmaster (and so the HTTP worker) inherits the environment it starts in. Only it gets the
# proxy variables: this test's own HTTP client (HTTP::Tiny) would honour them too.
sub with_proxy_environment
{
	my ($code) = @_;
	local $ENV{http_proxy}  = $proxy_url;
	local $ENV{HTTP_PROXY}  = $proxy_url;
	local $ENV{https_proxy} = $proxy_url;
	local $ENV{all_proxy}   = $proxy_url;
	local $ENV{ALL_PROXY}   = $proxy_url;
	delete local $ENV{no_proxy};
	delete local $ENV{NO_PROXY};
	return $code->();
}
my $node = with_proxy_environment(sub { http_node('http_proxy') });

sub send_step
{
	my ($step, $tag) = @_;
	my $url = $p->url($tag);
	$node->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('proxy', '$step', '{"method": "POST", "url": "$url",
  "headers": {"Authorization": "Bearer sk_secret"}}')});
	return settle_http($node, 'proxy', $step);
}

# 1. the environment names a proxy, the setting none: sent directly
is(send_step('direct', 'direct'), 'succeeded', 'environment proxy: the step succeeded');
is($p->requests('direct'), 1, 'environment proxy: the receiver got the request directly');
is($proxy->requests('direct'), 0, 'environment proxy: the proxy of the environment got nothing');
is(join(',', grep { defined } @{ $proxy->counts->{auth}{direct} // [] }), '',
	'environment proxy: and never saw the Authorization header');

# 2. the superuser's setting names it: the request goes through it
$node->append_conf('postgresql.conf', "durable_steps.http_proxy = '$proxy_url'\n");
with_proxy_environment(sub { $node->restart });
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps http'"),
	'setting: the HTTP worker is back');
is(send_step('proxied', 'proxied'), 'succeeded', 'setting: the step succeeded');
is($proxy->requests('proxied'), 1, 'setting: the request went through the named proxy');
is($p->requests('proxied'), 0, 'setting: and not directly');

# 3. the setting is a superuser's, and hidden from other roles (a proxy URL may hold a password)
my ($rc, $out, $err) = $node->psql('postgres', 'SET ROLE app; SHOW durable_steps.http_proxy');
like($err, qr/permission denied|must be superuser|privileges of pg_read_all_settings/,
	'setting: SHOW is refused to a plain role');

done_testing();
