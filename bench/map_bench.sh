#!/usr/bin/env bash
# map_bench.sh -- a map of N no-op items (ds_map in a SQL workflow) against N deferred steps, in
# one invocation: items (steps) per second, the executors' CPU and the WAL per item.
#
#   bench/map_bench.sh [port]
#
# A private throwaway cluster (bench/lib.sh) with durable_steps preloaded, DS_WORKERS executors
# and one database `bench`; durable_steps must be installed in the PostgreSQL of PG_CONFIG (make
# install). Each round, alternating which goes first:
#   deferred  N x ds_run_step('d<round>', 's<i>', 'SELECT 1', defer => true), BATCH per
#             transaction; from before the first storing transaction to the last finished_at;
#   map       one run of workflow fan: ds_map('m', 'SELECT 1', <N inputs>, concurrency =>
#             CONCURRENCY) (none by default); from before ds_start_run to the run's finished_at
#             (its items stored, run, joined, and the run's last turn).
# Before each: the previous round's rows deleted, VACUUM ANALYZE, CHECKPOINT. CPU: utime + stime
# of the cluster's processes (/proc), from start to end; WAL: pg_current_wal_lsn() difference.
# Prints each round and the ratio of the means (target: the map >= 0.8x the deferred steps).
#
# Environment: N [10000], BATCH [1000], ROUNDS [3], CONCURRENCY [none], DS_WORKERS [2],
# BENCH_PORT [5541], PG_CONFIG, BENCH_OS_USER [postgres] (the cluster's account when root).
set -euo pipefail

die() { echo "map_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5541}}"
BENCH_NAME=map_bench
N="${N:-10000}"
BATCH="${BATCH:-1000}"
ROUNDS="${ROUNDS:-3}"
DS_WORKERS="${DS_WORKERS:-2}"
CONCURRENCY="${CONCURRENCY:-}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive N BATCH ROUNDS DS_WORKERS
[[ -z "$CONCURRENCY" || "$CONCURRENCY" =~ ^[1-9][0-9]*$ ]] || die "CONCURRENCY must be empty or a positive integer"
trap bench_on_exit EXIT

bench_workdir
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'bench'
durable_steps.max_workers = $DS_WORKERS
max_wal_size = 4GB
autovacuum = off
EOF
bench_start
psql_db() { as_cluster_owner "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d bench "$@"; }
q() { psql_db -At -c "$1"; }
as_cluster_owner "$BINDIR/createdb" -h "$WORK" -p "$PORT" -U postgres bench
conc_sql=NULL
[[ -n "$CONCURRENCY" ]] && conc_sql="$CONCURRENCY"
psql_db -c "CREATE EXTENSION durable_steps" -c "
CREATE FUNCTION fan(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
    RETURN jsonb_build_object('n', jsonb_array_length(
        ds_map('m', 'SELECT 1', input->'items', concurrency => $conc_sql)));
END \$\$;"
postmaster_pid=$(head -1 "$PGDATA_DIR/postmaster.pid")

# utime + stime of the postmaster and all its children, in clock ticks
cluster_ticks() {
	local total=0 pid
	for pid in $postmaster_pid $(pgrep -P "$postmaster_pid" || true); do
		[[ -r /proc/$pid/stat ]] || continue
		total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
	done
	echo "$total"
}
hz=$(getconf CLK_TCK)

prepare() {
	psql_db -c "DELETE FROM durable_steps.attempts" -c "DELETE FROM durable_steps.steps" \
		-c "DELETE FROM durable_steps.runs" -c "DELETE FROM durable_steps.maps" \
		-c "VACUUM ANALYZE" -c "CHECKPOINT"
}

# one measured system; prints "items/s cpu_ms_per_item wal_bytes_per_item"
measure() {
	local what=$1 round=$2 lsn0 t0 ticks0 secs ticks1 wal
	prepare
	lsn0=$(q "SELECT pg_current_wal_lsn()")
	ticks0=$(cluster_ticks)
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	if [[ $what == deferred ]]; then
		local b
		for ((b = 0; b < N; b += BATCH)); do
			local e=$((b + BATCH < N ? b + BATCH : N))
			q "SELECT count(*) FROM generate_series($b, $((e - 1))) i,
			     ds_run_step('d$round', 's' || i, 'SELECT 1', defer => true) r" >/dev/null
		done
		until [[ $(q "SELECT count(*) FROM durable_steps.steps WHERE run_id = 'd$round' AND status = 'succeeded'") == "$N" ]]; do
			sleep 0.05
		done
		secs=$(q "SELECT extract(epoch FROM max(finished_at)) - $t0 FROM durable_steps.steps WHERE run_id = 'd$round'")
	else
		local run
		run=$(q "SELECT run_id FROM ds_start_run('fan', jsonb_build_object('items',
		           (SELECT jsonb_agg(i) FROM generate_series(1, $N) i)), run_key => 'm$round')")
		until [[ $(q "SELECT status FROM ds_runs WHERE run_id = '$run'") =~ ^(succeeded|failed|cancelled)$ ]]; do
			sleep 0.05
		done
		[[ $(q "SELECT output->>'n' FROM ds_runs WHERE run_id = '$run' AND status = 'succeeded'") == "$N" ]] ||
			die "the map's run did not succeed with $N results: $(q "SELECT status, error_message FROM ds_runs WHERE run_id = '$run'")"
		secs=$(q "SELECT extract(epoch FROM finished_at) - $t0 FROM ds_runs WHERE run_id = '$run'")
	fi
	ticks1=$(cluster_ticks)
	wal=$(q "SELECT pg_current_wal_lsn() - '$lsn0'")
	awk -v n="$N" -v s="$secs" -v t=$((ticks1 - ticks0)) -v hz="$hz" -v w="$wal" \
		'BEGIN { printf "%.0f %.4f %.0f\n", n / s, 1000 * t / hz / n, w / n }'
}

echo "map_bench: PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $DS_WORKERS executors, N=$N, concurrency ${CONCURRENCY:-none}"
echo "library: $(stat -c '%y' "$("$PG_CONFIG" --pkglibdir)/durable_steps.so" | cut -d. -f1), md5 $(md5sum "$("$PG_CONFIG" --pkglibdir)/durable_steps.so" | cut -c1-12)"
printf '%-6s %-9s %12s %14s %12s\n' round system items/s "CPU ms/item" "WAL B/item"
sum_d=0
sum_m=0
for ((r = 1; r <= ROUNDS; r++)); do
	if ((r % 2)); then order="deferred map"; else order="map deferred"; fi
	for what in $order; do
		read -r rate cpu wal < <(measure "$what" "$r")
		printf '%-6s %-9s %12s %14s %12s\n' "$r" "$what" "$rate" "$cpu" "$wal"
		if [[ $what == deferred ]]; then sum_d=$((sum_d + rate)); else sum_m=$((sum_m + rate)); fi
	done
done
awk -v d="$sum_d" -v m="$sum_m" -v r="$ROUNDS" \
	'BEGIN { printf "mean: map %.0f items/s, deferred %.0f steps/s: %.2fx (target >= 0.8x)\n", m / r, d / r, m / d }'
