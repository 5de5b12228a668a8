# DurableSteps::Http -- what the TAP tests of HTTP steps share (test/t/0NN_http_*.pl).
#
#   my $p = DurableSteps::Http::Provider->start(close => 1);   # test/fake_provider.py on 127.0.0.1
#   $p->url('tag', 'fault=500')   # http://127.0.0.1:PORT/charge/tag?fault=500
#   $p->counts                    # {charges => {tag => n}, requests => {...}, keys => {...}, ...}
#   $p->charges('tag'), $p->requests('tag')
#   my $node = http_node('name' [, $conf]);   # worker node, extension, role app (HTTP role),
#                                             # its HTTP worker running
#   http_worker_pid($node); settle_http($node, $run, $step)
package DurableSteps::Http;

use strict;
use warnings;

use Exporter 'import';
use FindBin;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use DurableSteps::Test;

our @EXPORT = qw(http_node http_worker_pid settle_http step_field);

package DurableSteps::Http::Provider;

# Start the fake provider; close => 1 makes every response close its connection.
sub start
{
	my ($class, %opt) = @_;
	my $portfile = PostgreSQL::Test::Utils::tempdir() . '/provider.port';
	my @cmd = ('python3', "$FindBin::RealBin/../fake_provider.py", $portfile);
	push @cmd, '--close' if $opt{close};
	my $h = IPC::Run::start(\@cmd, '<', \undef, '>', '/dev/null', '2>', '/dev/null');
	for (1 .. 100)
	{
		last if -e $portfile;
		Time::HiRes::usleep(50_000);
	}
	die "fake provider did not start" unless -e $portfile;
	my $port = PostgreSQL::Test::Utils::slurp_file($portfile);
	return bless { h => $h, port => $port }, $class;
}

sub port { return $_[0]->{port}; }

sub url
{
	my ($self, $tag, $query) = @_;
	return "http://127.0.0.1:$self->{port}/charge/$tag" . (defined $query ? "?$query" : '');
}

sub counts
{
	my ($self) = @_;
	my $r = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$self->{port}/counts");
	die "counts: $r->{status}" unless $r->{success};
	return JSON::PP::decode_json($r->{content});
}

sub charges { return $_[0]->counts->{charges}{ $_[1] } // 0; }
sub requests { return $_[0]->counts->{requests}{ $_[1] } // 0; }

# The idempotency keys the provider saw for $tag, joined with ',' ('-' for none).
sub keys_seen
{
	my ($self, $tag) = @_;
	return join(',', map { $_ // '-' } @{ $self->counts->{keys}{$tag} // [] });
}

# The header names (lower case) of the provider's requests for $tag, all of them, sorted and
# joined with ','.
sub header_names_seen
{
	my ($self, $tag) = @_;
	my %names = map { map { $_ => 1 } @$_ } @{ $self->counts->{header_names}{$tag} // [] };
	return join(',', sort keys %names);
}

sub DESTROY
{
	my ($self) = @_;
	# freed late (at the test's exit), killing the provider must not set the test's exit status
	local $?;
	# the provider also leaves by itself when its parent (this test) is gone
	$self->{h}->kill_kill(grace => 1) if $self->{h};
}

package DurableSteps::Http;

# A worker node serving database postgres with the extension installed, a role `app` that may
# create HTTP steps, and its HTTP worker running.
sub http_node
{
	my ($name, $conf) = @_;
	my $node = worker_node($name,
		"durable_steps.database = 'postgres'\ndurable_steps.max_workers = 1\n" . ($conf // ''));
	$node->safe_psql('postgres', q{
CREATE EXTENSION durable_steps;
CREATE ROLE app LOGIN IN ROLE durable_steps_http;
CREATE ROLE plain LOGIN;
});
	ok(poll_until($node, 'postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'durable_steps http' AND datname = 'postgres'"),
		'the HTTP worker is running');
	return $node;
}

sub http_worker_pid
{
	my ($node) = @_;
	my $pid = $node->safe_psql('postgres',
		"SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'durable_steps http'");
	die "expected one HTTP worker, found '$pid'" unless $pid =~ /^\d+$/;
	return $pid;
}

# Wait until the step has left pending/running/retrying; returns its status.
sub settle_http
{
	my ($node, $run, $step) = @_;
	poll_until($node, 'postgres',
		"SELECT status NOT IN ('pending', 'running', 'retrying') FROM ds_steps "
		  . "WHERE run_id = '$run' AND step_id = '$step'")
	  or diag("step $run/$step did not settle");
	return step_field($node, $run, $step, 'status');
}

sub step_field
{
	my ($node, $run, $step, $expr) = @_;
	return $node->safe_psql('postgres',
		"SELECT $expr FROM ds_steps WHERE run_id = '$run' AND step_id = '$step'");
}

1;
