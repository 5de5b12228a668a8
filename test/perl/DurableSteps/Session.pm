# DurableSteps::Session -- one interactive psql session for TAP tests (test/t/*.pl).
#
# Sessions are driven through psql processes of our own (IPC::Run), so that the tests work with
# every PostgreSQL 15 minor release, whatever background_psql() returns there.
#
#   my $s = DurableSteps::Session->new($node [, $name [, $db]]);   # database postgres by default
#   $s->send('BEGIN; SELECT ...');                # does not wait
#   my $out = $s->wait;                           # output up to the end of what was sent
#   $s->query_ok('SELECT 1');  $s->pid;  $s->quit;
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

# One interactive SQL session: statements are sent without waiting, and their output is collected
# up to a marker that psql echoes on stdout and on stderr once it has finished them.
package DurableSteps::Session;

use Carp;

sub new
{
	my ($class, $node, $name, $db) = @_;
	my $self = bless {
		name => $name,
		in => '',
		out => '',
		err => '',
		n => 0,
		timer => IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default),
	}, $class;

	# ON_ERROR_STOP off: an error is an outcome to look at, not the end of the session.
	# VERBOSITY verbose: errors show their SQLSTATE.
	$self->{h} = IPC::Run::start(
		[
			'psql', '-X', '-A', '-t', '-q',
			'-v', 'ON_ERROR_STOP=0',
			'-v', 'VERBOSITY=verbose',
			'-d', $node->connstr($db // 'postgres'),
			'-f', '-'
		],
		'<', \$self->{in},
		'>', \$self->{out},
		'2>', \$self->{err},
		$self->{timer});
	$self->{pid} = $self->query_ok('SELECT pg_backend_pid();');
	return $self;
}

sub pid { return $_[0]->{pid}; }

# Queue SQL; returns a ticket for finished() and wait().
sub send
{
	my ($self, $sql) = @_;
	my $n = ++$self->{n};
	$self->{in} .= "$sql\n\\echo '\@\@done $n\@\@'\n\\warn '\@\@done $n\@\@'\n";
	$self->{h}->pump_nb;
	return $n;
}

sub finished
{
	my ($self, $n) = @_;
	$self->{h}->pump_nb;
	return $self->{out} =~ /\@\@done $n\@\@\n/ && $self->{err} =~ /\@\@done $n\@\@\n/;
}

# Wait for ticket $n; returns (stdout, stderr) of what it ran, without the marker.
sub wait
{
	my ($self, $n) = @_;
	$self->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	until ($self->finished($n))
	{
		croak "session $self->{name}: timed out waiting for statement $n\n"
		  . "stdout: $self->{out}\nstderr: $self->{err}"
		  if $self->{timer}->is_expired;
		croak "session $self->{name}: psql exited\nstdout: $self->{out}\nstderr: $self->{err}"
		  unless $self->{h}->pumpable;
		$self->{h}->pump;
	}
	my ($out, $err);
	$self->{out} =~ s/\A(.*?)\@\@done $n\@\@\n//s and $out = $1;
	$self->{err} =~ s/\A(.*?)\@\@done $n\@\@\n//s and $err = $1;
	chomp $out;
	chomp $err;
	return ($out, $err);
}

sub query
{
	my ($self, $sql) = @_;
	return $self->wait($self->send($sql));
}

# Like query(), but any error output is fatal; returns stdout.
sub query_ok
{
	my ($self, $sql) = @_;
	my ($out, $err) = $self->query($sql);
	croak "session $self->{name}: unexpected error for\n$sql\n$err" if $err ne '';
	return $out;
}

sub quit
{
	my ($self) = @_;
	$self->{in} .= "\\q\n";
	$self->{h}->finish;
}

# Ends a session that cannot go on (its server went away, a statement timed out).
sub abandon
{
	my ($self) = @_;
	eval { $self->{h}->kill_kill(grace => 1) };
}


1;
