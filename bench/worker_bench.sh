#!/usr/bin/env bash
# worker_bench.sh -- benchmarks of the durable_steps background worker (see bench/WORKER.md).
#
#   bench/worker_bench.sh [drain|latency|memory|all] [port]
#
#   drain    DRAIN_STEPS due no-op SQL steps drained by the worker (durable_steps.max_workers =
#            DS_WORKERS), once per batch size of DS_BATCH_SIZES; then as many no-op jobs drained
#            by graphile-worker 0.17.3 (bench/graphile, npm-installed there when missing), once
#            per configuration of GW_CONFIGS -- same cluster, same settings, same measuring code.
#            Per run: steps per second, commits per step (pg_stat_database.xact_commit), WAL bytes
#            per step (pg_current_wal_lsn), WAL fsyncs per step (pg_stat_wal), CPU per step of the
#            measured processes, and the share of the machine other programs used meanwhile.
#            Target: best durable_steps rate >= 1.5 x best graphile-worker rate. Then one "cold"
#            durable_steps drain: empty tables before it (no history rows, as after CREATE
#            EXTENSION), batch_size DRAIN_COLD_BATCH (the setting's default); see WORKER.md.
#   latency  LAT_SAMPLES steps made due, one at a time, by a committed client transaction;
#            commit-to-start latency of the worker's attempt. Target: p50 <= 5 ms, p99 <= 50 ms.
#   memory   MEM_STEPS no-op steps through one executor (max_workers = 1), in chunks; the
#            executor's RSS / PSS / private / anonymous memory after each chunk. Target: after
#            MEM_STEPS within 10 MB of the size after MEM_FIRST.
#   all      the three, in this order (the default).
#
# Starts a private, throwaway PostgreSQL cluster (initdb in a mktemp directory, Unix socket in it,
# listen_addresses = '', durable_steps preloaded, synchronous_commit = on, fsync = on,
# shared_buffers = 256MB, autovacuum off: VACUUM runs between measured runs); stops it and removes
# the directory on exit. It builds nothing: run `make install` first. As root, the cluster runs as
# BENCH_OS_USER (default postgres) through runuser; otherwise as the current user.
# Environment (defaults in brackets):
#
#   BENCH_PORT      [5460]     port (the second argument wins); names the socket file only
#   DRAIN_STEPS     [100000]   steps / jobs per drain
#   DRAIN_COLD_STEPS [30000]   steps of the cold drain (0: none; its cost per step grows with it)
#   DRAIN_COLD_BATCH [default] durable_steps.batch_size of the cold drain
#   DS_WORKERS      [2]        durable_steps.max_workers for drain and latency
#   DS_BATCH_SIZES  [default]  durable_steps.batch_size values tried in the drain; "default"
#                              leaves the setting at the extension's default (1000): the
#                              target is met with the default settings
#   DS_HISTORY      [100000]   finished steps (with their attempts) present before each
#                              durable_steps run, as retention keeps them in a running system
#   DS_POLL_INTERVAL [1h]      durable_steps.poll_interval while steps are drained and during
#                              the latency run (see WORKER.md: the lost-attempt pass runs once
#                              per poll interval)
#   GW_CONFIGS      [2:1000:0 2:5000:0 4:5000:0 10:1000:0 10:5000:0]  graphile-worker runs, each
#                   concurrency:localQueue.size:completeJobBatchDelay (failJobBatchDelay = the
#                   same); localQueue.size is 0.17's job batching (-1 disables it)
#   DRAIN_ROUNDS    [2]        rounds over all drain configurations (interleaved)
#   DRAIN_POLL_MS   [100]      how often the end of a drain is checked
#   DRAIN_TIMEOUT   [1800]     seconds before a drain is declared stuck
#   LAT_SAMPLES     [1000]     latency samples;  LAT_GAP_MS [10] idle time after each sample
#   LAT_BATCH_SIZE  [default]  durable_steps.batch_size during the latency run
#   MEM_STEPS       [1000000]  steps through the single executor;  MEM_FIRST [10000] the first
#                   chunk (the baseline);  MEM_CHUNK [100000] later chunks
#   MEM_BATCH_SIZE  [500]      durable_steps.batch_size during the memory run
#   BENCH_PROFILE   [0]        1: also preload pg_stat_statements (track = all) and, after the
#                              drain, print the worker's statements by total time (a profile
#                              run: its throughput is not comparable with a run without it)
#   BENCH_WALDUMP   [0]        1: after each drain, print its WAL by record type and relation
#                              (pg_waldump --stats=record): where the WAL bytes per step go
#   BENCH_OUT       []         a directory to copy the raw results into (drain rows, latency
#                              samples, memory series, the server log)
#   BENCH_STRICT    [0]        1: exit with status 3 when a target is missed
#   BENCH_OS_USER   [postgres] the account that runs the cluster when the script runs as root
#   PG_CONFIG       [pg_config] selects the PostgreSQL installation
#   NPM             [npm]      the npm used to install bench/graphile when node_modules is missing
set -euo pipefail

WHAT="${1:-all}"
PORT="${2:-${BENCH_PORT:-5460}}"
DRAIN_STEPS="${DRAIN_STEPS:-100000}"
DRAIN_COLD_STEPS="${DRAIN_COLD_STEPS:-30000}"
DRAIN_COLD_BATCH="${DRAIN_COLD_BATCH:-default}"
DS_WORKERS="${DS_WORKERS:-2}"
DS_BATCH_SIZES="${DS_BATCH_SIZES:-default}"
DS_HISTORY="${DS_HISTORY:-100000}"
DS_POLL="${DS_POLL_INTERVAL:-1h}"
GW_CONFIGS="${GW_CONFIGS:-2:1000:0 2:5000:0 4:5000:0 10:1000:0 10:5000:0}"
DRAIN_ROUNDS="${DRAIN_ROUNDS:-2}"
DRAIN_POLL_MS="${DRAIN_POLL_MS:-100}"
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-1800}"
LAT_SAMPLES="${LAT_SAMPLES:-1000}"
LAT_GAP_MS="${LAT_GAP_MS:-10}"
LAT_BATCH_SIZE="${LAT_BATCH_SIZE:-default}"
MEM_STEPS="${MEM_STEPS:-1000000}"
MEM_FIRST="${MEM_FIRST:-10000}"
MEM_CHUNK="${MEM_CHUNK:-100000}"
MEM_BATCH_SIZE="${MEM_BATCH_SIZE:-500}"
PROFILE="${BENCH_PROFILE:-0}"
WALDUMP="${BENCH_WALDUMP:-0}"
OUT="${BENCH_OUT:-}"
STRICT="${BENCH_STRICT:-0}"
PG_CONFIG="${PG_CONFIG:-pg_config}"
NPM="${NPM:-npm}"

DB=bench
DRAIN_TARGET=1.5
LAT_P50_MS=5
LAT_P99_MS=50
MEM_TARGET_MB=10
# the built-in retry policy (5 attempts, 1 s to 10 min, exponential x2, no jitter), in the
# steps table's columns
NOOP_POLICY_COLUMNS='retry_initial_delay, retry_max_delay, retry_multiplier, retry_jitter, retry_exponential'
NOOP_POLICY_VALUES='1000000, 600000000, 2, 0, true'

die() { echo "worker_bench: $*" >&2; exit 1; }
note() { echo "worker_bench: $*" >&2; }

case "$WHAT" in
drain | latency | memory | all) ;;
*) die "usage: $0 [drain|latency|memory|all] [port]" ;;
esac
for v in PORT DRAIN_STEPS DRAIN_COLD_STEPS DS_WORKERS DS_HISTORY DRAIN_ROUNDS DRAIN_POLL_MS \
	DRAIN_TIMEOUT LAT_SAMPLES LAT_GAP_MS MEM_STEPS MEM_FIRST MEM_CHUNK MEM_BATCH_SIZE \
	PROFILE STRICT WALDUMP; do
	[[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, not '${!v}'"
done
((PORT < 5470 || PORT > 5499)) || die "ports 5470-5499 are used by others on this machine; pick another"
((DRAIN_STEPS > 0 && DS_WORKERS > 0 && DS_WORKERS <= 16 && DRAIN_ROUNDS > 0 && DRAIN_POLL_MS > 0)) ||
	die "DRAIN_STEPS, DRAIN_ROUNDS, DRAIN_POLL_MS must be > 0 and DS_WORKERS in 1..16"
((LAT_SAMPLES > 0 && MEM_FIRST > 0 && MEM_CHUNK > 0 && MEM_STEPS >= MEM_FIRST)) ||
	die "LAT_SAMPLES, MEM_FIRST, MEM_CHUNK must be > 0 and MEM_STEPS >= MEM_FIRST"
for b in $DS_BATCH_SIZES $DRAIN_COLD_BATCH $LAT_BATCH_SIZE $MEM_BATCH_SIZE; do
	[[ "$b" == default ]] && continue
	if ! [[ "$b" =~ ^[0-9]+$ ]] || ((b < 1 || b > 10000)); then
		die "batch sizes must be 1..10000 or default, not '$b'"
	fi
done
for c in $GW_CONFIGS; do
	[[ "$c" =~ ^[0-9]+:-?[0-9]+:-?[0-9]+$ ]] || die "GW_CONFIGS entries are concurrency:localQueue:delay, not '$c'"
done
[[ "$DS_POLL" =~ ^[0-9]+(ms|s|min|h)?$ ]] || die "DS_POLL_INTERVAL must look like 1h, 1s or 500ms, not '$DS_POLL'"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v "$PG_CONFIG" >/dev/null || die "$PG_CONFIG not found (set PG_CONFIG)"
BINDIR="$("$PG_CONFIG" --bindir)"
for prog in initdb pg_ctl psql; do
	[[ -x "$BINDIR/$prog" ]] || die "$BINDIR/$prog not found"
done
[[ -f "$("$PG_CONFIG" --sharedir)/extension/durable_steps.control" ]] ||
	die "durable_steps is not installed in $("$PG_CONFIG" --sharedir); run 'make install' first"
GW_VERSION=
if [[ "$WHAT" == drain || "$WHAT" == all ]]; then
	command -v node >/dev/null || die "node is needed for the graphile-worker comparison"
	if [[ ! -f "$HERE/graphile/node_modules/graphile-worker/package.json" ]]; then
		note "installing graphile-worker into bench/graphile (npm install)"
		(cd "$HERE/graphile" && "$NPM" install --no-audit --no-fund >/dev/null) || die "npm install failed"
	fi
	GW_VERSION="$(node -p "require('$HERE/graphile/node_modules/graphile-worker/package.json').version")"
	[[ "$GW_VERSION" == 0.17.3 ]] || note "graphile-worker is $GW_VERSION, not 0.17.3"
fi

BENCH_NAME=worker_bench
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_workdir
NODE_PID=
POLLER_PID=

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ -n "$NODE_PID" ]] && kill -0 "$NODE_PID" 2>/dev/null; then
		kill "$NODE_PID" 2>/dev/null || true
		wait "$NODE_PID" 2>/dev/null || true
	fi
	if [[ -n "$POLLER_PID" ]] && kill -0 "$POLLER_PID" 2>/dev/null; then
		kill "$POLLER_PID" 2>/dev/null || true
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

# --- the cluster ----------------------------------------------------------------------------
PRELOAD=durable_steps
((PROFILE == 1)) && PRELOAD="durable_steps,pg_stat_statements"
bench_initdb C
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = '$PRELOAD'
durable_steps.database = '$DB'
durable_steps.max_workers = $DS_WORKERS
max_worker_processes = 24
max_wal_size = 4GB
# VACUUM runs between the measured runs, never inside one (the same for both systems)
autovacuum = off
log_line_prefix = '%m [%p] '
EOF
if ((PROFILE == 1)); then
	printf 'pg_stat_statements.track = all\npg_stat_statements.max = 1000\n' >>"$PGDATA_DIR/postgresql.conf"
fi

pg_restart() {
	as_cluster_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -l "$LOG" -m fast -w -t 60 restart >/dev/null ||
		die "the server did not restart"
}
bench_start

psql_db() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d "$DB" "$@"; }
q() { psql_db -At -F ' ' -c "$1"; }

"$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d postgres \
	-c "CREATE DATABASE $DB"
psql_db -c "CREATE EXTENSION durable_steps"
if ((PROFILE == 1)); then psql_db -c "CREATE EXTENSION pg_stat_statements"; fi

# A crashed server process invalidates every figure: stop with the evidence.
no_crash() {
	if grep -q "terminated by signal" "$LOG"; then
		grep -B2 -A3 -m1 "terminated by signal" "$LOG" >&2
		die "a server process crashed during $1 (the lines above; the whole log with BENCH_OUT)"
	fi
}

# the executors of the worker, by pid (waits for them after a start or restart)
worker_pids() {
	local want="$1" pids i
	for ((i = 0; i < 300; i++)); do
		pids="$(q "SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM pg_stat_activity
			WHERE backend_type = 'durable_steps worker'")"
		if [[ -n "$pids" ]] && (($(wc -w <<<"$pids") == want)); then
			echo "$pids"
			return 0
		fi
		sleep 0.1
	done
	die "expected $want durable_steps executors, found '${pids:-none}'"
}

set_workers() { # max_workers: a postmaster setting, so a restart when it changes
	local cur
	cur="$(q "SHOW durable_steps.max_workers")"
	if [[ "$cur" != "$1" ]]; then
		q "ALTER SYSTEM SET durable_steps.max_workers = $1" >/dev/null
		pg_restart
	fi
	worker_pids "$1" >/dev/null
}

# sighup settings. An executor reloads first thing when the signal wakes it, but the sleep that
# follows is still the old poll_interval (it is read before the reload), so a second signal
# makes sure the new one is in force.
set_sighup() { # name value [name value ...]; the value "default" resets the setting
	while (($#)); do
		if [[ "$2" == default ]]; then
			q "ALTER SYSTEM RESET $1" >/dev/null
		else
			q "ALTER SYSTEM SET $1 = '$2'" >/dev/null
		fi
		shift 2
	done
	q "SELECT pg_reload_conf()" >/dev/null
	sleep 0.3
	q "SELECT pg_reload_conf()" >/dev/null
	sleep 0.3
}

# Empty the extension's tables, then give them the finished history a running system has
# (retention keeps finished steps and their attempts for 7 days by default): steps that
# succeeded at their first attempt in the worker, which their own rows record (docs/internals.md, "Plans and writes"), and, for a tenth of them, a first attempt that failed, in the attempts table.
reset_durable() { # history_rows
	q "TRUNCATE durable_steps.steps, durable_steps.attempts, durable_steps.runs" >/dev/null
	if (($1 > 0)); then
		psql_db -c "INSERT INTO durable_steps.steps (run_id, step_id, kind, sql, fingerprint,
				max_attempts, $NOOP_POLICY_COLUMNS, attempt_base, attempts, on_timeout, owner, search_path, status, result,
				claimed_by, attempt_claimed_at, attempt_started_at, created_at, updated_at, finished_at)
			SELECT 'history', 's' || i, 'sql', 'SELECT 1', 'noop', 5, $NOOP_POLICY_VALUES, 0,
				CASE WHEN i % 10 = 0 THEN 2 ELSE 1 END, 'retry',
				'postgres'::regrole, '\"\$user\", public', 'succeeded', '1'::jsonb, 1,
				now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
				now() - interval '1 hour', now() - interval '1 hour'
			FROM generate_series(1, $1) i" \
			-c "INSERT INTO durable_steps.attempts (run_id, step_id, attempt, class, error_code, executor,
				backend_pid, role, claimed_at, started_at, finished_at)
			SELECT 'history', 's' || i, 1, 'retryable', 'P0001', 'worker', 1, 'postgres'::regrole,
				now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
			FROM generate_series(10, $1, 10) i"
	fi
	psql_db -c "VACUUM ANALYZE durable_steps.steps" -c "VACUUM ANALYZE durable_steps.attempts"
}

# Due no-op steps, written straight into the table as the superuser.
load_due() { # run_id first last
	psql_db -c "INSERT INTO durable_steps.steps (run_id, step_id, kind, sql, fingerprint,
			max_attempts, $NOOP_POLICY_COLUMNS, attempt_base, attempts, on_timeout, owner, search_path, status,
			next_attempt_at, created_at, updated_at)
		SELECT '$1', 's' || i, 'sql', 'SELECT 1', 'noop', 5, $NOOP_POLICY_VALUES, 0, 0, 'retry',
			'postgres'::regrole, '\"\$user\", public', 'pending', now(), now(), now()
		FROM generate_series($2, $3) i"
}

LIB="$("$PG_CONFIG" --pkglibdir)/durable_steps.so"
PG_VERSION="$(q "SELECT version()")"
SHORT_COMMIT="$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "durable_steps worker benchmark ($WHAT), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine:    $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo) RAM ($(uname -srm)); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "postgres:   $PG_VERSION"
echo "extension:  $LIB ($(date -u -r "$LIB" '+%Y-%m-%d %H:%M:%S UTC'), md5 $(md5sum <"$LIB" | cut -c1-12)); repo HEAD $SHORT_COMMIT"
echo "settings:   $(q "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'wal_sync_method',
	'max_wal_size', 'autovacuum', 'wal_level', 'full_page_writes')")"
echo

# --- measurement helpers --------------------------------------------------------------------

HZ="$(getconf CLK_TCK)"
NCPU="$(nproc)"
machine_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# "pid ticks" of the cluster's processes (the postmaster and its children) and the node worker
our_ticks() {
	local pm p
	pm="$(head -n 1 "$PGDATA_DIR/postmaster.pid")"
	for p in "$pm" $(pgrep -P "$pm") ${NODE_PID:+"$NODE_PID"}; do
		# utime and stime are the 14th and 15th fields; the command name may hold spaces
		awk -v p="$p" '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print p, f[12] + f[13] }' \
			"/proc/$p/stat" 2>/dev/null || true
	done
}
# ticks used between two our_ticks snapshots (processes started meanwhile count from zero)
ticks_between() { awk 'NR == FNR { a[$1] = $2; next } { d += $2 - ($1 in a ? a[$1] : 0) } END { print d + 0 }' "$1" "$2"; }

# A persistent psql session answers the end-of-drain check, so that polling costs no connection
# setup; its statements are counted and subtracted from the commits.
poller_start() {
	coproc POLLER { exec "$BINDIR/psql" -X -q -At -F ' ' -h "$WORK" -p "$PORT" -U postgres -d "$DB" 2>&1; }
	# index scans only: a sequential scan of a table full of finished rows would cost the
	# measured systems CPU at every poll
	echo "SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT 'ok';" >&"${POLLER[1]}"
	local line
	read -r -t 10 line <&"${POLLER[0]}" || die "the polling session did not answer"
	[[ "$line" == ok ]] || die "the polling session said: $line"
}
poller_ask() { # sql -> one line
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

# the counters a drain is measured by: "lsn xact_commit wal_sync checkpoints". WAL fsyncs are
# pg_stat_wal's up to 17 and pg_stat_io's from 18; checkpoints pg_stat_bgwriter's up to 16 and
# pg_stat_checkpointer's from 17.
counters() {
	local syncs="(SELECT wal_sync FROM pg_stat_wal)"
	local checkpoints="(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)"
	if [ -z "${SERVER_VERSION_NUM:-}" ]; then
		SERVER_VERSION_NUM=$(q "SHOW server_version_num")
	fi
	if [ "$SERVER_VERSION_NUM" -ge 170000 ]; then
		checkpoints="(SELECT num_timed + num_requested FROM pg_stat_checkpointer)"
	fi
	if [ "$SERVER_VERSION_NUM" -ge 180000 ]; then
		syncs="(SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal')"
	fi
	q "SELECT pg_current_wal_lsn(),
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		$syncs, $checkpoints"
}

# measure_drain label n done_sql trigger_fn
#   sets M_SECS M_RATE M_COMMITS M_WAL M_SYNCS M_CPU M_OTHER
# t0 is taken just before the trigger; the end is the first poll that finds done_sql true.
measure_drain() {
	local label="$1" n="$2" done_sql="$3" trigger="$4"
	local lsn0 xc0 ws0 cp0 xc1 ws1 cp1 t0 t1 m0 m1 ours polls=0 ans finished lsn_end sleep_s deadline
	poller_start
	read -r lsn0 xc0 ws0 cp0 <<<"$(counters)"
	our_ticks >"$WORK/ticks0"
	m0="$(machine_busy_ticks)"
	t0="$(q "SELECT extract(epoch FROM clock_timestamp())")"
	"$trigger"
	deadline=$((SECONDS + DRAIN_TIMEOUT))
	sleep_s="$(awk -v m="$DRAIN_POLL_MS" 'BEGIN { printf "%.3f", m / 1000 }')"
	while :; do
		sleep "$sleep_s"
		ans="$(poller_ask "SELECT ($done_sql)::int, extract(epoch FROM clock_timestamp()), pg_current_wal_lsn();")"
		polls=$((polls + 1))
		read -r finished t1 lsn_end <<<"$ans"
		[[ "$finished" == 1 || "$finished" == 0 ]] || die "$label: unexpected poll answer '$ans'"
		((finished == 1)) && break
		((SECONDS < deadline)) || die "$label: not drained after ${DRAIN_TIMEOUT}s"
	done
	our_ticks >"$WORK/ticks1"
	m1="$(machine_busy_ticks)"
	poller_stop
	# what the measured system still has to tell the statistics arrives within a second or so
	# (a backend reports at most once a second, and when it exits)
	sleep 2
	read -r _ xc1 ws1 cp1 <<<"$(counters)"
	ours="$(ticks_between "$WORK/ticks0" "$WORK/ticks1")"
	M_SECS="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
	M_RATE="$(awk -v s="$M_SECS" -v n="$n" 'BEGIN { printf "%.0f", n / s }')"
	# the poller's own transactions (its SETs, its first SELECT, one per poll) are not the system's
	M_COMMITS="$(awk -v a="$xc0" -v b="$xc1" -v p="$((polls + 3))" -v n="$n" \
		'BEGIN { printf "%.4f", (b - a - p) / n }')"
	M_WAL="$(q "SELECT round(pg_wal_lsn_diff('$lsn_end', '$lsn0') / $n)")"
	M_SYNCS="$(awk -v a="$ws0" -v b="$ws1" -v n="$n" 'BEGIN { printf "%.4f", (b - a) / n }')"
	M_CPU="$(awk -v t="$ours" -v n="$n" -v hz="$HZ" 'BEGIN { printf "%.3f", t * 1000 / hz / n }')"
	M_OTHER="$(awk -v m="$((m1 - m0))" -v t="$ours" -v s="$M_SECS" -v hz="$HZ" -v c="$NCPU" \
		'BEGIN { o = (m - t) / (s * hz * c) * 100; printf "%.0f", (o < 0) ? 0 : o }')"
	M_CKPT=$((cp1 - cp0))
	M_LSN0="$lsn0"
	M_LSN1="$lsn_end"
	((M_CKPT == 0)) || note "$label: $M_CKPT checkpoint(s) ran during the drain; its WAL includes their full-page images"
	no_crash "$label"
}

# --- drain ----------------------------------------------------------------------------------
BEST_DS=0
BEST_DS_B=
BEST_GW=0
BEST_GW_CFG=
MIN_CPU_DS=
MIN_CPU_GW=
# lowest CPU per step of a system so far (a figure other programs on the machine disturb less)
min_cpu() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a < b) ? a : b }'; }
DRAIN_HEADER="$(printf '%-16s %-27s %8s %8s %8s %10s %8s %9s %9s %6s' system config steps seconds \
	"steps/s" "commits/st" "WAL B/st" "fsyncs/st" "cpu ms/st" other%)"

# the drain's WAL by record type, the largest first, in bytes per step (BENCH_WALDUMP=1)
wal_by_record() { # n
	((WALDUMP)) || return 0
	as_cluster_owner "$BINDIR/pg_waldump" --stats=record -p "$PGDATA_DIR/pg_wal" \
		-s "$M_LSN0" -e "$M_LSN1" 2>/dev/null |
		awk -v n="$1" '{ gsub(/\([^)]*\)/, "") }
			NF == 5 && $2 ~ /^[0-9]+$/ && $5 > 0 {
				printf "%10.1f  %-34s %8.1f B/st in records %8.1f B/st in full-page images\n",
					$5 / n, $1, $3 / n, $4 / n }' | sort -rn | head -12
}

drain_row() { # system config n
	printf '%-16s %-27s %8d %8.2f %8d %10.4f %8d %9.4f %9.3f %6s\n' "$1" "$2" "$3" \
		"$M_SECS" "$M_RATE" "$M_COMMITS" "$M_WAL" "$M_SYNCS" "$M_CPU" "$M_OTHER"
	echo "$1,$2,$3,$M_SECS,$M_RATE,$M_COMMITS,$M_WAL,$M_SYNCS,$M_CPU,$M_OTHER" >>"$WORK/out/drain.csv"
	wal_by_record "$3"
}

ds_trigger() {
	# the executors sleep (poll_interval 1h, nothing was due when they last looked); the reload
	# sets the drain's polling interval and wakes them: the drain starts here
	q "ALTER SYSTEM SET durable_steps.poll_interval = '$DS_POLL'" >/dev/null
	q "SELECT pg_reload_conf()" >/dev/null
}

drain_durable() { # batch_size history_rows steps label
	local b="$1" hist="$2" n="$3" label="$4" check
	# put the executors to sleep for good first: nothing wakes them until the trigger
	set_sighup durable_steps.batch_size "$b" durable_steps.poll_interval 1h
	if ((hist == 0)); then
		# cold: fresh executors too (no plans kept from earlier runs), as after CREATE
		# EXTENSION or a restart; they start with poll_interval 1h and go to sleep
		pg_restart
		worker_pids "$DS_WORKERS" >/dev/null
		sleep 1
	fi
	reset_durable "$hist"
	load_due drain 1 "$n"
	psql_db -c "VACUUM ANALYZE durable_steps.steps" -c "CHECKPOINT"
	check="$(q "SELECT count(*) FROM durable_steps.steps WHERE status = 'pending'")"
	((check == n)) || die "durable_steps: an executor ran steps before the drain started ($check of $n pending)"
	measure_drain "durable_steps batch_size=$b history=$hist" "$n" \
		"NOT EXISTS (SELECT 1 FROM durable_steps.steps WHERE next_attempt_at IS NOT NULL
		   AND status IN ('pending', 'retrying', 'running'))" ds_trigger
	check="$(q "SELECT count(*) FILTER (WHERE status <> 'succeeded'), count(*) FROM durable_steps.steps
		WHERE run_id = 'drain'")"
	[[ "$check" == "0 $n" ]] || die "durable_steps: after the drain (not succeeded, all) = $check"
	check="$(q "SELECT count(*) FILTER (WHERE class = 'completed' AND executor = 'worker'), count(*)
		FROM ds_attempts WHERE run_id = 'drain'")"
	[[ "$check" == "$n $n" ]] || die "durable_steps: attempts (completed by the worker, all) = $check"
	drain_row durable_steps "$label" "$n"
}

GW_CONN="postgres:///$DB?host=$WORK&port=$PORT&user=postgres"

gw_trigger() {
	local i
	echo go >&"$NODE_IN"
	for ((i = 0; i < 1000; i++)); do
		grep -q '^started' "$WORK/node.out" && return 0
		sleep 0.01
	done
	die "graphile-worker did not start: $(cat "$WORK/node.err")"
}

drain_graphile() { # concurrency:localqueue:delay
	local conc lq delay n="$DRAIN_STEPS" check summary i
	IFS=: read -r conc lq delay <<<"$1"
	q "DELETE FROM graphile_worker._private_jobs" >/dev/null
	q "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
			SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
			FROM generate_series(1, $n)))" >/dev/null
	psql_db -c "VACUUM ANALYZE graphile_worker._private_jobs" -c "CHECKPOINT"
	check="$(q "SELECT count(*) FROM graphile_worker._private_jobs WHERE locked_at IS NULL AND attempts = 0")"
	((check == n)) || die "graphile-worker: $check of $n jobs ready before the drain"
	# the node process is started and has loaded graphile-worker before t0; "go" calls run()
	rm -f "$WORK/node.in" && mkfifo "$WORK/node.in"
	: >"$WORK/node.out"
	(cd "$HERE/graphile" && GW_CONNECTION="$GW_CONN" GW_CONCURRENCY="$conc" GW_LOCAL_QUEUE="$lq" \
		GW_COMPLETE_DELAY="$delay" GW_FAIL_DELAY="$delay" \
		exec node drain.js drain <"$WORK/node.in" >"$WORK/node.out" 2>"$WORK/node.err") &
	NODE_PID=$!
	exec {NODE_IN}>"$WORK/node.in"
	for ((i = 0; i < 300; i++)); do
		grep -q '^ready' "$WORK/node.out" && break
		sleep 0.05
	done
	grep -q '^ready' "$WORK/node.out" || die "drain.js did not start: $(cat "$WORK/node.err")"
	measure_drain "graphile-worker $1" "$n" "NOT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)" gw_trigger
	echo stop >&"$NODE_IN"
	exec {NODE_IN}>&-
	wait "$NODE_PID" || die "drain.js failed: $(cat "$WORK/node.err")"
	NODE_PID=
	summary="$(grep '^{' "$WORK/node.out" | tail -n 1)"
	check="$(node -e "const s = JSON.parse(process.argv[1]); console.log(s.succeeded + ' ' + s.errored)" "$summary")"
	[[ "$check" == "$n 0" ]] || die "graphile-worker: (succeeded, errored) = $check, expected $n 0"
	if [[ -s "$WORK/node.err" ]]; then
		note "graphile-worker said:"
		sed 's/^/    /' "$WORK/node.err" >&2
	fi
	drain_row graphile-worker "conc=$conc lq=$lq delay=$delay" "$n"
	MIN_CPU_GW="$(min_cpu "$M_CPU" "$MIN_CPU_GW")"
	if awk -v a="$M_RATE" -v b="$BEST_GW" 'BEGIN { exit !(a > b) }'; then
		BEST_GW="$M_RATE"
		BEST_GW_CFG="concurrency=$conc localQueue.size=$lq completeJobBatchDelay=failJobBatchDelay=$delay"
	fi
}

profile_durable() { # batch_size history_rows steps
	local b="$1" hist="$2" n="$3"
	q "SELECT pg_stat_statements_reset()" >/dev/null
	drain_durable "$b" "$hist" "$n" "profile" >/dev/null
	echo
	echo "profile: durable_steps drain of $n steps, batch_size=$b, history=$hist, with pg_stat_statements"
	echo "(track = all); the database's statements by total time, per step = divided by $n:"
	psql_db -P pager=off -c "SELECT round(total_exec_time::numeric, 0) AS total_ms,
			round((total_exec_time / $n * 1000)::numeric, 1) AS us_per_step,
			round(calls::numeric / $n, 3) AS calls_per_step,
			round(wal_records::numeric / $n, 2) AS wal_recs_per_step,
			round(wal_bytes / $n) AS wal_b_per_step,
			left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$DB')
		ORDER BY total_exec_time DESC LIMIT 10"
}

run_drain() {
	local r b c
	set_workers "$DS_WORKERS"
	(cd "$HERE/graphile" && GW_CONNECTION="$GW_CONN" node drain.js migrate) || die "graphile-worker migration failed"
	echo "drain: $DRAIN_STEPS due no-op steps / jobs per run"
	echo "  durable_steps: max_workers = $DS_WORKERS, poll_interval = $DS_POLL, $DS_HISTORY finished steps (and attempts) in the tables"
	echo "  graphile-worker $GW_VERSION: run() in one node $(node --version) process, task noop: async () => {}"
	echo "  commits: pg_stat_database.xact_commit; WAL: pg_current_wal_lsn; fsyncs: pg_stat_wal.wal_sync;"
	echo "  cpu: the cluster's processes (and node) per step; other%: the machine's CPU used by other programs"
	echo
	echo "$DRAIN_HEADER"
	echo "system,config,steps,seconds,steps_per_s,commits_per_step,wal_bytes_per_step,fsyncs_per_step,cpu_ms_per_step,other_cpu_pct" >"$WORK/out/drain.csv"
	for ((r = 1; r <= DRAIN_ROUNDS; r++)); do
		for b in $DS_BATCH_SIZES; do
			drain_durable "$b" "$DS_HISTORY" "$DRAIN_STEPS" "workers=$DS_WORKERS batch=$b"
			MIN_CPU_DS="$(min_cpu "$M_CPU" "$MIN_CPU_DS")"
			if awk -v a="$M_RATE" -v b="$BEST_DS" 'BEGIN { exit !(a > b) }'; then
				BEST_DS="$M_RATE"
				BEST_DS_B="$b"
			fi
		done
		for c in $GW_CONFIGS; do drain_graphile "$c"; done
	done
	if ((DRAIN_COLD_STEPS > 0)); then
		drain_durable "$DRAIN_COLD_BATCH" 0 "$DRAIN_COLD_STEPS" "COLD workers=$DS_WORKERS batch=$DRAIN_COLD_BATCH"
		COLD_RATE="$M_RATE"
	fi
	DRAIN_RATIO="$(awk -v a="$BEST_DS" -v b="$BEST_GW" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')"
	echo
	echo "best durable_steps:   $BEST_DS steps/s (max_workers=$DS_WORKERS batch_size=$BEST_DS_B)"
	echo "best graphile-worker: $BEST_GW jobs/s ($BEST_GW_CFG)"
	echo "lowest CPU per step:  durable_steps $MIN_CPU_DS ms, graphile-worker $MIN_CPU_GW ms" \
		"($(awk -v a="$MIN_CPU_DS" -v b="$MIN_CPU_GW" 'BEGIN { printf "%.2f", a / b }')x)"
	if ((DRAIN_COLD_STEPS > 0)); then
		echo "COLD: $DRAIN_COLD_STEPS steps, batch_size $DRAIN_COLD_BATCH, empty tables before the drain: $COLD_RATE steps/s"
	fi
	if ((PROFILE == 1)); then
		profile_durable "$BEST_DS_B" "$DS_HISTORY" "$DRAIN_STEPS"
		if ((DRAIN_COLD_STEPS > 0)); then
			profile_durable "$DRAIN_COLD_BATCH" 0 "$DRAIN_COLD_STEPS"
		fi
	fi
	reset_durable 0 >/dev/null
	echo
}

# --- latency --------------------------------------------------------------------------------
run_latency() {
	local n="$LAT_SAMPLES" check
	set_workers "$DS_WORKERS"
	set_sighup durable_steps.batch_size "$LAT_BATCH_SIZE" durable_steps.poll_interval "$DS_POLL"
	reset_durable "$DS_HISTORY" >/dev/null
	psql_db -c "SET client_min_messages = warning" -c "DROP TABLE IF EXISTS lat_client" \
		-c "CREATE TABLE lat_client (i int PRIMARY KEY, t_commit timestamptz NOT NULL)" \
		-c "CHECKPOINT"
	echo "latency: $n steps, one at a time (each waits for the previous to finish, then ${LAT_GAP_MS} ms idle);"
	echo "  durable_steps.max_workers = $DS_WORKERS, batch_size = $LAT_BATCH_SIZE, poll_interval = $DS_POLL,"
	echo "  $DS_HISTORY finished steps in the tables"
	# Attempt 1 runs in the caller and asks for a retry after 0 s; its commit wakes an executor,
	# which claims and starts attempt 2. t_commit is read right after COMMIT returns.
	psql_db <<EOF
DO \$do\$
DECLARE
    t timestamptz[] := '{}';
    st text;
    waited int;
BEGIN
    FOR i IN 1..$n LOOP
        PERFORM ds_run_step('lat', 's' || i,
            \$q\$SELECT CASE WHEN ds_attempt_number() = 1 THEN ds_retry_after('x', '0 s')::text ELSE 'ok' END\$q\$);
        COMMIT;
        t := t || clock_timestamp();
        waited := 0;
        LOOP
            SELECT status INTO st FROM durable_steps.steps WHERE run_id = 'lat' AND step_id = 's' || i;
            EXIT WHEN st = 'succeeded' OR waited >= 5000;
            PERFORM pg_sleep(0.001);
            waited := waited + 1;
        END LOOP;
        COMMIT;
        PERFORM pg_sleep($LAT_GAP_MS / 1000.0);
    END LOOP;
    INSERT INTO lat_client SELECT g, t[g] FROM generate_series(1, $n) g;
END
\$do\$;
EOF
	no_crash "the latency run"
	check="$(q "SELECT count(*) FROM ds_attempts a JOIN lat_client c
		ON a.run_id = 'lat' AND a.step_id = 's' || c.i AND a.attempt = 2
		WHERE a.executor = 'worker' AND a.class = 'completed'")"
	((check == n)) || die "latency: only $check of $n second attempts completed by the worker"
	psql_db -At -F ',' -c "SELECT c.i, a1.finished_at, c.t_commit, a2.claimed_at, a2.started_at, a2.finished_at, a2.backend_pid
		FROM lat_client c
		JOIN ds_attempts a1 ON a1.run_id = 'lat' AND a1.step_id = 's' || c.i AND a1.attempt = 1
		JOIN ds_attempts a2 ON a2.run_id = 'lat' AND a2.step_id = 's' || c.i AND a2.attempt = 2
		ORDER BY c.i" >"$WORK/out/latency.csv"
	echo
	printf '%-44s %8s %8s %8s %8s %8s\n' "interval (ms)" p50 p90 p99 max n
	psql_db -At -F ' ' -c "WITH s AS (
			SELECT extract(epoch FROM a2.claimed_at - a1.finished_at) * 1000 AS claim_f,
			       extract(epoch FROM a2.started_at - a1.finished_at) * 1000 AS start_f,
			       extract(epoch FROM a2.claimed_at - c.t_commit) * 1000 AS claim_c,
			       extract(epoch FROM a2.started_at - c.t_commit) * 1000 AS start_c
			FROM lat_client c
			JOIN ds_attempts a1 ON a1.run_id = 'lat' AND a1.step_id = 's' || c.i AND a1.attempt = 1
			JOIN ds_attempts a2 ON a2.run_id = 'lat' AND a2.step_id = 's' || c.i AND a2.attempt = 2),
		m(ord, name, v) AS (
			SELECT 1, 'claimed_at - attempt 1 finished_at', claim_f FROM s UNION ALL
			SELECT 2, 'started_at - attempt 1 finished_at', start_f FROM s UNION ALL
			SELECT 3, 'claimed_at - client saw COMMIT return', claim_c FROM s UNION ALL
			SELECT 4, 'started_at - client saw COMMIT return', start_c FROM s)
		SELECT replace(name, ' ', '_'),
		       round(percentile_disc(0.5) WITHIN GROUP (ORDER BY v)::numeric, 2),
		       round(percentile_disc(0.9) WITHIN GROUP (ORDER BY v)::numeric, 2),
		       round(percentile_disc(0.99) WITHIN GROUP (ORDER BY v)::numeric, 2),
		       round(max(v)::numeric, 2), count(*)
		FROM m GROUP BY ord, name ORDER BY ord" >"$WORK/lat.txt"
	while read -r name p50 p90 p99 max cnt; do
		printf '%-44s %8s %8s %8s %8s %8s\n' "${name//_/ }" "$p50" "$p90" "$p99" "$max" "$cnt"
	done <"$WORK/lat.txt"
	read -r _ LAT_P50 _ LAT_P99 _ _ < <(sed -n 2p "$WORK/lat.txt")
	echo "(attempt 1's finished_at is taken before its transaction commits, so the first two rows"
	echo " include the commit and its WAL flush; the last two start when the client had its COMMIT"
	echo " back, after the wake-up was sent, and may be slightly negative)"
	reset_durable 0 >/dev/null
	echo
}

# --- memory ---------------------------------------------------------------------------------
mem_sample() { # pid -> "rss anon file shmem pss private (kB) context_bytes"
	local pid="$1" rss anon file shmem pss priv ctx before i
	read -r rss anon file shmem < <(awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 }
		/^RssShmem:/ { s = $2 } END { print r, a, f, s }' "/proc/$pid/status")
	read -r pss priv < <(awk '/^Pss:/ { p = $2 } /^Private_(Clean|Dirty):/ { v += $2 }
		END { print p, v }' "/proc/$pid/smaps_rollup")
	# the executor's memory contexts, as it logs them itself
	before="$(grep -c "\[$pid\].*Grand total" "$LOG" || true)"
	q "SELECT pg_log_backend_memory_contexts($pid)" >/dev/null
	ctx=
	for ((i = 0; i < 50; i++)); do
		if (($(grep -c "\[$pid\].*Grand total" "$LOG" || true) > before)); then
			ctx="$(grep "\[$pid\].*Grand total" "$LOG" | tail -n 1 | sed -n 's/.*Grand total: \([0-9]*\) bytes.*/\1/p')"
			break
		fi
		sleep 0.1
	done
	echo "$rss $anon $file $shmem $pss $priv ${ctx:-?}"
}

run_memory() {
	local done_n=0 chunk pid pid_now v=() first=() last=() check deadline
	# one executor, so the polling interval can stay the default (1s): nothing else wakes it
	# when a chunk is loaded
	q "ALTER SYSTEM RESET durable_steps.poll_interval" >/dev/null
	q "ALTER SYSTEM SET durable_steps.retention = 0" >/dev/null
	q "ALTER SYSTEM SET durable_steps.batch_size = $MEM_BATCH_SIZE" >/dev/null
	set_workers 1
	q "SELECT pg_reload_conf()" >/dev/null
	reset_durable "$DS_HISTORY" >/dev/null
	pid="$(worker_pids 1)"
	echo "memory: $MEM_STEPS no-op steps through one executor (pid $pid; max_workers = 1, batch_size = $MEM_BATCH_SIZE,"
	echo "  retention = 0, poll_interval = 1s; $DS_HISTORY finished steps kept in the tables); chunks of"
	echo "  $MEM_FIRST then $MEM_CHUNK; after each chunk this script deletes the chunk's steps and attempts and"
	echo "  vacuums the two tables. kB from /proc/<pid>/status (VmRSS = RssAnon + RssFile + RssShmem)"
	echo "  and /proc/<pid>/smaps_rollup (Pss, Private_Clean + Private_Dirty); contexts: the executor's"
	echo "  memory contexts in bytes (pg_log_backend_memory_contexts, \"Grand total\")"
	echo
	printf '%9s %8s %8s %8s %9s %8s %8s %10s\n' steps VmRSS RssAnon RssFile RssShmem Pss Private contexts
	echo "steps,vmrss_kb,rssanon_kb,rssfile_kb,rssshmem_kb,pss_kb,private_kb,context_bytes" >"$WORK/out/memory.csv"
	while ((done_n < MEM_STEPS)); do
		if ((done_n == 0)); then chunk=$MEM_FIRST; else chunk=$MEM_CHUNK; fi
		((done_n + chunk <= MEM_STEPS)) || chunk=$((MEM_STEPS - done_n))
		load_due mem $((done_n + 1)) $((done_n + chunk))
		q "ANALYZE durable_steps.steps" >/dev/null
		deadline=$((SECONDS + DRAIN_TIMEOUT))
		while [[ "$(q "SELECT count(*) FROM durable_steps.steps WHERE run_id = 'mem' AND status <> 'succeeded'")" != 0 ]]; do
			((SECONDS < deadline)) || die "memory: chunk not drained after ${DRAIN_TIMEOUT}s"
			no_crash "the memory run"
			sleep 0.5
		done
		check="$(q "SELECT count(*) FROM ds_attempts WHERE run_id = 'mem' AND class = 'completed'")"
		((check == chunk)) || die "memory: $check completed attempts in a chunk of $chunk"
		done_n=$((done_n + chunk))
		pid_now="$(worker_pids 1)"
		[[ "$pid_now" == "$pid" ]] || die "memory: the executor changed (pid $pid, now $pid_now): it restarted"
		sleep 0.5
		read -r -a v <<<"$(mem_sample "$pid")"
		printf '%9d %8d %8d %8d %9d %8d %8d %10s\n' "$done_n" "${v[@]}"
		(IFS=,; echo "$done_n,${v[*]}") >>"$WORK/out/memory.csv"
		((${#first[@]})) || first=("${v[@]}")
		last=("${v[@]}")
		psql_db -c "DELETE FROM durable_steps.attempts WHERE run_id = 'mem'" \
			-c "DELETE FROM durable_steps.steps WHERE run_id = 'mem' AND status = 'succeeded'" \
			-c "VACUUM ANALYZE durable_steps.steps" -c "VACUUM ANALYZE durable_steps.attempts"
	done
	no_crash "the memory run"
	MEM_D_RSS=$((last[0] - first[0]))
	MEM_D_OWN=$((last[1] + last[2] - first[1] - first[2]))
	MEM_D_SHM=$((last[3] - first[3]))
	MEM_D_PRIV=$((last[5] - first[5]))
	echo
	echo "growth from $MEM_FIRST to $MEM_STEPS steps: VmRSS $MEM_D_RSS kB, of which shared memory (RssShmem)" \
		"$MEM_D_SHM kB and the process's own pages (RssAnon + RssFile) $MEM_D_OWN kB; Private $MEM_D_PRIV kB;" \
		"contexts $((last[6] - first[6])) bytes"
	echo "(RssShmem, Pss and Private count the pages of shared_buffers the executor has touched -- a"
	echo " buffer page only it has touched counts as \"private\" -- so they grow with the pages it"
	echo " visits, up to shared_buffers, without any leak; RssAnon is its own heap)"
	reset_durable 0 >/dev/null
	q "ALTER SYSTEM RESET durable_steps.retention" >/dev/null
	q "ALTER SYSTEM RESET durable_steps.batch_size" >/dev/null
	echo
}

# --- run ------------------------------------------------------------------------------------
if [[ "$WHAT" == drain || "$WHAT" == all ]]; then run_drain; fi
if [[ "$WHAT" == latency || "$WHAT" == all ]]; then run_latency; fi
if [[ "$WHAT" == memory || "$WHAT" == all ]]; then run_memory; fi

below=0
verdict() { # name measured required ok
	[[ "$4" == PASS ]] || below=1
	printf '%-54s %12s %12s   %s\n' "$1" "$2" "$3" "$4"
}
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
pass_if() { if awk "BEGIN { exit !($1) }"; then echo PASS; else echo BELOW; fi; }
echo "summary (load average now $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-54s %12s %12s   %s\n' target measured required verdict
if [[ "$WHAT" == drain || "$WHAT" == all ]]; then
	verdict "drain: best durable_steps / best graphile-worker" "${DRAIN_RATIO}x" ">= ${DRAIN_TARGET}x" \
		"$(pass_if "$DRAIN_RATIO >= $DRAIN_TARGET")"
	if ((DRAIN_COLD_STEPS > 0)); then
		COLD_RATIO="$(awk -v a="$COLD_RATE" -v b="$BEST_GW" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')"
		# a figure of this script's own, without a target: the target is the drain's, above
		printf '%-54s %12s %12s   %s\n' "drain, cold tables, batch $DRAIN_COLD_BATCH / best graphile" \
			"${COLD_RATIO}x" "-" "(no target)"
	fi
fi
if [[ "$WHAT" == latency || "$WHAT" == all ]]; then
	verdict "latency p50: started_at - attempt 1 finished_at" "$LAT_P50 ms" "<= $LAT_P50_MS ms" \
		"$(pass_if "$LAT_P50 <= $LAT_P50_MS")"
	verdict "latency p99: started_at - attempt 1 finished_at" "$LAT_P99 ms" "<= $LAT_P99_MS ms" \
		"$(pass_if "$LAT_P99 <= $LAT_P99_MS")"
fi
if [[ "$WHAT" == memory || "$WHAT" == all ]]; then
	verdict "memory: RSS growth, $MEM_FIRST -> $MEM_STEPS steps" "$(mb "$MEM_D_RSS") MB" "<= $MEM_TARGET_MB MB" \
		"$(pass_if "$MEM_D_RSS <= $MEM_TARGET_MB * 1024")"
	verdict "memory: RSS without shared memory, $MEM_FIRST -> $MEM_STEPS" "$(mb "$MEM_D_OWN") MB" "<= $MEM_TARGET_MB MB" \
		"$(pass_if "$MEM_D_OWN <= $MEM_TARGET_MB * 1024")"
fi
if ((below && STRICT == 1)); then
	exit 3
fi
