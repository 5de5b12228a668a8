# Copyright (c) durable_steps contributors
#
# Property: after pg_upgrade to a newer major (docs/backups.md), the new worker carries on the
# work left before the upgrade, and every effect happens exactly once, on the server it belongs
# to. A due retry and a due deferred step run; the attempt the old server stopped is recorded as
# lost (DS007) and retried; a pending HTTP step is sent once; the sleeping run wakes when its
# time has come and the waiting run when its event is emitted; an event emitted before the
# upgrade is seen; a blocked step re-armed runs; an uncertain HTTP step is resolved; what ended
# before the upgrade is neither run nor sent again.
#
# The scenario and these checks are DurableSteps::Upgrade's (test/perl/DurableSteps/Test.pm,
# carries_on; TAP 090 makes the same checks after ALTER EXTENSION UPDATE). TAP 047 has the state
# the upgrade keeps, 046 what the stored steps answer before the worker starts.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Http;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $up = DurableSteps::Upgrade->prepare(newest_only => 1);
my $new = $up->{new};
# the steps as upgraded, before any worker of the new cluster ran
my $steps_upgraded = $up->snapshot($new, 'step');
$new->stop;

# The new cluster with its worker
my $t = 'new';
$new->append_conf('postgresql.conf', "durable_steps.max_workers = 2\n");
$new->start;
ok( poll_until(
		$new, 'postgres',
		q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps worker') = 2
		     AND count(*) FILTER (WHERE backend_type = 'durable_steps http') = 1
		    FROM pg_stat_activity WHERE datname = 'postgres'}),
	"$t: two executors and the HTTP worker serve database postgres");

$up->carries_on($t, $steps_upgraded);

$up->finish;
done_testing();
