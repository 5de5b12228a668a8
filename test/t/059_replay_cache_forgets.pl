# Property: a backend's remembered replays never outlive the step (src/store/replay_cache.c). A
# backend remembers the answers of succeeded steps it replays; another session's DELETE or
# TRUNCATE of the step makes it forget at once: its next call runs the body again instead of
# replaying a step that no longer exists. (sql/04_run_step.sql has the same backend's own
# deletes, updates and rollbacks.)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;

my $node = claims_node('replay_cache_forgets');

my $sa = DurableSteps::Session->new($node, 'A');
my $sb = DurableSteps::Session->new($node, 'B');

{
	my $t = 'replay cache';
	my $effects = sub {
		return $node->safe_psql('postgres', "SELECT count(*) FROM effects WHERE k = 'cache'");
	};
	my $replayed = sub { return decode_row($sa->query_ok(claim_sql('cache')))->{replayed}; };
	is($replayed->(), 'false', "$t: the first call runs the body");
	is($replayed->(), 'true', "$t: the second call replays (and remembers)");
	is($replayed->(), 'true', "$t: the third call replays");
	is($effects->(), '1', "$t: one effect");

	$sb->query_ok("DELETE FROM durable_steps.attempts WHERE run_id = 'cache'; "
		  . "DELETE FROM durable_steps.steps WHERE run_id = 'cache';");
	is($replayed->(), 'false',
		"$t: after another session deleted the step, the remembering session runs it again");
	is($effects->(), '2', "$t: a second effect");
	is($replayed->(), 'true', "$t: which it then replays");

	$sb->query_ok('TRUNCATE durable_steps.steps, durable_steps.attempts;');
	is($replayed->(), 'false',
		"$t: after another session truncated the steps, the remembering session runs it again");
	is($effects->(), '3', "$t: a third effect");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
