# Queues (docs/queues.md): a slow queue with concurrency 1 does not delay the due steps of
# another queue; a queue's concurrency holds across executors; within a queue, lower priority
# numbers run first; a paused queue (concurrency 0) runs nothing until it is given a limit.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = worker_node('queues', "durable_steps.database = 'postgres'\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
-- every attempt that completes leaves its span: when its body started and ended, where it ran
CREATE TABLE spans (id serial PRIMARY KEY, queue text, step text, started timestamptz,
                    ended timestamptz DEFAULT clock_timestamp(), pid int DEFAULT pg_backend_pid());
-- gates the slow bodies wait for; the test opens them
CREATE TABLE gates (name text PRIMARY KEY);
-- waits (each statement sees the latest commits) until the gate is open, at most 60 s
CREATE FUNCTION wait_gate(q text, step text, gate text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..1200 LOOP
        IF EXISTS (SELECT FROM gates WHERE name = gate) THEN
            INSERT INTO spans(queue, step, started) VALUES (q, step, t0);
            RETURN i;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RAISE EXCEPTION 'gate % never opened', gate;
END
$$;
CREATE FUNCTION span(q text, step text, secs float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_sleep(secs);
    INSERT INTO spans(queue, step, started) VALUES (q, step, t0);
    RETURN 1;
END
$$;
});

# The most attempts of queue $q whose bodies ran at the same moment.
sub max_overlap
{
	my ($q) = @_;
	return $node->safe_psql('postgres', qq{
SELECT coalesce(max(n), 0) FROM (
  SELECT count(*) AS n FROM spans a JOIN spans b
    ON b.queue = a.queue AND b.started <= a.started AND b.ended > a.started
   WHERE a.queue = '$q' GROUP BY a.id) o});
}

is($node->safe_psql('postgres', 'SHOW durable_steps.max_workers'), '2',
	'more than one executor by default');
ok(executors_running($node, 2), 'both executors are up');

# --- a slow queue with concurrency 1 does not delay 200 due steps of queue default ---
$node->safe_psql('postgres', q{
SELECT ds_set_queue('slow', 1);
SELECT count(*) FROM generate_series(1, 3) g,
  ds_run_step('slow', 's' || g, format('SELECT wait_gate(%L, %L, %L)', 'slow', 's' || g, 'slow'),
              defer => true, queue => 'slow', timeout => '1 min');
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 1 FROM ds_steps WHERE run_id = 'slow' AND status = 'running'"),
	'slow: one slow step is running');
my $t0 = time();
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 200) g,
  ds_run_step('fast', 'f' || g, format('SELECT span(%L, %L, 0)', 'default', 'f' || g),
              defer => true);
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 200 FROM ds_steps WHERE run_id = 'fast' AND status = 'succeeded'"),
	'fast: the 200 steps of queue default succeeded');
my $elapsed = time() - $t0;
# (had the slow queue held them back, they would wait for its gate, which opens only below;
# the bound is wide because four clusters share two CPUs in the suite)
cmp_ok($elapsed, '<', 60, "fast: without waiting for the slow queue (${\ sprintf('%.1f', $elapsed)} s)");
is($node->safe_psql('postgres',
		"SELECT string_agg(status || ':' || count, ',' ORDER BY status) FROM "
		  . "(SELECT status, count(*) FROM ds_steps WHERE run_id = 'slow' GROUP BY status) s"),
	'pending:2,running:1', 'slow: meanwhile one slow step ran and the others waited their turn');
is($node->safe_psql('postgres',
		"SELECT queue || ' ' || concurrency || ' ' || running || ' ' || due FROM ds_queues WHERE queue = 'slow'"),
	'slow 1 1 2', 'ds_queues shows the slow queue full, with two due steps');

$node->safe_psql('postgres', "INSERT INTO gates VALUES ('slow')");
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 3 FROM ds_steps WHERE run_id = 'slow' AND status = 'succeeded'"),
	'slow: all three succeeded once released');
is(max_overlap('slow'), '1', 'slow: never two of its steps at once');

# --- a limit holds across executors; a paused queue runs nothing; priorities in order ---
# four executors claiming one step at a time: without the limit they would run four at once
$node->append_conf('postgresql.conf',
	"durable_steps.max_workers = 4\ndurable_steps.batch_size = 1\n");
$node->restart;
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 4 FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"),
	'four executors are up');

$node->safe_psql('postgres', q{
SELECT ds_set_queue('pair', 2);
-- short bodies: the executors claim from the queue all the time, racing each other
SELECT count(*) FROM generate_series(1, 80) g,
  ds_run_step('pair', 'p' || g, format('SELECT span(%L, %L, %s)', 'pair', 'p' || g, 0.01 * (1 + g % 3)),
              defer => true, queue => 'pair');
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 80 FROM ds_steps WHERE run_id = 'pair' AND status = 'succeeded'"),
	'pair: all 80 succeeded');
is(max_overlap('pair'), '2', 'pair: two ran at once, never more (concurrency 2)');
cmp_ok($node->safe_psql('postgres', "SELECT count(DISTINCT pid) FROM spans WHERE queue = 'pair'"),
	'>=', 2, 'pair: served by several executors');

# fair serving: a backlog in queue a (first in name order) does not hold back queue z, whose
# step is due after it: the executors take the queues with due steps in turn
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 60) g,
  ds_run_step('a', 'a' || g, format('SELECT span(%L, %L, 0.05)', 'a', 'a' || g),
              defer => true, queue => 'a');
SELECT status FROM ds_run_step('z', 'z1', format('SELECT span(%L, %L, 0)', 'z', 'z1'),
                               defer => true, queue => 'z');
});
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 61 FROM ds_steps WHERE run_id IN ('a', 'z') AND status = 'succeeded'"),
	'fair: all succeeded');
cmp_ok($node->safe_psql('postgres',
		"SELECT count(*) FROM spans WHERE queue = 'a' "
		  . "AND ended <= (SELECT started FROM spans WHERE queue = 'z')"),
	'<', 30, 'fair: the step of queue z ran before half the backlog of queue a was done');

# paused: the steps wait, whatever their due time, while other queues are served
$node->safe_psql('postgres', q{
SELECT ds_set_queue('prio', 0);
SELECT count(*) FROM unnest(ARRAY[5, -1, 3, 0, 10, 0, -7, 3]) WITH ORDINALITY AS p(priority, n),
  ds_run_step('prio', 'n' || n, format('SELECT span(%L, %L, 0)', 'prio', 'n' || n),
              defer => true, queue => 'prio', priority => p.priority);
SELECT status FROM ds_run_step('marker', 'm', 'SELECT 1', defer => true);
});
ok(poll_until($node, 'postgres',
		"SELECT status = 'succeeded' FROM ds_steps WHERE run_id = 'marker'"),
	'marker: a step of another queue created after them ran');
is($node->safe_psql('postgres',
		"SELECT running || ' ' || due FROM ds_queues WHERE queue = 'prio'"),
	'0 8', 'prio: paused, its 8 due steps wait');

# one at a time: lowest priority number first, then in the order they were made due
$node->safe_psql('postgres', "SELECT ds_set_queue('prio', 1)");
ok(poll_until($node, 'postgres',
		"SELECT count(*) = 8 FROM ds_steps WHERE run_id = 'prio' AND status = 'succeeded'"),
	'prio: all 8 succeeded once given a limit');
is($node->safe_psql('postgres',
		"SELECT string_agg(step, ',' ORDER BY id) FROM spans WHERE queue = 'prio'"),
	'n7,n2,n4,n6,n3,n8,n1,n5', 'prio: ran in priority order (lower first), ties by due time');

unlike(slurp_file($node->logfile), qr/terminated by signal|PANIC:/,
	'no server process crashed');
done_testing();
