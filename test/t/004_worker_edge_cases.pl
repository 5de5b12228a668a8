# Worker edge cases found in review: a step created under an empty search_path, and a step body
# that calls another step its own executor claimed in the same batch and has not run yet.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('edge');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'postgres'
durable_steps.poll_interval = '200ms'
# one executor: the nested-step case needs parent and child in one executor's claim
durable_steps.max_workers = 1
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION durable_steps');

sub step_status
{
	my ($run, $step) = @_;
	return $node->safe_psql('postgres',
		"SELECT status FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

# 1. An empty stored search_path: the worker runs the body under pg_temp alone.
my $first = $node->safe_psql('postgres', q{
SET search_path = '';
SELECT status FROM public.ds_run_step('edge', 'empty-path',
  $$SELECT CASE WHEN public.ds_attempt_number() = 1
                THEN public.ds_retry_after('later', '0 s')::text ELSE 'ran' END$$);
});
is($first, 'retrying', 'a step created under an empty search_path is retrying after attempt 1');
ok($node->poll_query_until('postgres',
		"SELECT status = 'succeeded' FROM ds_steps WHERE run_id = 'edge' AND step_id = 'empty-path'"),
	'the worker runs a step whose stored search_path is empty');
is($node->safe_psql('postgres',
		"SELECT search_path FROM durable_steps.steps WHERE step_id = 'empty-path'"),
	'""', 'the empty search_path was stored as the caller had it');

# 2. A parent body that calls a child step claimed in the same batch by the same executor.
$node->safe_psql('postgres', q{
CREATE TABLE child_effects (n int);
CREATE SEQUENCE child_runs;
});
my $child_sql = q{WITH i AS (INSERT INTO child_effects VALUES (1) RETURNING 1)
  SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after('later', '1 s')::text
              ELSE 'child ran ' || nextval('child_runs') END FROM i};
(my $child_literal = $child_sql) =~ s/'/''/g;
my $parent_sql = "SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after('later', '1 s')::text "
  . "ELSE (ds_run_step('nest', 'child', '$child_literal')).status END";
$node->safe_psql('postgres', qq{
BEGIN;
SELECT status FROM ds_run_step('nest', 'parent', \$p\$$parent_sql\$p\$);
SELECT status FROM ds_run_step('nest', 'child', \$c\$$child_sql\$c\$);
-- due together, parent first: one claim takes both, and the parent runs while the child waits
UPDATE durable_steps.steps
   SET next_attempt_at = now() + interval '1 s'
       + CASE step_id WHEN 'child' THEN interval '10 microseconds' ELSE interval '0' END
 WHERE run_id = 'nest';
COMMIT;
});
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 2 FROM ds_steps WHERE run_id = 'nest' AND status = 'succeeded'"),
	'parent and child both succeed');
is($node->safe_psql('postgres', 'SELECT count(*) FROM child_effects'), '1',
	'the child step took effect exactly once');
is($node->safe_psql('postgres', 'SELECT last_value FROM child_runs'), '1',
	'the child body ran once after its first attempt');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM ds_attempts WHERE run_id = 'nest' AND error_code = 'DS007'"),
	'0', 'no attempt was recorded as lost');
my $child_attempts = $node->safe_psql('postgres',
	"SELECT string_agg(attempt || ':' || class, ',' ORDER BY attempt) FROM ds_attempts "
	  . "WHERE run_id = 'nest' AND step_id = 'child'");
is($child_attempts, '1:retryable,2:completed', 'the child has one retryable and one completed attempt');
my $parent_codes = $node->safe_psql('postgres',
	"SELECT string_agg(coalesce(error_code, 'ok'), ',' ORDER BY attempt) FROM ds_attempts "
	  . "WHERE run_id = 'nest' AND step_id = 'parent'");
note("parent attempts: $parent_codes; child attempts: $child_attempts");
like($parent_codes, qr/^DS002,(DS409,)+ok$/,
	'the parent waited for the child (DS409 while its own executor held it) and then succeeded');

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|PANIC|duplicate key value/,
	'no crash and no duplicate attempt in the server log');

$node->stop;
done_testing();
