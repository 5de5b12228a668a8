#!/usr/bin/env bash
# partitions_bench.sh -- steps per second through 1, 2 and 4 partitions, direct and through
# PL/Proxy, and what the proxy's hop costs a call (docs/plproxy.md, "What the proxy costs").
#
#   bench/partitions_bench.sh [port]
#
# For each N of BENCH_PARTITIONS it starts N throwaway servers of PG_CONFIG's PostgreSQL
# (durable_steps preloaded, durable_steps.partition_count = N, server k owning partition k,
# synchronous_commit and fsync on, Unix sockets in a private directory) and one proxy (Debian's
# PostgreSQL 15 with postgresql-15-plproxy, its functions written by
# examples/plproxy/generate-proxy.sql, its cluster by examples/plproxy/cluster-config.sh), then
# measures, all in this one invocation:
#
#   direct  BENCH_CLIENTS clients spread over the N servers (the client routes: each server gets
#           the run ids of its own partition), one pgbench per server, at once
#   proxy   BENCH_CLIENTS clients on the proxy, run ids of every partition
#
# Each call is a fresh ds_run_step (a new step id of one of 64 run ids per partition) whose body
# is one INSERT: every call claims, executes and records a step, and commits. Then the cost of
# the hop, with 1 client and N = 1: the mean latency of a fresh step and of a replay (a completed
# step called again), direct and through the proxy; the difference is the proxy's cost per call.
# The servers of one N all share this machine: on a machine with fewer CPUs than servers, an
# added server adds no CPU (see the report's note). It builds nothing: run `make install` first.
# As root, the clusters run as BENCH_OS_USER (default postgres). Environment (defaults in brackets):
#
#   BENCH_PARTITIONS [1 2 4]  the N measured
#   BENCH_SECONDS    [10]     duration of each measured pgbench run
#   BENCH_CLIENTS    [8]      clients of a throughput run (direct: split over the servers)
#   BENCH_LAT_SECONDS [10]    duration of each latency run (1 client)
#   BENCH_PORT       [5480]   first port (the argument wins): servers PORT+1.., proxy PORT
#   PROXY_BINDIR     [/usr/lib/postgresql/15/bin]  the proxy's PostgreSQL (with plproxy)
#   BENCH_OS_USER    [postgres]
#   PG_CONFIG        [pg_config]  the servers' PostgreSQL
set -euo pipefail

die() { echo "partitions_bench: $*" >&2; exit 1; }

PORT="${1:-${BENCH_PORT:-5480}}"
PARTS="${BENCH_PARTITIONS:-1 2 4}"
SECS="${BENCH_SECONDS:-10}"
CLIENTS="${BENCH_CLIENTS:-8}"
LAT_SECS="${BENCH_LAT_SECONDS:-10}"
PROXY_BINDIR="${PROXY_BINDIR:-/usr/lib/postgresql/15/bin}"
BINDIR="$("${PG_CONFIG:-pg_config}" --bindir)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXAMPLES="$HERE/../examples/plproxy"

[[ -x "$PROXY_BINDIR/initdb" ]] || die "no PostgreSQL at $PROXY_BINDIR (PROXY_BINDIR)"
[[ -e "$PROXY_BINDIR/../lib/plproxy.so" ]] || die "PL/Proxy is not installed ($PROXY_BINDIR/../lib/plproxy.so): apt-get install postgresql-15-plproxy"
for n in $PARTS; do
	((n == 1 || n == 2 || n == 4 || n == 8)) || die "BENCH_PARTITIONS: $n is not 1, 2, 4 or 8"
done

RUNAS=()
if [[ "$(id -u)" == 0 ]]; then
	OS_USER="${BENCH_OS_USER:-postgres}"
	RUNAS=(runuser -u "$OS_USER" --)
fi
as_owner() { ${RUNAS[@]+"${RUNAS[@]}"} "$@"; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ds_partitions_bench.XXXXXX")"
chmod 755 "$WORK"
((${#RUNAS[@]})) && chown "$OS_USER" "$WORK"
DATADIRS=()
cleanup() {
	local rc=$?
	for d in "${DATADIRS[@]}"; do
		if [[ -e "$d/postmaster.pid" ]]; then
			as_owner "$(cat "$d.bindir")/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
		fi
	done
	((rc == 0)) || { echo "partitions_bench: failed; logs in $WORK" >&2; return; }
	rm -rf "$WORK"
}
trap cleanup EXIT

conn() { echo "host=$WORK port=$1 dbname=postgres user=postgres"; }
q() { as_owner "$BINDIR/psql" -X -At -v ON_ERROR_STOP=1 -d "$(conn "$1")" -c "$2"; }

# a server: port, bindir, extra settings
start_server() {
	local port=$1 bindir=$2 conf=$3 d="$WORK/data-$SETUP-$1"
	as_owner "$bindir/initdb" -D "$d" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
		>"$WORK/initdb-$port.log" 2>&1 || { cat "$WORK/initdb-$port.log" >&2; die "initdb failed"; }
	echo "$bindir" >"$d.bindir"
	DATADIRS+=("$d")
	cat >>"$d/postgresql.conf" <<EOF
port = $port
listen_addresses = ''
unix_socket_directories = '$WORK'
synchronous_commit = on
fsync = on
shared_buffers = 128MB
max_connections = 60
$conf
EOF
	as_owner "$bindir/pg_ctl" -D "$d" -l "$WORK/server-$port.log" -w -t 60 start >/dev/null ||
		die "the server on port $port did not start"
}

stop_all() {
	for d in "${DATADIRS[@]}"; do
		as_owner "$(cat "$d.bindir")/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true
	done
	DATADIRS=()
}

# fresh steps: a random run id of the table bench_ids, a new step id each call
cat >"$WORK/fresh.sql" <<'EOF'
\set i random(1, :nids)
\set s random(1, 1000000000000)
SELECT (ds_run_step(b.run_id, :client_id || '.' || :s, 'INSERT INTO bench_rows VALUES (1) RETURNING 1')).status
  FROM bench_ids b WHERE b.i = :i;
EOF
# replays: the same completed step again
cat >"$WORK/replay.sql" <<'EOF'
SELECT (ds_run_step(b.run_id, 'done', 'INSERT INTO bench_rows VALUES (1) RETURNING 1')).status
  FROM bench_ids b WHERE b.i = 1;
EOF
chmod 644 "$WORK"/*.sql

# pgbench's steps/s ("tps = ... (without initial connection time)") and mean latency (ms)
pgb() {
	local port=$1 script=$2 clients=$3 secs=$4 nids=$5 bindir=${6:-$BINDIR}
	as_owner "$BINDIR/pgbench" -n -M prepared -c "$clients" -j "$clients" -T "$secs" -D nids="$nids" \
		-f "$script" -h "$WORK" -p "$port" -U postgres postgres 2>"$WORK/pgbench.err" |
		awk '/^latency average/ { lat = $4 } /^tps = / { tps = $3 } END { printf "%s %s\n", tps, lat }'
}

# a cluster of n servers and the proxy, run ids of each partition in bench_ids
setup() {
	local n=$1 k
	SETUP=$n
	for ((k = 0; k < n; k++)); do
		start_server $((PORT + 1 + k)) "$BINDIR" "shared_preload_libraries = 'durable_steps'
durable_steps.database = 'postgres'
durable_steps.partition_count = $n
durable_steps.partitions = '$k'"
		q $((PORT + 1 + k)) "CREATE EXTENSION durable_steps; CREATE TABLE bench_rows (x int);
CREATE TABLE bench_ids (i int PRIMARY KEY, run_id text NOT NULL);
INSERT INTO bench_ids SELECT row_number() OVER (ORDER BY g), 'run-' || g
  FROM generate_series(1, 100000) g WHERE hashtext('run-' || g) & ($n - 1) = $k LIMIT 64;
SELECT ds_run_step(run_id, 'done', 'INSERT INTO bench_rows VALUES (1) RETURNING 1') FROM bench_ids WHERE i = 1;" >/dev/null
	done
	start_server "$PORT" "$PROXY_BINDIR" ""
	as_owner "$BINDIR/psql" -X -At -v ON_ERROR_STOP=1 -f "$EXAMPLES/generate-proxy.sql" \
		-d "$(conn $((PORT + 1)))" >"$WORK/proxy.sql"
	local servers=()
	for ((k = 0; k < n; k++)); do servers+=("$(conn $((PORT + 1 + k)) | sed 's/ user=postgres//')"); done
	as_owner env PSQL="$BINDIR/psql" "$EXAMPLES/cluster-config.sh" "${servers[@]}" >"$WORK/cluster.sql"
	as_owner "$PROXY_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$(conn "$PORT")" -f "$WORK/proxy.sql" -f "$WORK/cluster.sql" \
		>"$WORK/proxy-setup.log" 2>&1 || { cat "$WORK/proxy-setup.log" >&2; die "the proxy's functions failed"; }
	# the proxy's bench_ids: every partition's, in turn
	q "$PORT" "CREATE TABLE bench_ids (i int PRIMARY KEY, run_id text NOT NULL)" >/dev/null
	for ((k = 0; k < n; k++)); do
		q $((PORT + 1 + k)) "SELECT (i - 1) * $n + $k + 1 || ',' || run_id FROM bench_ids" |
			q "$PORT" "COPY bench_ids FROM STDIN (FORMAT csv)" >/dev/null
	done
}

echo "partitions_bench: servers $("$BINDIR/postgres" --version), proxy $("$PROXY_BINDIR/postgres" --version) with PL/Proxy"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other programs share these CPUs: the figures are this moment's)"
echo "machine: $(nproc) CPUs; $SECS s per throughput run, $CLIENTS clients; fresh ds_run_step, body one INSERT; fsync on"
printf '%-11s %-8s %10s %10s\n' partitions route 'steps/s' 'ms/call'
declare -A TPS
for n in $PARTS; do
	setup "$n"
	nids=$(q $((PORT + 1)) "SELECT count(*) FROM bench_ids")
	# direct: clients split over the servers, all at once
	per=$(((CLIENTS + n - 1) / n))
	pids=()
	for ((k = 0; k < n; k++)); do
		pgb $((PORT + 1 + k)) "$WORK/fresh.sql" "$per" "$SECS" "$nids" >"$WORK/direct-$k.out" &
		pids+=($!)
	done
	wait "${pids[@]}"
	read -r tps lat < <(awk '{ t += $1; l += $2 } END { printf "%.0f %.2f\n", t, l / NR }' "$WORK"/direct-*.out)
	rm -f "$WORK"/direct-*.out
	TPS[$n.direct]=$tps
	printf '%-11s %-8s %10s %10s\n' "$n" direct "$tps" "$lat"
	pnids=$(q "$PORT" "SELECT count(*) FROM bench_ids")
	read -r tps lat < <(pgb "$PORT" "$WORK/fresh.sql" "$((per * n))" "$SECS" "$pnids")
	TPS[$n.proxy]=$tps
	printf '%-11s %-8s %10.0f %10s\n' "$n" proxy "$tps" "$lat"
	if [[ "$n" == "$(echo "$PARTS" | awk '{ print $1 }')" ]]; then
		# the hop's cost, one client, one call at a time
		echo
		printf '%-22s %10s %10s %10s %8s\n' 'one client' 'direct ms' 'proxy ms' 'hop ms' ratio
		for s in fresh replay; do
			read -r _ dl < <(pgb $((PORT + 1)) "$WORK/$s.sql" 1 "$LAT_SECS" "$nids")
			read -r _ pl < <(pgb "$PORT" "$WORK/$s.sql" 1 "$LAT_SECS" 1)
			awk -v s="$s" -v d="$dl" -v p="$pl" 'BEGIN { printf "%-22s %10.3f %10.3f %10.3f %8.2f\n", s " ds_run_step", d, p, p - d, p / d }'
		done
		echo
		printf '%-11s %-8s %10s %10s\n' partitions route 'steps/s' 'ms/call'
	fi
	stop_all
done
echo
base=$(echo "$PARTS" | awk '{ print $1 }')
for n in $PARTS; do
	awk -v n="$n" -v d="${TPS[$n.direct]}" -v p="${TPS[$n.proxy]}" -v b="${TPS[$base.direct]}" \
		'BEGIN { printf "%s partition(s): direct %.2f x the %s-partition rate, proxy %.2f x direct\n", n, d / b, "'"$base"'", p / d }'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "note: the $(nproc) CPUs of this machine run every server and the proxy: beyond $(nproc) busy servers an"
echo "added server brings no CPU, only more backends sharing the same CPUs and the same disk."
