#!/usr/bin/env bash
# console_bench.sh -- how long the operator's console (console/) takes to answer its overview and
# its inbox ("Needs a person") with HISTORY finished steps in the tables (docs/console.md).
#
#   bench/console_bench.sh [port]
#
# A private throwaway cluster (bench/lib.sh) with durable_steps preloaded and one database
# `bench`; durable_steps must be installed in the PostgreSQL of PG_CONFIG (make install) and the
# console built (console/build). The history: HISTORY steps run by ds_run_step (SELECT 1,
# succeeded), BATCH to a transaction, from two sessions, each with its attempt recorded; then
# ATTENTION steps that need a person (blocked, failed for good), ACTIVE steps in flight across ten
# queues and as many tasks, and VACUUM ANALYZE. Then the console, on its own (durable-steps-console,
# HTTP Basic, connected as the cluster's superuser), is asked REPS times for each page, one
# request at a time, alternately, from one Node.js process; the time of each is from the request
# to the last byte of the answer (the console's queries, its rendering and the loopback). Prints
# the median, the 95th percentile and the largest of each page, against the target (p95 <= 100 ms).
#
# Environment: HISTORY [1000000], ATTENTION [5000], ACTIVE [1000], BATCH [1000], REPS [200],
# BENCH_PORT [5533], PG_CONFIG, BENCH_OS_USER [postgres] (the cluster's account when run as root).
set -euo pipefail

die() { echo "console_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5533}}"
BENCH_NAME=console_bench
HISTORY="${HISTORY:-1000000}"
ATTENTION="${ATTENTION:-5000}"
ACTIVE="${ACTIVE:-1000}"
BATCH="${BATCH:-1000}"
REPS="${REPS:-200}"
MAIN="$HERE/../console/dist/esm/main.js"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive HISTORY ATTENTION ACTIVE BATCH REPS
[ -f "$MAIN" ] || die "$MAIN is missing: build the console first (console/build)"
CONSOLE_PID=
stop_console() { [ -z "$CONSOLE_PID" ] || kill "$CONSOLE_PID" 2>/dev/null || true; }
trap 'stop_console; bench_on_exit' EXIT

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
psql_db -c "CREATE EXTENSION durable_steps"

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
# what needs a person: blocked and failed steps, spread over the history's time
for ((b = 1; b <= ATTENTION; b += BATCH)); do
	q "SELECT count(*) FROM generate_series($b, $((b + BATCH - 1 < ATTENTION ? b + BATCH - 1 : ATTENTION))) i,
	     ds_run_step('n' || (i / 100), 'n' || i,
	                 CASE WHEN i % 3 = 0 THEN 'SELECT ds_non_retriable(''declined'')'
	                      ELSE 'SELECT ds_blocked(''no stock'', ''restock, then re-arm'')' END) r" >/dev/null
done
# in flight: steps across ten queues, half due, half a day away; tasks waiting for a worker
q "SELECT count(*) FROM generate_series(1, $ACTIVE) i,
     ds_run_step('a', 'a' || i, 'SELECT 1', defer => true, queue => 'q' || (i % 10),
                 run_at => CASE WHEN i % 2 = 0 THEN now() ELSE now() + interval '1 day' END) r" >/dev/null
q "SELECT ds_set_queue('q' || i, 0) FROM generate_series(0, 9) i" >/dev/null
q "SELECT count(*) FROM generate_series(1, $ACTIVE) i, ds_task_step('t', 't' || i, 'email', '{}') r" >/dev/null
psql_db -c "VACUUM ANALYZE" -c "CHECKPOINT"
echo "history: $(q "SELECT count(*) FROM durable_steps.steps") steps ($(q "SELECT pg_size_pretty(pg_total_relation_size('durable_steps.steps'))")), $(q "SELECT count(*) FROM durable_steps.attempts") attempt rows, $(q "SELECT count(*) FROM ds_steps WHERE status IN ('blocked', 'failed')") needing a person; filled in $(( $(date +%s) - t0 )) s"

# ---- the console, on its own ---------------------------------------------------------------------
cport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DS_CONSOLE_USER=bench DS_CONSOLE_PASSWORD=bench node "$MAIN" --port "$cport" \
	--database-url "postgresql://postgres@/bench?host=$WORK&port=$PORT" >"$WORK/console.log" 2>&1 &
CONSOLE_PID=$!
for _ in $(seq 1 100); do
	grep -q 'http://' "$WORK/console.log" 2>/dev/null && break
	sleep 0.1
done
grep -q 'http://' "$WORK/console.log" || die "the console did not start: $(cat "$WORK/console.log")"

# ---- the rounds ------------------------------------------------------------------------------------
REPS=$REPS URL="http://127.0.0.1:$cport" node --input-type=module -e '
const reps = Number(process.env.REPS);
const auth = "Basic " + Buffer.from("bench:bench").toString("base64");
const pages = { overview: "/", inbox: "/inbox" };
const times = Object.fromEntries(Object.keys(pages).map((p) => [p, []]));
for (let i = 0; i < reps + 5; i++) {
    for (const [name, path] of Object.entries(pages)) {
        const t = performance.now();
        const r = await fetch(process.env.URL + path, { headers: { Authorization: auth } });
        const body = await r.text();
        const ms = performance.now() - t;
        if (r.status !== 200 || body.length < 1000) {
            throw new Error(`${path}: ${r.status} ${body.slice(0, 200)}`);
        }
        if (i >= 5) {
            times[name].push(ms);    // the first five warm the plans and the caches
        }
    }
}
const q = (xs, p) => xs[Math.min(xs.length - 1, Math.ceil(p * xs.length) - 1)];
for (const [name, xs] of Object.entries(times)) {
    xs.sort((a, b) => a - b);
    const p95 = q(xs, 0.95);
    console.log(`${name}: median ${q(xs, 0.5).toFixed(2)} ms, p95 ${p95.toFixed(2)} ms, max ${xs[xs.length - 1].toFixed(2)} ms over ${xs.length} requests (target p95 <= 100 ms: ${p95 <= 100 ? "met" : "MISSED"})`);
}
'
