#!/usr/bin/env bash
# wait_bench.sh -- how soon ds_wait_step answers after the outcome's commit, against a client
# that polls the step every POLL_MS, in one invocation; and what WAITERS sleeping waiters cost.
#
#   bench/wait_bench.sh [port]
#
# A private throwaway cluster (bench/lib.sh: Unix socket in a mktemp directory only, fsync and
# synchronous_commit on) with durable_steps preloaded, one database `bench`. durable_steps must be
# installed in the PostgreSQL of PG_CONFIG (make install).
#
#   latency  SAMPLES steps, one at a time: a waiter session starts waiting on a step that is not
#            due (ds_wait_step, or a PL/pgSQL loop that reads the step's status and sleeps POLL_MS
#            between reads: what an application without ds_wait_step writes), and once it waits
#            another session cancels the step (ds_cancel_step: the outcome, committed). The
#            latency is the waiter's clock_timestamp() when it returned minus the step's
#            finished_at, which the cancelling transaction wrote just before its commit: the
#            commit itself is inside it. The two waiters alternate, sample by sample.
#   waiters  WAITERS sessions wait on WAITERS steps of one run for SLEEP_S seconds: the CPU the
#            server's processes used meanwhile (from /proc), against the same seconds with the
#            same sessions polling every POLL_MS; then one transaction cancels the run's steps,
#            and the time until the last waiter returned.
#
# Environment: SAMPLES [200], POLL_MS [10], WAITERS [200], SLEEP_S [5], BENCH_PORT [5530],
# PG_CONFIG, BENCH_OS_USER [postgres] (the cluster's account when run as root).
set -euo pipefail

die() { echo "wait_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5530}}"
BENCH_NAME=wait_bench
SAMPLES="${SAMPLES:-200}"
POLL_MS="${POLL_MS:-10}"
WAITERS="${WAITERS:-200}"
SLEEP_S="${SLEEP_S:-5}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive SAMPLES POLL_MS WAITERS SLEEP_S
trap bench_on_exit EXIT

bench_workdir
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'bench'
max_connections = $((WAITERS + 20))
EOF
bench_start
psql_db() { as_cluster_owner "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d bench "$@"; }
q() { psql_db -At -c "$1"; }
as_cluster_owner "$BINDIR/createdb" -h "$WORK" -p "$PORT" -U postgres bench
psql_db -c "CREATE EXTENSION durable_steps" -c "CREATE TABLE lat (kind text, i int, ms float8)" -c "
CREATE FUNCTION poll_step(r text, s text, every_ms int) RETURNS timestamptz LANGUAGE plpgsql AS \$\$
BEGIN
    LOOP
        EXIT WHEN (SELECT status FROM ds_steps WHERE run_id = r AND step_id = s)
                  IN ('succeeded', 'failed', 'blocked', 'uncertain', 'cancelled');
        PERFORM pg_sleep(every_ms / 1000.0);
    END LOOP;
    RETURN clock_timestamp();
END \$\$;"

# waiting sessions of the database, other than autovacuum's and the worker's
waiting_sessions() {
	q "SELECT count(*) FROM pg_stat_activity WHERE datname = 'bench' AND backend_type = 'client backend'
	     AND query LIKE '%$1%' AND state = 'active' AND pid <> pg_backend_pid()"
}

# ---- latency ----------------------------------------------------------------------------------
echo "latency: $SAMPLES samples each, ds_wait_step against polling every $POLL_MS ms"
for ((i = 1; i <= SAMPLES; i++)); do
	for kind in wait poll; do
		step="$kind$i"
		q "SELECT 1 FROM ds_run_step('lat', '$step', 'SELECT 1', run_at => now() + interval '1 hour')" >/dev/null
		if [[ $kind == wait ]]; then
			sql="SELECT clock_timestamp() FROM ds_wait_step('lat', '$step', '30 s') /* $step */"
		else
			sql="SELECT poll_step('lat', '$step', $POLL_MS) /* $step */"
		fi
		out="$WORK/$step.out"
		psql_db -At -c "$sql" >"$out" &
		until [[ "$(waiting_sessions "/* $step */")" == 1 ]]; do sleep 0.005; done
		q "SELECT 1 FROM ds_cancel_step('lat', '$step')" >/dev/null
		wait
		q "INSERT INTO lat SELECT '$kind', $i, extract(epoch FROM '$(cat "$out")'::timestamptz - finished_at) * 1000
		     FROM ds_steps WHERE run_id = 'lat' AND step_id = '$step'"
	done
done
psql_db -c "SELECT kind, count(*) AS samples,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) AS p50_ms,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2) AS p99_ms,
       round(max(ms)::numeric, 2) AS max_ms
  FROM lat GROUP BY kind ORDER BY kind DESC"
q "SELECT 'latency ratio (p50 polling / p50 ds_wait_step): ' ||
       round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM lat WHERE kind = 'poll')::numeric
           / nullif((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM lat WHERE kind = 'wait'), 0)::numeric, 1)"

# ---- many waiters -----------------------------------------------------------------------------
# CPU ticks of the server's processes (the postmaster's children), one "pid ticks" line each
# (one awk over every /proc/PID/stat: a process per reading would take seconds on a loaded machine)
server_ticks() {
	local pm files=()
	pm="$(head -n 1 "$PGDATA_DIR/postmaster.pid")"
	for p in $(pgrep -P "$pm"); do files+=("/proc/$p/stat"); done
	awk '{print $1, $14 + $15}' "${files[@]}" 2>/dev/null || true
}

# The ticks the processes present in both readings used between them: a process read only at
# the end would count its whole life
ticks_between() {
	awk 'NR == FNR { before[$1] = $2; next } ($1 in before) { sum += $2 - before[$1] } END { print sum + 0 }' "$1" "$2"
}

many() {
	local kind=$1 run="many-$1" t0 t1 start end
	q "SELECT count(*) FROM generate_series(1, $WAITERS) g,
	     ds_run_step('$run', 's' || g, 'SELECT 1', run_at => now() + interval '1 hour')" >/dev/null
	for ((k = 1; k <= WAITERS; k++)); do
		if [[ $kind == wait ]]; then
			sql="SELECT clock_timestamp() FROM ds_wait_step('$run', 's$k', '5 min') /* $run */"
		else
			sql="SELECT poll_step('$run', 's$k', $POLL_MS) /* $run */"
		fi
		psql_db -At -c "$sql" >"$WORK/$run.$k" &
	done
	until [[ "$(waiting_sessions "/* $run */")" == "$WAITERS" ]]; do sleep 0.05; done
	local w0 w1 secs
	w0="$(date +%s.%N)"
	server_ticks >"$WORK/ticks0"
	sleep "$SLEEP_S"
	w1="$(date +%s.%N)"
	server_ticks >"$WORK/ticks1"
	# the seconds between the two readings, as they were taken (the sleep, and a reading's time)
	secs="$(awk -v a="$w0" -v b="$w1" 'BEGIN {print b - a}')"
	t0=0
	t1="$(ticks_between "$WORK/ticks0" "$WORK/ticks1")"
	start="$(q "SELECT extract(epoch FROM clock_timestamp())")"
	q "SELECT count(*) FROM generate_series(1, $WAITERS) g, ds_cancel_step('$run', 's' || g)" >/dev/null
	wait
	end="$(cat "$WORK/$run".* | sort | tail -n 1)"
	end="$(q "SELECT extract(epoch FROM '$end'::timestamptz)")"
	printf '%-14s %d sessions: server CPU while they waited %.1f%% of one CPU; all answered %.0f ms after the cancelling statement began\n' \
		"$([[ $kind == wait ]] && echo ds_wait_step || echo "polling ${POLL_MS}ms")" "$WAITERS" \
		"$(awk -v a="$t0" -v b="$t1" -v s="$secs" -v hz="$(getconf CLK_TCK)" 'BEGIN {print 100 * (b - a) / hz / s}')" \
		"$(awk -v a="$start" -v b="$end" 'BEGIN {print (b - a) * 1000}')"
}
echo "waiters: $WAITERS sessions for $SLEEP_S s"
many wait
many poll
