# Property: a step body that fails never aborts the caller's transaction (docs/steps.md, "How a
# step behaves"). A retryable failure is answered as status retrying with its class, SQLSTATE and
# next attempt; the body's own writes roll back, the caller's later statements work and commit;
# the failure is recorded as one attempt, and a call before the retry is due answers the same
# state without running the body early.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Session;
use DurableSteps::Test;

my $node = claims_node('failing_body_in_caller');

my $sa = DurableSteps::Session->new($node, 'A');
my $sb = DurableSteps::Session->new($node, 'B');

############################################################################################
# 5. A retryable failure of the body does not abort the caller's transaction; it is recorded.
{
	my $t = 'test 5 (retryable failure)';
	# a long first delay, so that nothing retries the step while the test looks at it
	my $policy =
	  q{ds_retry_policy(max_attempts => 3, initial_delay => '1 hour', max_delay => '2 hours')};
	my $call = row_sql(
		"SELECT status, error_class, error_code, error_message, attempt, max_attempts, "
		  . "next_attempt_at > now() + interval '30 minutes' AS due_in_30_min_or_more, replayed "
		  . "FROM ds_run_step('t5', 's1', \$\$SELECT flaky('t5')\$\$, policy => $policy)");
	my %retrying = (
		status => 'retrying',
		error_class => 'retryable',
		error_code => 'P0001',
		error_message => 'x',
		attempt => 1,
		max_attempts => 3,
		due_in_30_min_or_more => 'true');
	$sa->query_ok('BEGIN;');
	my ($out, $err) = $sa->query($call);
	is($err, '', "$t: the failing step raised no error to the caller");
	is_deeply(decode_row($out), { %retrying, replayed => 'false' },
		"$t: the call returns status retrying, class retryable, P0001, next attempt scheduled");
	($out, $err) = $sa->query(
		"INSERT INTO effects(k) VALUES ('t5-after');\nSELECT count(*) FROM effects WHERE k = 't5';"
	);
	is($err, '', "$t: a later statement in the same transaction works");
	is($out, '0', "$t: the body's own write was rolled back");
	$sa->query_ok('COMMIT;');

	is_deeply(
		row_of(
			$node, 'postgres',
			"SELECT (SELECT count(*) FROM effects WHERE k = 't5-after') AS callers_effects, "
			  . "(SELECT count(*) FROM effects WHERE k = 't5') AS bodys_effects"),
		{ callers_effects => 1, bodys_effects => 0 },
		"$t: the caller's transaction committed, with none of the body's writes");
	is_deeply(
		row_of(
			$node, 'postgres',
			"SELECT status, error_class, error_code, error_message, attempt, "
			  . "(next_attempt_at IS NOT NULL AND next_attempt_at > now() + interval '30 minutes') AS due_in_30_min_or_more "
			  . "FROM ds_steps WHERE run_id = 't5'"),
		{
			status => 'retrying',
			error_class => 'retryable',
			error_code => 'P0001',
			error_message => 'x',
			attempt => 1,
			due_in_30_min_or_more => 'true'
		},
		"$t: the step row is retrying with next_attempt_at set");
	is_deeply(
		rows_of(
			$node, 'postgres',
			"SELECT attempt, class, error_code, error_message, executor FROM ds_attempts WHERE run_id = 't5'"),
		[ { attempt => 1, class => 'retryable', error_code => 'P0001', error_message => 'x', executor => 'caller' } ],
		"$t: one attempt row, class retryable");

	# not yet due: a new call answers with the pending state and does not run the body early
	($out, $err) = $sb->query($call);
	is($err, '', "$t: calling again raises no error");
	my $again = decode_row($out);
	delete $again->{replayed};
	is_deeply($again, \%retrying, "$t: calling again before it is due returns the retrying state");
	is($node->safe_psql('postgres', "SELECT count(*) FROM ds_attempts WHERE run_id = 't5'"),
		'1', "$t: ... without another attempt");
}

$sa->quit;
$sb->quit;
$node->stop;

done_testing();
