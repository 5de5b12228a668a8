#!/usr/bin/env bash
# tasks_bench.sh -- tasks (steps whose body is application code, docs/tasks.md) run by the Node
# and Python workers of durable_steps, against graphile-worker 0.17.3 and pg-boss 10.4.2, on one
# throwaway cluster, same settings, same concurrency, one invocation.
#
#   bench/tasks_bench.sh [port]
#
# 1. Drain. N no-op tasks are stored beforehand (one transaction; no worker running), the table
#    is vacuumed and checkpointed, the worker process is started and has loaded its library
#    (pg-boss: boss.start() too), then the start counters are taken and a line "go" starts its
#    worker; the end is the first check (every DRAIN_POLL_MS, from one persistent psql session)
#    that finds no task left. One system runs at a time, ROUNDS rounds, the systems interleaved.
#      ds   durable_steps' Node worker (clients/node, built): new Worker({pool, concurrency: CONC,
#           tasks: {noop: async () => {}}}), pool max CONC + 2; tasks stored with
#           ds_task_step(run, 's<i>', 'noop')
#      gw   graphile-worker 0.17.3, run({concurrency: CONC, taskList: {noop}}), once per entry of
#           GW_CONFIGS: "default" (nothing else set: pollInterval 2000, preparedStatements true,
#           no local queue, no completion batching, maxPoolSize 10) and "LQ:DELAY" (0.17's
#           batching: preset.worker.localQueue.size LQ, completeJobBatchDelay = failJobBatchDelay
#           = DELAY ms; maxPoolSize CONC + 2); jobs added with graphile_worker.add_jobs
#      pb   pg-boss 10.4.2: CONC boss.work('noop', {batchSize, pollingIntervalSeconds: 0.5})
#           loops (pg-boss 10 has no teamSize: one loop per work() call, each runs one batch
#           handler at a time), once per batchSize of PB_BATCHES; jobs inserted into pgboss.job
#      py   durable_steps' Python worker (clients/python, psycopg2 from python3-psycopg2):
#           Worker(dsn, concurrency=CONC), @worker.task('noop'), worker.run()
#    Per run: tasks/s; CPU ms per task of the cluster's processes (the postmaster and all its
#    children: backends, the durable_steps background workers, the checker) and of the worker
#    process (utime + stime from /proc/<pid>/stat, all threads), given apart and summed; WAL
#    bytes per task (pg_current_wal_lsn); and the share of the machine other programs used.
#    Target: the durable_steps Node worker's mean >= 1.5x the best peer's mean (the best of the
#    graphile-worker and pg-boss configurations).
# 2. Latency. Each system's worker idles (LAT_IDLE_S seconds after it started); one psql
#    session then stores LAT_SAMPLES tasks one at a time, each in its own transaction: the task
#    (input {"i": i}), then INSERT INTO tb_enq (clock_timestamp() in ms), then COMMIT, then a random
#    gap of LAT_GAP_MIN_MS..LAT_GAP_MAX_MS. The handler records its start with the wall clock
#    (Node: performance.timeOrigin + performance.now(); Python: time.time()) in memory; the
#    worker writes them to a file when it stops. The server and the worker run on this machine and
#    read the same clock (CLOCK_REALTIME), so the latency is start - enqueue: it begins just before
#    COMMIT (the commit's WAL flush is inside it) and ends when the handler starts. The same method
#    for every system. graphile-worker runs its default configuration (LISTEN/NOTIFY), pg-boss
#    batchSize LAT_PB_BATCH (it polls: no notification in pg-boss 10). p50, p90, p99, max.
#    Targets for durable_steps' Node worker: p50 <= 2 ms, p99 <= 10 ms.
#
# Starts a private, throwaway PostgreSQL cluster (bench/lib.sh: initdb in a mktemp directory, Unix
# socket in it, listen_addresses = '', durable_steps preloaded, synchronous_commit = on, fsync =
# on, shared_buffers = 256MB, max_wal_size 4GB, autovacuum off: VACUUM runs before every measured
# run); stops it and removes the directory on exit. It builds nothing: `make install` the extension
# and build the Node client (cd clients/node && npm ci && npm run build) first. npm installs
# bench/graphile and bench/pgboss when their node_modules are missing.
# Environment (defaults in brackets):
#
#   BENCH_PORT     [5540]   port (the first argument wins); names the socket file only
#   N              [20000]  tasks per drain
#   CONC           [10]     concurrency of every system
#   ROUNDS         [2]      drain rounds
#   SYSTEMS        [ds gw pb py]  which systems, in this order
#   GW_CONFIGS     [default 1000:0 5000:0]  graphile-worker drains
#   PB_BATCHES     [100 1000]  pg-boss drains: batchSize of each of the CONC loops
#   LAT_SAMPLES    [500]    latency samples per system;  LAT_GAP_MIN_MS, LAT_GAP_MAX_MS [5, 25]
#   LAT_IDLE_S     [2]      idle seconds before the first latency sample
#   LAT_PB_BATCH   [100]    pg-boss batchSize in the latency run
#   DS_WORKERS     [2]      durable_steps.max_workers (the background worker: lost leases)
#   DRAIN_POLL_MS  [50]     how often the end of a drain is checked;  DRAIN_TIMEOUT [600] s
#   BENCH_PROFILE  [0]      1: preload pg_stat_statements (track all) and print the statements
#                           of each durable_steps drain by total time (its rates then carry the
#                           extension's overhead: compare them with nothing)
#   BENCH_OUT      []       a directory to copy raw results into (drain rows, latency samples)
#   BENCH_OS_USER  [postgres] the cluster's account when run as root
#   PG_CONFIG      [pg_config] which PostgreSQL;  PYTHON [/usr/bin/python3];  NPM [npm]
set -euo pipefail

PORT="${1:-${BENCH_PORT:-5540}}"
N="${N:-20000}"
CONC="${CONC:-10}"
ROUNDS="${ROUNDS:-2}"
SYSTEMS="${SYSTEMS:-ds gw pb py}"
GW_CONFIGS="${GW_CONFIGS:-default 1000:0 5000:0}"
PB_BATCHES="${PB_BATCHES:-100 1000}"
LAT_SAMPLES="${LAT_SAMPLES:-500}"
LAT_GAP_MIN_MS="${LAT_GAP_MIN_MS:-5}"
LAT_GAP_MAX_MS="${LAT_GAP_MAX_MS:-25}"
LAT_IDLE_S="${LAT_IDLE_S:-2}"
LAT_PB_BATCH="${LAT_PB_BATCH:-100}"
DS_WORKERS="${DS_WORKERS:-2}"
DRAIN_POLL_MS="${DRAIN_POLL_MS:-50}"
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-600}"
PROFILE="${BENCH_PROFILE:-0}"
OUT="${BENCH_OUT:-}"
PG_CONFIG="${PG_CONFIG:-pg_config}"
PYTHON="${PYTHON:-/usr/bin/python3}"
NPM="${NPM:-npm}"

DB=bench
TARGET_RATIO=1.5
TARGET_P50=2
TARGET_P99=10

die() { echo "tasks_bench: $*" >&2; exit 1; }
note() { echo "tasks_bench: $*" >&2; }

for v in PORT N CONC ROUNDS LAT_SAMPLES LAT_IDLE_S LAT_PB_BATCH DS_WORKERS DRAIN_POLL_MS DRAIN_TIMEOUT; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not '${!v}'"
done
[[ "$LAT_GAP_MIN_MS" =~ ^[0-9]+$ && "$LAT_GAP_MAX_MS" =~ ^[0-9]+$ ]] && ((LAT_GAP_MIN_MS <= LAT_GAP_MAX_MS)) ||
	die "LAT_GAP_MIN_MS <= LAT_GAP_MAX_MS, both integers"
[[ "$PROFILE" =~ ^[01]$ ]] || die "BENCH_PROFILE must be 0 or 1"
((PORT < 5470 || PORT > 5499)) || die "ports 5470-5499 are used by others on this machine; pick another"
for s in $SYSTEMS; do
	[[ "$s" == ds || "$s" == gw || "$s" == pb || "$s" == py ]] || die "SYSTEMS: ds, gw, pb, py, not '$s'"
done
for c in $GW_CONFIGS; do
	[[ "$c" == default || "$c" =~ ^-?[0-9]+:-?[0-9]+$ ]] || die "GW_CONFIGS: default or LQ:DELAY, not '$c'"
done
for b in $PB_BATCHES; do [[ "$b" =~ ^[1-9][0-9]*$ ]] || die "PB_BATCHES: positive integers, not '$b'"; done
has() { [[ " $SYSTEMS " == *" $1 "* ]]; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v "$PG_CONFIG" >/dev/null || die "$PG_CONFIG not found (set PG_CONFIG)"
BINDIR="$("$PG_CONFIG" --bindir)"
for prog in initdb pg_ctl psql; do
	[[ -x "$BINDIR/$prog" ]] || die "$BINDIR/$prog not found"
done
[[ -f "$("$PG_CONFIG" --sharedir)/extension/durable_steps.control" ]] ||
	die "durable_steps is not installed in $("$PG_CONFIG" --sharedir); run 'make install' first"
if has ds || has gw || has pb; then
	command -v node >/dev/null || die "node is needed (or SYSTEMS=py)"
fi
if has ds; then
	[[ -f "$HERE/../clients/node/dist/cjs/index.js" && -f "$HERE/../clients/node/node_modules/pg/package.json" ]] ||
		die "build the Node client first: cd clients/node && npm ci && npm run build"
fi
if has py; then
	"$PYTHON" -c 'import psycopg2' 2>/dev/null || die "$PYTHON has no psycopg2 (apt-get install python3-psycopg2)"
fi
need_npm() { # dir module
	if [[ ! -f "$HERE/$1/node_modules/$2/package.json" ]]; then
		note "installing $2 into bench/$1 (npm install)"
		(cd "$HERE/$1" && "$NPM" install --no-audit --no-fund >/dev/null) || die "npm install failed in bench/$1"
	fi
	node -p "require('$HERE/$1/node_modules/$2/package.json').version"
}
GW_VERSION=-
PB_VERSION=-
if has gw; then
	GW_VERSION="$(need_npm graphile graphile-worker)"
	[[ "$GW_VERSION" == 0.17.3 ]] || note "graphile-worker is $GW_VERSION, not 0.17.3"
fi
if has pb; then
	PB_VERSION="$(need_npm pgboss pg-boss)"
	[[ "$PB_VERSION" == 10.4.2 ]] || note "pg-boss is $PB_VERSION, not 10.4.2"
fi

BENCH_NAME=tasks_bench # read by lib.sh
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_workdir
WPID=
WIN=
POLLER_PID=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ -n "$WPID" ]] && kill -0 "$WPID" 2>/dev/null; then
		kill "$WPID" 2>/dev/null || true
		wait "$WPID" 2>/dev/null || true
	fi
	bench_stop "$rc"
	if [[ -n "$OUT" && -d "$WORK/out" ]]; then
		{ mkdir -p "$OUT" && cp -r "$WORK/out/." "$OUT/" && cp "$LOG" "$OUT/server.log"; } 2>/dev/null || true
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$WORK/out"
chmod 777 "$WORK/out"

# --- the cluster ----------------------------------------------------------------------------
bench_initdb C
PRELOAD=durable_steps
((PROFILE == 0)) || PRELOAD="durable_steps, pg_stat_statements"
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = '$PRELOAD'
durable_steps.database = '$DB'
durable_steps.max_workers = $DS_WORKERS
max_worker_processes = 24
max_wal_size = 4GB
autovacuum = off
log_line_prefix = '%m [%p] '
EOF
((PROFILE == 0)) || echo "pg_stat_statements.track = all" >>"$PGDATA_DIR/postgresql.conf"
bench_start

psql_db() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d "$DB" "$@"; }
q() { psql_db -At -F ' ' -c "$1"; }
"$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE $DB"
psql_db -c "CREATE EXTENSION durable_steps"
((PROFILE == 0)) || psql_db -c "CREATE EXTENSION pg_stat_statements"
no_crash() {
	if grep -q "terminated by signal" "$LOG"; then
		grep -B2 -A3 -m1 "terminated by signal" "$LOG" >&2
		die "a server process crashed during $1"
	fi
}

CONN="postgres:///$DB?host=$WORK&port=$PORT&user=postgres"
DSN="host=$WORK port=$PORT dbname=$DB user=postgres"
psql_db <<'EOF'
SET client_min_messages = warning;
CREATE TABLE tb_enq (sys text, i int, t float8);      -- enqueue: clock_timestamp() in ms
CREATE TABLE tb_start (sys text, i int, t float8);    -- handler start: wall clock in ms
EOF
if has gw; then
	(cd "$HERE/graphile" && GW_CONNECTION="$CONN" node drain.js migrate) || die "graphile-worker migration failed"
fi
if has pb; then
	(cd "$HERE/pgboss" && PB_CONNECTION="$CONN" PB_QUEUE=noop node boss.js migrate >/dev/null) ||
		die "pg-boss migration failed"
fi

LIB="$("$PG_CONFIG" --pkglibdir)/durable_steps.so"
SHORT_COMMIT="$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "durable_steps tasks benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "command:    $(printf '%q ' "$0" "$@")"
echo "env:        N=$N CONC=$CONC ROUNDS=$ROUNDS SYSTEMS='$SYSTEMS' GW_CONFIGS='$GW_CONFIGS' PB_BATCHES='$PB_BATCHES'"
echo "            LAT_SAMPLES=$LAT_SAMPLES LAT_GAP=${LAT_GAP_MIN_MS}..${LAT_GAP_MAX_MS}ms DS_WORKERS=$DS_WORKERS BENCH_PROFILE=$PROFILE"
echo "machine:    $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo) RAM ($(uname -srm)); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "postgres:   $(q "SELECT version()")"
echo "extension:  $LIB ($(date -u -r "$LIB" '+%Y-%m-%d %H:%M:%S UTC'), md5 $(md5sum <"$LIB" | cut -c1-12)); repo HEAD $SHORT_COMMIT"
echo "versions:   node $(node --version 2>/dev/null || echo -), graphile-worker $GW_VERSION, pg-boss $PB_VERSION," \
	"python $("$PYTHON" -c 'import sys, psycopg2; print(sys.version.split()[0], "psycopg2", psycopg2.__version__.split()[0])' 2>/dev/null || echo -)"
echo "settings:   $(q "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'wal_sync_method',
	'max_wal_size', 'autovacuum', 'durable_steps.max_workers', 'durable_steps.poll_interval')")"
echo

# --- systems --------------------------------------------------------------------------------
sys_name() {
	case "$1" in
	ds) echo "durable_steps Node" ;; py) echo "durable_steps Python" ;;
	gw) echo "graphile-worker" ;; pb) echo "pg-boss" ;;
	esac
}
# the SQL that stores tasks i = lo..hi of run $2 in one statement (drain)
fill_sql() { # sys run n
	case "$1" in
	# (a transaction holds a lock per step it stores: 2,000 a transaction)
	ds | py) echo "DO \$\$ BEGIN FOR b IN 0..($3 - 1) / 2000 LOOP
			PERFORM ds_task_step('$2', 's' || i, 'noop') FROM generate_series(b * 2000 + 1, least($3, (b + 1) * 2000)) i;
			COMMIT; END LOOP; END \$\$; SELECT count(*) FROM durable_steps.steps WHERE run_id = '$2'" ;;
	gw) echo "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
			SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
			FROM generate_series(1, $3)))" ;;
	pb) echo "INSERT INTO pgboss.job (name, data, policy) SELECT 'noop', '{}'::jsonb, 'standard'
			FROM generate_series(1, $3)" ;;
	esac
}
# one task of the latency run, input {"i": i} (PL/pgSQL, i is the loop variable)
one_sql() { # sys
	case "$1" in
	ds | py) echo "PERFORM ds_task_step('lat-$1', 'l' || i, 'noop', jsonb_build_object('i', i));" ;;
	gw) echo "PERFORM graphile_worker.add_job('noop', json_build_object('i', i));" ;;
	pb) echo "INSERT INTO pgboss.job (name, data, policy) VALUES ('noop', jsonb_build_object('i', i), 'standard');" ;;
	esac
}
# true when nothing is left to run
done_sql() { # sys
	case "$1" in
	ds | py) echo "NOT EXISTS (SELECT 1 FROM durable_steps.steps WHERE next_attempt_at IS NOT NULL AND task IS NOT NULL)" ;;
	gw) echo "NOT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)" ;;
	pb) echo "NOT EXISTS (SELECT 1 FROM pgboss.job WHERE name = 'noop' AND state < 'completed')" ;;
	esac
}
vacuum_sql() { # sys
	case "$1" in
	ds | py) echo "VACUUM ANALYZE durable_steps.steps" ;;
	gw) echo "VACUUM ANALYZE graphile_worker._private_jobs" ;;
	pb) echo "VACUUM ANALYZE pgboss.job" ;;
	esac
}

# start_worker sys config starts_file: the process is loaded ("ready"), its worker not started
start_worker() {
	local sys="$1" cfg="$2" starts="$3" i
	rm -f "$WORK/w.in" && mkfifo "$WORK/w.in"
	: >"$WORK/w.out"
	: >"$WORK/w.err"
	case "$sys" in
	ds) TB_CONNECTION="$CONN" TB_CONCURRENCY="$CONC" TB_STARTS="$starts" \
		node "$HERE/tasks/worker.js" ds <"$WORK/w.in" >"$WORK/w.out" 2>"$WORK/w.err" & ;;
	gw) TB_CONNECTION="$CONN" TB_CONCURRENCY="$CONC" TB_STARTS="$starts" TB_GW_CONFIG="$cfg" \
		node "$HERE/tasks/worker.js" gw <"$WORK/w.in" >"$WORK/w.out" 2>"$WORK/w.err" & ;;
	pb) TB_CONNECTION="$CONN" TB_CONCURRENCY="$CONC" TB_STARTS="$starts" TB_PB_LOOPS="$CONC" TB_PB_BATCH="$cfg" \
		node "$HERE/tasks/worker.js" pb <"$WORK/w.in" >"$WORK/w.out" 2>"$WORK/w.err" & ;;
	py) TB_DSN="$DSN" TB_CONCURRENCY="$CONC" TB_STARTS="$starts" \
		"$PYTHON" "$HERE/tasks/worker.py" <"$WORK/w.in" >"$WORK/w.out" 2>"$WORK/w.err" & ;;
	esac
	WPID=$!
	exec {WIN}>"$WORK/w.in"
	for ((i = 0; i < 600; i++)); do
		grep -q '^ready' "$WORK/w.out" && return 0
		sleep 0.05
	done
	die "$(sys_name "$sys") did not start: $(cat "$WORK/w.err")"
}
go_worker() { echo go >&"$WIN"; }
wait_started() {
	local i
	for ((i = 0; i < 600; i++)); do
		grep -q '^started' "$WORK/w.out" && return 0
		sleep 0.05
	done
	die "the worker did not start: $(cat "$WORK/w.err")"
}
stop_worker() { # sys
	echo stop >&"$WIN"
	exec {WIN}>&-
	wait "$WPID" || die "$(sys_name "$1") failed: $(cat "$WORK/w.err")"
	WPID=
	if [[ -s "$WORK/w.err" ]]; then
		note "$(sys_name "$1") said:"
		sed 's/^/    /' "$WORK/w.err" | head -20 >&2
	fi
}

HZ="$(getconf CLK_TCK)"
NCPU="$(nproc)"
machine_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# "pid ticks" of the cluster's processes (the postmaster and its children)
server_ticks() {
	local pm p
	pm="$(head -n 1 "$PGDATA_DIR/postmaster.pid")"
	for p in "$pm" $(pgrep -P "$pm"); do
		awk -v p="$p" '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print p, f[12] + f[13] }' \
			"/proc/$p/stat" 2>/dev/null || true
	done
}
proc_ticks() { awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
ticks_between() { awk 'NR == FNR { a[$1] = $2; next } { d += $2 - ($1 in a ? a[$1] : 0) } END { print d + 0 }' "$1" "$2"; }

poller_start() {
	coproc POLLER { exec "$BINDIR/psql" -X -q -At -F ' ' -h "$WORK" -p "$PORT" -U postgres -d "$DB" 2>&1; }
	echo "SET enable_seqscan = off; SELECT 'ok';" >&"${POLLER[1]}"
	local line
	read -r -t 10 line <&"${POLLER[0]}" || die "the polling session did not answer"
	[[ "$line" == ok ]] || die "the polling session said: $line"
}
poller_ask() {
	local line
	echo "$1" >&"${POLLER[1]}"
	read -r -t 60 line <&"${POLLER[0]}" || die "the polling session did not answer"
	echo "$line"
}
poller_stop() {
	echo '\q' >&"${POLLER[1]}"
	wait "$POLLER_PID" 2>/dev/null || true
	POLLER_PID=
}

# --- drain ----------------------------------------------------------------------------------
: >"$WORK/out/drain.csv"
drain_one() { # sys config round label
	local sys="$1" cfg="$2" r="$3" label="$4" run n lsn0 lsn1 t0 t1 m0 m1 w0 w1 ans fin deadline sleep_s srv wrk
	run="drain-$sys-${cfg//:/_}-$r"
	n="$(psql_db -At <<<"$(fill_sql "$sys" "$run" "$N")" | tail -n 1)"
	[[ "$sys" == pb ]] && n=$N
	((n == N)) || die "$label: stored $n of $N"
	psql_db -c "$(vacuum_sql "$sys")" -c "CHECKPOINT"
	((PROFILE == 0)) || q "SELECT pg_stat_statements_reset()" >/dev/null
	start_worker "$sys" "$cfg" ""
	poller_start
	server_ticks >"$WORK/ticks0"
	w0="$(proc_ticks "$WPID")"
	m0="$(machine_busy_ticks)"
	read -r lsn0 t0 <<<"$(poller_ask "SELECT pg_current_wal_lsn(), extract(epoch FROM clock_timestamp());")"
	go_worker
	deadline=$((SECONDS + DRAIN_TIMEOUT))
	sleep_s="$(awk -v m="$DRAIN_POLL_MS" 'BEGIN { printf "%.3f", m / 1000 }')"
	while :; do
		sleep "$sleep_s"
		ans="$(poller_ask "SELECT ($(done_sql "$sys"))::int, extract(epoch FROM clock_timestamp()), pg_current_wal_lsn();")"
		read -r fin t1 lsn1 <<<"$ans"
		[[ "$fin" == 1 || "$fin" == 0 ]] || die "$label: unexpected poll answer '$ans'"
		((fin == 1)) && break
		((SECONDS < deadline)) || die "$label: not drained after ${DRAIN_TIMEOUT}s"
	done
	server_ticks >"$WORK/ticks1"
	w1="$(proc_ticks "$WPID")"
	m1="$(machine_busy_ticks)"
	poller_stop
	stop_worker "$sys"
	no_crash "$label"
	case "$sys" in
	ds | py) ans="$(q "SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1) FROM durable_steps.steps WHERE run_id = '$run'")" ;;
	pb) ans="$(q "SELECT count(*) FROM pgboss.job WHERE name = 'noop' AND state = 'completed'")"; ans=$((ans - PB_DONE)); PB_DONE=$((PB_DONE + ans)) ;;
	gw) ans="$N" ;; # graphile-worker deletes what it finished; the table is empty (checked)
	esac
	((ans == N)) || die "$label: $ans of $N tasks succeeded once"
	srv="$(ticks_between "$WORK/ticks0" "$WORK/ticks1")"
	wrk=$((w1 - w0))
	awk -v l="$label" -v s="$sys" -v c="$cfg" -v r="$r" -v n="$N" -v t0="$t0" -v t1="$t1" -v srv="$srv" -v wrk="$wrk" \
		-v m="$((m1 - m0))" -v hz="$HZ" -v nc="$NCPU" -v wal="$(q "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")" 'BEGIN {
		secs = t1 - t0; o = (m - srv - wrk) / (secs * hz * nc) * 100
		printf "%s,%s,%s,%s,%.3f,%.0f,%.4f,%.4f,%.4f,%.0f,%.0f\n", l, s, c, r, secs, n / secs,
			srv * 1000 / hz / n, wrk * 1000 / hz / n, (srv + wrk) * 1000 / hz / n, wal / n, (o < 0) ? 0 : o
	}' >>"$WORK/out/drain.csv"
	tail -n 1 "$WORK/out/drain.csv" | awk -F, '{ printf "  %-36s round %s: %6.2f s %8s tasks/s  cpu ms/task server %s worker %s sum %s  WAL %s B/task  other %s%%\n", $1, $4, $5, $6, $7, $8, $9, $10, $11 }'
	if ((PROFILE == 1)) && [[ "$sys" == ds || "$sys" == py ]]; then
		psql_db -c "SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
			round(mean_exec_time::numeric, 3) AS mean_ms, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS query
			FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8"
	fi
}

PB_DONE=0
configs_of() { # sys
	case "$1" in
	ds | py) echo "-" ;;
	gw) echo "$GW_CONFIGS" ;;
	pb) echo "$PB_BATCHES" ;;
	esac
}
label_of() { # sys config
	case "$1" in
	ds | py) echo "$(sys_name "$1") conc $CONC" ;;
	gw) if [[ "$2" == default ]]; then echo "graphile-worker default conc $CONC"
	    else echo "graphile-worker conc $CONC lq ${2%%:*} delay ${2##*:}"; fi ;;
	pb) echo "pg-boss $CONC loops x batch $2" ;;
	esac
}

echo "== drain: $N no-op tasks stored beforehand, concurrency $CONC, $ROUNDS rounds"
for ((r = 1; r <= ROUNDS; r++)); do
	for sys in $SYSTEMS; do
		for cfg in $(configs_of "$sys"); do
			drain_one "$sys" "$cfg" "$r" "$(label_of "$sys" "$cfg")"
		done
	done
done
echo

# --- latency --------------------------------------------------------------------------------
: >"$WORK/out/latency.csv"
latency_one() { # sys
	local sys="$1" cfg="-" deadline starts
	[[ "$sys" == gw ]] && cfg=default
	[[ "$sys" == pb ]] && cfg="$LAT_PB_BATCH"
	starts="$WORK/out/starts-$sys.csv"
	psql_db -c "$(vacuum_sql "$sys")" -c "CHECKPOINT"
	start_worker "$sys" "$cfg" "$starts"
	go_worker
	wait_started
	sleep "$LAT_IDLE_S"
	PGAPPNAME=tasks_bench_producer psql_db -c "DO \$do\$
BEGIN
	FOR i IN 1..$LAT_SAMPLES LOOP
		$(one_sql "$sys")
		INSERT INTO tb_enq VALUES ('$sys', i, extract(epoch FROM clock_timestamp()) * 1000);
		COMMIT;
		PERFORM pg_sleep(($LAT_GAP_MIN_MS + random() * ($LAT_GAP_MAX_MS - $LAT_GAP_MIN_MS)) / 1000.0);
	END LOOP;
END
\$do\$" || die "the latency producer failed"
	deadline=$((SECONDS + 60))
	until [[ "$(q "SELECT ($(done_sql "$sys"))::int")" == 1 ]]; do
		((SECONDS < deadline)) || die "$(sys_name "$sys"): latency tasks not done after 60 s"
		sleep 0.2
	done
	stop_worker "$sys"
	no_crash "latency $sys"
	psql_db -c "\\copy tb_start (i, t) FROM '$starts' WITH (FORMAT csv)" -c "UPDATE tb_start SET sys = '$sys' WHERE sys IS NULL"
	q "SELECT '$sys', count(s.t), count(*),
		round(percentile_cont(0.5) WITHIN GROUP (ORDER BY s.t - e.t)::numeric, 2),
		round(percentile_cont(0.9) WITHIN GROUP (ORDER BY s.t - e.t)::numeric, 2),
		round(percentile_cont(0.99) WITHIN GROUP (ORDER BY s.t - e.t)::numeric, 2),
		round(max(s.t - e.t)::numeric, 2), round(min(s.t - e.t)::numeric, 2)
		FROM tb_enq e LEFT JOIN tb_start s USING (sys, i) WHERE e.sys = '$sys'" | tr ' ' ',' >>"$WORK/out/latency.csv"
	tail -n 1 "$WORK/out/latency.csv" | awk -F, -v n="$(sys_name "$sys")" '{
		printf "  %-22s %s of %s started; p50 %s ms, p90 %s, p99 %s, max %s (min %s)\n", n, $2, $3, $4, $5, $6, $7, $8 }'
}
echo "== latency: $LAT_SAMPLES tasks, one per transaction, gaps ${LAT_GAP_MIN_MS}..${LAT_GAP_MAX_MS} ms, on an idle worker"
for sys in $SYSTEMS; do
	latency_one "$sys"
done
echo

# --- summary --------------------------------------------------------------------------------
echo "summary (load average now $(cut -d' ' -f1-3 /proc/loadavg)); $(nproc) CPUs; concurrency $CONC everywhere"
printf '%-38s %-18s %9s %9s %9s %9s %8s %7s\n' "drain ($N tasks)" "tasks/s by round" "mean/s" "cpu srv" "cpu wrk" "cpu sum" "WAL B" "other%"
awk -F, '{ k = $1; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
	rates[k] = rates[k] (rates[k] == "" ? "" : ", ") $6; sum[k] += $6; cnt[k]++
	if (!(k in lo) || $9 < lo[k]) lo[k] = $9; if (!(k in hi) || $9 > hi[k]) hi[k] = $9
	srv[k] += $7; wrk[k] += $8; cpu[k] += $9; wal[k] += $10; oth[k] += $11 }
	END { for (j = 1; j <= nk; j++) { k = order[j]
		printf "%-38s %-18s %9.0f %9.4f %9.4f %9.4f %8.0f %7.0f\n", k, rates[k], sum[k] / cnt[k], srv[k] / cnt[k],
			wrk[k] / cnt[k], cpu[k] / cnt[k], wal[k] / cnt[k], oth[k] / cnt[k] } }' "$WORK/out/drain.csv"
echo "(cpu: ms per task, means over the rounds: srv the cluster's processes, wrk the worker process;"
echo " WAL: bytes per task; other%: the machine's CPU used by other programs meanwhile)"
if has ds && { has gw || has pb; }; then
	read -r ds_mean best_peer best_label <<<"$(awk -F, '{ sum[$1] += $6; cnt[$1]++; sys[$1] = $2 }
		END { for (k in sum) { m = sum[k] / cnt[k]
			if (sys[k] == "ds") d = m; else if ((sys[k] == "gw" || sys[k] == "pb") && m > b) { b = m; bl = k } }
			gsub(/ /, "_", bl); printf "%.0f %.0f %s\n", d, b, bl }' "$WORK/out/drain.csv")"
	ratio="$(awk -v a="$ds_mean" -v b="$best_peer" 'BEGIN { printf "%.2f", a / b }')"
	echo "drain: durable_steps Node $ds_mean tasks/s = ${ratio}x the best peer (${best_label//_/ }, $best_peer tasks/s); target >= ${TARGET_RATIO}x:" \
		"$(awk -v r="$ratio" -v t="$TARGET_RATIO" 'BEGIN { print (r >= t) ? "MET" : "MISSED" }')"
fi
printf '%-22s %8s %8s %8s %8s\n' "latency (ms)" p50 p90 p99 max
while IFS=, read -r s _ _ p50 p90 p99 mx _; do
	printf '%-22s %8s %8s %8s %8s\n' "$(sys_name "$s")" "$p50" "$p90" "$p99" "$mx"
	if [[ "$s" == ds ]]; then
		echo "  durable_steps Node target p50 <= $TARGET_P50 ms, p99 <= $TARGET_P99 ms:" \
			"$(awk -v a="$p50" -v b="$p99" -v x="$TARGET_P50" -v y="$TARGET_P99" 'BEGIN { print (a <= x && b <= y) ? "MET" : "MISSED" }')"
	fi
done <"$WORK/out/latency.csv"
echo "(latency: clock_timestamp() just before the enqueue's COMMIT -> the handler's start, same clock)"
