#!/usr/bin/env bash
# run_step_bench.sh -- the synchronous durable step against bare SQL, side by side.
#
#   bench/run_step_bench.sh [port]
#
# Starts a private, throwaway PostgreSQL cluster (initdb in a mktemp directory, Unix socket only,
# durable_steps preloaded, synchronous_commit = on, fsync on), prepares the data and runs the
# pgbench scripts of this directory in pairs, interleaved round after round:
#
#   replay_bare  bare primary-key SELECT of a comparable row       } target: step >= 0.8 x bare
#   replay_step  ds_run_step replaying a completed step             }
#   fresh_bare   bare INSERT in its own transaction                 } target: step >= 0.6 x bare
#   fresh_step   fresh ds_run_step whose body is that one INSERT    }
#
# It builds nothing: run `make install` first. It runs as a normal user, or as root (the cluster
# then runs as BENCH_OS_USER, default postgres, through runuser). The cluster is stopped and its
# directory removed on exit. Environment (defaults in brackets):
#
#   BENCH_SECONDS [20]   duration of each measured pgbench run
#   BENCH_ROUNDS  [3]    rounds; each runs every script once, bare and step of a pair adjacent,
#                        in alternating order (odd rounds bare first, even rounds step first)
#   BENCH_WARMUP  [3]    seconds of unmeasured warm-up per script before round 1 (0: none)
#   BENCH_CLIENTS [8]    pgbench -c;  BENCH_THREADS [2]  pgbench -j
#   BENCH_ROWS    [10000] completed steps and kv rows for the replay pair
#   BENCH_PORT    [5470] port (the first argument wins); it only names the socket file, which
#                        lives in the private directory
#   BENCH_STRICT  [0]    1: exit with status 3 when a ratio is below its target
#   BENCH_DIAG    [0]    1: also run the diagnostics replay_floor.sql and fresh_floor.sql (what
#                        a step leaves in the tables, read or written by plain SQL as the table
#                        owner), figures without a target
#   BENCH_LOCALE  [C.UTF-8] initdb --locale (the collation of the steps' text keys)
#   BENCH_OS_USER [postgres] the account that runs the cluster when the script runs as root
#   PG_CONFIG     [pg_config] selects the PostgreSQL installation
set -euo pipefail

PORT="${1:-${BENCH_PORT:-5470}}"
SECS="${BENCH_SECONDS:-20}"
ROUNDS="${BENCH_ROUNDS:-3}"
WARMUP="${BENCH_WARMUP:-3}"
CLIENTS="${BENCH_CLIENTS:-8}"
THREADS="${BENCH_THREADS:-2}"
NROWS="${BENCH_ROWS:-10000}"
STRICT="${BENCH_STRICT:-0}"
DIAG="${BENCH_DIAG:-0}"
LOCALE="${BENCH_LOCALE:-C.UTF-8}"
PG_CONFIG="${PG_CONFIG:-pg_config}"

REPLAY_TARGET=0.8
FRESH_TARGET=0.6
DB=benchdb
APP_ROLE=bench

die() { echo "run_step_bench: $*" >&2; exit 1; }

for v in PORT SECS ROUNDS WARMUP CLIENTS THREADS NROWS; do
	[[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, not '${!v}'"
done
((SECS > 0 && ROUNDS > 0 && CLIENTS > 0 && THREADS > 0 && NROWS > 0)) ||
	die "BENCH_SECONDS, BENCH_ROUNDS, BENCH_CLIENTS, BENCH_THREADS and BENCH_ROWS must be > 0"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v "$PG_CONFIG" >/dev/null || die "$PG_CONFIG not found (set PG_CONFIG)"
BINDIR="$("$PG_CONFIG" --bindir)"
for prog in initdb pg_ctl psql pgbench; do
	[[ -x "$BINDIR/$prog" ]] || die "$BINDIR/$prog not found"
done
[[ -f "$("$PG_CONFIG" --sharedir)/extension/durable_steps.control" ]] ||
	die "durable_steps is not installed in $("$PG_CONFIG" --sharedir); run 'make install' first"
for script in replay_bare replay_step replay_floor fresh_bare fresh_step fresh_floor; do
	[[ -f "$HERE/$script.sql" ]] || die "missing $HERE/$script.sql"
done

BENCH_NAME=run_step_bench
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_workdir

PGBENCH_PID=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ -n "$PGBENCH_PID" ]]; then
		kill "$PGBENCH_PID" 2>/dev/null || true
		wait "$PGBENCH_PID" 2>/dev/null || true
	fi
	bench_stop "$rc"
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the cluster ----------------------------------------------------------------------------
bench_initdb "$LOCALE"
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps'
durable_steps.database = '$DB'
EOF
bench_start

psql_admin() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres "$@"; }
psql_app() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U "$APP_ROLE" -d "$DB" "$@"; }

# --- data -----------------------------------------------------------------------------------
# The application is a plain login role owning its database; only CREATE EXTENSION needs a
# superuser.
psql_admin -d postgres -c "CREATE ROLE $APP_ROLE LOGIN" -c "CREATE DATABASE $DB OWNER $APP_ROLE"
psql_admin -d "$DB" -c "CREATE EXTENSION durable_steps"

psql_app <<EOF
CREATE TABLE kv (id int PRIMARY KEY, payload jsonb NOT NULL);
INSERT INTO kv SELECT i, jsonb_build_object('id', i) FROM generate_series(1, $NROWS) i;
CREATE TABLE events (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
CREATE SEQUENCE bench_seq;
EOF

# The completed steps the replay pair reads, in batches of 1000 per transaction: every step a
# transaction creates holds its identity lock to commit, and those share the lock table.
psql_app <<EOF
DO \$\$
DECLARE
    lo int := 1;
    n int;
BEGIN
    WHILE lo <= $NROWS LOOP
        SELECT count(*) INTO n
          FROM generate_series(lo, least(lo + 999, $NROWS)) i,
               LATERAL ds_run_step('bench', 's' || i, 'SELECT \$1', jsonb_build_object('id', i)) r
         WHERE r.status = 'succeeded' AND NOT r.replayed;
        IF n <> least(lo + 999, $NROWS) - lo + 1 THEN
            RAISE EXCEPTION 'seeding steps % to %: only % succeeded', lo, least(lo + 999, $NROWS), n;
        END IF;
        COMMIT;
        lo := lo + 1000;
    END LOOP;
END
\$\$;
EOF
psql_admin -d "$DB" -c "VACUUM ANALYZE" -c "CHECKPOINT"

# The scripts must do what they claim: a replay answers from the store and equals the kv row,
# a fresh step runs its INSERT.
check="$(psql_app -At <<'EOF'
SELECT r.replayed AND r.status = 'succeeded' AND r.result = k.payload
  FROM ds_run_step('bench', 's1', 'SELECT $1', jsonb_build_object('id', 1)) r,
       kv k WHERE k.id = 1;
EOF
)"
[[ "$check" == t ]] || die "replaying step bench/s1 did not return its stored result (got '$check')"
attempts_before="$(psql_admin -d "$DB" -At -c \
	"SELECT count(*) FROM durable_steps.attempts WHERE run_id = 'bench'")"

# --- measurement ----------------------------------------------------------------------------
PG_VERSION="$(psql_app -At -c "SELECT version()")"
PG_SETTINGS="$(psql_app -At -c "SELECT string_agg(name || '=' || current_setting(name), ', '
	ORDER BY name) FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync',
	'shared_buffers', 'wal_sync_method', 'max_connections', 'lc_collate')")"

REPLAY_GROUP=(replay_bare replay_step)
((DIAG == 1)) && REPLAY_GROUP+=(replay_floor)
FRESH_GROUP=(fresh_bare fresh_step)
((DIAG == 1)) && FRESH_GROUP+=(fresh_floor)
SCRIPTS=("${REPLAY_GROUP[@]}" "${FRESH_GROUP[@]}")
declare -A TPS LAT FAILED

# run_pgbench script seconds outfile
run_pgbench() {
	local user="$APP_ROLE"
	[[ "$1" == *_floor ]] && user=postgres # the app role cannot touch the extension's tables
	# in the background, so that a signal to this script is handled at once (see cleanup)
	"$BINDIR/pgbench" -h "$WORK" -p "$PORT" -U "$user" -n -M prepared \
		-c "$CLIENTS" -j "$THREADS" -T "$2" -D nrows="$NROWS" -f "$HERE/$1.sql" "$DB" \
		>"$3" 2>&1 &
	PGBENCH_PID=$!
	wait "$PGBENCH_PID" || { PGBENCH_PID=; cat "$3" >&2; die "pgbench $1 failed"; }
	PGBENCH_PID=
}

# reversed NAME...: the arguments in reverse order
reversed() {
	local i
	for ((i = $#; i > 0; i--)); do printf '%s\n' "${!i}"; done
}

echo "durable_steps run-step benchmark"
echo "machine:    $(nproc) CPUs ($(uname -srm))"
echo "postgres:   $PG_VERSION"
LIB="$("$PG_CONFIG" --pkglibdir)/durable_steps.so"
echo "extension:  $LIB ($(date -u -r "$LIB" '+%Y-%m-%d %H:%M:%S UTC'), md5 $(md5sum <"$LIB" | cut -c1-12))"
echo "settings:   $PG_SETTINGS"
echo "pgbench:    -c $CLIENTS -j $THREADS -T $SECS -M prepared -n; $ROUNDS round(s), bare and step" \
	"adjacent, order alternating by round; $NROWS completed steps / kv rows"
echo

if ((WARMUP > 0)); then
	for s in "${SCRIPTS[@]}"; do
		run_pgbench "$s" "$WARMUP" "$WORK/warmup.$s.out"
	done
fi

printf '%-12s %6s %11s %12s %8s\n' script round tps latency_ms failed
for ((r = 1; r <= ROUNDS; r++)); do
	# odd rounds run bare then step, even rounds step then bare: a drift of the machine's speed
	# during the run then favours neither side
	if ((r % 2)); then
		order=("${REPLAY_GROUP[@]}" "${FRESH_GROUP[@]}")
	else
		mapfile -t order < <(reversed "${REPLAY_GROUP[@]}"; reversed "${FRESH_GROUP[@]}")
	fi
	for s in "${order[@]}"; do
		psql_admin -d "$DB" -c "CHECKPOINT"
		out="$WORK/$s.$r.out"
		run_pgbench "$s" "$SECS" "$out"
		TPS[$s,$r]="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out" | head -n 1)"
		LAT[$s,$r]="$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out" | head -n 1)"
		FAILED[$s,$r]="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out" | head -n 1)"
		[[ -n "${TPS[$s,$r]}" && -n "${LAT[$s,$r]}" ]] || { cat "$out" >&2; die "could not parse pgbench output of $s"; }
		printf '%-12s %6s %11.1f %12.3f %8s\n' "$s" "$r" "${TPS[$s,$r]}" "${LAT[$s,$r]}" "${FAILED[$s,$r]:-?}"
	done
done

# --- after the runs: the replays ran no body, the fresh steps all succeeded ------------------
attempts_after="$(psql_admin -d "$DB" -At -c \
	"SELECT count(*) FROM durable_steps.attempts WHERE run_id = 'bench'")"
((attempts_after == attempts_before)) ||
	die "replay ran step bodies: attempts of run 'bench' went from $attempts_before to $attempts_after"
fresh_check="$(psql_admin -d "$DB" -At -F ' ' -c "SELECT count(*), count(*) FILTER (WHERE status <> 'succeeded')
	FROM durable_steps.steps WHERE run_id LIKE 'fresh-%'")"
# (the rows of fresh_floor.sql are under runs 'floor-<client>' and are not steps that ran)
read -r fresh_steps fresh_bad <<<"$fresh_check"
((fresh_bad == 0)) || die "$fresh_bad fresh steps did not succeed"

# --- summary --------------------------------------------------------------------------------
mean() { # mean of TPS or LAT (array name) of a script over the rounds
	local -n arr="$1"
	local s="$2" r
	for ((r = 1; r <= ROUNDS; r++)); do echo "${arr[$s,$r]}"; done |
		awk '{ sum += $1 } END { printf "%.3f", sum / NR }'
}

echo
printf '%-12s %11s %12s\n' script "mean tps" "latency_ms"
for s in "${SCRIPTS[@]}"; do
	printf '%-12s %11.1f %12.3f\n' "$s" "$(mean TPS "$s")" "$(mean LAT "$s")"
done

# The verdict is the median over the rounds of step tps / bare tps, each ratio taken from two
# adjacent runs.
below=0
ratio_line() { # step bare target label
	local r ratios=() median ok
	for ((r = 1; r <= ROUNDS; r++)); do
		ratios+=("$(awk -v a="${TPS[$1,$r]}" -v b="${TPS[$2,$r]}" 'BEGIN { printf "%.3f", a / b }')")
	done
	median="$(printf '%s\n' "${ratios[@]}" | sort -g |
		awk '{ v[NR] = $1 } END { printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
	if [[ "$3" == - ]]; then
		ok=-
	else
		ok="$(awk -v r="$median" -v t="$3" 'BEGIN { print (r >= t) ? "PASS" : "BELOW" }')"
		[[ "$ok" == PASS ]] || below=1
	fi
	printf '%-34s %-22s %7s %8s   %s\n' "$4" "${ratios[*]}" "$median" \
		"$([[ "$3" == - ]] && echo - || echo ">= $3")" "$ok"
}
echo
printf '%-34s %-22s %7s %8s   %s\n' pair "per-round ratios" median target verdict
ratio_line replay_step replay_bare "$REPLAY_TARGET" "replay step / bare PK SELECT"
ratio_line fresh_step fresh_bare "$FRESH_TARGET" "fresh step / bare INSERT"
if ((DIAG == 1)); then
	ratio_line replay_floor replay_bare - "diag: replay floor / bare PK"
	ratio_line replay_step replay_floor - "diag: replay step / replay floor"
	ratio_line fresh_floor fresh_bare - "diag: fresh floor / bare INSERT"
	ratio_line fresh_step fresh_floor - "diag: fresh step / fresh floor"
fi
echo
echo "checks: $attempts_after attempts for the $NROWS replayed steps (unchanged: no body ran);" \
	"$fresh_steps fresh steps, all succeeded"

if ((below && STRICT == 1)); then
	exit 3
fi
