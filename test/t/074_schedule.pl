# ds_schedule over pg_cron (docs/schedules.md): a real pg_cron job fires at a minute boundary and
# starts the run of its slot, as the role that scheduled it; a second firing for the same slot
# starts nothing; a late firing runs the slot it was for; backfill starts the missed slots, none
# before the schedule was created; a slot's key is its owner's: no other role makes a run or a
# step under it;
# another role can neither see, fire, take over nor unschedule the schedule; malformed arguments
# create nothing; on a partitioned server a firing starts only the slots of its partitions.
# Needs pg_cron, packaged for PostgreSQL 15 only.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $probe = PostgreSQL::Test::Cluster->new('schedule_probe');
my $pkglibdir = $probe->config_data('--pkglibdir');
plan skip_all => "pg_cron is not installed for this PostgreSQL ($pkglibdir/pg_cron.so is absent)"
  unless -e "$pkglibdir/pg_cron.so";

# pg_cron runs jobs in background workers: no connection over the node's private socket
my $node = worker_node('schedule',
	"shared_preload_libraries = 'pg_cron,durable_steps'\n"
	  . "cron.database_name = 'postgres'\ncron.use_background_workers = on\n"
	  . "max_worker_processes = 32\ndurable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION pg_cron;
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE carol LOGIN;
GRANT USAGE ON SCHEMA cron TO alice, bob;
GRANT CREATE ON SCHEMA public TO bob;
CREATE FUNCTION tick(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT input $$;
});
ok(executors_running($node, 1), 'an executor is running');

my $job = q{tick's; DROP TABLE x; --};
(my $job_lit = $job) =~ s/'/''/g;

# a real firing: the first slot after the schedule was created, as alice
psql_as_ok($node, 'alice', qq{SELECT ds_schedule('$job_lit', '* * * * *', 'tick', '{"k": 1}')});
is($node->safe_psql('postgres', q{SELECT username || ' ' || command FROM cron.job}),
	qq{alice SELECT public.ds_schedule_fire('$job_lit')},
	'the pg_cron job runs as alice, the job name quoted in its command');
ok(poll_until($node, 'postgres', qq{SELECT count(*) > 0 FROM ds_runs
   WHERE run_key LIKE 'schedule:tick''s; DROP TABLE x; --:%' AND status = 'succeeded'}),
	'pg_cron fired the job at a minute boundary and its run succeeded');
my $first = row_of($node, 'postgres', qq{SELECT run_id, input, owner::text AS owner,
       (input->>'scheduled_at')::timestamptz = date_trunc('minute', created_at) AS on_time,
       run_id = ds_key('schedule', '$job_lit', (input->>'scheduled_at')::timestamptz) AS keyed
  FROM ds_runs WHERE run_key LIKE 'schedule:%' ORDER BY created_at LIMIT 1});
is($first->{owner}, 'alice', 'the run is alice\'s');
is($first->{on_time}, 'true', 'the run is for the slot of the minute it fired in');
is($first->{keyed}, 'true', 'its run id is ds_key(\'schedule\', job_name, slot)');
like($first->{input}, qr/^\{"k": 1, "scheduled_at": "\d{4}-\d\d-\d\dT\d\d:\d\d:00Z"\}$/,
	'its input is the schedule\'s with the slot as scheduled_at');
ok(poll_until($node, 'postgres', q{SELECT count(*) > 0 FROM cron.job_run_details WHERE status = 'succeeded'}),
	'pg_cron recorded the firing as succeeded');

# a duplicate firing for the same slot (up to 30 s into its minute, never later than now) starts
# nothing
(my $rid_lit = $first->{run_id}) =~ s/'/''/g;
my $slot = $node->safe_psql('postgres', qq{SELECT input->>'scheduled_at' FROM ds_runs WHERE run_id = '$rid_lit'});
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('$job_lit', least('$slot'::timestamptz + interval '30 s', now()))}),
	'0', 'a second firing for the same slot starts nothing');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM ds_runs WHERE run_key = '$rid_lit'}),
	'1', 'the slot has one run');

# firings at chosen times, of a schedule made older than it is (as if the server had been down):
# created at M - 29:30 (M: a whole hour, an hour ago), every minute, backfill 5 minutes
psql_as_ok($node, 'alice', q{SELECT ds_schedule('bf', '* * * * *', 'tick', backfill => '5 minutes')});
my $m = $node->safe_psql('postgres', q{SELECT date_trunc('hour', now()) - interval '1 hour'});
$node->safe_psql('postgres', qq{UPDATE durable_steps.schedules SET created_at = '$m'::timestamptz - interval '29 min 30 s' WHERE job_name = 'bf'});
my $slots = sub {
	return $node->safe_psql('postgres', qq{SELECT string_agg(to_char((input->>'scheduled_at')::timestamptz - '$m'::timestamptz, 'MI'), ',' ORDER BY input->>'scheduled_at')
  FROM ds_runs WHERE run_id LIKE 'schedule:bf:%' AND (input->>'scheduled_at')::timestamptz < '$m'::timestamptz});
};
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('bf', '$m'::timestamptz - interval '27 min 50 s')}),
	'2', 'a firing 2 minutes after creation with a 5 minute backfill starts 2 slots');
is($slots->(), '-29,-28', 'the slots since the schedule was created, none before');
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('bf', '$m'::timestamptz - interval '19 min 50 s')}),
	'5', 'a firing after a gap starts the slots of the last 5 minutes');
is($slots->(), '-29,-28,-24,-23,-22,-21,-20', 'the latest slot and the 4 before it; not those before the backfill');
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('bf', '$m'::timestamptz - interval '19 min 20 s')}),
	'0', 'a repeat of that firing starts nothing');

# a late firing without backfill runs the slot it was for, only that one
psql_as_ok($node, 'alice', q{SELECT ds_schedule('late', '*/10 * * * *', 'tick')});
$node->safe_psql('postgres', qq{UPDATE durable_steps.schedules SET created_at = '$m'::timestamptz - interval '3 hours' WHERE job_name = 'late'});
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('late', '$m'::timestamptz - interval '33 min')}),
	'1', 'a firing 3 minutes late starts one run');
is($node->safe_psql('postgres', qq{SELECT string_agg(input->>'scheduled_at', ',') = to_char(('$m'::timestamptz - interval '40 min') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
  FROM ds_runs WHERE run_id LIKE 'schedule:late:%' AND run_id < ds_key('schedule', 'late', '$m'::timestamptz)}), 't', 'the run is for the slot the firing was late for');

# a slot whose key alice's run holds with other input is hers already; another role can make
# neither a run nor a step under a schedule's slot keys, nor under those of a job not scheduled
# yet: nobody can make a firing skip a slot, or wait for one
psql_as_ok($node, 'alice', qq{SELECT ds_start_run('tick', '{"by": "hand"}', ds_key('schedule', 'late', '$m'::timestamptz - interval '30 min'))});
psql_as_ok($node, 'bob', q{CREATE FUNCTION public.bob_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$});
my ($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_start_run('bob_wf', '{}', ds_key('schedule', 'late', '$m'::timestamptz - interval '20 min'))});
like($err, qr/42501: run id "schedule:late:.*" is reserved for the slots of schedule "late"/, 'bob cannot start a run under a slot key of alice\'s schedule');
($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_run_step(ds_key('schedule', 'late', '$m'::timestamptz - interval '20 min'), 's', 'SELECT 1', defer => true)});
like($err, qr/42501: run id .* is reserved/, 'nor store a step under one');
($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_run_step(ds_key('schedule', 'not-yet', '$m'::timestamptz), 's', 'SELECT 1', defer => true)});
like($err, qr/42501: run id .* is reserved for the slots of schedule "not-yet"/, 'nor under a slot key of a job nobody scheduled yet');
($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_run_step(ds_key('schedule', 'late:x\\', '$m'::timestamptz), 's', 'SELECT 1', defer => true)});
like($err, qr/42501: run id .* is reserved for the slots of schedule "late:x\\"/, 'a job name with a colon and a backslash is read as ds_key wrote it');
$node->safe_psql('postgres', q{UPDATE durable_steps.schedules SET backfill = '30 minutes' WHERE job_name = 'late'});
is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('late', '$m'::timestamptz - interval '1 min')}),
	'2', 'the firing started the two slots whose keys nobody held');
is($node->safe_psql('postgres', qq{SELECT string_agg(owner::text || ' ' || (input ? 'by')::text, ',' ORDER BY run_id) FROM ds_runs WHERE run_id LIKE 'schedule:late:%' AND run_id < ds_key('schedule', 'late', '$m'::timestamptz)}),
	'alice false,alice true,alice false,alice false', 'the runs of the slots: all alice\'s, the hand-started one kept');

# the reservation is of new run ids only: a firing's run goes on after its schedule is dropped,
# and a step its turn makes through another role's SECURITY DEFINER function (as any run's may:
# docs/security.md) is made
$node->safe_psql('postgres', q{
CREATE FUNCTION public.napper(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('one', 'SELECT 1');
    PERFORM ds_sleep('nap', '2 s');
    RETURN ds_step('two', 'SELECT 2');
END $$;
GRANT EXECUTE ON FUNCTION public.napper(text, jsonb) TO alice;
CREATE FUNCTION public.via_bob(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql
  AS $$ BEGIN RETURN public.bob_helper(); END $$;
GRANT EXECUTE ON FUNCTION public.via_bob(text, jsonb) TO alice;
});
psql_as_ok($node, 'bob', q{CREATE FUNCTION public.bob_helper() RETURNS jsonb LANGUAGE sql SECURITY DEFINER
  AS $$ SELECT ds_step('bobstep', 'SELECT 42') $$;
GRANT EXECUTE ON FUNCTION public.bob_helper() TO alice;});
for my $job (qw(napjob viabob))
{
	my $wf = $job eq 'napjob' ? 'napper' : 'via_bob';
	psql_as_ok($node, 'alice', qq{SELECT ds_schedule('$job', '*/10 * * * *', '$wf')});
	$node->safe_psql('postgres', qq{UPDATE durable_steps.schedules SET created_at = '$m'::timestamptz - interval '3 hours' WHERE job_name = '$job'});
	is(psql_as_ok($node, 'alice', qq{SELECT ds_schedule_fire('$job', '$m'::timestamptz - interval '33 min')}),
		'1', "$job: a firing starts its slot");
}
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || current_step FROM ds_runs WHERE run_id LIKE 'schedule:napjob:%'}, 'waiting nap'),
	'napjob: its run sleeps');
is(psql_as_ok($node, 'alice', q{SELECT ds_unschedule('napjob')}), 't', 'napjob: unscheduled while its run sleeps');
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || output FROM ds_runs WHERE run_id LIKE 'schedule:napjob:%'}, 'succeeded 2'),
	'napjob: the run goes on and succeeds after its schedule is gone');
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || output FROM ds_runs WHERE run_id LIKE 'schedule:viabob:%'}, 'succeeded 42'),
	'viabob: the step its turn makes through bob\'s SECURITY DEFINER function is made, and the run succeeds');
psql_as_ok($node, 'alice', q{SELECT ds_unschedule('viabob')});

# a trial: a firing right after ds_schedule starts nothing (no slot since it was created);
# now => true starts one run at once, for the current second, keyed as any slot
psql_as_ok($node, 'alice', q{SELECT ds_schedule('trial', '0 3 * * *', 'tick', '{"k": 2}')});
is(psql_as_ok($node, 'alice', q{SELECT ds_schedule_fire('trial')}), '0',
	'trial: a firing right after ds_schedule starts nothing');
is(psql_as_ok($node, 'alice', q{SELECT ds_schedule_fire('trial', now => true)}), '1',
	'trial: now => true starts one run at once');
ok( poll_until($node, 'postgres', q{SELECT status || ' ' || (input->>'k') || ' '
	     || (run_id = ds_key('schedule', 'trial', (input->>'scheduled_at')::timestamptz))
	     FROM ds_runs WHERE run_key LIKE 'schedule:trial:%'}, 'succeeded 2 true'),
	'trial: its run, keyed by its slot with the schedule\'s input, succeeds');
($rc, $out, $err) = psql_as($node, 'alice', q{SELECT ds_schedule_fire('trial', now(), now => true)});
like($err, qr/22023: a trial firing \(now => true\) takes no fired_at/, 'trial: with a fired_at, refused');
($rc, $out, $err) = psql_as($node, 'bob', q{SELECT ds_schedule_fire('trial', now => true)});
like($err, qr/DS404/, 'trial: another role cannot fire one');
psql_as_ok($node, 'alice', q{SELECT ds_unschedule('trial')});

# another role: sees nothing, cannot fire, take over or unschedule alice's schedules
is(psql_as_ok($node, 'bob', q{SELECT count(*) FROM ds_schedules}), '0', 'bob sees none of alice\'s schedules');
is(psql_as_ok($node, 'alice', q{SELECT count(*) FROM ds_schedules}), '3', 'alice sees her three');
($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_unschedule('$job_lit')});
like($err, qr/DS404: schedule .* does not exist/, 'bob cannot unschedule alice\'s job: it does not exist for him');
($rc, $out, $err) = psql_as($node, 'bob', q{SELECT ds_schedule_fire('bf')});
like($err, qr/DS404/, 'nor fire it');
($rc, $out, $err) = psql_as($node, 'bob', qq{SELECT ds_schedule('$job_lit', '* * * * *', 'bob_wf')});
like($err, qr/42710: job name .* is taken by another role/, 'nor take its name');
($rc, $out, $err) = psql_as($node, 'carol', q{SELECT ds_schedule('c', '* * * * *', sql => 'SELECT 1')});
like($err, qr/42501: permission denied for schema cron.*HINT:  .*GRANT USAGE ON SCHEMA cron TO carol/s,
	'a role without USAGE on schema cron is told what it needs');
($rc, $out, $err) = psql_as($node, 'alice', q{SELECT ds_schedule('g', 'every day at noon', sql => 'SELECT 1')});
like($err, qr/22023: invalid schedule/, 'a garbage schedule is refused');
psql_as_ok($node, 'alice', q{SELECT cron.schedule('mine', '0 0 * * *', 'SELECT 1')});
($rc, $out, $err) = psql_as($node, 'alice', q{SELECT ds_schedule('mine', '* * * * *', sql => 'SELECT 1')});
like($err, qr/42710: pg_cron already has a job named "mine"/, 'a pg_cron job of the same name is not replaced');
is($node->safe_psql('postgres', q{SELECT string_agg(jobname || ' ' || command, ',' ORDER BY jobid) FROM cron.job WHERE jobname IN ('g', 'c', 'mine')}),
	'mine SELECT 1', 'the refused calls created no job');

# alice unschedules: her job leaves pg_cron, the schedule the view
is(psql_as_ok($node, 'alice', qq{SELECT ds_unschedule('$job_lit')}), 't', 'alice unschedules her job');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM cron.job WHERE jobname = '$job_lit'}), '0', 'its pg_cron job is gone');
is(psql_as_ok($node, 'alice', q{SELECT string_agg(job_name, ',' ORDER BY job_name) FROM ds_schedules}), 'bf,late', 'and the schedule');

# partitioned (docs/partitions.md): a schedule made on every server starts each slot once, on the
# server that owns the partition of the slot's key. One server plays both servers of two
# partitions: it owns partition 0, then partition 1; the slots are 20 minutes of a backfill.
my $parts = sub {
	my ($owned) = @_;
	$node->safe_psql('postgres', qq{ALTER SYSTEM SET durable_steps.partition_count = 2;
ALTER SYSTEM SET durable_steps.partitions = '$owned'; SELECT pg_reload_conf();});
	# a new session reads the reloaded file
	poll_until($node, 'postgres', 'SHOW durable_steps.partitions', $owned)
	  or die "durable_steps.partitions did not become '$owned'";
};
$parts->('0');
psql_as_ok($node, 'alice', q{SELECT ds_schedule('parts', '* * * * *', 'tick', backfill => '20 minutes')});
$node->safe_psql('postgres', qq{UPDATE durable_steps.schedules SET created_at = '$m'::timestamptz - interval '3 hours' WHERE job_name = 'parts'});
my $fired_at = "'$m'::timestamptz - interval '39 min 50 s'";
my $expected = sub {
	my ($p) = @_;
	return $node->safe_psql('postgres', qq{SELECT string_agg(ds_key('schedule', 'parts', s), ',' ORDER BY s)
  FROM generate_series('$m'::timestamptz - interval '59 min', '$m'::timestamptz - interval '40 min', interval '1 min') s
 WHERE ds_partition_of(ds_key('schedule', 'parts', s)) IN ($p)});
};
my $started = sub {
	return $node->safe_psql('postgres', qq{SELECT string_agg(run_id, ',' ORDER BY input->>'scheduled_at') FROM ds_runs
 WHERE run_id LIKE 'schedule:parts:%' AND (input->>'scheduled_at')::timestamptz < '$m'::timestamptz});
};
my @in0 = split /,/, $expected->('0');
my @in1 = split /,/, $expected->('1');
ok(@in0 > 0 && @in1 > 0, 'the 20 slots fall in both partitions (' . scalar(@in0) . ' and ' . scalar(@in1) . ')');
is(psql_as_ok($node, 'alice', "SELECT ds_schedule_fire('parts', $fired_at)"), scalar(@in0),
	'owning partition 0, a firing starts the slots of partition 0 only');
is($started->(), $expected->('0'), 'the runs started are those of partition 0');
$parts->('1');
is(psql_as_ok($node, 'alice', "SELECT ds_schedule_fire('parts', $fired_at)"), scalar(@in1),
	'owning partition 1, the same firing starts the slots of partition 1');
is($started->(), $expected->('0, 1'), 'every slot of the 20 minutes has its run');
$parts->('0,1');
is(psql_as_ok($node, 'alice', "SELECT ds_schedule_fire('parts', $fired_at)"), '0',
	'owning both, the firing starts nothing more: each slot started once');
is($node->safe_psql('postgres', q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'schedule:parts:%' GROUP BY run_id HAVING count(*) > 1}),
	'', 'no slot has two runs');

$node->stop;
done_testing();
