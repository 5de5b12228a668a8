# Not preloaded (README, "Install on an existing server"): the extension works in the caller; a
# retryable failure warns once per session that retries will not run. Every session loads the
# library on its first call, so each call below is a session of its own unless said otherwise.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Test;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

{
	my $t = 'not preloaded';
	my $n = PostgreSQL::Test::Cluster->new('no_preload');
	$n->init;
	$n->start;
	my ($ret, $stdout, $stderr) = $n->psql('postgres', 'CREATE EXTENSION durable_steps');
	is($ret, 0, "$t: CREATE EXTENSION works without shared_preload_libraries");
	is($stderr, '', "$t: ... without any message") or diag "$t: CREATE EXTENSION said: $stderr";
  SKIP:
	{
		skip "$t: the extension could not be created", 9 if $ret != 0;
		($ret, $stdout, $stderr) = $n->psql('postgres',
			"SELECT status || '|' || result::text || '|' || attempt FROM ds_run_step('np', 'ok', 'SELECT 42')"
		);
		is("$stdout|$stderr", 'succeeded|42|1|', "$t: ds_run_step runs a step in the caller, silently");

		my $retry = sub {
			my ($step) = @_;
			return
			  "SELECT status FROM ds_run_step('np', '$step', \$\$SELECT ds_retry_after('later', '1 min')\$\$);";
		};
		my $warning =
		  qr/WARNING:\s+durable_steps is not in shared_preload_libraries: retries will not run until it is/;
		($ret, $stdout, $stderr) = $n->psql('postgres', $retry->('r1') . "\n" . $retry->('r2'));
		is($ret, 0, "$t: two retryable steps in one session: no error");
		is($stdout, "retrying\nretrying", "$t: both steps are retrying");
		is(count_matches($stderr, $warning), 1, "$t: the warning is given once in the session");
		unlike($stderr, qr/ERROR|FATAL/, "$t: ... and nothing worse");
		($ret, $stdout, $stderr) = $n->psql('postgres', $retry->('r3'));
		is($stdout, 'retrying', "$t: a step in a second session is retrying");
		is(count_matches($stderr, $warning), 1, "$t: a new session is warned again, once");
		($ret, $stdout, $stderr) =
		  $n->psql('postgres', "SELECT status FROM ds_run_step('np', 'ok2', 'SELECT 1')");
		is("$stdout|$stderr", 'succeeded|', "$t: a step that succeeds gives no warning");
		is( $n->safe_psql(
				'postgres',
				"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'durable_steps%'"),
			'0',
			"$t: no launcher and no executor");
	}
	$n->stop;
}

done_testing();
