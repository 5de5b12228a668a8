#!/usr/bin/env bash
# stats_bench.sh -- how long ds_stats() takes with HISTORY finished steps in the table, against the
# query an operator would otherwise write (a count of the steps by queue, kind and status, which
# reads the whole table), in one invocation.
#
#   bench/stats_bench.sh [port]
#
# A private throwaway cluster (bench/lib.sh) with durable_steps preloaded and one database
# `bench`; durable_steps must be installed in the PostgreSQL of PG_CONFIG (make install). The
# history: HISTORY steps run by ds_run_step (SELECT 1, succeeded), BATCH to a transaction, from
# two sessions; then ACTIVE steps in flight across ten queues (deferred a day, half of a paused
# queue due now), and VACUUM ANALYZE. Then REPS rounds, each timing one ds_stats() and one scan,
# alternately, from one session (clock_timestamp() around each statement, inside the server).
# Prints the median and the largest of each, and the ratio of the medians.
#
# Environment: HISTORY [1000000], ACTIVE [1000], BATCH [1000], REPS [20], BENCH_PORT [5531],
# PG_CONFIG, BENCH_OS_USER [postgres] (the cluster's account when run as root).
set -euo pipefail

die() { echo "stats_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5531}}"
BENCH_NAME=stats_bench
HISTORY="${HISTORY:-1000000}"
ACTIVE="${ACTIVE:-1000}"
BATCH="${BATCH:-1000}"
REPS="${REPS:-20}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive HISTORY ACTIVE BATCH REPS
trap bench_on_exit EXIT

bench_workdir
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'bench'
max_wal_size = 4GB
autovacuum = off
EOF
bench_start
psql_db() { as_cluster_owner "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d bench "$@"; }
q() { psql_db -At -c "$1"; }
as_cluster_owner "$BINDIR/createdb" -h "$WORK" -p "$PORT" -U postgres bench
psql_db -c "CREATE EXTENSION durable_steps" -c "CREATE TABLE timing (what text, ms float8)"

# ---- the history, from two sessions ----------------------------------------------------------
t0=$(date +%s)
fill() {
	local from=$1 to=$2 b
	for ((b = from; b < to; b += BATCH)); do
		local e=$((b + BATCH < to ? b + BATCH : to))
		q "SELECT count(*) FROM generate_series($b, $((e - 1))) i, ds_run_step('h' || (i / 1000), 's' || i, 'SELECT 1') r" >/dev/null
	done
}
half=$((HISTORY / 2))
fill 0 "$half" &
fill "$half" "$HISTORY" &
wait
q "SELECT ds_set_queue('paused', 0)" >/dev/null
q "SELECT count(*) FROM generate_series(1, $ACTIVE) i,
     ds_run_step('a', 'a' || i, 'SELECT 1',
                 queue => CASE WHEN i % 2 = 0 THEN 'paused' ELSE 'q' || (i % 10) END,
                 run_at => CASE WHEN i % 2 = 0 THEN now() ELSE now() + interval '1 day' END) r" >/dev/null
psql_db -c "VACUUM ANALYZE" -c "CHECKPOINT"
echo "history: $(q "SELECT count(*) FROM durable_steps.steps") steps ($(q "SELECT pg_size_pretty(pg_total_relation_size('durable_steps.steps'))")), filled in $(( $(date +%s) - t0 )) s"

# ---- the rounds ------------------------------------------------------------------------------
psql_db -c "
DO \$\$
DECLARE t timestamptz;
BEGIN
    FOR i IN 1..$REPS LOOP
        t := clock_timestamp();
        PERFORM count(*) FROM ds_stats();
        INSERT INTO timing VALUES ('ds_stats', 1000 * date_part('epoch', clock_timestamp() - t));
        t := clock_timestamp();
        PERFORM count(*) FROM (SELECT queue, kind, status, count(*) FROM durable_steps.steps
                                GROUP BY queue, kind, status) s;
        INSERT INTO timing VALUES ('scan', 1000 * date_part('epoch', clock_timestamp() - t));
    END LOOP;
END \$\$;"
q "SELECT what || ': median ' || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2)
          || ' ms, max ' || round(max(ms)::numeric, 2) || ' ms over ' || count(*) || ' rounds'
     FROM timing GROUP BY what ORDER BY what"
q "SELECT 'ratio: the scan takes ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FILTER (WHERE what = 'scan')
          / percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FILTER (WHERE what = 'ds_stats'))::numeric, 1)
          || ' times as long as ds_stats()' FROM timing"
q "SELECT 'ds_stats() rows: ' || count(*) FROM ds_stats()"
