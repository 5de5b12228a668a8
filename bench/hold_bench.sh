#!/usr/bin/env bash
# hold_bench.sh -- the claim path under a held xmin horizon: durable_steps' steps, runs and tasks
# against graphile-worker 0.17.3 and pg-boss 10.4.2, on one throwaway cluster, same settings, one
# invocation.
#
#   bench/hold_bench.sh [port]
#
# For each system of SYSTEMS and each hold kind of HOLD_KIND, in turn (one system's workers run
# at a time; its table is vacuumed and checkpointed before it starts):
#   1. unheld: a producer offers OFFERED_RATE no-op items per second for UNHELD_SECONDS (one
#      session, PRODUCER_BATCH items per transaction, one transaction every
#      PRODUCER_BATCH / OFFERED_RATE seconds on a fixed schedule: it catches up when it falls
#      behind) while the system's workers run them;
#   2. held: the same offered load for HOLD_SECONDS while another session keeps a transaction
#      open and idle: `rr` = BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();
#      `xid` = BEGIN; SELECT txid_current(); (READ COMMITTED). Either keeps the cluster's xmin
#      horizon: vacuum (autovacuum is ON) cannot remove the row versions the claims leave behind;
#   3. recovery: the hold commits, the offered load goes on until the backlog is back to the
#      largest backlog seen unheld (then RECOVERY_TAIL more seconds; RECOVERY_MAX at most);
#      then the producer stops and the queue is drained.
# Items: durable_steps: ds_run_step('hold-<kind>', 'i<n>', 'SELECT 1', defer => true) (the
# executors run every attempt); its runs: ds_start_run('hold_one_step', '{}', 'hold-<kind>-<n>'),
# a workflow of one SQL step (ds_step('s', 'SELECT 1')), its turns and step run by the executors;
# its tasks: ds_task_step('hold-task-<kind>', 'i<n>', 'noop') run by durable_steps' Node worker
# (bench/tasks/worker.js ds: new Worker({pool, concurrency: DST_CONCURRENCY, tasks: {noop}}));
# graphile-worker: graphile_worker.add_job('noop') run by
# bench/graphile/drain.js (run(), task noop: async () => {}); pg-boss: rows inserted into
# pgboss.job with SQL (queue 'noop', policy standard, pg-boss's column defaults) run by
# bench/pgboss/boss.js (boss.work(), handler async (jobs) => {}). All three are produced by the
# same PL/pgSQL loop.
# Latency, the same method for all three: the item's creation time to the time the system records
# it finished, both written by the system in its own table: durable_steps.steps.created_at ->
# finished_at (runs: durable_steps.runs.created_at -> finished_at); pgboss.job.created_on -> completed_on; graphile-worker deletes a finished job, so an
# AFTER DELETE row trigger on graphile_worker._private_jobs copies created_at with
# clock_timestamp() into a side table. (created_at / created_on are taken in the producer's
# transaction, before its commit; the finish times before the finishing transaction's commit.)
# Printed per 60-second bucket (by finish time): items finished per second, p50 and p99 latency,
# and, sampled once a second by a separate connection, the table's dead tuples
# (pg_stat_user_tables.n_dead_tup of durable_steps.steps, graphile_worker._private_jobs, the
# queue's partition of pgboss.job) and the backlog (items not finished). Recovery: seconds from the
# hold's end to the first sample with the backlog back to the unheld maximum and the p99 of the
# items finished in the next RECOVERY_WINDOW seconds <= RECOVERY_FACTOR x the unheld p99.
#
# Target, per system and hold kind: throughput held within 10 % of the offered rate (every held
# bucket finishes >= 90 % of OFFERED_RATE per second) and p99 <= 10x the unheld p99 (in every
# held bucket) through the whole hold.
#
# Starts a private, throwaway PostgreSQL cluster (initdb in a mktemp directory, Unix socket in it,
# listen_addresses = '', durable_steps preloaded, synchronous_commit = on, fsync = on,
# shared_buffers = 256MB, autovacuum ON with its default settings); stops it and removes the
# directory on exit. It builds nothing: run `make install` first. As root, the cluster runs as
# BENCH_OS_USER (default postgres) through runuser; otherwise as the current user. Node 20 and npm
# are needed for the peers (npm install runs in bench/graphile and bench/pgboss when their
# node_modules are missing).
# Environment (defaults in brackets):
#
#   BENCH_PORT       [5530]    port (the first argument wins); names the socket file only
#   SYSTEMS          [ds dsr dst gw pb]  which systems, in this order (ds durable_steps' steps,
#                              dsr its runs, dst its tasks, gw graphile-worker, pb pg-boss)
#   HOLD_KIND        [both]    rr, xid or both (rr then xid: a full unheld/held/recovery per kind)
#   OFFERED_RATE     [200]     items offered per second
#   PRODUCER_BATCH   [10]      items per producer transaction
#   UNHELD_SECONDS   [30]      the unheld phase
#   HOLD_SECONDS     [600]     the held phase
#   BUCKET_SECONDS   [60]      bucket length of the per-bucket table
#   RECOVERY_MAX     [600]     seconds of recovery before giving up
#   RECOVERY_TAIL    [15]      seconds of offered load after the backlog is back
#   RECOVERY_WINDOW  [5]       seconds of finished items whose p99 says latency is back
#   RECOVERY_FACTOR  [1.5]     ... back means <= this x the unheld p99
#   DRAIN_TIMEOUT    [900]     seconds to drain the queue after the producer stops
#   DS_WORKERS       [2]       durable_steps.max_workers (other durable_steps settings: defaults)
#   DST_CONCURRENCY  [4]       the tasks' Node worker: concurrency (prefetch and batching: its
#                              defaults)
#   GW_CONFIG        [4:-1:-1] graphile-worker concurrency:localQueue.size:completeJobBatchDelay
#                              (failJobBatchDelay the same); -1:-1 is its stock mode (one job per
#                              claim, no batching)
#   PB_CONFIG        [2:100:0.5] pg-boss work() loops:batchSize:pollingIntervalSeconds (0.5 s is
#                              pg-boss's minimum; each loop fetches at most once per interval:
#                              capacity loops x batchSize / interval = 400 jobs/s)
#   BENCH_OUT        []        a directory to copy the raw results into (per-item latencies,
#                              samples, phases, the server log)
#   BENCH_STRICT     [0]       1: exit with status 3 when a target is missed
#   BENCH_OS_USER    [postgres] the account that runs the cluster when the script runs as root
#   PG_CONFIG        [pg_config] selects the PostgreSQL installation
#   NPM              [npm]     the npm used to install the peers when node_modules is missing
set -euo pipefail

PORT="${1:-${BENCH_PORT:-5530}}"
SYSTEMS="${SYSTEMS:-ds dsr dst gw pb}"
HOLD_KIND="${HOLD_KIND:-both}"
OFFERED_RATE="${OFFERED_RATE:-200}"
PRODUCER_BATCH="${PRODUCER_BATCH:-10}"
UNHELD_SECONDS="${UNHELD_SECONDS:-30}"
HOLD_SECONDS="${HOLD_SECONDS:-600}"
BUCKET_SECONDS="${BUCKET_SECONDS:-60}"
RECOVERY_MAX="${RECOVERY_MAX:-600}"
RECOVERY_TAIL="${RECOVERY_TAIL:-15}"
RECOVERY_WINDOW="${RECOVERY_WINDOW:-5}"
RECOVERY_FACTOR="${RECOVERY_FACTOR:-1.5}"
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-900}"
DS_WORKERS="${DS_WORKERS:-2}"
DST_CONCURRENCY="${DST_CONCURRENCY:-4}"
GW_CONFIG="${GW_CONFIG:-4:-1:-1}"
PB_CONFIG="${PB_CONFIG:-2:100:0.5}"
OUT="${BENCH_OUT:-}"
STRICT="${BENCH_STRICT:-0}"
PG_CONFIG="${PG_CONFIG:-pg_config}"
NPM="${NPM:-npm}"

DB=bench
TARGET_RATE_PCT=90
TARGET_P99_RATIO=10

die() { echo "hold_bench: $*" >&2; exit 1; }
note() { echo "hold_bench: $*" >&2; }

for v in PORT OFFERED_RATE PRODUCER_BATCH UNHELD_SECONDS HOLD_SECONDS BUCKET_SECONDS RECOVERY_MAX \
	RECOVERY_TAIL RECOVERY_WINDOW DRAIN_TIMEOUT DS_WORKERS DST_CONCURRENCY; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not '${!v}'"
done
[[ "$STRICT" =~ ^[01]$ ]] || die "BENCH_STRICT must be 0 or 1"
((PORT < 5470 || PORT > 5499)) || die "ports 5470-5499 are used by others on this machine; pick another"
[[ "$RECOVERY_FACTOR" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "RECOVERY_FACTOR must be a number"
case "$HOLD_KIND" in
rr | xid) KINDS="$HOLD_KIND" ;;
both) KINDS="rr xid" ;;
*) die "HOLD_KIND must be rr, xid or both, not '$HOLD_KIND'" ;;
esac
for s in $SYSTEMS; do
	[[ "$s" == ds || "$s" == dsr || "$s" == dst || "$s" == gw || "$s" == pb ]] ||
		die "SYSTEMS: ds, dsr, dst, gw, pb, not '$s'"
done
[[ "$GW_CONFIG" =~ ^[0-9]+:-?[0-9]+:-?[0-9]+$ ]] || die "GW_CONFIG is concurrency:localQueue:delay, not '$GW_CONFIG'"
[[ "$PB_CONFIG" =~ ^[0-9]+:[0-9]+:[0-9.]+$ ]] || die "PB_CONFIG is workers:batchSize:pollSeconds, not '$PB_CONFIG'"
TICK_MS="$(awk -v b="$PRODUCER_BATCH" -v r="$OFFERED_RATE" 'BEGIN { printf "%.3f", b * 1000 / r }')"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v "$PG_CONFIG" >/dev/null || die "$PG_CONFIG not found (set PG_CONFIG)"
BINDIR="$("$PG_CONFIG" --bindir)"
for prog in initdb pg_ctl psql; do
	[[ -x "$BINDIR/$prog" ]] || die "$BINDIR/$prog not found"
done
[[ -f "$("$PG_CONFIG" --sharedir)/extension/durable_steps.control" ]] ||
	die "durable_steps is not installed in $("$PG_CONFIG" --sharedir); run 'make install' first"
GW_VERSION=-
PB_VERSION=-
need_npm() { # dir module
	if [[ ! -f "$HERE/$1/node_modules/$2/package.json" ]]; then
		note "installing $2 into bench/$1 (npm install)"
		(cd "$HERE/$1" && "$NPM" install --no-audit --no-fund >/dev/null) || die "npm install failed in bench/$1"
	fi
	node -p "require('$HERE/$1/node_modules/$2/package.json').version"
}
if [[ " $SYSTEMS " == *" gw "* || " $SYSTEMS " == *" pb "* || " $SYSTEMS " == *" dst "* ]]; then
	command -v node >/dev/null || die "node is needed for the peers and the tasks (or SYSTEMS='ds dsr')"
fi
if [[ " $SYSTEMS " == *" dst "* ]]; then
	[[ -f "$HERE/../clients/node/dist/cjs/index.js" && -f "$HERE/../clients/node/node_modules/pg/package.json" ]] ||
		die "build the Node client first: cd clients/node && npm ci && npm run build"
fi
if [[ " $SYSTEMS " == *" gw "* ]]; then
	GW_VERSION="$(need_npm graphile graphile-worker)"
	[[ "$GW_VERSION" == 0.17.3 ]] || note "graphile-worker is $GW_VERSION, not 0.17.3"
fi
if [[ " $SYSTEMS " == *" pb "* ]]; then
	PB_VERSION="$(need_npm pgboss pg-boss)"
	[[ "$PB_VERSION" == 10.4.2 ]] || note "pg-boss is $PB_VERSION, not 10.4.2"
fi

BENCH_NAME=hold_bench
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_workdir
NODE_PID=
NODE_IN=
HOLD_PID=
HOLD_IN=
PROD_PID=
SAMPLER_PID=

kill_wait() { # pid
	if [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; then
		kill "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
	fi
}
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	kill_wait "$SAMPLER_PID"
	kill_wait "$PROD_PID"
	kill_wait "$HOLD_PID"
	kill_wait "$NODE_PID"
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
bench_initdb C
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = '$DB'
durable_steps.max_workers = $DS_WORKERS
max_worker_processes = 24
max_wal_size = 4GB
# ON: the point is that vacuum cannot remove the dead rows while the hold lasts
autovacuum = on
log_line_prefix = '%m [%p] '
EOF
bench_start

psql_db() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d "$DB" "$@"; }
q() { psql_db -At -F ' ' -c "$1"; }
now() { date +%s.%N; }

"$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres -d postgres \
	-c "CREATE DATABASE $DB"
psql_db -c "CREATE EXTENSION durable_steps"
# the runs' workflow: one SQL step
psql_db -c "CREATE FUNCTION hold_one_step(run_id text, input jsonb) RETURNS jsonb LANGUAGE plpgsql
	AS \$\$ BEGIN RETURN ds_step('s', 'SELECT 1'); END \$\$"

no_crash() {
	if grep -q "terminated by signal" "$LOG"; then
		grep -B2 -A3 -m1 "terminated by signal" "$LOG" >&2
		die "a server process crashed during $1"
	fi
}

CONN="postgres:///$DB?host=$WORK&port=$PORT&user=postgres"
psql_db <<'EOF'
SET client_min_messages = warning;
-- every finished item of every run: system, hold kind, created and finished (epoch seconds)
CREATE TABLE hold_lat (sys text, kind text, c float8, d float8);
CREATE TABLE hold_samples (sys text, kind text, t float8, backlog bigint, dead bigint);
CREATE TABLE hold_phases (sys text, kind text, t0 float8, h0 float8, h1 float8, t_end float8,
	hold_backlog bigint, produced_held bigint);
EOF
PB_REL=
if [[ " $SYSTEMS " == *" gw "* ]]; then
	(cd "$HERE/graphile" && GW_CONNECTION="$CONN" node drain.js migrate) || die "graphile-worker migration failed"
	psql_db <<'EOF'
SET client_min_messages = warning;
CREATE TABLE hold_gw_done (c timestamptz NOT NULL, d timestamptz NOT NULL);
CREATE FUNCTION hold_gw_done() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	INSERT INTO public.hold_gw_done VALUES (OLD.created_at, clock_timestamp());
	RETURN NULL;
END
$f$;
CREATE TRIGGER hold_gw_done AFTER DELETE ON graphile_worker._private_jobs
	FOR EACH ROW EXECUTE FUNCTION hold_gw_done();
EOF
fi
if [[ " $SYSTEMS " == *" pb "* ]]; then
	(cd "$HERE/pgboss" && PB_CONNECTION="$CONN" node boss.js migrate >/dev/null) || die "pg-boss migration failed"
	PB_REL="pgboss.$(q "SELECT partition_name FROM pgboss.queue WHERE name = 'noop'")"
	[[ "$PB_REL" != pgboss. ]] || die "pg-boss: no partition for queue noop"
fi

LIB="$("$PG_CONFIG" --pkglibdir)/durable_steps.so"
SHORT_COMMIT="$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')"
IFS=: read -r GW_CONC GW_LQ GW_DELAY <<<"$GW_CONFIG"
IFS=: read -r PB_WORKERS PB_BATCH PB_POLL <<<"$PB_CONFIG"
echo "held-horizon benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine:    $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo) RAM ($(uname -srm)); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "postgres:   $(q "SELECT version()")"
echo "extension:  $LIB ($(date -u -r "$LIB" '+%Y-%m-%d %H:%M:%S UTC'), md5 $(md5sum <"$LIB" | cut -c1-12)); repo HEAD $SHORT_COMMIT"
echo "settings:   $(q "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'max_wal_size',
	'autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold',
	'durable_steps.max_workers', 'durable_steps.batch_size', 'durable_steps.poll_interval')")"
echo "systems:    durable_steps (max_workers $DS_WORKERS, other settings default);" \
	"graphile-worker $GW_VERSION (concurrency $GW_CONC, localQueue.size $GW_LQ, completeJobBatchDelay $GW_DELAY);" \
	"pg-boss $PB_VERSION ($PB_WORKERS work() loops, batchSize $PB_BATCH, pollingIntervalSeconds $PB_POLL); node $(node --version 2>/dev/null || echo -)"
echo "load:       $OFFERED_RATE items/s offered, $PRODUCER_BATCH per transaction every $TICK_MS ms;" \
	"unheld ${UNHELD_SECONDS}s, held ${HOLD_SECONDS}s (hold kinds: $KINDS), recovery up to ${RECOVERY_MAX}s"
echo "latency:    created -> finished as each system records it (durable_steps.steps created_at ->"
echo "            finished_at; pgboss.job created_on -> completed_on; graphile-worker: created_at ->"
echo "            clock_timestamp() of the DELETE that finishes the job, by an AFTER DELETE trigger)"
echo

# --- per system -----------------------------------------------------------------------------
sys_name() {
	case "$1" in
	ds) echo durable_steps ;; dsr) echo "durable_steps runs" ;; dst) echo "durable_steps tasks" ;;
	gw) echo graphile-worker ;; pb) echo pg-boss ;;
	esac
}
sys_rel() {
	case "$1" in
	ds | dst) echo durable_steps.steps ;; dsr) echo durable_steps.runs ;;
	gw) echo graphile_worker._private_jobs ;; pb) echo "$PB_REL" ;;
	esac
}
sys_backlog_sql() {
	case "$1" in
	ds | dst) echo "SELECT count(*) FROM durable_steps.steps WHERE next_attempt_at IS NOT NULL
		AND status IN ('pending', 'retrying', 'running')" ;;
	dsr) echo "SELECT count(*) FROM durable_steps.runs WHERE finished_at IS NULL" ;;
	gw) echo "SELECT count(*) FROM graphile_worker._private_jobs" ;;
	pb) echo "SELECT count(*) FROM pgboss.job WHERE name = 'noop' AND state < 'completed'" ;;
	esac
}
sys_item_sql() { # one item; k is the item's number
	case "$1" in
	ds) echo "PERFORM ds_run_step('hold-$2', 'i' || k, 'SELECT 1', defer => true);" ;;
	dsr) echo "PERFORM ds_start_run('hold_one_step', '{}', 'hold-$2-' || k);" ;;
	dst) echo "PERFORM ds_task_step('hold-task-$2', 'i' || k, 'noop');" ;;
	gw) echo "PERFORM graphile_worker.add_job('noop', '{}'::json);" ;;
	pb) echo "INSERT INTO pgboss.job (name, data, policy) VALUES ('noop', '{}'::jsonb, 'standard');" ;;
	esac
}
sys_export_sql() { # sys kind t0: the finished items into hold_lat
	case "$1" in
	ds) echo "INSERT INTO hold_lat SELECT 'ds', '$2', extract(epoch FROM created_at), extract(epoch FROM finished_at)
		FROM durable_steps.steps WHERE run_id = 'hold-$2' AND finished_at IS NOT NULL" ;;
	dst) echo "INSERT INTO hold_lat SELECT 'dst', '$2', extract(epoch FROM created_at), extract(epoch FROM finished_at)
		FROM durable_steps.steps WHERE run_id = 'hold-task-$2' AND finished_at IS NOT NULL" ;;
	dsr) echo "INSERT INTO hold_lat SELECT 'dsr', '$2', extract(epoch FROM created_at), extract(epoch FROM finished_at)
		FROM durable_steps.runs WHERE run_id LIKE 'hold-$2-%' AND finished_at IS NOT NULL" ;;
	gw) echo "INSERT INTO hold_lat SELECT 'gw', '$2', extract(epoch FROM c), extract(epoch FROM d)
		FROM hold_gw_done WHERE c >= to_timestamp($3); TRUNCATE hold_gw_done" ;;
	pb) echo "INSERT INTO hold_lat SELECT 'pb', '$2', extract(epoch FROM created_on), extract(epoch FROM completed_on)
		FROM pgboss.job WHERE name = 'noop' AND state = 'completed' AND created_on >= to_timestamp($3)" ;;
	esac
}

start_peer() { # sys
	local i
	[[ "$1" == ds || "$1" == dsr ]] && return 0
	rm -f "$WORK/node.in" && mkfifo "$WORK/node.in"
	: >"$WORK/node.out"
	if [[ "$1" == dst ]]; then
		(TB_CONNECTION="$CONN" TB_CONCURRENCY="$DST_CONCURRENCY" \
			exec node "$HERE/tasks/worker.js" ds <"$WORK/node.in" >"$WORK/node.out" 2>"$WORK/node.err") &
	elif [[ "$1" == gw ]]; then
		(cd "$HERE/graphile" && GW_CONNECTION="$CONN" GW_CONCURRENCY="$GW_CONC" GW_LOCAL_QUEUE="$GW_LQ" \
			GW_COMPLETE_DELAY="$GW_DELAY" GW_FAIL_DELAY="$GW_DELAY" \
			exec node drain.js drain <"$WORK/node.in" >"$WORK/node.out" 2>"$WORK/node.err") &
	else
		(cd "$HERE/pgboss" && PB_CONNECTION="$CONN" PB_WORKERS="$PB_WORKERS" PB_BATCH="$PB_BATCH" \
			PB_POLL_SECONDS="$PB_POLL" exec node boss.js work <"$WORK/node.in" >"$WORK/node.out" 2>"$WORK/node.err") &
	fi
	NODE_PID=$!
	exec {NODE_IN}>"$WORK/node.in"
	for ((i = 0; i < 600; i++)); do
		grep -q '^ready' "$WORK/node.out" && break
		sleep 0.05
	done
	grep -q '^ready' "$WORK/node.out" || die "$(sys_name "$1") did not start: $(cat "$WORK/node.err")"
	echo go >&"$NODE_IN"
	for ((i = 0; i < 600; i++)); do
		grep -q '^started' "$WORK/node.out" && return 0
		sleep 0.05
	done
	die "$(sys_name "$1") workers did not start: $(cat "$WORK/node.err")"
}
stop_peer() { # sys
	[[ "$1" == ds || "$1" == dsr ]] && return 0
	echo stop >&"$NODE_IN"
	exec {NODE_IN}>&-
	wait "$NODE_PID" || die "$(sys_name "$1") failed: $(cat "$WORK/node.err")"
	NODE_PID=
	if [[ -s "$WORK/node.err" ]]; then
		note "$(sys_name "$1") said:"
		sed 's/^/    /' "$WORK/node.err" | head -20 >&2
	fi
}

# the hold: a session with an idle open transaction that has an xid (and, rr, a snapshot)
hold_open() { # kind
	local i iso=""
	[[ "$1" == rr ]] && iso=" ISOLATION LEVEL REPEATABLE READ"
	rm -f "$WORK/hold.in" && mkfifo "$WORK/hold.in"
	: >"$WORK/hold.out"
	PGAPPNAME=hold_bench_hold "$BINDIR/psql" -X -q -At -h "$WORK" -p "$PORT" -U postgres -d "$DB" \
		<"$WORK/hold.in" >"$WORK/hold.out" 2>&1 &
	HOLD_PID=$!
	exec {HOLD_IN}>"$WORK/hold.in"
	echo "BEGIN$iso; SELECT 'xid ' || txid_current();" >&"$HOLD_IN"
	for ((i = 0; i < 200; i++)); do
		grep -q '^xid ' "$WORK/hold.out" && break
		sleep 0.05
	done
	grep -q '^xid ' "$WORK/hold.out" || die "the hold did not start: $(cat "$WORK/hold.out")"
	HOLD_XID="$(sed -n 's/^xid //p' "$WORK/hold.out")"
}
hold_close() {
	echo "COMMIT;" >&"$HOLD_IN"
	echo '\q' >&"$HOLD_IN"
	exec {HOLD_IN}>&-
	wait "$HOLD_PID" 2>/dev/null || true
	HOLD_PID=
}

# the producer: one session, PRODUCER_BATCH items per transaction on a fixed schedule, until
# cancelled (pg_cancel_backend: the transaction under way is lost, the committed ones stay)
producer_start() { # sys kind
	local item
	item="$(sys_item_sql "$1" "$2")"
	PGAPPNAME=hold_bench_producer psql_db -c "DO \$do\$
DECLARE
	k bigint := 0;
	tick bigint := 0;
	t0 timestamptz := clock_timestamp();
	pause float8;
BEGIN
	LOOP
		FOR j IN 1..$PRODUCER_BATCH LOOP
			k := k + 1;
			$item
		END LOOP;
		COMMIT;
		tick := tick + 1;
		pause := extract(epoch FROM t0 + tick * interval '$TICK_MS ms' - clock_timestamp());
		IF pause > 0 THEN
			PERFORM pg_sleep(pause);
		END IF;
	END LOOP;
END
\$do\$" >/dev/null 2>"$WORK/producer.err" &
	PROD_PID=$!
}
producer_stop() {
	q "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'hold_bench_producer'" >/dev/null
	wait "$PROD_PID" 2>/dev/null || true
	PROD_PID=
	grep -v "canceling statement due to user request\|^CONTEXT\|^PL/pgSQL\|^SQL statement\|^ *$" \
		"$WORK/producer.err" >&2 || true
}

# the sampler: once a second, from a connection of its own: time, backlog, dead tuples
sampler_start() { # sys kind
	local sql
	sql="SELECT '$1', '$2', extract(epoch FROM clock_timestamp()), ($(sys_backlog_sql "$1")),
		(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '$(sys_rel "$1")'::regclass)"
	: >"$WORK/samples.csv"
	(
		while :; do
			psql_db -At -F ',' -c "$sql" >>"$WORK/samples.csv" 2>/dev/null || true
			sleep 1
		done
	) &
	SAMPLER_PID=$!
}
sampler_stop() {
	kill_wait "$SAMPLER_PID"
	SAMPLER_PID=
}
last_backlog() { tail -n 1 "$WORK/samples.csv" | cut -d, -f4; }

sleep_until() { # epoch
	local s
	s="$(awk -v t="$1" -v n="$(now)" 'BEGIN { d = t - n; printf "%.3f", (d > 0) ? d : 0 }')"
	sleep "$s"
}

ms() { awk -v v="$1" 'BEGIN { if (v == "") print "-"; else printf "%.1f", v * 1000 }'; }

run_one() { # sys kind
	local sys="$1" kind="$2" rel t0 h0 h1 t_end hold_backlog thresh deadline b produced
	rel="$(sys_rel "$sys")"
	echo "== $(sys_name "$sys"), hold $kind: unheld ${UNHELD_SECONDS}s, held ${HOLD_SECONDS}s, then recovery"
	psql_db -c "VACUUM ANALYZE $rel" -c "CHECKPOINT"
	start_peer "$sys"
	sampler_start "$sys" "$kind"
	t0="$(now)"
	producer_start "$sys" "$kind"
	sleep_until "$(awk -v t="$t0" -v s="$UNHELD_SECONDS" 'BEGIN { printf "%.6f", t + s }')"
	hold_open "$kind"
	h0="$(now)"
	echo "   hold open: xid $HOLD_XID; $(q "SELECT 'backend_xid ' || coalesce(backend_xid::text, '-') || ', backend_xmin ' ||
		coalesce(backend_xmin::text, '-') || ', state ' || state FROM pg_stat_activity WHERE application_name = 'hold_bench_hold'")"
	sleep_until "$(awk -v t="$h0" -v s="$HOLD_SECONDS" 'BEGIN { printf "%.6f", t + s }')"
	hold_backlog="$(q "$(sys_backlog_sql "$sys")")"
	h1="$(now)"
	echo "   hold still open at its end: $(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'hold_bench_hold'
		AND state = 'idle in transaction'") session(s) idle in transaction; backlog $hold_backlog"
	hold_close
	no_crash "$(sys_name "$sys") $kind"
	# recovery: the offered load goes on until the backlog is back to the unheld maximum
	thresh="$(awk -F, -v h="$h0" '$3 < h && $4 > m { m = $4 } END { print (m > 0) ? m : 0 }' "$WORK/samples.csv")"
	((thresh >= PRODUCER_BATCH)) || thresh=$PRODUCER_BATCH
	deadline=$((SECONDS + RECOVERY_MAX))
	while :; do
		sleep 1
		b="$(last_backlog)"
		[[ -n "$b" && "$b" -le "$thresh" ]] && break
		((SECONDS < deadline)) || { note "$(sys_name "$sys") $kind: backlog $b after ${RECOVERY_MAX}s of recovery"; break; }
		no_crash "$(sys_name "$sys") $kind"
	done
	sleep "$RECOVERY_TAIL"
	producer_stop
	t_end="$(now)"
	deadline=$((SECONDS + DRAIN_TIMEOUT))
	while [[ "$(q "$(sys_backlog_sql "$sys")")" != 0 ]]; do
		((SECONDS < deadline)) || die "$(sys_name "$sys") $kind: not drained ${DRAIN_TIMEOUT}s after the producer stopped"
		sleep 1
	done
	sampler_stop
	stop_peer "$sys"
	no_crash "$(sys_name "$sys") $kind"
	psql_db -c "$(sys_export_sql "$sys" "$kind" "$t0")"
	psql_db -c "\\copy hold_samples FROM '$WORK/samples.csv' WITH (FORMAT csv)"
	produced="$(q "SELECT count(*) FROM hold_lat WHERE sys = '$sys' AND kind = '$kind' AND c >= $h0 AND c < $h1")"
	q "INSERT INTO hold_phases VALUES ('$sys', '$kind', $t0, $h0, $h1, $t_end, $hold_backlog, $produced)" >/dev/null
	report_one "$sys" "$kind"
}

# per-bucket table of one run, and its row of the final table (appended to $WORK/final.txt)
report_one() { # sys kind
	local sys="$1" kind="$2"
	psql_db -At -F ' ' >"$WORK/buckets.txt" <<EOF
WITH p AS (SELECT * FROM hold_phases WHERE sys = '$sys' AND kind = '$kind'),
l AS (SELECT (d - c) AS lat, d FROM hold_lat WHERE sys = '$sys' AND kind = '$kind'),
b AS (
	SELECT 'unheld' AS phase, g AS i, p.t0 + g * $BUCKET_SECONDS AS b0,
	       least(p.t0 + (g + 1) * $BUCKET_SECONDS, p.h0) AS b1
	FROM p, generate_series(0, ceil((p.h0 - p.t0 - 0.5) / $BUCKET_SECONDS)::int - 1) g
	UNION ALL
	-- (a last bucket shorter than half a second is left out)
	SELECT 'held', g, p.h0 + g * $BUCKET_SECONDS, least(p.h0 + (g + 1) * $BUCKET_SECONDS, p.h1)
	FROM p, generate_series(0, ceil((p.h1 - p.h0 - 0.5) / $BUCKET_SECONDS)::int - 1) g)
SELECT b.phase, b.i, round((b.b0 - p.t0)::numeric, 0), round((b.b1 - p.t0)::numeric, 0),
       round((count(l.d) / (b.b1 - b.b0))::numeric, 1),
       coalesce(round((percentile_cont(0.5) WITHIN GROUP (ORDER BY l.lat) * 1000)::numeric, 1)::text, '-'),
       coalesce(round((percentile_cont(0.99) WITHIN GROUP (ORDER BY l.lat) * 1000)::numeric, 1)::text, '-'),
       coalesce((SELECT s.dead FROM hold_samples s WHERE s.sys = '$sys' AND s.kind = '$kind' AND s.t <= b.b1
                 ORDER BY s.t DESC LIMIT 1)::text, '-'),
       coalesce((SELECT s.backlog FROM hold_samples s WHERE s.sys = '$sys' AND s.kind = '$kind' AND s.t <= b.b1
                 ORDER BY s.t DESC LIMIT 1)::text, '-')
FROM b CROSS JOIN p LEFT JOIN l ON l.d >= b.b0 AND l.d < b.b1
GROUP BY b.phase, b.i, b.b0, b.b1, p.t0
ORDER BY b.b0
EOF
	printf '   %-7s %11s %10s %10s %10s %10s %9s\n' phase "seconds" "done/s" "p50 ms" "p99 ms" "dead tup" backlog
	while read -r phase _ s0 s1 rate p50 p99 dead backlog; do
		printf '   %-7s %11s %10s %10s %10s %10s %9s\n' "$phase" "$s0-$s1" "$rate" "$p50" "$p99" "$dead" "$backlog"
	done <"$WORK/buckets.txt"
	# the whole unheld phase; the hold; recovery
	local un_p50 un_p99 un_rate held_rate produced worst_rate worst_p99 hb rec ratio pct verdict
	read -r un_rate un_p50 un_p99 <<<"$(q "SELECT round((count(*) / (p.h0 - p.t0))::numeric, 1),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY l.d - l.c), percentile_cont(0.99) WITHIN GROUP (ORDER BY l.d - l.c)
		FROM hold_phases p JOIN hold_lat l USING (sys, kind)
		WHERE p.sys = '$sys' AND p.kind = '$kind' AND l.d >= p.t0 AND l.d < p.h0 GROUP BY p.t0, p.h0")"
	read -r held_rate produced hb <<<"$(q "SELECT round(((SELECT count(*) FROM hold_lat l WHERE l.sys = p.sys AND l.kind = p.kind
		AND l.d >= p.h0 AND l.d < p.h1) / (p.h1 - p.h0))::numeric, 1), round((p.produced_held / (p.h1 - p.h0))::numeric, 1),
		p.hold_backlog FROM hold_phases p WHERE p.sys = '$sys' AND p.kind = '$kind'")"
	worst_rate="$(awk '$1 == "held" { if (m == "" || $5 + 0 < m) m = $5 + 0 } END { print m }' "$WORK/buckets.txt")"
	worst_p99="$(awk '$1 == "held" { if ($7 == "-") { inf = 1 } else if ($7 + 0 > m) m = $7 + 0 }
		END { print inf ? "none" : m }' "$WORK/buckets.txt")"
	# recovery: the first sample after the hold with the backlog back and the next
	# RECOVERY_WINDOW seconds' p99 back
	rec="$(q "WITH p AS (SELECT * FROM hold_phases WHERE sys = '$sys' AND kind = '$kind'),
		th AS (SELECT greatest(max(s.backlog), $PRODUCER_BATCH) AS m FROM hold_samples s, p
			WHERE s.sys = p.sys AND s.kind = p.kind AND s.t < p.h0)
		SELECT round((s.t - p.h1)::numeric, 1) FROM hold_samples s, p, th
		WHERE s.sys = p.sys AND s.kind = p.kind AND s.t >= p.h1 AND s.t <= p.t_end - $RECOVERY_WINDOW
		  AND s.backlog <= th.m
		  AND (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY l.d - l.c) FROM hold_lat l
		       WHERE l.sys = p.sys AND l.kind = p.kind AND l.d >= s.t AND l.d < s.t + $RECOVERY_WINDOW)
		      <= $RECOVERY_FACTOR * ${un_p99:-0}
		ORDER BY s.t LIMIT 1")"
	[[ -n "$rec" ]] || rec="not"
	pct="$(awk -v a="$held_rate" -v o="$OFFERED_RATE" 'BEGIN { printf "%.0f", a * 100 / o }')"
	if [[ "$worst_p99" == none ]]; then
		ratio="inf"
	else
		ratio="$(awk -v w="$worst_p99" -v u="$un_p99" 'BEGIN { printf "%.1f", (u > 0) ? w / (u * 1000) : 0 }')"
	fi
	if [[ "$ratio" != inf ]] && awk -v r="$worst_rate" -v o="$OFFERED_RATE" -v x="$ratio" -v pr="$TARGET_RATE_PCT" -v t="$TARGET_P99_RATIO" \
		'BEGIN { exit !(r * 100 >= o * pr && x <= t) }'; then
		verdict=PASS
	else
		verdict=BELOW
		BELOW=1
	fi
	echo "   unheld: $un_rate done/s, p50 $(ms "$un_p50") ms, p99 $(ms "$un_p99") ms; held: offered $produced/s" \
		"(produced), finished $held_rate/s ($pct % of $OFFERED_RATE), worst bucket $worst_rate/s, worst bucket p99 $worst_p99 ms;"
	echo "   backlog at the hold's end $hb; recovery (backlog back, p99 of the next ${RECOVERY_WINDOW}s <= ${RECOVERY_FACTOR}x unheld p99):" \
		"$( [[ "$rec" == not ]] && echo "not reached" || echo "${rec}s after the hold ended")"
	echo
	printf '%-20s %-4s %7s %9s %8s %6s %9s %9s %11s %8s %8s %9s  %s\n' "$(sys_name "$sys")" "$kind" "$OFFERED_RATE" \
		"$produced" "$held_rate" "$pct%" "$worst_rate" "$(ms "$un_p99")" "$worst_p99" "$ratio" "$hb" \
		"$( [[ "$rec" == not ]] && echo "not" || echo "$rec")" "$verdict" >>"$WORK/final.txt"
}

BELOW=0
: >"$WORK/final.txt"
for kind in $KINDS; do
	for sys in $SYSTEMS; do
		run_one "$sys" "$kind"
	done
done

psql_db -At -F ',' -c "SELECT * FROM hold_lat ORDER BY sys, kind, d" >"$WORK/out/latencies.csv"
psql_db -At -F ',' -c "SELECT * FROM hold_samples ORDER BY sys, kind, t" >"$WORK/out/samples.csv"
psql_db -At -F ',' -c "SELECT * FROM hold_phases" >"$WORK/out/phases.csv"

echo "summary: ${HOLD_SECONDS}s hold, ${UNHELD_SECONDS}s unheld, offered $OFFERED_RATE items/s (load average now $(cut -d' ' -f1-3 /proc/loadavg))"
echo "target: throughput held within 10 % of the offered rate (every ${BUCKET_SECONDS}s bucket >= $TARGET_RATE_PCT %)" \
	"and p99 <= ${TARGET_P99_RATIO}x the unheld p99 through the whole hold"
printf '%-20s %-4s %7s %9s %8s %6s %9s %9s %11s %8s %8s %9s  %s\n' system hold offered produced "held/s" "%off" \
	"worst/s" "p99 unh" "worst p99" "ratio" backlog "recov s" verdict
cat "$WORK/final.txt"
echo "(offered: the nominal rate; produced: items created per second during the hold; held/s: items"
echo " finished per second during the hold; worst/s: the slowest bucket; p99 in ms; ratio: worst held"
echo " bucket p99 / unheld p99; backlog: unfinished items when the hold ended; recov s: seconds from"
echo " the hold's end until the backlog and p99 were back)"
if ((BELOW && STRICT == 1)); then
	exit 3
fi
