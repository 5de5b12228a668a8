# Copyright (c) durable_steps contributors
#
# Property (docs/operations.md, "Upgrades"): an install of the last release, full of work,
# upgrades in place. The release's own library (scripts/release-build, from the commit sql/RELEASES
# names) makes steps in every status, HTTP steps sent and pending, runs asleep and waiting for an
# event, an event, a queue limit; the server stops while an attempt runs. Then the library under
# test replaces it and the server starts again, the extension still at the release's version:
#   - every function that reads or writes the extension's tables refuses with DS426 and a hint
#     that names ALTER EXTENSION durable_steps UPDATE, and changes nothing;
#   - the worker waits: one executor, no HTTP worker, one log line however long it waits, and
#     nothing of the stored work moves;
# after ALTER EXTENSION durable_steps UPDATE the worker carries on, every effect exactly once
# (DurableSteps::Upgrade::carries_on, the checks TAP 064 makes after pg_upgrade), and the schema
# is the one a fresh CREATE EXTENSION makes (pg_dump --schema-only --binary-upgrade of both, which
# writes every object of the extension).

use strict;
use warnings;

use FindBin;
use IPC::Run;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Http;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# the newest release, and the version under test
my ($release) = map { (split)[0] } grep { !/^\s*(#|$)/ } split /\n/,
  slurp_file("$FindBin::RealBin/../../sql/RELEASES");
my ($current) = slurp_file("$FindBin::RealBin/../../durable_steps.control") =~ /^default_version\s*=\s*'([^']*)'/m;
note("from durable_steps $release to $current");

my $up = DurableSteps::Upgrade->prepare(from_release => $release);
my $node = $up->{new};
my $install = $up->{install};
my $version_sql = q{SELECT extversion FROM pg_extension WHERE extname = 'durable_steps'};

my $t = "$release under the library of $current";
is($node->safe_psql('postgres', $version_sql), $release, "$t: the extension is still at $release");
is( $node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'}),
	'0', "$t: no durable_steps process runs");
my $steps_upgraded = $up->snapshot($node, 'step');

# Every part of the state as it was when the release's server stopped.
sub state_unchanged
{
	my ($name) = @_;
	my @moved = grep {
		JSON::PP->new->canonical->encode($up->snapshot($node, $_)) ne
		  JSON::PP->new->canonical->encode($up->{before}{$_})
	} sort keys %{ $up->{before} };
	is("@moved", '', $name);
}

# The functions: each call that would read or write the extension's tables is refused with DS426,
# whose hint names the UPDATE; a replay is refused as well as a new step.
my %calls = (
	'ds_run_step, a replay' =>
	  q{SET ROLE alice; SELECT ds_run_step('up', 'paid', $$SELECT book('paid')$$, '{}')},
	'ds_run_step, a new step' =>
	  q{SET ROLE alice; SELECT ds_run_step('up', 'new', $$SELECT book('new')$$, '{}')},
	'ds_run_step, deferred' =>
	  q{SET ROLE bob; SELECT ds_run_step('up', 'new-deferred', $$SELECT book('new-deferred')$$, '{}', defer => true)},
	'ds_http_step' =>
	  q{SET ROLE alice; SELECT ds_http_step('up-http', 'new', '{"method": "POST", "url": "http://127.0.0.1:1/"}')},
	'ds_start_run' => q{SET ROLE alice; SELECT ds_start_run('short', '{}', 'new-run')},
	'ds_retry_step' => q{SET ROLE bob; SELECT ds_retry_step('up', 'fixed', '{"ok": true}')},
	'ds_cancel_step' => q{SET ROLE bob; SELECT ds_cancel_step('up', 'later')},
	'ds_wait_step' => q{SET ROLE alice; SELECT ds_wait_step('up', 'paid', '0 s')},
	'ds_emit_event' => q{SET ROLE bob; SELECT ds_emit_event('shipped:ship-run', '{"early": true}')},
	'ds_idempotent, a replay' => q{SET ROLE alice; } . DurableSteps::Upgrade::idempotent_sql(),
	'ds_idempotent_begin' =>
	  q{SET ROLE bob; SELECT ds_idempotent_begin('checkout', 'key-new', '{"amount": 1}')},
	$up->{cron} ? ('ds_schedule_fire' => q{SET ROLE alice; SELECT ds_schedule_fire('yearly-report')}) : (),);
for my $call (sort keys %calls)
{
	my ($rc, $out, $err) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n$calls{$call}", on_error_stop => 1);
	like($err, qr/ERROR:  DS426: extension "durable_steps" is installed at version \Q$release\E in this database, and the server has loaded its library of version \Q$current\E/,
		"$t: $call: refused with DS426");
	like($err, qr/HINT:  Run ALTER EXTENSION durable_steps UPDATE in this database/,
		"$t: $call: the hint names the UPDATE");
}
state_unchanged("$t: the refused calls changed nothing");

# The worker waits: one executor, which logs once and takes nothing; no HTTP worker.
my $offset = log_offset($node);
$node->append_conf('postgresql.conf', "durable_steps.max_workers = 2\n");
$node->restart;
my $waiting = qr/durable_steps: extension is installed at version \Q$release\E in database "postgres", and the server's library is version \Q$current\E; waiting for the two to match/;
ok(poll_log($node, $offset, $waiting), "$t: the worker says it waits for the versions to match");
like(log_since($node, $offset), qr/HINT:  Run ALTER EXTENSION durable_steps UPDATE in this database/,
	"$t: its hint names the UPDATE");
my $pid = executor_pid($node);
ok(wait_executor_loops($node, 'postgres', $pid, 2000), "$t: the executor went round its loop for 2 s");
is(count_matches(log_since($node, $offset), $waiting), 1, "$t: it said so once");
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps http'}),
	'0', "$t: no HTTP worker runs");
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}),
	'1', "$t: no other executor was started");
state_unchanged("$t: the worker moved nothing: the due steps, the lost attempt, the runs wait");

# ALTER EXTENSION durable_steps UPDATE: the worker carries on.
$t = "updated to $current";
$offset = log_offset($node);
$node->safe_psql('postgres', 'ALTER EXTENSION durable_steps UPDATE');
is($node->safe_psql('postgres', $version_sql), $current, "$t: the extension is at $current");
ok(poll_log($node, $offset, qr/durable_steps: extension found at version \Q$current\E; running steps/),
	"$t: the waiting executor says it runs steps");
ok( poll_until(
		$node, 'postgres',
		q{SELECT count(*) FILTER (WHERE backend_type = 'durable_steps worker') = 2
		     AND count(*) FILTER (WHERE backend_type = 'durable_steps http') = 1
		    FROM pg_stat_activity WHERE datname = 'postgres'}),
	"$t: two executors and the HTTP worker serve database postgres");
$up->carries_on($t, $steps_upgraded);

# the schedule, kept with its pg_cron job, is its owner's to change
SKIP:
{
	skip 'pg_cron is not installed for this PostgreSQL: the scenario has no schedule', 3 unless $up->{cron};
	is( $node->safe_psql('postgres', q{SET ROLE alice; SELECT job_name || ' ' || schedule FROM ds_schedules}),
		'yearly-report 0 3 1 1 *', "$t: yearly-report: alice's schedule is there");
	is($node->safe_psql('postgres', q{SET ROLE alice; SELECT ds_unschedule('yearly-report')}),
		't', "$t: yearly-report: alice unschedules it");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM cron.job}), '0', "$t: yearly-report: its pg_cron job is gone");
}

# What 0.2.0 adds for operators, on the history the update kept: the steps that need a person
# are counted through the index the UPDATE built, as the table counts them; the last hour's
# attempts are read from the counters; a repeat waits for a held key (ds_idempotent_begin's wait)
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(label || '=' || value::int, ',' ORDER BY label)
                        FROM ds_stats() WHERE metric = 'steps_needing_person'}),
	$node->safe_psql(
		'postgres', q{SELECT string_agg(st || '=' || (SELECT count(*) FROM durable_steps.steps s WHERE s.status = st),
                                         ',' ORDER BY st) FROM unnest('{blocked,failed,uncertain}'::text[]) st}),
	"$t: ds_stats() counts the kept steps that need a person as the table does");
ok($node->safe_psql('postgres', q{SELECT sum(value) FROM ds_stats() WHERE metric = 'steps_needing_person'}) > 0,
	"$t: and there are some");
is($node->safe_psql('postgres', q{SELECT sum(attempts) > 0 FROM ds_attempt_minutes()}), 't',
	"$t: ds_attempt_minutes() has the attempts run since the restart");
$node->safe_psql('postgres',
	q{SET ROLE bob; SELECT ds_idempotent_begin('checkout', 'key-lapsing', '{}', lease => '300 ms')});
is( $node->safe_psql(
		'postgres', q{SET ROLE bob; SELECT state FROM ds_idempotent_begin('checkout', 'key-lapsing', '{}', wait => '30 s')}),
	'new', "$t: a repeat waits for a held key, and holds it once the holder's lease ran out");
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET ROLE bob; SELECT state FROM ds_idempotent_begin('checkout', 'key-lapsing', '{}', wait => '50 ms')});
like($err, qr{idempotency key checkout/key-lapsing is in progress}, "$t: past its wait, a repeat is refused: in progress (DS409)");

# An application workflow (docs/app-workflows.md) on the updated install: declared, started,
# its segment stored by the worker's turn, its step claimed by the segment's holder and recorded,
# the run finished with the segment's output. Its schema is dropped again: the dump below
# compares the extension's objects with a fresh install's.
$node->safe_psql('postgres', 'CREATE SCHEMA up_flows AUTHORIZATION alice');
is( $node->safe_psql(
		'postgres', q{SET ROLE alice; SET search_path = up_flows, public;
SELECT ds_define_workflow('up_flow');
SELECT run_id FROM ds_start_run('up_flow', '{"n": 1}', run_key => 'up-flow');}),
	"up_flow(text,jsonb)\nup-flow",
	"$t: an application workflow is declared and started");
ok( poll_until(
		$node, 'postgres',
		q{SELECT count(*) = 1 FROM durable_steps.steps WHERE run_id = 'up-flow' AND step_id = 'ds.segment:1'}),
	"$t: the worker's turn stored the workflow's first segment");
is( $node->safe_psql(
		'postgres', q{SET ROLE alice;
SELECT token AS holder FROM ds_claim_tasks(ARRAY['ds.workflow:up_flow'], 1, '1 hour') \gset
SELECT c.token AS step FROM ds_task_step('up-flow', 's1', 'ds.step:up_flow', '{"seq": 1}') s,
       LATERAL ds_claim_task(:'holder', s.step_id) c \gset
SELECT status FROM ds_complete_task(:'step', '{"done": 1}');
SELECT status FROM ds_complete_task(:'holder', '{"then": "return", "output": {"n": 1}}');}),
	"succeeded\nsucceeded",
	"$t: the segment's holder claims its step and both are recorded");
ok( poll_until(
		$node, 'postgres',
		q{SELECT status = 'succeeded' AND output = '{"n": 1}' FROM durable_steps.runs WHERE run_id = 'up-flow'}),
	"$t: the run finishes with the segment's output");
$node->safe_psql('postgres', 'DROP SCHEMA up_flows CASCADE');

# Limits, maps and child runs (docs/limits.md, docs/runs.md) on the updated install: a step
# held by a limit and admitted, a workflow that maps and joins a child run. The schema is dropped
# again, for the dump below.
$node->safe_psql('postgres', q{CREATE SCHEMA up_fan AUTHORIZATION alice;
SELECT ds_set_concurrency_limit('up-one', 1);});
is( $node->safe_psql(
		'postgres', q{SET ROLE alice; SET search_path = up_fan, public;
CREATE FUNCTION up_kid(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '"kid"'::jsonb $$;
CREATE FUNCTION up_fan(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM ds_start_child_run('kid', 'up_kid', '{}');
    RETURN jsonb_build_object('map', ds_map('m', 'SELECT ($1::text)::int * 3', '[1, 2, 3]', concurrency => 2),
                              'kid', ds_join_child('kid'));
END $f$;
SELECT run_id FROM ds_start_run('up_fan', '{}', run_key => 'up-fan');
SELECT status FROM ds_run_step('up-limited', 's', 'SELECT 7', defer => true, policy => '{"limit": "up-one"}');}),
	"up-fan\npending",
	"$t: a map with a child run started, a step of a limit stored");
ok( poll_until(
		$node, 'postgres',
		q{SELECT (SELECT status = 'succeeded' AND output = '{"map": [3, 6, 9], "kid": "kid"}'
                    FROM durable_steps.runs WHERE run_id = 'up-fan')
             AND (SELECT status = 'succeeded' FROM durable_steps.steps WHERE run_id = 'up-limited')}),
	"$t: the map and its child joined, the step of the limit admitted and run");
$node->safe_psql('postgres', q{DROP SCHEMA up_fan CASCADE; SELECT ds_drop_limit('up-one');});

# A fresh install of the version under test has the schema of the upgraded one.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', qq{CREATE EXTENSION durable_steps;
GRANT durable_steps_http TO alice;
$up->{app_sql}});
is($node->safe_psql('fresh', $version_sql), $current, "fresh: CREATE EXTENSION installs $current");

# pg_dump --schema-only --binary-upgrade writes each object of the extension (and of no other
# extension: the upgraded database has pg_cron where it is installed); what differs between
# two databases with the same objects is their OIDs, relfilenodes, frozen xids, the sequences'
# positions and the \restrict key, which are left out.
sub schema_of
{
	my ($db) = @_;
	my ($out, $err);
	IPC::Run::run([ "$install->{install_path}/bin/pg_dump", '--schema-only', '--binary-upgrade',
			'--extension=durable_steps', '-d', $node->connstr($db) ], '>', \$out, '2>', \$err)
	  or die "pg_dump of $db failed: $err";
	my @lines = grep {
		!/^\\(un)?restrict /
		  && !/binary_upgrade_set_next_/
		  && !/relfrozenxid|relminmxid/
		  && !/^WHERE oid = '\d+';$/
		  && !/^SELECT pg_catalog\.setval\(/
	} split /\n/, $out;
	s/(binary_upgrade_create_empty_extension\('durable_steps', '[^']*', \w+, '[^']*', ')\{[0-9,]*\}/$1\{...\}/
	  for @lines;
	return \@lines;
}
my ($upgraded, $fresh) = (schema_of('postgres'), schema_of('fresh'));
cmp_ok(scalar(grep { /^CREATE TABLE durable_steps\./ } @$upgraded), '>=', 5, 'the dump has the extension\'s tables');
my @differ = grep { ($upgraded->[$_] // '') ne ($fresh->[$_] // '') } 0 .. ($#$upgraded > $#$fresh ? $#$upgraded : $#$fresh);
is(scalar(@differ), 0, "the upgraded schema is the fresh one: pg_dump --schema-only of both is the same")
  or diag(join("\n", map { "line $_: upgraded: " . ($upgraded->[$_] // '(none)') . "\n         fresh:    " . ($fresh->[$_] // '(none)') } @differ[0 .. ($#differ < 9 ? $#differ : 9)]));

$up->finish;
done_testing();
