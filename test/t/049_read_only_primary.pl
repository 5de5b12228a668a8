# A primary held read-only (docs/worker.md): while default_transaction_read_only
# is on -- as pg_auto_failover sets it in its draining and stop_replication states -- the
# executors and the HTTP worker write nothing and wait, instead of failing on their first write
# and being restarted every second; once the server accepts writes they run what came due.
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
my $node = http_node('read_only', "durable_steps.poll_interval = '200ms'\n");
$node->safe_psql('postgres', q{
CREATE TABLE done (step text);
GRANT INSERT ON done TO app;
});
my $workers = q{SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
 WHERE backend_type IN ('durable_steps worker', 'durable_steps http')};
my $pids = $node->safe_psql('postgres', $workers);
like($pids, qr/^\d+,\d+$/, 'an executor and the HTTP worker run');

my $offset = log_offset($node);
$node->safe_psql('postgres', 'ALTER SYSTEM SET default_transaction_read_only = on');
$node->reload;
my $waiting = qr/durable_steps: the server is read-only \(default_transaction_read_only\); waiting/;
# each process logs it when it next looks for work
is(poll_log($node, $offset, $waiting, 2), 2,
	'read-only: the executor and the HTTP worker each said once that they wait');

# the steps are made due in 2 s only now: made before, they might come due before a slow reload
# reached the workers, and run
my $url = $p->url('ro');
$node->safe_psql('postgres', qq{SET default_transaction_read_only = off; SET ROLE app;
SELECT ds_run_step('ro', 'sql', \$\$INSERT INTO done VALUES ('sql')\$\$, run_at => now() + interval '2 s');
SELECT ds_http_step('ro', 'http', '{"method": "POST", "url": "$url"}', run_at => now() + interval '2 s');});

# the steps come due while the server is read-only, and both processes go round several times
ok(poll_until($node, 'postgres',
		"SELECT now() > max(next_attempt_at) + interval '3 s' FROM ds_steps WHERE run_id = 'ro'"),
	'read-only: the steps came due a while ago');
is($node->safe_psql('postgres',
		"SELECT string_agg(step_id || ':' || status, ',' ORDER BY step_id) FROM ds_steps WHERE run_id = 'ro'"),
	'http:pending,sql:pending', 'read-only: neither step was claimed');
is($p->requests('ro'), 0, 'read-only: nothing was sent');
is($node->safe_psql('postgres', $workers), $pids, 'read-only: no worker process was restarted');
unlike(log_since($node, $offset), qr/read-only transaction/,
	'read-only: no worker failed on a write');

# writable again: what came due runs, by the same processes
$node->safe_psql('postgres',
	'SET default_transaction_read_only = off; ALTER SYSTEM RESET default_transaction_read_only');
$node->reload;
ok(poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE status = 'succeeded') = 2 FROM ds_steps WHERE run_id = 'ro'"),
	'writable: both steps succeeded');
is($node->safe_psql('postgres', 'SELECT string_agg(step, \',\') FROM done'), 'sql', 'writable: the SQL step ran once');
is($p->charges('ro'), 1, 'writable: the HTTP step was sent once');
like(log_since($node, $offset), qr/durable_steps: the server accepts writes again/,
	'writable: the workers said so');
is($node->safe_psql('postgres', $workers), $pids, 'writable: by the same processes');

done_testing();
