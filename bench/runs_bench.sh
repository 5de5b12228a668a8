#!/usr/bin/env bash
# runs_bench.sh -- runs of a three-step no-op workflow: durable_steps against Absurd 0.4.0 and
# DBOS Transact 5.3.0 on the same throwaway cluster, in one invocation; then the latency from an
# event's commit to the awaiting run's next step, and the cost of a step in a run against a plain
# deferred step.
#
#   bench/runs_bench.sh [port]
#
# A private throwaway cluster (bench/lib.sh: Unix socket in a mktemp directory only, fsync and
# synchronous_commit on) with durable_steps preloaded (max_workers = DS_WORKERS, by default 2, the
# machine's CPUs), one
# database `bench`. durable_steps must be installed in the PostgreSQL of PG_CONFIG (make install);
# Absurd's SQL is loaded from PEERS/absurd-0.4.0/absurd.sql; the two TypeScript/JavaScript peers
# run from bench/runs (`npm install` there when node_modules is missing: absurd-sdk 0.4.0,
# @dbos-inc/dbos-sdk 5.3.0, pg). A peer that cannot be installed or started is reported as such
# (with the reason) and the others still run.
#
# Throughput, ROUNDS rounds, the order of the systems rotating from round to round:
#
#   durable_steps  N `ds_start_run('three', ...)` in transactions of TXN runs, workflow three()
#                  a plpgsql function calling ds_step three times ('SELECT 1', 'SELECT 2',
#                  'SELECT 3'); executors running. Timed from before the first starting
#                  transaction to the last run's finished_at.
#   Absurd         N `absurd.spawn_task('bench', 'three', ...)` in transactions of TXN, task three
#                  three no-op ctx.step calls, its worker (startWorker, ABSURD_CONCURRENCY tasks in
#                  flight, claiming ABSURD_BATCH per call, polling every 50 ms) already running.
#                  Timed from before the first spawning transaction to the last completed_at.
#   durable_steps Node  the same workflow written in application code (docs/app-workflows.md):
#                  workflow("three_app") with three no-op ctx.step calls, run by the Node client's
#                  Worker (concurrency ABSURD_CONCURRENCY) in its own process, already running;
#                  N `ds_start_run('three_app', ...)` in transactions of TXN. Timed as durable_steps.
#   DBOS           N `DBOS.startWorkflow(three)` (DBOS starts workflows from its library, in its
#                  process: there is no SQL to start one), three no-op DBOS.runStep calls; timed by
#                  the node process from its first start to its last result.
#
# Every run is checked to have succeeded (durable_steps: status, output, 3 succeeded steps each;
# Absurd: tasks completed; DBOS: results and workflow_status SUCCESS). Per system: runs/s, CPU ms
# per run of the cluster's processes plus the peer's node process, WAL bytes per run, and the
# share of the machine's CPU used by everything else meanwhile (other helpers' tests on a shared
# machine): the figures mean little when that is high.
#
# Then, durable_steps only:
#   latency  LAT_SAMPLES runs wait in ds_await_event; one session emits their events one at a
#            time, LAT_GAP_MS apart, each in its own transaction that also records
#            clock_timestamp() just before COMMIT (so the commit's WAL flush is inside the figure);
#            the run's next step records clock_timestamp() in its body. p50/p90/p99/max.
#   per step N runs' 3N steps vs 3N plain deferred steps (`ds_run_step(..., defer => true)`,
#            body 'SELECT 1', stored in transactions of 1,000): steps/s and the executors' CPU
#            ms per step, and the ratios.
#
# Environment [defaults]: N [2000], TXN [500], ROUNDS [2], LAT_SAMPLES [300], LAT_GAP_MS [20],
# ABSURD_CONCURRENCY [16], ABSURD_BATCH [16], PEER_POOL [20], SYSTEMS [ds dsnode absurd dbos], DS_WORKERS [2],
# BENCH_PORT [5520], PEERS [../shared/peers beside the repository], PG_CONFIG [pg_config],
# BENCH_OS_USER [postgres] (the cluster's account when run as root).
set -euo pipefail

die() { echo "runs_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5520}}"
BENCH_NAME=runs_bench
N="${N:-2000}"
TXN="${TXN:-500}"
ROUNDS="${ROUNDS:-2}"
LAT_SAMPLES="${LAT_SAMPLES:-300}"
LAT_GAP_MS="${LAT_GAP_MS:-20}"
ABSURD_CONCURRENCY="${ABSURD_CONCURRENCY:-16}"
ABSURD_BATCH="${ABSURD_BATCH:-16}"
PEER_POOL="${PEER_POOL:-20}"
DS_WORKERS="${DS_WORKERS:-2}"
SYSTEMS="${SYSTEMS-ds dsnode absurd dbos}"
PEERS="${PEERS:-$HERE/../../shared/peers}"
for v in N TXN ROUNDS LAT_SAMPLES LAT_GAP_MS ABSURD_CONCURRENCY ABSURD_BATCH PEER_POOL DS_WORKERS; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not '${!v}'"
done
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"

PEER_PID=
cleanup() {
	local rc=$?
	if [[ -n "$PEER_PID" ]]; then kill "$PEER_PID" 2>/dev/null || true; fi
	bench_stop "$rc"
	[[ -n "${WORK:-}" ]] && rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT

# ---- the peers' availability: a peer that cannot run is reported, not fatal -----------------------
declare -A UNAVAILABLE=()
RUNS_DIR="$HERE/runs"
if [[ " $SYSTEMS " == *" absurd "* || " $SYSTEMS " == *" dbos "* ]]; then
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		why="node and npm are not installed"
		UNAVAILABLE[absurd]=$why; UNAVAILABLE[dbos]=$why
	elif [[ ! -d "$RUNS_DIR/node_modules/absurd-sdk" || ! -d "$RUNS_DIR/node_modules/@dbos-inc/dbos-sdk" ]]; then
		if ! (cd "$RUNS_DIR" && npm install --no-audit --no-fund >"${TMPDIR:-/tmp}/runs_bench_npm.log" 2>&1); then
			why="npm install in bench/runs failed: $(tail -n 3 "${TMPDIR:-/tmp}/runs_bench_npm.log" | tr '\n' ' ')"
			UNAVAILABLE[absurd]=$why; UNAVAILABLE[dbos]=$why
		fi
	fi
	[[ -f "$PEERS/absurd-0.4.0/absurd.sql" ]] || UNAVAILABLE[absurd]="no $PEERS/absurd-0.4.0/absurd.sql"
fi

# ---- the cluster ----------------------------------------------------------------------------------
bench_workdir
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'bench'
durable_steps.max_workers = $DS_WORKERS
max_worker_processes = 40
max_connections = 100
max_wal_size = 4GB
autovacuum = off
EOF
bench_start
PSQL=("$BINDIR/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres)
q() { as_cluster_owner "${PSQL[@]}" -d bench -c "$1"; }
as_cluster_owner "${PSQL[@]}" -d postgres -c 'CREATE DATABASE bench'
# DBOS insists on a host name and a user in the URL; host= in the query names the socket directory
CONN="postgresql://postgres@localhost:$PORT/bench?host=$WORK"
q 'CREATE EXTENSION durable_steps'
q "CREATE FUNCTION three(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM ds_step('one', 'SELECT 1');
    PERFORM ds_step('two', 'SELECT 2');
    PERFORM ds_step('three', 'SELECT 3');
    RETURN jsonb_build_object('done', input->'i');
END \$\$;
CREATE TABLE woke (i int PRIMARY KEY, at timestamptz NOT NULL);
CREATE TABLE emitted (i int PRIMARY KEY, at timestamptz NOT NULL);
CREATE FUNCTION awaiter(run_id text, input jsonb) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM ds_await_event('wait', 'lat:' || (input->>'i'));
    PERFORM ds_step('next', 'INSERT INTO woke VALUES ((\$1->>''i'')::int, clock_timestamp())', input);
END \$\$;"
if [[ -z "${UNAVAILABLE[absurd]:-}" ]]; then
	if ! as_cluster_owner "${PSQL[@]}" -d bench -f "$PEERS/absurd-0.4.0/absurd.sql" >"$WORK/absurd.log" 2>&1 ||
		! q "SELECT absurd.create_queue('bench')" >/dev/null 2>>"$WORK/absurd.log"; then
		UNAVAILABLE[absurd]="absurd.sql did not load: $(tail -n 2 "$WORK/absurd.log" | tr '\n' ' ')"
	fi
fi

LIB="$("$PG_CONFIG" --pkglibdir)/durable_steps.so"
HZ="$(getconf CLK_TCK)"
echo "machine:    $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo) RAM ($(uname -srm)); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "postgres:   $(q 'SHOW server_version')"
echo "extension:  $LIB ($(date -u -r "$LIB" '+%Y-%m-%d %H:%M:%S UTC'), md5 $(md5sum <"$LIB" | cut -c1-12)); repo HEAD $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "settings:   $(q "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'max_wal_size',
	'autovacuum', 'durable_steps.max_workers', 'durable_steps.batch_size', 'durable_steps.poll_interval')")"
echo "node:       $(node --version 2>/dev/null || echo none); N = $N runs per round, started $TXN per transaction; $ROUNDS rounds"
for s in absurd dbos; do
	[[ -n "${UNAVAILABLE[$s]:-}" ]] && echo "UNAVAILABLE $s: ${UNAVAILABLE[$s]}"
done
echo

# ---- measurement helpers --------------------------------------------------------------------------
machine_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# "pid ticks" of the cluster's processes (the postmaster and its children) and the node process
our_ticks() {
	local pm p
	pm="$(head -n 1 "$PGDATA_DIR/postmaster.pid")"
	for p in "$pm" $(pgrep -P "$pm") ${PEER_PID:+"$PEER_PID"}; do
		awk -v p="$p" '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print p, f[12] + f[13] }' \
			"/proc/$p/stat" 2>/dev/null || true
	done
}
# ticks between two our_ticks snapshots (processes started meanwhile count from zero)
ticks_between() { awk 'NR == FNR { a[$1] = $2; next } { d += $2 - ($1 in a ? a[$1] : 0) } END { print d + 0 }' "$1" "$2"; }
executor_pids() { q "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type = 'durable_steps worker'"; }
pid_ticks() { local p t=0; for p in "$@"; do t=$((t + $(awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$p/stat"))); done; echo "$t"; }
now() { date +%s.%N; }
wait_for() { # sql that answers t
	local deadline=$(($(date +%s) + 1800))
	until [[ "$(q "$1")" == t ]]; do
		(($(date +%s) < deadline)) || die "timed out waiting for: $1"
		sleep 0.05
	done
}
# start the measurement: CHECKPOINT, counters
begin_measure() {
	q "CHECKPOINT" >/dev/null
	M_LSN=$(q "SELECT pg_current_wal_lsn()")
	our_ticks >"$WORK/ticks0"
	M_BUSY=$(machine_busy_ticks)
	M_T0=$(now)
}
# end it: print the line and remember runs/s for the ratios
end_measure() { # name round seconds
	local name=$1 round=$2 secs=$3 ours busy wal
	our_ticks >"$WORK/ticks1"
	busy=$(($(machine_busy_ticks) - M_BUSY))
	ours=$(ticks_between "$WORK/ticks0" "$WORK/ticks1")
	wal=$(q "SELECT pg_current_wal_lsn() - '$M_LSN'::pg_lsn")
	awk -v name="$name" -v r="$round" -v n="$N" -v s="$secs" -v ours="$ours" -v busy="$busy" \
		-v hz="$HZ" -v wal="$wal" -v ncpu="$(nproc)" -v t0="$M_T0" -v t1="$(now)" 'BEGIN {
		# the other load over the whole window of the counters, not only the timed part
		other = busy - ours; if (other < 0) other = 0
		printf "round %d  %-14s %8.0f runs/s  %7.3f s  CPU %6.2f ms/run (cluster + node)  WAL %6.0f B/run  other load %3.0f%% of the machine\n",
		       r, name, n / s, s, ours * 1000 / hz / n, wal / n, 100 * other / hz / (t1 - t0) / ncpu }'
	awk -v name="$name" -v n="$N" -v s="$secs" 'BEGIN { printf "%s\t%.3f\n", name, n / s }' >>"$WORK/rates"
}

# ---- durable_steps --------------------------------------------------------------------------------
start_runs_sql() { # workflow tag n -> SQL starting n runs, TXN per transaction
	local sql="" i
	for ((i = 0; i < $3; i += TXN)); do
		sql+="SELECT count(*) FROM generate_series($i + 1, least($i + $TXN, $3)) i, ds_start_run('$1', jsonb_build_object('tag', '$2', 'i', i));"$'\n'
	done
	echo "$sql"
}
run_ds() { # round
	local tag="r$1" t0 secs bad
	q "DELETE FROM durable_steps.runs WHERE status = 'succeeded'; DELETE FROM durable_steps.steps WHERE status = 'succeeded'" >/dev/null
	q "VACUUM ANALYZE" >/dev/null
	begin_measure
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	start_runs_sql three "$tag" "$N" | as_cluster_owner "${PSQL[@]}" -d bench >/dev/null
	wait_for "SELECT count(*) = $N FROM durable_steps.runs WHERE status IN ('succeeded', 'failed', 'cancelled')"
	secs=$(q "SELECT extract(epoch FROM max(finished_at)) - $t0 FROM durable_steps.runs")
	end_measure durable_steps "$1" "$secs"
	bad=$(q "SELECT count(*) FROM durable_steps.runs r WHERE r.status <> 'succeeded' OR r.output <> jsonb_build_object('done', r.input->'i')
		OR (SELECT count(*) FROM durable_steps.steps s WHERE s.run_id = r.run_id AND s.status = 'succeeded') <> 3")
	[[ "$bad" == 0 ]] || die "durable_steps: $bad of $N runs did not succeed with 3 succeeded steps"
}

# ---- Absurd ---------------------------------------------------------------------------------------
node_start() { # mode: starts node peer.js MODE as a coprocess, waits for "ready"
	local line
	coproc NODE { cd "$RUNS_DIR" && PEER_DB="$CONN" PEER_N="$N" PEER_POOL="$PEER_POOL" \
		PEER_CONCURRENCY="$ABSURD_CONCURRENCY" PEER_BATCH="$ABSURD_BATCH" exec node peer.js "$1" 2>"$WORK/node.err"; }
	PEER_PID=$NODE_PID
	NODE_IN=${NODE[1]}
	NODE_OUT=${NODE[0]}
	read -r -t 120 line <&"$NODE_OUT" || { cat "$WORK/node.err" >&2; return 1; }
	[[ "$line" == ready ]] || { echo "$line" >&2; cat "$WORK/node.err" >&2; return 1; }
}
node_stop() {
	{ echo stop >&"$NODE_IN"; } 2>/dev/null || true
	wait "$PEER_PID" 2>/dev/null || true
	PEER_PID=
}
node_read() { # -> one line of the node process
	local line
	read -r -t 1800 line <&"$NODE_OUT" || { cat "$WORK/node.err" >&2; die "the node process said nothing"; }
	echo "$line"
}
run_absurd() { # round
	local t0 secs bad sql="" i line
	q "DELETE FROM absurd.c_bench; DELETE FROM absurd.r_bench; DELETE FROM absurd.t_bench" >/dev/null
	q "VACUUM ANALYZE" >/dev/null
	node_start absurd || { echo "round $1  Absurd: the worker did not start: $(tail -n 3 "$WORK/node.err" | tr '\n' ' ')"; return 0; }
	echo go >&"$NODE_IN"
	line=$(node_read)
	[[ "$line" == started ]] || die "absurd: $line"
	for ((i = 0; i < N; i += TXN)); do
		sql+="SELECT count(*) FROM generate_series($i + 1, least($i + $TXN, $N)) i, absurd.spawn_task('bench', 'three', jsonb_build_object('i', i));"$'\n'
	done
	begin_measure
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	as_cluster_owner "${PSQL[@]}" -d bench >/dev/null <<<"$sql"
	wait_for "SELECT count(*) = $N FROM absurd.t_bench WHERE state IN ('completed', 'failed', 'cancelled')"
	secs=$(q "SELECT extract(epoch FROM max(completed_at)) - $t0 FROM absurd.r_bench")
	end_measure Absurd "$1" "$secs"
	node_stop
	bad=$(q "SELECT count(*) FROM absurd.t_bench WHERE state <> 'completed' OR completed_payload <> jsonb_build_object('done', params->'i')")
	[[ "$bad" == 0 ]] || die "Absurd: $bad of $N tasks did not complete"
}

# ---- durable_steps, the workflow in application code ---------------------------------------------
run_dsnode() { # round
	local tag="n$1" t0 secs bad line
	q "DELETE FROM durable_steps.runs WHERE status = 'succeeded'; DELETE FROM durable_steps.steps WHERE status = 'succeeded'; DELETE FROM durable_steps.attempts" >/dev/null
	q "VACUUM ANALYZE" >/dev/null
	node_start dsnode || { echo "round $1  durable_steps Node: the worker did not start: $(tail -n 3 "$WORK/node.err" | tr '\n' ' ')"; return 0; }
	echo go >&"$NODE_IN"
	line=$(node_read)
	[[ "$line" == started ]] || die "dsnode: $line"
	begin_measure
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	start_runs_sql three_app "$tag" "$N" | as_cluster_owner "${PSQL[@]}" -d bench >/dev/null
	wait_for "SELECT count(*) = $N FROM durable_steps.runs WHERE workflow LIKE '%three_app%' AND status IN ('succeeded', 'failed', 'cancelled')"
	secs=$(q "SELECT extract(epoch FROM max(finished_at)) - $t0 FROM durable_steps.runs WHERE workflow LIKE '%three_app%'")
	end_measure "ds Node" "$1" "$secs"
	node_stop
	bad=$(q "SELECT count(*) FROM durable_steps.runs r WHERE r.workflow LIKE '%three_app%' AND (r.status <> 'succeeded'
		OR r.output <> jsonb_build_object('done', r.input->'i')
		OR (SELECT count(*) FROM durable_steps.steps s WHERE s.run_id = r.run_id AND s.status = 'succeeded'
		    AND s.step_id IN ('one', 'two', 'three')) <> 3)")
	[[ "$bad" == 0 ]] || die "durable_steps Node: $bad of $N runs did not succeed with 3 succeeded steps"
}

# ---- DBOS -----------------------------------------------------------------------------------------
run_dbos() { # round
	local line secs
	if [[ "$(q "SELECT to_regclass('dbos.workflow_status') IS NOT NULL")" == t ]]; then
		q "DELETE FROM dbos.operation_outputs; DELETE FROM dbos.workflow_status" >/dev/null
	fi
	q "VACUUM ANALYZE" >/dev/null
	node_start dbos || { echo "round $1  DBOS: did not launch: $(tail -n 3 "$WORK/node.err" | tr '\n' ' ')"; return 0; }
	begin_measure
	echo go >&"$NODE_IN"
	line=$(node_read)
	secs=$(sed -E 's/.*"seconds":([0-9.e+-]+).*/\1/' <<<"$line")
	[[ "$line" == *"\"succeeded\":$N,"* ]] || die "DBOS: $line"
	end_measure DBOS "$1" "$secs"
	node_stop
	line=$(q "SELECT count(*) FILTER (WHERE status = 'SUCCESS') || '/' || count(*) FROM dbos.workflow_status WHERE name = 'three'")
	[[ "$line" == "$N/$N" ]] || die "DBOS: workflow_status says $line succeeded"
}

# ---- throughput rounds ----------------------------------------------------------------------------
echo "== runs of a three-step no-op workflow, $N per round"
: >"$WORK/rates"
read -r -a order <<<"$SYSTEMS"
for ((r = 1; r <= ROUNDS; r++)); do
	for ((k = 0; k < ${#order[@]}; k++)); do
		s=${order[$(((k + r - 1) % ${#order[@]}))]}
		case $s in
		ds) run_ds "$r" ;;
		absurd) if [[ -z "${UNAVAILABLE[absurd]:-}" ]]; then run_absurd "$r"; fi ;;
		dbos) if [[ -z "${UNAVAILABLE[dbos]:-}" ]]; then run_dbos "$r"; fi ;;
		dsnode) run_dsnode "$r" ;;
		*) die "unknown system '$s' in SYSTEMS" ;;
		esac
	done
done
awk -F'\t' '{ sum[$1] += $2; cnt[$1]++ }
	END {
		for (s in sum) mean[s] = sum[s] / cnt[s]
		for (s in mean) if (s != "durable_steps" && s != "ds Node" && mean[s] > best) { best = mean[s]; which = s }
		if ("durable_steps" in mean) printf "mean durable_steps %.0f runs/s", mean["durable_steps"]
		for (s in mean) if (s != "durable_steps") printf "; %s %.0f", s, mean[s]
		printf "\n"
		if (best <= 0) { print "no peer ran: no ratio"; exit }
		if ("durable_steps" in mean) {
			verdict = mean["durable_steps"] >= 2 * best ? "PASS" : "BELOW"
			printf "durable_steps / better peer (%s): %.2fx (target >= 2x: %s)\n", which, mean["durable_steps"] / best, verdict
		}
		if ("ds Node" in mean) {
			verdict = mean["ds Node"] >= 3 * best ? "PASS" : "BELOW"
			printf "durable_steps Node (workflow in application code) / better peer (%s): %.2fx (target >= 3x: %s)\n", which, mean["ds Node"] / best, verdict
		}
	}' "$WORK/rates"
for s in absurd dbos; do
	[[ -n "${UNAVAILABLE[$s]:-}" ]] && echo "not measured: $s (${UNAVAILABLE[$s]})"
done
echo

# ---- latency: ds_emit_event commit -> the awaiting run's next step ---------------------------------
echo "== latency from ds_emit_event's commit to the awaiting run's next step, $LAT_SAMPLES samples, ${LAT_GAP_MS} ms apart (load average $(cut -d' ' -f1-3 /proc/loadavg))"
start_runs_sql awaiter lat "$LAT_SAMPLES" | as_cluster_owner "${PSQL[@]}" -d bench >/dev/null
wait_for "SELECT count(*) = $LAT_SAMPLES FROM durable_steps.runs WHERE workflow LIKE '%awaiter%' AND status = 'waiting' AND wait_event IS NOT NULL"
busy0=$(machine_busy_ticks); our_ticks >"$WORK/ticks0"; l0=$(now)
for ((i = 1; i <= LAT_SAMPLES; i++)); do
	echo "BEGIN; SELECT ds_emit_event('lat:$i'); INSERT INTO emitted VALUES ($i, clock_timestamp()); COMMIT; SELECT pg_sleep($LAT_GAP_MS / 1000.0);"
done | as_cluster_owner "${PSQL[@]}" -d bench >/dev/null
wait_for "SELECT count(*) = $LAT_SAMPLES FROM woke"
our_ticks >"$WORK/ticks1"
other=$(awk -v b="$(($(machine_busy_ticks) - busy0))" -v o="$(ticks_between "$WORK/ticks0" "$WORK/ticks1")" -v hz="$HZ" \
	-v s="$(awk -v a="$l0" -v b="$(now)" 'BEGIN { print b - a }')" -v n="$(nproc)" \
	'BEGIN { x = b - o; if (x < 0) x = 0; printf "%.0f", 100 * x / hz / s / n }')
q "SELECT format('p50 %s ms  p90 %s ms  p99 %s ms  max %s ms  (other load %s%% of the machine)',
	round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	round(percentile_cont(0.9) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	round(max(ms)::numeric, 2), $other)
	FROM (SELECT extract(epoch FROM w.at - e.at) * 1000 AS ms FROM woke w JOIN emitted e USING (i)) d"
bad=$(q "SELECT count(*) FROM durable_steps.runs WHERE workflow LIKE '%awaiter%' AND status <> 'succeeded'")
# the wait is real: every run was waiting for its event before it was emitted
[[ "$bad" == 0 ]] || die "latency: $bad runs did not succeed"
echo

# ---- a step in a run vs a plain deferred step -----------------------------------------------------
STEPS=$((3 * N))
echo "== cost of a step: $N runs ($STEPS steps in runs) vs $STEPS plain deferred steps (SELECT 1)"
EXEC_PIDS=$(executor_pids)
# shellcheck disable=SC2086
step_cost() { # name seconds ticks0 -> line, and remember steps/s and ms/step
	local t1
	t1=$(pid_ticks $EXEC_PIDS)
	awk -v name="$1" -v s="$2" -v n="$STEPS" -v t="$((t1 - $3))" -v hz="$HZ" 'BEGIN {
		printf "%-22s %8.0f steps/s  executors CPU %.3f ms/step\n", name, n / s, t * 1000 / hz / n
		printf "%s\t%f\t%f\n", name, n / s, t * 1000 / hz / n >> "'"$WORK/steps"'" }'
}
for ((r = 1; r <= ROUNDS; r++)); do
	q "DELETE FROM durable_steps.runs WHERE status = 'succeeded'; DELETE FROM durable_steps.steps WHERE status = 'succeeded'" >/dev/null
	q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
	# shellcheck disable=SC2086
	c0=$(pid_ticks $EXEC_PIDS)
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	start_runs_sql three "c$r" "$N" | as_cluster_owner "${PSQL[@]}" -d bench >/dev/null
	wait_for "SELECT count(*) = $N FROM durable_steps.runs WHERE status IN ('succeeded', 'failed', 'cancelled')"
	step_cost "round $r steps in runs" "$(q "SELECT extract(epoch FROM max(finished_at)) - $t0 FROM durable_steps.runs")" "$c0"
	q "DELETE FROM durable_steps.runs WHERE status = 'succeeded'; DELETE FROM durable_steps.steps WHERE status = 'succeeded'" >/dev/null
	q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
	# shellcheck disable=SC2086
	c0=$(pid_ticks $EXEC_PIDS)
	t0=$(q "SELECT extract(epoch FROM clock_timestamp())")
	sql=""
	for ((i = 0; i < STEPS; i += 1000)); do
		sql+="SELECT count(ds_run_step('plain', i::text, 'SELECT 1', defer => true)) FROM generate_series($i + 1, least($i + 1000, $STEPS)) i;"$'\n'
	done
	as_cluster_owner "${PSQL[@]}" -d bench >/dev/null <<<"$sql"
	wait_for "SELECT count(*) = $STEPS FROM durable_steps.steps WHERE run_id = 'plain' AND status IN ('succeeded', 'failed', 'cancelled')"
	[[ "$(q "SELECT count(*) FROM durable_steps.steps WHERE run_id = 'plain' AND status = 'succeeded'")" == "$STEPS" ]] ||
		die "plain deferred steps did not all succeed"
	step_cost "round $r plain deferred" "$(q "SELECT extract(epoch FROM max(finished_at)) - $t0 FROM durable_steps.steps WHERE run_id = 'plain'")" "$c0"
done
awk -F'\t' '/steps in runs/ { rs += $2; rc += $3; n++ } /plain deferred/ { ps += $2; pc += $3; m++ }
	END { printf "mean: steps in runs %.0f steps/s, %.3f ms CPU/step; plain deferred %.0f steps/s, %.3f ms CPU/step; a step in a run costs %.2fx the CPU of a plain one (%.2fx its throughput)\n",
	      rs / n, rc / n, ps / m, pc / m, (rc / n) / (pc / m), (rs / n) / (ps / m) }' "$WORK/steps"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
