# Property: an idempotency key runs its handler once however many duplicates arrive together
# (docs/idempotent-requests.md). Twenty sessions send the same request under one key at once:
# with `wait`, the first runs the handler and the nineteen others wait for its commit and replay
# its response; without it, they are refused with DS409 while it is in flight, and a retry after
# its commit replays. Held keys whose lease ran out, keys past their expiry and keys of a role
# dropped in another database are purged by the worker; a live key never is.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('idempotent_concurrent', "durable_steps.database = 'postgres'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE charges (id serial PRIMARY KEY, amount int, at timestamptz DEFAULT clock_timestamp());
});

# the handler charges, and takes its time (3 s): every duplicate arrives while it is in flight,
# even on a loaded machine
my $handler = q{INSERT INTO charges (amount) SELECT ($1->>'amount')::int FROM pg_sleep(3)
  RETURNING 201, jsonb_build_object('charge', id)};

# Sends the call in 20 sessions at once; returns each session's (stdout, stderr).
sub twenty_at_once
{
	my ($key, $wait) = @_;
	my @sessions = map { DurableSteps::Session->new($node, "dup$_") } 1 .. 20;
	my $call = qq{SELECT status || ' ' || body::text || ' ' || replayed FROM ds_idempotent('checkout', '$key', '{"amount": 70}', \$h\$$handler\$h\$, wait => $wait);};
	my @tickets = map { $_->send($call) } @sessions;
	my @answers = map { [ $sessions[$_]->wait($tickets[$_]) ] } 0 .. 19;
	$_->quit for @sessions;
	return @answers;
}

my $t = 'with wait';
my @answers = twenty_at_once('waited', q{'30 s'});
my %by = ();
$by{ $_->[1] ne '' ? 'error' : $_->[0] }++ for @answers;
is($node->safe_psql('postgres', 'SELECT count(*) FROM charges'), '1', "$t: one charge for 20 duplicates");
is_deeply(
	\%by,
	{ '201 {"charge": 1} false' => 1, '201 {"charge": 1} true' => 19 },
	"$t: the first ran the handler, the 19 others waited and replayed its response");

$t = 'without wait';
@answers = twenty_at_once('refused', 'NULL');
my @errors = grep { $_->[1] ne '' } @answers;
my @ran = grep { $_->[1] eq '' } @answers;
is(scalar(@ran) . ' ran, ' . scalar(grep { $_->[1] =~ /DS409/ || $_->[1] =~ /is in progress/ } @errors) . ' in progress',
	'1 ran, 19 in progress', "$t: one ran the handler, the 19 others were refused as in progress");
is($ran[0][0], '201 {"charge": 2} false', "$t: the one that ran charged once");
is($node->safe_psql('postgres', 'SELECT count(*) FROM charges'), '2', "$t: one charge more");
is( $node->safe_psql('postgres',
		qq{SELECT status || ' ' || body::text || ' ' || replayed FROM ds_idempotent('checkout', 'refused', '{"amount": 70}', \$h\$$handler\$h\$)}),
	'201 {"charge": 2} true', "$t: a retry after its commit replays it");

# a duplicate that waits for a handler that then raises: nothing was stored, so it runs the
# handler itself
$t = 'a failed first';
my $first = DurableSteps::Session->new($node, 'first');
my $second = DurableSteps::Session->new($node, 'second');
$first->query_ok(q{BEGIN;});
$first->query_ok(
	qq{SELECT status FROM ds_idempotent('checkout', 'failing', '{"amount": 5}', \$h\$$handler\$h\$);});
my $ticket = $second->send(
	qq{SELECT status || ' ' || replayed FROM ds_idempotent('checkout', 'failing', '{"amount": 5}', \$h\$$handler\$h\$, wait => '30 s');});
ok( poll_until($node, 'postgres',
		q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17481 AND NOT granted},
		'1'),
	"$t: the duplicate waits for the first's transaction");
$first->query_ok(q{ROLLBACK;});
my ($out, $err) = $second->wait($ticket);
is("$out|$err", '201 false|', "$t: the first rolled back, so the duplicate ran the handler");
$first->quit;
$second->quit;

# a duplicate in REPEATABLE READ (or SERIALIZABLE) waits as one in READ COMMITTED, and replays:
# its snapshot, taken before the wait, cannot see what the first committed, so the entry is read
# as committed now rather than written over (40001)
for my $level ('REPEATABLE READ', 'SERIALIZABLE')
{
	$t = "a duplicate in $level";
	(my $key = lc $level) =~ s/ /-/g;
	$first = DurableSteps::Session->new($node, 'first');
	$second = DurableSteps::Session->new($node, 'second');
	$first->query_ok(q{BEGIN;});
	my $charged = $first->query_ok(
		qq{SELECT body->>'charge' FROM ds_idempotent('checkout', '$key', '{"amount": 6}', \$h\$$handler\$h\$);});
	$second->query_ok(qq{BEGIN ISOLATION LEVEL $level;});
	$second->query_ok(q{SELECT count(*) FROM charges;});
	$ticket = $second->send(
		qq{SELECT status || ' ' || (body->>'charge') || ' ' || replayed FROM ds_idempotent('checkout', '$key', '{"amount": 6}', \$h\$$handler\$h\$, wait => '30 s');});
	ok( poll_until($node, 'postgres',
			q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17481 AND NOT granted},
			'1'),
		"$t: the duplicate waits for the first's transaction");
	$first->query_ok(q{COMMIT;});
	($out, $err) = $second->wait($ticket);
	is("$out|$err", "201 $charged true|", "$t: it replays the response the first committed");
	$second->query_ok(q{COMMIT;});
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM charges WHERE id >= $charged}), '1',
		"$t: one charge");
	$first->quit;
	$second->quit;
}

# the worker purges what expired, and nothing live
$t = 'purge';
$node->safe_psql(
	'postgres', q{
SELECT ds_idempotent('purge', 'expired', '{}', 'SELECT 200, NULL::jsonb', ttl => '1 ms');
SELECT ds_idempotent_begin('purge', 'lease-ran-out', '{}', ttl => '1 ms', lease => '1 ms');
SELECT ds_idempotent_begin('purge', 'held', '{}', ttl => '1 ms', lease => '1 hour');
SELECT ds_idempotent('purge', 'live', '{}', 'SELECT 200, NULL::jsonb');
SELECT pg_sleep(0.01);
SELECT pg_reload_conf();
});
ok( poll_until($node, 'postgres',
		q{SELECT string_agg(key, ',' ORDER BY key) FROM durable_steps.idempotency_keys WHERE scope = 'purge'},
		'held,live'),
	"$t: the expired keys are purged; a held key within its lease and a live one stay");

# DROP ROLE deletes a role's keys in the database it runs in; a role dropped while connected to
# another database leaves them behind, and the worker's sweep deletes them there, so that a role
# created later with the same OID is never answered them. The keys of roles that exist stay.
$t = 'a role dropped elsewhere';
$node->safe_psql('postgres', q{CREATE ROLE leaver LOGIN; CREATE DATABASE elsewhere;});
psql_as_ok($node, 'leaver', q{
SELECT ds_idempotent('orphan', 'k' || g, '{}', 'SELECT 200, NULL::jsonb') FROM generate_series(1, 1500) g;
SELECT ds_idempotent_begin('orphan', 'held', '{}', lease => '1 hour');
});
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM durable_steps.idempotency_keys WHERE owner = 'leaver'::regrole}),
	'1501', "$t: the role's keys, answered and held, more than one purge batch of them");
my $leaver = $node->safe_psql('postgres', q{SELECT 'leaver'::regrole::oid});
$node->safe_psql('elsewhere', q{DROP ROLE leaver});
is( $node->safe_psql('postgres',
		qq{SELECT count(*) FROM durable_steps.idempotency_keys WHERE owner::oid = $leaver}),
	'1501', "$t: DROP ROLE in another database left them here");
$node->safe_psql('postgres', q{SELECT pg_reload_conf()});
ok( poll_until($node, 'postgres',
		qq{SELECT count(*) FROM durable_steps.idempotency_keys WHERE owner::oid = $leaver}, '0'),
	"$t: the worker deleted every key of the role that no longer exists");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(key, ',' ORDER BY key) FROM durable_steps.idempotency_keys WHERE scope = 'purge'}),
	'held,live', "$t: the keys of roles that exist stay");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
