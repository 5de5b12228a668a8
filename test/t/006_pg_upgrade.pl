# Copyright (c) durable_steps contributors
#
# pg_upgrade keeps the steps. Role OIDs are preserved, so the owners (regrole columns, which
# pg_upgrade accepts) stay the same roles; the attempt history, the replays and the worker carry
# on in the new cluster. Both clusters preload the library with the default
# durable_steps.database, postgres, which pg_upgrade drops and recreates in the new cluster: the
# worker does not start in binary-upgrade mode, so no executor is connected there to make the
# upgrade fail.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $conf = q{
shared_preload_libraries = 'durable_steps'
durable_steps.poll_interval = '200ms'
};

my $old = PostgreSQL::Test::Cluster->new('old');
$old->init;
$old->append_conf('postgresql.conf', $conf);
$old->start;
$old->safe_psql(
	'postgres', q{
CREATE ROLE alice;
CREATE ROLE bob;
CREATE EXTENSION durable_steps;
CREATE TABLE ledger (
    id   serial PRIMARY KEY,
    step text NOT NULL,
    who  text NOT NULL DEFAULT current_user
);
GRANT SELECT, INSERT ON ledger TO alice, bob;
GRANT USAGE ON SEQUENCE ledger_id_seq TO alice, bob;
CREATE FUNCTION book(step text) RETURNS integer LANGUAGE sql
    AS $$INSERT INTO ledger(step) VALUES (step) RETURNING id$$;
-- blocked until re-armed with {"ok": true}
CREATE FUNCTION book_when_ok(input jsonb) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF (input->>'ok') IS NULL THEN
        PERFORM ds_blocked('not ok', 'Re-arm it with {"ok": true}.');
    END IF;
    RETURN book('fixed');
END
$$;
});

my %body = (
	'paid'  => q{SELECT book('paid')},
	'later' => q{SELECT ds_retry_after('not before an hour', '1 h')},
	'fixed' => q{SELECT book_when_ok($1)},);

sub call_step
{
	my ($node, $role, $step) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE $role; SELECT status || '|' || attempt || '|' || replayed FROM ds_run_step('up', '$step', \$\$$body{$step}\$\$, '{}')"
	);
}

is(call_step($old, 'alice', 'paid'),  'succeeded|1|false', 'old: alice: succeeded');
is(call_step($old, 'bob',   'later'), 'retrying|1|false',  'old: bob: retrying in an hour');
is(call_step($old, 'bob',   'fixed'), 'blocked|1|false',   'old: bob: blocked');

my $steps = q{
SELECT string_agg(step_id || '|' || status || '|' || attempt || '|' || owner || '|' || owner::oid || '|' ||
                  coalesce(extract(epoch FROM next_attempt_at)::text, ''), E'\n' ORDER BY step_id)
  FROM ds_steps};
my $history = q{
SELECT string_agg(step_id || '|' || attempt || '|' || class || '|' || coalesce(error_code, '') || '|' ||
                  role || '|' || role::oid || '|' || extract(epoch FROM finished_at), E'\n' ORDER BY step_id, attempt)
  FROM ds_attempts};
my $old_steps   = $old->safe_psql('postgres', $steps);
my $old_history = $old->safe_psql('postgres', $history);
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->append_conf('postgresql.conf', $conf);

my $bindir = $old->config_data('--bindir');
# pg_upgrade writes its files under the new data directory and the current directory
chdir ${PostgreSQL::Test::Utils::tmp_check};
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $bindir, '-B', $bindir,
		'-p', $old->port, '-P', $new->port,
		'-s', $new->host
	],
	'pg_upgrade with the worker preloaded in both clusters');

$new->start;
is($new->safe_psql('postgres', $steps), $old_steps,
	'new: the steps, their owners (name and OID) and schedules, as they were');
is($new->safe_psql('postgres', $history), $old_history, 'new: the attempt history, as it was');
is(call_step($new, 'alice', 'paid'),  'succeeded|1|true', 'new: alice: "paid" replays');
is(call_step($new, 'bob',   'later'), 'retrying|1|true',  'new: bob: "later" waits for its time');

# re-armed with the correction, the blocked step is run by the new cluster's worker, as bob
is( $new->safe_psql('postgres',
		q{SET ROLE bob; SELECT status FROM ds_retry_step('up', 'fixed', '{"ok": true}')}),
	'pending', 'new: bob re-arms the blocked step');
ok( $new->poll_query_until(
		'postgres', "SELECT status FROM ds_steps WHERE step_id = 'fixed'", 'succeeded'),
	'new: the worker runs it');
is( $new->safe_psql(
		'postgres', "SELECT string_agg(step || ':' || who, ',' ORDER BY id) FROM ledger"),
	'paid:alice,fixed:bob',
	'new: the ledger: "paid" once (before the upgrade), "fixed" once, as bob');

$new->stop;
done_testing();
