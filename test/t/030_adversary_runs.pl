# An unprivileged role against runs, events, queues and the worker's isolation of workflows
# (README, "Security model"): mallory (LOGIN, nothing else) tries to act on alice's work, to keep
# something of its workflow in the executor's superuser session, or to hold other roles' work
# back. Every section asserts the safe behaviour.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use DurableSteps::Session;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_runs',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});

# psql as a role: (rc, stdout, stderr), the SQLSTATE in the error message
sub as
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql,
		connstr => $node->connstr('postgres') . " user=$role",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($rc, $out, $err);
}

sub as_ok
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = as($role, $sql);
	die "as $role: $sql\n$err" if $rc != 0;
	return $out;
}

ok(poll_until($node, 'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}, '1'),
	'an executor is running');
my $pid = executor_pid($node);

as_ok('alice', q{
CREATE TABLE alice_log (what text, v text);
-- waits for alice's event, then charges
CREATE FUNCTION alice_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    ev jsonb;
BEGIN
    ev := ds_await_event('go', 'go:' || (input->>'order'));
    RETURN ds_step('charge', 'INSERT INTO alice_log VALUES (''charge'', $1::text) RETURNING $1', ev);
END $$;
-- records what its step sees of the executor's session
CREATE FUNCTION alice_probe(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('probe', $q$SELECT jsonb_build_object(
        'session_user', session_user, 'current_user', current_user,
        'superuser', current_setting('is_superuser'),
        'search_path', current_setting('search_path'),
        'leak', coalesce(current_setting('app.leak', true), ''),
        'work_mem', current_setting('work_mem'),
        'cursors', (SELECT count(*) FROM pg_cursors),
        'prepared', (SELECT count(*) FROM pg_prepared_statements),
        'temp', (SELECT count(*) FROM pg_class WHERE relpersistence = 't'),
        'listening', (SELECT count(*) FROM pg_listening_channels()))$q$);
END $$;
});
as_ok('mallory', q{
CREATE TABLE mallory_log (what text, session_user_name text, current_user_name text, su text);
CREATE FUNCTION mallory_wait(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_await_event('never', 'never');
END $$;
});

# A run key names a run of one role, but a run's steps are found by run_id alone: another role's
# plain steps under that run_id must stay out of the run -- neither replayed by its workflow nor
# cancelled with it.
my $t = 'a run over another role\'s steps';
as_ok('alice', q{SELECT ds_run_step('nightly', 'report', 'SELECT 1', defer => true,
                                     run_at => now() + interval '1 day')});
my ($rc, $out, $err) = as('mallory', q{SELECT * FROM ds_start_run('mallory_wait', '{}', 'nightly')});
like($err, qr/42501.*run nightly belongs to another role/,
	"$t: mallory cannot start a run under the run_id of alice's steps");
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.runs WHERE run_id = 'nightly'}), '0',
	"$t: no run was stored");
# the same in a race: mallory's start waits for alice's step to commit (the run_id's lock), then
# sees it (TAP 029 has both orders)
my $s = DurableSteps::Session->new($node);
my $m = DurableSteps::Session->new($node);
$s->query_ok(q{SET SESSION AUTHORIZATION alice; BEGIN;});
$s->query_ok(q{SELECT ds_run_step('nightly-2', 'report', 'SELECT 1', defer => true,
                                  run_at => now() + interval '1 day');});
$m->query_ok(q{SET SESSION AUTHORIZATION mallory;});
my $ticket = $m->send(q{SELECT created FROM ds_start_run('mallory_wait', '{}', 'nightly-2');});
my $mpid = $m->pid;
ok(poll_until($node, 'postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $mpid", 'Lock'),
	"$t: mallory's start under the run_id of alice's step being created waits for it");
$s->query_ok(q{COMMIT;});
my (undef, $merr) = $m->wait($ticket);
like($merr, qr/run nightly-2 belongs to another role/, "$t: and is then refused");
$s->quit;
$m->quit;
is($node->safe_psql('postgres',
		q{SELECT status FROM durable_steps.steps WHERE run_id = 'nightly-2' AND step_id = 'report'}),
	'pending', "$t: alice's step of that run_id is still pending");

# A step squatted in another role's run: the run's steps must stay its owner's.
$t = 'steps in another role\'s run';
is(as_ok('alice', q{SELECT status FROM ds_start_run('alice_wf', '{"order": "o-1"}', 'checkout:o-1')}),
	'pending', "$t: alice starts a run");
ok(poll_until($node, 'postgres',
		q{SELECT status || ' ' || wait_event FROM durable_steps.runs WHERE run_id = 'checkout:o-1'},
		'waiting go:o-1'), "$t: it waits for alice's event");
($rc, $out, $err) = as('mallory', q{SELECT ds_run_step('checkout:o-1', 'charge', 'SELECT 1')});
like($err, qr/42501.*run checkout:o-1 belongs to another role/,
	"$t: mallory cannot create a step in alice's run");
($rc, $out, $err) = as('mallory', q{SELECT ds_run_step('checkout:o-1', 'early', 'SELECT 1', defer => true)});
like($err, qr/42501.*run checkout:o-1 belongs to another role/, "$t: nor a deferred one");
$node->safe_psql('postgres', q{GRANT durable_steps_http TO mallory});
($rc, $out, $err) = as('mallory', q{SELECT ds_http_step('checkout:o-1', 'charge', '{"url": "http://127.0.0.1:9/x"}')});
like($err, qr/42501.*run checkout:o-1 belongs to another role/, "$t: nor an HTTP one");
as_ok('alice', q{SELECT ds_emit_event('go:o-1', '{"from": "alice"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'checkout:o-1'}, 'succeeded'),
	"$t: alice's run succeeds");
is($node->safe_psql('postgres', q{SELECT string_agg(step_id || ' ' || owner, ', ' ORDER BY step_id)
                                    FROM durable_steps.steps WHERE run_id = 'checkout:o-1'}),
	'charge alice, go alice', "$t: its steps are alice's own");

# The exception: the run's own workflow may call a SECURITY DEFINER function whose step is then
# its definer's, in the run.
$t = 'a definer\'s step in a run';
$node->safe_psql('postgres', q{CREATE ROLE bob LOGIN; GRANT CREATE ON SCHEMA public TO bob});
as_ok('bob', q{
CREATE FUNCTION bob_step(run_id text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER
    AS $$SELECT ds_step('bob', 'SELECT to_jsonb(current_user::text)')$$;
REVOKE ALL ON FUNCTION bob_step(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION bob_step(text) TO alice;
});
as_ok('alice', q{
CREATE FUNCTION alice_def(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql
    AS $$SELECT bob_step(run_id)$$;
SELECT ds_start_run('alice_def', '{}', 'definer');
});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || output FROM durable_steps.runs WHERE run_id = 'definer'},
		'succeeded "bob"'), "$t: alice's run succeeds with the step bob's function made, run as bob");
($rc, $out, $err) = as('bob', q{SELECT ds_run_step('definer', 'other', 'SELECT 1')});
like($err, qr/42501.*run definer belongs to another role/, "$t: outside the run's turn bob cannot add a step");

# Events are per role: mallory's emit of the same name neither wakes nor feeds alice's run.
$t = 'events of another role';
as_ok('alice', q{SELECT ds_start_run('alice_wf', '{"order": "o-2"}', 'checkout:o-2')});
ok(poll_until($node, 'postgres',
		q{SELECT status || ' ' || wait_event FROM durable_steps.runs WHERE run_id = 'checkout:o-2'},
		'waiting go:o-2'), "$t: alice's run waits for its event");
my $turns = $node->safe_psql('postgres', q{SELECT turns FROM durable_steps.runs WHERE run_id = 'checkout:o-2'});
is(as_ok('mallory', q{SELECT ds_emit_event('go:o-2', '{"from": "mallory"}')}), 't',
	"$t: mallory records an event of the same name (her own)");
ok(wait_executor_loops($node, 'postgres', $pid, 300), "$t: the executor went round its loop");
is($node->safe_psql('postgres',
		q{SELECT status || ' ' || turns FROM durable_steps.runs WHERE run_id = 'checkout:o-2'}),
	"waiting $turns", "$t: alice's run still waits, not woken");
as_ok('alice', q{SELECT ds_emit_event('go:o-2', '{"from": "alice"}')});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_runs WHERE run_id = 'checkout:o-2'}, 'succeeded'),
	"$t: alice's own emit finishes the run");
is(as_ok('alice', q{SELECT output FROM ds_runs WHERE run_id = 'checkout:o-2'}), '{"from": "alice"}',
	"$t: with alice's payload");

# The controls and the views: another role's run does not exist for mallory.
$t = 'controls on another role\'s run';
for my $call (q{ds_cancel_run('checkout:o-2')}, q{ds_resume_run('checkout:o-2')},
	q{ds_retry_step('checkout:o-2', 'charge')}, q{ds_cancel_step('checkout:o-2', 'go')})
{
	($rc, $out, $err) = as('mallory', "SELECT $call");
	like($err, qr/DS404/, "$t: $call is DS404 for mallory");
}
is(as_ok('mallory', q{SELECT count(*) FROM ds_runs WHERE run_id LIKE 'checkout:%'}), '0',
	"$t: ds_runs shows mallory none of alice's runs");
is(as_ok('mallory', q{SELECT count(*) FROM ds_steps WHERE run_id LIKE 'checkout:%' AND owner <> 'mallory'::regrole}), '0',
	"$t: nor ds_steps their steps");
($rc, $out, $err) = as('mallory', q{SELECT * FROM ds_start_run('alice_wf', '{"order": "o-2"}', 'checkout:o-2')});
like($err, qr/42501.*belongs to another role/, "$t: alice's run key is 42501 for mallory");
unlike($err, qr/alice_wf|o-2"|succeeded/, "$t: and tells nothing about the run");
($rc, $out, $err) = as('mallory', q{SELECT durable_steps.ds_serve_this_database()});
like($err, qr/42501/, "$t: the launcher's ds_serve_this_database is not for mallory");

# Queues are the worker's configuration: mallory cannot pause or limit anybody's queue.
$t = 'queues';
($rc, $out, $err) = as('mallory', q{SELECT ds_set_queue('default', 0)});
like($err, qr/42501.*permission denied to set queue/, "$t: ds_set_queue is 42501 for mallory");
($rc, $out, $err) = as('mallory', q{INSERT INTO durable_steps.queues VALUES ('default', 0)});
like($err, qr/42501/, "$t: the queues table is not hers to write");
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_steps.queues}), '0',
	"$t: no queue configured");

# A workflow of mallory's that tries to leave state in the executor's superuser session for the
# next turn (alice's): settings with set_config(..., false), a session advisory lock, and whatever
# the security-restricted operation refuses.
$t = 'workflow state left behind';
as_ok('mallory', q{
CREATE FUNCTION mallory_leave(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('app.leak', 'mallory', false);
    PERFORM set_config('search_path', 'mallory_schema, public', false);
    PERFORM set_config('work_mem', '77MB', false);
    PERFORM pg_advisory_lock(4242);
    PERFORM pg_advisory_xact_lock(4243);
    RETURN '"left"';
END $$;
});
as_ok('mallory', q{SELECT ds_start_run('mallory_leave', '{}', 'leave')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'leave'}, 'succeeded'),
	"$t: mallory's run succeeds");
is($node->safe_psql('postgres',
		qq{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid IN (4242, 4243) AND pid = $pid}),
	'0', "$t: the executor holds none of the workflow's advisory locks");
as_ok('alice', q{SELECT ds_start_run('alice_probe', '{}', 'probe')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'probe'}, 'succeeded'),
	"$t: alice's run succeeds");
is($node->safe_psql('postgres', q{SELECT output - 'search_path' FROM durable_steps.runs WHERE run_id = 'probe'}),
	'{"leak": "", "temp": 0, "cursors": 0, "prepared": 0, "work_mem": "4MB", "listening": 0, "superuser": "off", "current_user": "alice", "session_user": "alice"}',
	"$t: alice's step sees none of mallory's settings, as alice");
unlike($node->safe_psql('postgres', q{SELECT output->>'search_path' FROM durable_steps.runs WHERE run_id = 'probe'}),
	qr/mallory/, "$t: nor her search_path");

# What the security-restricted operation refuses fails the run; COMMIT in a procedure fails it too,
# and nothing after it runs as the executor's superuser.
$t = 'workflow escapes';
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
	as_ok('mallory', qq{
CREATE FUNCTION esc_$name(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
    $sql;
    INSERT INTO mallory_log VALUES ('$name', session_user, current_user, current_setting('is_superuser'));
    RETURN '"escaped"';
END \$\$;
SELECT ds_start_run('esc_$name', '{}', 'esc-$name');
});
}
as_ok('mallory', q{
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
is($node->safe_psql('postgres',
		q{SELECT string_agg(run_id || ' ' || status || ' ' || coalesce(error_code, ''), ', ' ORDER BY run_id)
		    FROM durable_steps.runs WHERE run_id LIKE 'esc-%'}),
	'esc-commit failed 2D000, esc-hold_cursor failed 42501, esc-listen failed 42501, '
	  . 'esc-prepare failed 42501, esc-session_authorization failed 42501, esc-set_config_role failed 42501, '
	  . 'esc-set_config_session failed 42501, esc-set_role failed 42501, esc-temp_table failed 42501',
	"$t: each fails, refused");
is($node->safe_psql('postgres', q{SELECT count(*) FROM mallory_log}), '0',
	"$t: nothing after an escape ran");

# An outcome hook of mallory's, run by the worker, tries the same.
$t = 'hooks';
as_ok('mallory', q{SELECT ds_run_step('hook-run', 'h1', 'SELECT 1', defer => true,
    on_success => $h$SELECT set_config('app.leak', 'hook', false), pg_advisory_lock(4244),
                  set_config('work_mem', '78MB', false)$h$)});
as_ok('mallory', q{SELECT ds_run_step('hook-run', 'h2', 'SELECT 1', defer => true,
    on_success => $h$SET SESSION AUTHORIZATION postgres$h$)});
ok(poll_until($node, 'postgres',
		q{SELECT string_agg(step_id || ' ' || status, ', ' ORDER BY step_id) FROM durable_steps.steps
		   WHERE run_id = 'hook-run'}, 'h1 succeeded, h2 blocked'),
	"$t: the leaving hook's step succeeds; the escaping hook's is refused (blocked, 42501 is correctable)");
is($node->safe_psql('postgres', q{SELECT error_code FROM durable_steps.steps WHERE run_id = 'hook-run' AND step_id = 'h2'}),
	'42501', "$t: with 42501");
is($node->safe_psql('postgres',
		qq{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4244 AND pid = $pid}),
	'0', "$t: the executor holds no advisory lock of the hook");
as_ok('alice', q{SELECT ds_start_run('alice_probe', '{}', 'probe-2')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'probe-2'}, 'succeeded'),
	"$t: alice's run succeeds");
is($node->safe_psql('postgres', q{SELECT output->>'leak' || '|' || (output->>'work_mem') || '|' || (output->>'session_user')
                                    FROM durable_steps.runs WHERE run_id = 'probe-2'}),
	'|4MB|alice', "$t: alice's step sees none of the hook's settings");

# A hook run again in an admin's session (ds_retry_step of a step blocked by its on_success hook)
# runs as its owner: whatever it sets must not stay in the admin's session.
$t = 'a hook in an admin\'s session';
$node->safe_psql('postgres', q{CREATE ROLE adm LOGIN IN ROLE durable_steps_admin});
as_ok('mallory', q{
CREATE TABLE mallory_flag (x int);
SELECT ds_run_step('hook-admin', 's', 'SELECT 1',
    on_success => $h$SELECT set_config('search_path', 'mallory_s, public', false),
                            set_config('app.leak', 'hook', false),
                            set_config('work_mem', '79MB', false),
                            1 / (SELECT count(*) FROM public.mallory_flag)$h$);
});
is($node->safe_psql('postgres', q{SELECT status FROM durable_steps.steps WHERE run_id = 'hook-admin'}),
	'blocked', "$t: mallory's step is blocked by its failing hook");
as_ok('mallory', q{INSERT INTO mallory_flag VALUES (1)});
is(as_ok('adm', q{SELECT (ds_retry_step('hook-admin', 's')).status;
                  SELECT current_setting('search_path') || '|' || coalesce(current_setting('app.leak', true), '')
                         || '|' || current_setting('work_mem') || '|' || current_user}),
	"succeeded\n\"\$user\", public||4MB|adm", "$t: the admin re-runs the hook; its session keeps none of the hook's settings");

is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'}),
	$pid, 'the same executor ran everything');
unlike(slurp_file($node->logfile), $DurableSteps::Test::crash_re, 'no server process crashed');
$node->stop;
done_testing();
