#!/usr/bin/env bash
# citus_bench.sh -- what two-phase commit costs a step that writes a distributed table.
#
#   bench/citus_bench.sh [port]
#
# Starts three throwaway clusters on 127.0.0.1 (a Citus coordinator with durable_steps on PORT,
# two Citus worker nodes on PORT+1 and PORT+2), distributes a table of ROWS accounts over the
# worker nodes, and runs pgbench on the coordinator: each transaction one fresh step
# `ds_run_step(<new run>, 'debit', 'UPDATE accounts SET balance = balance - 1 WHERE id = <random>')`,
# CLIENTS clients for RUN_SECONDS seconds, alternately with durable_steps.citus_two_phase_commit on (the
# default: the step's transaction asks Citus for two-phase commit, so the worker node's
# transaction is prepared, then committed after the coordinator's commit) and off (Citus commits
# the worker node's transaction in one phase), ROUNDS times each, in this one invocation. Prints
# each run's steps per second, each mode's median and the ratio off/on.
#
# Citus must be installed in the PostgreSQL of PG_CONFIG (scripts/citus-build) and durable_steps
# too (make install). Environment (defaults in brackets): CLIENTS [8], RUN_SECONDS [15], ROUNDS [2],
# ROWS [10000], BENCH_PORT [5480], PG_CONFIG [pg_config], BENCH_OS_USER [postgres] (the clusters'
# account as root).
set -euo pipefail

die() { echo "citus_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5480}}"
BENCH_NAME=citus_bench
CLIENTS="${CLIENTS:-8}"
SECONDS_PER_RUN="${RUN_SECONDS:-15}"
ROUNDS="${ROUNDS:-2}"
ROWS="${ROWS:-10000}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive CLIENTS SECONDS_PER_RUN ROUNDS ROWS
[[ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]] ||
	die "Citus is not installed in $("$PG_CONFIG" --pkglibdir) (scripts/citus-build $PG_CONFIG)"
[[ -f "$("$PG_CONFIG" --pkglibdir)/durable_steps.so" ]] || die "durable_steps is not installed (make install)"

bench_workdir
NODES=(coordinator worker1 worker2)
cleanup() {
	local rc=$? n
	for n in "${NODES[@]}"; do
		if [[ -f "$WORK/$n/postmaster.pid" ]]; then
			as_cluster_owner "$BINDIR/pg_ctl" -D "$WORK/$n" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
		fi
	done
	if ((rc != 0)); then
		for n in "${NODES[@]}"; do
			[[ -f "$WORK/$n.log" ]] && { echo "--- $n.log" >&2; tail -n 15 "$WORK/$n.log" >&2; }
		done
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT

for i in 0 1 2; do
	n=${NODES[$i]}
	as_cluster_owner "$BINDIR/initdb" -D "$WORK/$n" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
		>"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
	preload=citus
	[[ $n == coordinator ]] && preload=citus,durable_steps
	cat >>"$WORK/$n/postgresql.conf" <<EOF

# $BENCH_NAME
port = $((PORT + i))
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
synchronous_commit = on
fsync = on
shared_buffers = 256MB
max_connections = 100
max_prepared_transactions = 100
shared_preload_libraries = '$preload'
citus.node_conninfo = 'sslmode=prefer'
durable_steps.database = 'postgres'
EOF
	as_cluster_owner "$BINDIR/pg_ctl" -D "$WORK/$n" -l "$WORK/$n.log" -w -t 60 start >/dev/null ||
		die "$n did not start"
done

psql_on() {
	local port=$1
	shift
	as_cluster_owner "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$port" -U postgres -d postgres "$@"
}
psql_on $((PORT + 1)) -c 'CREATE EXTENSION citus'
psql_on $((PORT + 2)) -c 'CREATE EXTENSION citus'
psql_on "$PORT" >/dev/null <<EOF
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('127.0.0.1', $PORT);
SELECT citus_add_node('127.0.0.1', $((PORT + 1)));
SELECT citus_add_node('127.0.0.1', $((PORT + 2)));
SET citus.enable_ddl_propagation = off;
CREATE EXTENSION durable_steps;
RESET citus.enable_ddl_propagation;
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
SELECT create_distributed_table('accounts', 'id');
INSERT INTO accounts SELECT g, 0 FROM generate_series(1, $ROWS) g;
EOF

cat >"$WORK/step.sql" <<EOF
\\set id random(1, $ROWS)
SELECT status FROM ds_run_step(gen_random_uuid()::text, 'debit', 'UPDATE accounts SET balance = balance - 1 WHERE id = :id');
EOF
chmod 644 "$WORK/step.sql"

declare -A runs=()
run() {
	local mode=$1 out tps
	out=$(as_cluster_owner env PGOPTIONS="-c durable_steps.citus_two_phase_commit=$mode" \
		"$BINDIR/pgbench" -n -h "$WORK" -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" \
		-T "$SECONDS_PER_RUN" -f "$WORK/step.sql" postgres 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
	tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' <<<"$out" | tail -n 1)
	[[ -n "$tps" ]] || { echo "$out" >&2; die "no tps in pgbench's output"; }
	runs[$mode]+="$tps "
	printf '2PC %-3s  %8.1f steps/s\n' "$mode" "$tps"
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "citus_bench: PostgreSQL $("$PG_CONFIG" --version | awk '{print $2}'), a coordinator and two worker nodes on 127.0.0.1;" \
	"$CLIENTS clients, $SECONDS_PER_RUN s a run, $ROUNDS rounds, one fresh step a transaction"
run on >/dev/null # warm-up: connections, caches
runs=()
for ((r = 1; r <= ROUNDS; r++)); do
	run on
	run off
done
on=$(median <<<"${runs[on]}")
off=$(median <<<"${runs[off]}")
prepared=$(psql_on $((PORT + 1)) -Atc 'SELECT count(*) FROM pg_prepared_xacts')
steps=$(psql_on "$PORT" -Atc "SELECT count(*) FROM durable_steps.steps WHERE status = 'succeeded'")
debits=$(psql_on "$PORT" -Atc 'SELECT -sum(balance) FROM accounts')
[[ "$steps" == "$debits" ]] || die "$steps steps succeeded but the accounts were debited $debits times"
printf 'median: 2PC on %.1f steps/s, off %.1f steps/s; on/off = %.2f (%d steps, %d debits, %d left prepared)\n' \
	"$on" "$off" "$(awk -v a="$on" -v b="$off" 'BEGIN {print a / b}')" "$steps" "$debits" "$prepared"
