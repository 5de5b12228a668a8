# Changing a workflow while runs are in flight (docs/runs.md, "Changing a workflow"):
# ds_patched(change_id) is false for a run whose history already went past the point of the
# change under the old code -- it replays its old steps -- and true for a run that reaches the
# point after the change was deployed, whether it started before or after; the answer is
# recorded (a step of kind `patch`) and every later turn answers it.
#
# The workflow, old: step a; wait for event `go:<order>`; step b_old; step c.
# New: step a; IF ds_patched('new-b') THEN step b_new ELSE step b_old; wait for event; step c
# (the new code also moved b before the wait: only the runs at the change's point take it).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = worker_node('patched', "durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n");
$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE TABLE effects (run text, step text);
CREATE FUNCTION checkout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('a', 'INSERT INTO effects VALUES ($1->>''run'', ''a'') RETURNING 1', jsonb_build_object('run', run_id));
    PERFORM ds_await_event('go', 'go:' || (input->>'order'));
    PERFORM ds_step('b_old', 'INSERT INTO effects VALUES ($1->>''run'', ''b_old'') RETURNING 1', jsonb_build_object('run', run_id));
    PERFORM ds_step('c', 'INSERT INTO effects VALUES ($1->>''run'', ''c'') RETURNING 1', jsonb_build_object('run', run_id));
    RETURN '"old"';
END $$;
-- a run of the old code that waits at the event, past where the change goes
SELECT ds_start_run('checkout', '{"order": "1"}', 'before');
});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || current_step FROM ds_runs WHERE run_id = 'before'}, 'waiting go'),
	'the old run waits for its event, after step a');

# the change is deployed
$node->safe_psql('postgres', q{
CREATE OR REPLACE FUNCTION checkout(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    path text;
BEGIN
    PERFORM ds_step('a', 'INSERT INTO effects VALUES ($1->>''run'', ''a'') RETURNING 1', jsonb_build_object('run', run_id));
    IF ds_patched('new-b') THEN
        PERFORM ds_step('b_new', 'INSERT INTO effects VALUES ($1->>''run'', ''b_new'') RETURNING 1', jsonb_build_object('run', run_id));
        path := 'new';
    END IF;
    PERFORM ds_await_event('go', 'go:' || (input->>'order'));
    IF path IS NULL THEN
        PERFORM ds_step('b_old', 'INSERT INTO effects VALUES ($1->>''run'', ''b_old'') RETURNING 1', jsonb_build_object('run', run_id));
        path := 'old';
    END IF;
    PERFORM ds_step('c', 'INSERT INTO effects VALUES ($1->>''run'', ''c'') RETURNING 1', jsonb_build_object('run', run_id));
    RETURN to_jsonb(path);
END $$;
SELECT ds_start_run('checkout', '{"order": "2"}', 'after');
});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || current_step FROM ds_runs WHERE run_id = 'after'}, 'waiting go'),
	'the new run waits for its event');
$node->safe_psql('postgres', q{SELECT ds_emit_event('go:1'), ds_emit_event('go:2')});
ok(poll_until($node, 'postgres',
		q{SELECT string_agg(run_id || ' ' || status || ' ' || output::text, ', ' ORDER BY run_id) FROM ds_runs},
		'after succeeded "new", before succeeded "old"'),
	'the old run finished on the old path, the new one on the new path');
is($node->safe_psql('postgres', q{SELECT string_agg(run || ':' || step, ' ' ORDER BY run, step) FROM effects}),
	'after:a after:b_new after:c before:a before:b_old before:c',
	'each step of each run took effect once, on its own path');
is($node->safe_psql('postgres', q{
SELECT string_agg(run_id || ' ' || status || ' ' || result::text, ', ' ORDER BY run_id)
  FROM ds_steps WHERE kind = 'patch' AND step_id = 'new-b'}),
	'after succeeded {"patched": true}, before succeeded {"patched": false}',
	'the answers are recorded as steps of kind patch');

# a run that reaches the change before it recorded any step takes the new path; replays of a
# recorded answer do not change it
$node->safe_psql('postgres', q{
CREATE TABLE gate (open boolean);
INSERT INTO gate VALUES (false);
CREATE OR REPLACE FUNCTION slow_start(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF ds_patched('v2') THEN
        PERFORM ds_step('new', 'SELECT 1');
    ELSE
        PERFORM ds_step('old', 'SELECT 1');
    END IF;
    PERFORM ds_sleep('nap', '200 ms');
    RETURN to_jsonb(ds_patched('v2'));
END $$;
SELECT ds_start_run('slow_start', '{}', 'fresh');
});
ok(poll_until($node, 'postgres', q{SELECT status || ' ' || output::text FROM ds_runs WHERE run_id = 'fresh'}, 'succeeded true'),
	'a run that reaches the change first takes it, and every later turn answers the same');
is($node->safe_psql('postgres', q{SELECT string_agg(step_id || ':' || kind, ' ' ORDER BY created_at) FROM ds_steps WHERE run_id = 'fresh'}),
	'v2:patch new:sql nap:sleep', 'its steps: the patch, the new step, the sleep');

# outside a workflow ds_patched is refused
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT ds_patched('x')});
like($err, qr/ds_patched\(\) can only be called by a run's workflow/, 'outside a run it is refused (DS105)');

$node->stop;
done_testing();
