# Property: pg_stat_activity shows a worker attempt's long identity whole and valid
# (docs/worker.md): a run_id of 200 two-byte characters is shown with its step and attempt
# number, as valid UTF-8, no character cut in two.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('worker_activity',
	"durable_steps.database = 'postgres'\ndurable_steps.poll_interval = '100ms'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
});

# 7. pg_stat_activity shows a worker's long identities whole and valid (no character cut in two).
my $long_run = 'é' x 200;
# attempt 2 waits for a lock the test holds, so it is still running when the test looks
my $holder = DurableSteps::Session->new($node, 'holder');
$holder->query_ok('SELECT pg_advisory_lock(6301);');
$node->safe_psql('postgres', qq{
SET ROLE alice;
SELECT status FROM ds_run_step('$long_run', 'sleepy',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text
               ELSE pg_advisory_xact_lock_shared(6301)::text END');
});
ok( poll_until($node, 'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker'
   AND convert_from(convert_to(query, 'UTF8'), 'UTF8') LIKE '%/sleepy attempt 2'}),
	'activity: the running attempt is shown whole, as valid UTF-8');
$holder->query_ok('SELECT pg_advisory_unlock(6301);');
ok( poll_until($node, 'postgres',
		qq{SELECT status || ' ' || attempts FROM durable_steps.steps WHERE run_id = '$long_run' AND step_id = 'sleepy'},
		'succeeded 2'),
	'activity: the attempt then succeeds');
$holder->quit;

$node->stop;
done_testing();
