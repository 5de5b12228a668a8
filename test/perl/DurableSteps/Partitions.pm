# DurableSteps::Partitions -- what the TAP tests of partitions share (084 calls the servers
# directly, 085 through a PL/Proxy proxy): two servers of four partitions, A owning 0 and 1 and B
# 2 and 3, each with its worker and the same application, and run ids of each partition.
#
#   my ($a, $b) = partition_nodes('part' [, $conf]);   # HTTP nodes (DurableSteps::Http), the app
#   my %id = ids_by_partition($node);    # three run ids of each partition, by $node's hashtext & 3
#   app_sql($node, $sql)                 # $sql as role app, errors verbose: (stdout, stderr)
#   orders_of($node, $run)               # the notes of the run's application rows, in order
#   steps_on($node, $run)                # how many steps of the run the node holds
package DurableSteps::Partitions;

use strict;
use warnings;

use Exporter 'import';

use DurableSteps::Http;

our @EXPORT = qw(partition_nodes ids_by_partition app_sql orders_of steps_on);

# The application of both servers: its rows carry their run's id, as a partition's rows must to
# move with it (docs/partitions.md, "Moving a partition").
my $app = q{
CREATE TABLE orders (run_id text NOT NULL, note text NOT NULL);
GRANT INSERT, SELECT ON orders TO app;
CREATE FUNCTION gate(n integer) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF ds_attempt_number() < n THEN
        RAISE EXCEPTION 'gate: attempt % < %', ds_attempt_number(), n;
    END IF;
    INSERT INTO orders VALUES (ds_run_id(), ds_step_id());
    RETURN ds_attempt_number();
END $$;
CREATE FUNCTION book(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('book', 'INSERT INTO orders VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    RETURN '{"booked": true}';
END $$;
CREATE FUNCTION ship(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_step('pack', 'INSERT INTO orders VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    PERFORM ds_await_event('wait', 'go');
    PERFORM ds_step('ship', 'INSERT INTO orders VALUES (ds_run_id(), ds_step_id()) RETURNING 1');
    RETURN '{"shipped": true}';
END $$;
};

sub partition_nodes
{
	my ($name, $conf) = @_;
	my $parts = "durable_steps.partition_count = 4\n" . ($conf // '');
	my $a = http_node("${name}_a", $parts . "durable_steps.partitions = '0,1'\n");
	my $b = http_node("${name}_b", $parts . "durable_steps.partitions = '2,3'\n");
	$_->safe_psql('postgres', $app) for ($a, $b);
	return ($a, $b);
}

sub ids_by_partition
{
	my ($node) = @_;
	my %id;
	for my $part (0 .. 3)
	{
		$id{$part} = [ split /\n/, $node->safe_psql('postgres', qq{
SELECT id FROM (SELECT 'order-' || i AS id FROM generate_series(1, 200) i) s
 WHERE hashtext(id) & 3 = $part ORDER BY length(id), id LIMIT 3}) ];
	}
	return %id;
}

sub app_sql
{
	my ($node, $sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSET ROLE app;\n$sql");
	return ($out, $err);
}

sub orders_of
{
	my ($node, $run) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(string_agg(note, ',' ORDER BY note), '') FROM orders WHERE run_id = '$run'");
}

sub steps_on
{
	my ($node, $run) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM durable_steps.steps WHERE run_id = '$run'");
}

1;
