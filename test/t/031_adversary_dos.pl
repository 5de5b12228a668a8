# An unprivileged role trying to hold back other roles' work in the worker (docs/security.md, "Queues"): a hook that sleeps, a workflow that never returns, a workflow that suspends
# for ever, and a paused queue that runs' steps should respect. One executor, so that whatever
# mallory occupies is all there is.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('adversary_dos',
	"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n"
	  . "durable_steps.default_timeout = '2s'\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT CREATE ON SCHEMA public TO alice, mallory;
});

sub as_ok
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql,
		connstr => $node->connstr('postgres') . " user=$role");
	die "as $role: $sql\n$err" if $rc != 0;
	return $out;
}

as_ok('alice', q{
CREATE FUNCTION alice_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('one', 'SELECT $1', input);
END $$;
});

# A hook is bounded by its step's timeout: it cannot keep the executor.
my $t = 'a hook that sleeps';
as_ok('mallory', q{SELECT ds_run_step('m', 'sleepy-hook', 'SELECT 1', defer => true,
    timeout => '1s', on_success => 'SELECT pg_sleep(600)')});
ok(poll_until($node, 'postgres',
		q{SELECT status || ' ' || error_code FROM durable_steps.steps WHERE run_id = 'm' AND step_id = 'sleepy-hook'},
		'blocked DS004'), "$t: the hook is stopped at the step's timeout (DS004), the step blocked");
as_ok('alice', q{SELECT ds_run_step('a', 'after-hook', 'SELECT 1', defer => true)});
ok(poll_until($node, 'postgres',
		q{SELECT status FROM durable_steps.steps WHERE run_id = 'a' AND step_id = 'after-hook'}, 'succeeded'),
	"$t: alice's step runs after it");

# A turn is bounded by durable_steps.default_timeout: a workflow that never returns fails.
$t = 'a workflow that never returns';
as_ok('mallory', q{
CREATE FUNCTION forever(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS $$SELECT pg_sleep(600)::text::jsonb$$;
SELECT ds_start_run('forever', '{}', 'forever');
});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || error_code FROM durable_steps.runs WHERE run_id = 'forever'},
		'failed DS004'), "$t: its turn is stopped by the timeout and the run fails");
as_ok('alice', q{SELECT ds_start_run('alice_wf', '{"n": 1}', 'alice-1')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'alice-1'}, 'succeeded'),
	"$t: alice's run goes on");

# A workflow that suspends for ever (a new sleep each turn) keeps its turns coming, but other
# runs due meanwhile are served too: due turns go by their due time.
$t = 'a workflow that suspends for ever';
as_ok('mallory', q{
CREATE FUNCTION ticks(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 1000000 LOOP
        PERFORM ds_sleep('tick-' || i, '0 s');
    END LOOP;
    RETURN NULL;
END $$;
SELECT ds_start_run('ticks', '{}', 'ticks');
});
ok(poll_until($node, 'postgres', q{SELECT turns > 20 FROM durable_steps.runs WHERE run_id = 'ticks'}),
	"$t: mallory's run takes turn after turn");
as_ok('alice', q{SELECT ds_start_run('alice_wf', '{"n": 2}', 'alice-2')});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'alice-2'}, 'succeeded'),
	"$t: alice's run is served meanwhile");
is(as_ok('mallory', q{SELECT ds_cancel_run('ticks')}), 'cancelled', "$t: mallory's run can be cancelled");

# A paused queue holds back every role's work: a run's step is a step of queue 'default'
# (durable_steps.steps.queue) and waits with the others while an admin pauses it; ds_set_queue
# wakes the run when it opens the queue again.
$t = 'a paused queue';
$node->safe_psql('postgres', q{SELECT ds_set_queue('default', 0)});
as_ok('alice', q{SELECT ds_run_step('a', 'paused', 'SELECT 1', defer => true)});
as_ok('mallory', q{
CREATE TABLE effects (n int);
CREATE FUNCTION paused_wf(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ds_step('effect', 'INSERT INTO effects VALUES (1) RETURNING 1');
END $$;
SELECT ds_start_run('paused_wf', '{}', 'paused');
});
my $pid = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'});
ok(wait_executor_loops($node, 'postgres', $pid, 1000), "$t: the executor went round its loop");
is($node->safe_psql('postgres', q{SELECT status FROM durable_steps.steps WHERE run_id = 'a' AND step_id = 'paused'}),
	'pending', "$t: alice's plain step of the paused queue waits");
ok(poll_until($node, 'postgres', q{SELECT status || ': ' || wait_reason FROM durable_steps.runs WHERE run_id = 'paused'},
		'waiting: queue default is paused'),
	"$t: mallory's run waits for the queue of its step");
is($node->safe_psql('postgres', q{SELECT count(*) FROM public.effects}), '0',
	"$t: mallory's run's step waits too");
my $opened = time();
$node->safe_psql('postgres', q{SELECT ds_set_queue('default', NULL)});
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.steps WHERE run_id = 'a' AND step_id = 'paused'},
		'succeeded'), "$t: alice's step runs once the queue is open again");
ok(poll_until($node, 'postgres', q{SELECT status FROM durable_steps.runs WHERE run_id = 'paused'}, 'succeeded'),
	"$t: and so does mallory's run");
cmp_ok(time() - $opened, '<', 30, "$t: woken by ds_set_queue, not by its once-a-minute look");
is($node->safe_psql('postgres', q{SELECT count(*) FROM public.effects}), '1', "$t: its step took effect once");
# (A limit above 0 does not count a run's turns nor the step attempts they run: docs/queues.md.)

unlike(slurp_file($node->logfile), $DurableSteps::Test::crash_re, 'no server process crashed');
$node->stop;
done_testing();
