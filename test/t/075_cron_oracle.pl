# ds_cron_slots against an oracle (docs/schedules.md, "Schedule syntax"): thousands of random
# schedules of pg_cron's grammar, each at random times from 2000 to 2040, whose next 5 and
# previous 3 slots python3-croniter computes (test/cron_oracle.py: where croniter disagrees with
# a plain walk over the days, the walk's answer, and the count is shown). Every slot must be the
# same. Needs no pg_cron: the evaluator is the extension's own.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my ($expressions, $times) = (3000, 3);
my $file = PostgreSQL::Test::Utils::tempdir() . '/oracle.tsv';
my ($out, $err) = ('', '');
my $ok = IPC::Run::run([ 'python3', "$FindBin::RealBin/../cron_oracle.py", 75, $expressions, $times ],
	'>', $file, '2>', \$err);
ok($ok, 'the oracle ran (python3-croniter is installed: scripts/lib.sh DS_PACKAGES)')
  or BAIL_OUT("test/cron_oracle.py failed: $err");
my $differs = () = $err =~ /^croniter differs/mg;

my $node = PostgreSQL::Test::Cluster->new('cron_oracle');
$node->init;
$node->start;
$node->safe_psql('postgres', qq{
CREATE EXTENSION durable_steps;
CREATE TABLE oracle (expr text, at timestamptz, nexts text, prevs text, who text);
COPY oracle FROM '$file';
});
my $lines = $node->safe_psql('postgres', 'SELECT count(*) FROM oracle');
cmp_ok($lines, '>=', $expressions * $times * 0.95, "$lines (schedule, time) pairs to compare");
diag("croniter and the day walk disagreed on $differs of them; those use the walk's slots");

# the slots ds_cron_slots finds, earliest first after the time and latest first before it (in
# the select list, so that LIMIT ends the walk)
my $mismatches = $node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE got_next IS DISTINCT FROM nexts OR got_prev IS DISTINCT FROM prevs)
       || ' of ' || count(*) || ' pairs, ' || count(DISTINCT expr) || ' schedules'
       || coalesce(': ' || string_agg(expr || ' at ' || at || ': ' || nexts || ' / ' || got_next
                                      || ' ; ' || prevs || ' / ' || got_prev, E'\n')
                           FILTER (WHERE got_next IS DISTINCT FROM nexts OR got_prev IS DISTINCT FROM prevs), '')
  FROM (SELECT o.*,
               (SELECT string_agg(to_char(s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI'), ',')
                  FROM (SELECT ds_cron_slots(o.expr, o.at, o.at + interval '60 years') s LIMIT 5) x) AS got_next,
               (SELECT string_agg(to_char(s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI'), ',')
                  FROM (SELECT ds_cron_slots(o.expr, o.at, o.at - interval '60 years') s LIMIT 3) x) AS got_prev
          FROM oracle o) c});
like($mismatches, qr/^0 of \d+ pairs, \d+ schedules$/, "every slot matches the oracle ($mismatches)");

# the evaluator is not the oracle's echo: a schedule of Vixie's day rule that croniter's default
# rule reads otherwise (day-of-month `*/2` with a weekday: both must match, not either)
is($node->safe_psql('postgres', q{
SELECT string_agg(to_char(s, 'YYYY-MM-DD Dy'), ',')
  FROM (SELECT ds_cron_slots('0 0 */2 * mon', '2026-01-01 00:00+00', '2026-03-01 00:00+00') AT TIME ZONE 'UTC' s) x}),
	'2026-01-05 Mon,2026-01-19 Mon,2026-02-09 Mon,2026-02-23 Mon',
	'a day-of-month field beginning with * and a weekday: days matching both');

$node->stop;
done_testing();
