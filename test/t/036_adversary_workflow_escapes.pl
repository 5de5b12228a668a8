# Property: a workflow cannot leave the security-restricted operation its turn runs in
# (docs/security.md). What that operation refuses (SET ROLE, SET SESSION AUTHORIZATION and their
# set_config forms, LISTEN, a temporary table, PREPARE, a WITH HOLD cursor) fails the run with
# 42501, a COMMIT in a workflow procedure fails it with 2D000, and nothing after the escape runs
# as the executor's superuser.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_workflow_escapes',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO mallory;
});
ok(executors_running($node, 1), 'an executor is running');
# what a workflow did after its escape, as whom
psql_as_ok($node, 'mallory',
	q{CREATE TABLE mallory_log (what text, session_user_name text, current_user_name text, su text)});

my $t = 'workflow escapes';
my %escapes = (
	set_role => q{SET ROLE postgres},
	session_authorization => q{SET SESSION AUTHORIZATION postgres},
	set_config_role => q{PERFORM set_config('role', 'postgres', false)},
	set_config_session => q{PERFORM set_config('session_authorization', 'postgres', false)},
	listen => q{LISTEN mallory_channel},
	temp_table => q{CREATE TEMP TABLE t_leak (x int)},
	prepare => q{PREPARE p_leak AS SELECT 1},
	hold_cursor => q{DECLARE c_leak CURSOR WITH HOLD FOR SELECT session_user},
);
for my $name (sort keys %escapes)
{
	my $sql = $escapes{$name};
	$sql = "EXECUTE \$e\$$sql\$e\$" unless $sql =~ /^PERFORM/;
	psql_as_ok($node, 'mallory', qq{
CREATE FUNCTION esc_$name(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
    $sql;
    INSERT INTO mallory_log VALUES ('$name', session_user, current_user, current_setting('is_superuser'));
    RETURN '"escaped"';
END \$\$;
SELECT ds_start_run('esc_$name', '{}', 'esc-$name');
});
}
psql_as_ok($node, 'mallory', q{
CREATE PROCEDURE esc_commit(run_id text, input jsonb) LANGUAGE plpgsql AS $$
BEGIN
    COMMIT;
    INSERT INTO mallory_log VALUES ('commit', session_user, current_user, current_setting('is_superuser'));
END $$;
SELECT ds_start_run('esc_commit(text, jsonb)', '{}', 'esc-commit');
});
ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM durable_steps.runs WHERE run_id LIKE 'esc-%' AND status IN ('failed', 'succeeded')},
		scalar(keys %escapes) + 1), "$t: every escape's run finished");
my %outcome = map { $_->{run_id} => { status => $_->{status}, error_code => $_->{error_code} } }
  @{ rows_of($node, 'postgres', q{SELECT run_id, status, error_code FROM durable_steps.runs WHERE run_id LIKE 'esc-%'}) };
is_deeply(
	\%outcome,
	{
		'esc-commit' => { status => 'failed', error_code => '2D000' },
		map { ("esc-$_" => { status => 'failed', error_code => '42501' }) } keys %escapes
	},
	"$t: each fails, refused (42501; 2D000 for the COMMIT)");
is($node->safe_psql('postgres', q{SELECT count(*) FROM mallory_log}), '0',
	"$t: nothing after an escape ran");

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
