# A restored copy that must not act at once (docs/backups.md): with durable_steps.paused on
# before it first starts, a copy made by a base backup runs no due step and sends no HTTP
# request -- its secrets go nowhere -- until an operator turns the setting off; then it runs
# what is due, once.
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
# production: paused itself here, so that only the copy could ever run the due work below
my $prod = http_node('production',
	"durable_steps.paused = on\ndurable_steps.poll_interval = '200ms'\nwal_level = replica\nmax_wal_senders = 2\n");
$prod->safe_psql('postgres', q{
CREATE TABLE done (step text);
GRANT INSERT ON done TO app;
});
my $url = $p->url('restored');
$prod->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_run_step('copy', 'sql', \$\$INSERT INTO done VALUES ('sql')\$\$, defer => true);
SELECT ds_http_step('copy', 'http', '{"method": "POST", "url": "$url",
  "headers": {"Authorization": "Bearer sk_live_production"}}');});
$prod->backup('base');
$prod->stop;

my $copy = PostgreSQL::Test::Cluster->new('staging');
$copy->init_from_backup($prod, 'base');
like(slurp_file($copy->data_dir . '/postgresql.conf'), qr/^durable_steps\.paused = on$/m,
	'the copy starts with durable_steps.paused = on');
$copy->start;

my $paused = qr/durable_steps: the worker is paused \(durable_steps\.paused\)/;
is(poll_log($copy, 0, $paused, 2), 2,
	'paused: the executor and the HTTP worker each said once that they wait');
is($copy->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('durable_steps worker', 'durable_steps http')"),
	'2', 'paused: both processes are up');
# both steps were due before the copy started; let the processes go round many poll intervals
ok(poll_until($copy, 'postgres',
		"SELECT now() > pg_postmaster_start_time() + interval '3 s'"),
	'paused: three seconds went by');
is($copy->safe_psql('postgres',
		"SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = 'copy'"),
	'http:pending,sql:pending', 'paused: no step ran');
is($copy->safe_psql('postgres', 'SELECT count(*) FROM done'), '0', 'paused: no effect');
is($p->requests('restored'), 0, 'paused: no request, and so no secret, left the copy');

# the operator has looked, and lets the copy act
$copy->safe_psql('postgres', 'ALTER SYSTEM SET durable_steps.paused = off');
$copy->reload;
ok(poll_until($copy, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') = 2 FROM ds_steps WHERE run_id = 'copy'"),
	'unpaused: both steps succeeded');
is($copy->safe_psql('postgres', 'SELECT string_agg(step, \',\') FROM done'), 'sql', 'unpaused: the SQL step ran once');
is($p->charges('restored'), 1, 'unpaused: the HTTP step was sent once');
like(log_since($copy, 0), qr/durable_steps: the worker is no longer paused/, 'unpaused: the workers said so');

done_testing();
