# One role's requests cannot take every slot of the HTTP worker (docs/security.md): with
# durable_steps.http_max_inflight_per_role below http_max_inflight, another role's request is
# sent while the first role's hang until their timeout.
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
my $node = http_node('http_fair_share',
	"durable_steps.http_max_inflight = 4\ndurable_steps.http_max_inflight_per_role = 3\n");
$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN IN ROLE durable_steps_http');

# mallory's six requests hang for 20 s each (the provider answers late): time enough for the
# checks below while her first three are in flight, even on a loaded machine
$node->safe_psql('postgres', join '', 'SET ROLE mallory;',
	map { qq{SELECT ds_http_step('hog', 'h$_', '{"method": "POST", "url": "@{[$p->url("hog-$_", 'fault=delay&secs=20')]}"}', timeout => '60 s');} } 1 .. 6);
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'hog' AND status = 'running'}, '3'),
	"mallory's requests take her share of the slots");
$node->safe_psql('postgres',
	qq{SET ROLE app; SELECT ds_http_step('fair', 'alice', '{"url": "@{[$p->url('alice')]}"}')});
is(settle_http($node, 'fair', 'alice'), 'succeeded', "another role's request is sent meanwhile");
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'hog' AND status = 'running'}), '3',
	"while mallory's hang: she never held more than her share");
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM ds_steps WHERE run_id = 'hog' AND status = 'succeeded'}, '6'),
	"mallory's requests are all sent in turn");
$node->stop;
done_testing();
