#!/usr/bin/env bash
# storage_bench.sh -- the disk and WAL a finished step costs, in steady state, at each fillfactor
# of durable_steps.steps (docs/internals.md, "Storage").
#
#   bench/storage_bench.sh [port]
#
# It starts one throwaway server of PG_CONFIG's PostgreSQL (durable_steps preloaded) and, for
# each fillfactor of BENCH_FILLFACTORS, creates the extension afresh, sets the table's fillfactor
# and stores BENCH_STEPS steps in two halves, in transactions of 1,000, with the worker running
# and a VACUUM every 10,000 (as autovacuum would), each step a real row: SQL of 40 bytes and an
# input of about 50. The first half fills the table; the second is measured, so that the space
# VACUUM freed is there to be used, as in a table that keeps a retention window of history:
#
#   inline    ds_run_step(...): each step runs and is stored finished by the call
#   deferred  ds_run_step(..., defer => true): stored pending, claimed, finished by the worker
#
# For each it prints the heap and index bytes the table grew by per step over the second half,
# the WAL bytes per step, and the share of updates that were HOT. It builds nothing: run `make
# install` first. Environment (defaults in brackets):
#
#   BENCH_FILLFACTORS [33 50 70 100]  the fillfactors measured (33 is the installed one)
#   BENCH_STEPS       [100000]        steps per measurement (a multiple of 2,000)
#   BENCH_PORT        [5480]          the server's port (the argument wins)
#   BENCH_OS_USER     [postgres]      as root, the account that runs the cluster
#   PG_CONFIG         [pg_config]     the server's PostgreSQL
set -euo pipefail

die() { echo "storage_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5480}}"
BENCH_NAME=storage_bench
FILLFACTORS="${BENCH_FILLFACTORS:-33 50 70 100}"
STEPS="${BENCH_STEPS:-100000}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
bench_positive STEPS
((STEPS % 2000 == 0)) || die "BENCH_STEPS must be a multiple of 2000, not $STEPS"
for ff in $FILLFACTORS; do
	[[ "$ff" =~ ^[0-9]+$ ]] && ((ff >= 10 && ff <= 100)) || die "a fillfactor is 10 to 100, not '$ff'"
done
[[ -f "$("$PG_CONFIG" --pkglibdir)/durable_steps.so" ]] || die "durable_steps is not installed (make install)"

bench_workdir
trap bench_on_exit EXIT
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<CONF
shared_preload_libraries = 'durable_steps'
durable_steps.database = 'postgres'
autovacuum = off
CONF
bench_start

q() { "$BINDIR/psql" -h "$WORK" -p "$PORT" -U postgres -d postgres -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# Stores $2 batches of 1,000 steps named $1-<batch>, then waits for them all to be finished.
store() {
	local b
	for ((b = 1; b <= $2; b++)); do
		q -c "SELECT count(*) FROM generate_series(1, 1000) g,
		        LATERAL ds_run_step('$1-$b', 's' || g,
		          'SELECT 1 AS order_total, 2 AS line_items',
		          input => jsonb_build_object('order', g, 'customer', 'c-' || g, 'amount', 12.5),
		          defer => $3) r" >/dev/null
		((b % 10 == 0)) && q -c 'VACUUM durable_steps.steps'
	done
	until [[ "$(q -c "SELECT count(*) FROM durable_steps.steps WHERE finished_at IS NULL")" == 0 ]]; do
		sleep 0.2
	done
	q -c 'VACUUM durable_steps.steps'
}

half=$((STEPS / 2000))
printf '%-9s %10s %10s %10s %10s %8s\n' mode fillfactor 'heap B' 'index B' 'WAL B' 'HOT %'
for mode in inline deferred; do
	defer=false
	[[ $mode == deferred ]] && defer=true
	for ff in $FILLFACTORS; do
		q -c 'DROP EXTENSION IF EXISTS durable_steps CASCADE' -c 'CREATE EXTENSION durable_steps' \
			-c "ALTER TABLE durable_steps.steps SET (fillfactor = $ff)" >/dev/null
		store fill "$half" "$defer"
		read -r heap0 idx0 wal0 hot0 upd0 < <(q -F ' ' -c "SELECT pg_relation_size('durable_steps.steps'),
			pg_indexes_size('durable_steps.steps'), pg_current_wal_lsn() - '0/0',
			n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relid = 'durable_steps.steps'::regclass")
		store measured "$half" "$defer"
		q -F ' ' -c "SELECT '$mode', $ff,
			round((pg_relation_size('durable_steps.steps') - $heap0) / ($half * 1000.0)),
			round((pg_indexes_size('durable_steps.steps') - $idx0) / ($half * 1000.0)),
			round((pg_current_wal_lsn() - '0/0' - $wal0) / ($half * 1000.0)),
			CASE WHEN n_tup_upd > $upd0 THEN round(100.0 * (n_tup_hot_upd - $hot0) / (n_tup_upd - $upd0)) END
			FROM pg_stat_user_tables WHERE relid = 'durable_steps.steps'::regclass" |
			while read -r m f h i w p; do printf '%-9s %10s %10s %10s %10s %8s\n' "$m" "$f" "$h" "$i" "$w" "${p:--}"; done
	done
done
echo "steady state: the second half of $STEPS steps, after the first filled the table; $("$BINDIR/postgres" --version)"
