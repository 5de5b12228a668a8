# Property: pg_stat_activity shows a worker attempt's long identity whole and valid
# (docs/worker.md): a run_id of 200 two-byte characters is shown with its step and attempt
# number, as valid UTF-8, no character cut in two.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
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
$node->safe_psql('postgres', qq{
SET ROLE alice;
SELECT status FROM ds_run_step('$long_run', 'sleepy',
  'SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after(''later'', ''0 s'')::text
               ELSE pg_sleep(1.5)::text END');
});
ok($node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'durable_steps worker'
   AND convert_from(convert_to(query, 'UTF8'), 'UTF8') LIKE '%/sleepy attempt 2'}),
	'activity: the running attempt is shown whole, as valid UTF-8');

$node->stop;
done_testing();
