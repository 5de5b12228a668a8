# No HTTP request leaves before its claim is as durable as a commit (docs/http.md): with a
# synchronous standby, a cancel of the HTTP worker while its claim's commit waits for the standby
# ("committed locally, but might not have been replicated") does not let it send -- it waits for
# the standby again -- so a failover cannot make the promoted server send the same attempt again.
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
my $primary = http_node('sync_primary', "wal_level = replica\nmax_wal_senders = 4\n");
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('sync_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "cluster_name = 'sync_standby'\n");
$standby->start;
$primary->safe_psql('postgres',
	"ALTER SYSTEM SET synchronous_standby_names = 'sync_standby'; SELECT pg_reload_conf()");
ok(poll_until($primary, 'postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'sync_standby'"),
	'the standby is synchronous');

# a keyless POST: sent twice, it would charge twice
my $url = $p->url('sync');
$primary->safe_psql('postgres', qq{SET ROLE app;
SELECT ds_http_step('sync', 'charge', '{"method": "POST", "url": "$url"}', idempotency_header => NULL,
                    run_at => now() + interval '1 hour')});
# the standby goes away before the step is due: the claim's commit waits for it. The step is made
# due once it is gone (committed locally: a synchronous commit would wait for the standby too).
$standby->stop('immediate');
$primary->safe_psql('postgres', q{SET synchronous_commit = local;
UPDATE durable_steps.steps SET next_attempt_at = now() WHERE run_id = 'sync' AND step_id = 'charge'});
my $http = http_worker_pid($primary);
ok(poll_until($primary, 'postgres',
		"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $http"),
	'the HTTP worker\'s claim waits for the synchronous standby');

# cancel that wait, as an operator (or a failover manager) would
my $offset = log_offset($primary);
$primary->safe_psql('postgres', "SELECT pg_cancel_backend($http)");
is(poll_log($primary, $offset, qr/canceling wait for synchronous replication/), 1,
	'the cancel ended the commit\'s wait: committed locally only');
ok(poll_until($primary, 'postgres',
		"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $http"),
	'the HTTP worker waits for the standby again');
is($p->requests('sync'), 0, 'nothing was sent on the claim the standby does not have');
is(http_worker_pid($primary), $http, 'the same HTTP worker');

# the standby is back: the claim is replicated, and the request leaves once
$standby->start;
ok(poll_until($primary, 'postgres',
		"SELECT status = 'succeeded' FROM ds_steps WHERE run_id = 'sync' AND step_id = 'charge'"),
	'the step succeeded once the standby confirmed the claim');
is($p->charges('sync'), 1, 'one charge');

done_testing();
