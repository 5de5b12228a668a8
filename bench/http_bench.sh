#!/usr/bin/env bash
# http_bench.sh -- HTTP steps against a local nginx, and pg_net 0.20.4 against the same endpoint.
#
#   bench/http_bench.sh [port]
#
# Starts nginx (Debian's nginx-light, installed when missing) on 127.0.0.1, a free port, serving
# one static JSON file with keep-alive, and a private throwaway PostgreSQL cluster (bench/lib.sh)
# with durable_steps and pg_net preloaded. pg_net is built from ../shared/peers/pg_net-0.20.4.tar.gz
# (PEERS) into the PostgreSQL of PG_CONFIG, in a temporary directory, when it is not installed
# there already; durable_steps must be installed there (make install) first. Then, in this one
# invocation:
#
#   durable_steps  N steps `ds_http_step(..., '{"url": ".../ok.json", "expect": "json"}')` stored by
#                  transactions of 1,000, sent by the HTTP worker (durable_steps.http_max_inflight =
#                  INFLIGHT); timed from before the storing transaction until every step succeeded
#   pg_net         N `net.http_get(url)` in one transaction, timed until N responses are stored,
#                  once per pg_net.batch_size of PGNET_BATCHES (200 is its default)
#
# Per run: steps (responses) per second, failed or lost requests, CPU milliseconds per step of the
# sending worker process, WAL bytes per step (pg_current_wal_lsn). Then MEM_STEPS more HTTP steps
# through the HTTP worker, in chunks of N, and its resident memory after each chunk.
# Environment (defaults in brackets): N [20000], INFLIGHT [64], PGNET_BATCHES [200 500 1000 2000],
# MEM_STEPS [100000] (0: no memory run), BENCH_PORT [5470], PEERS [../shared/peers beside the
# repository], PG_CONFIG [pg_config], BENCH_OS_USER [postgres] (the cluster's account as root).
set -euo pipefail

die() { echo "http_bench: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_CONFIG="${PG_CONFIG:-pg_config}"
BINDIR="$("$PG_CONFIG" --bindir)"
PORT="${1:-${BENCH_PORT:-5470}}"
BENCH_NAME=http_bench
N="${N:-20000}"
INFLIGHT="${INFLIGHT:-64}"
PGNET_BATCHES="${PGNET_BATCHES-200 500 1000 2000}"
MEM_STEPS="${MEM_STEPS:-100000}"
PEERS="${PEERS:-$HERE/../../shared/peers}"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"

NGINX_DIR=
cleanup() {
	local rc=$?
	if [[ -n "$NGINX_DIR" && -f "$NGINX_DIR/nginx.pid" ]]; then
		kill "$(cat "$NGINX_DIR/nginx.pid")" 2>/dev/null || true
	fi
	bench_stop "$rc"
	[[ -n "$NGINX_DIR" ]] && rm -rf "$NGINX_DIR"
	[[ -n "${WORK:-}" ]] && rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT

# ---- nginx: one static JSON file, keep-alive ------------------------------------------------------
if ! command -v nginx >/dev/null 2>&1 && [[ ! -x /usr/sbin/nginx ]]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y nginx-light >/dev/null ||
		die "could not install nginx-light"
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
NGINX_DIR="$(mktemp -d /tmp/ds_http_bench_nginx.XXXXXX)"
chmod 755 "$NGINX_DIR"
mkdir -p "$NGINX_DIR/www" "$NGINX_DIR/tmp"
printf '{"ok": true, "service": "bench", "items": [1, 2, 3]}\n' >"$NGINX_DIR/www/ok.json"
chmod -R a+rX "$NGINX_DIR"
NGINX_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$NGINX_DIR/nginx.conf" <<EOF
worker_processes 1;
pid $NGINX_DIR/nginx.pid;
error_log $NGINX_DIR/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path $NGINX_DIR/tmp;
    default_type application/json;
    server {
        listen 127.0.0.1:$NGINX_PORT;
        root $NGINX_DIR/www;
    }
}
EOF
"$NGINX" -c "$NGINX_DIR/nginx.conf" -p "$NGINX_DIR" || die "nginx did not start"
URL="http://127.0.0.1:$NGINX_PORT/ok.json"
for _ in $(seq 50); do
	python3 -c "import urllib.request; urllib.request.urlopen('$URL')" 2>/dev/null && break
	sleep 0.1
done

# ---- pg_net, built from the peers' tarball when missing -------------------------------------------
PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
if [[ ! -f "$PKGLIBDIR/pg_net.so" ]]; then
	[[ -f "$PEERS/pg_net-0.20.4.tar.gz" ]] || die "no $PEERS/pg_net-0.20.4.tar.gz"
	BUILD="$(mktemp -d /tmp/ds_http_bench_pgnet.XXXXXX)"
	tar -xzf "$PEERS/pg_net-0.20.4.tar.gz" -C "$BUILD"
	make -C "$BUILD/pg_net-0.20.4" PG_CONFIG="$PG_CONFIG" >"$BUILD/build.log" 2>&1 ||
		{ tail -20 "$BUILD/build.log"; die "pg_net did not build"; }
	make -C "$BUILD/pg_net-0.20.4" PG_CONFIG="$PG_CONFIG" install >>"$BUILD/build.log" 2>&1 ||
		die "pg_net did not install"
	rm -rf "$BUILD"
fi

# ---- the cluster ----------------------------------------------------------------------------------
bench_workdir
bench_initdb C.UTF-8
cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
shared_preload_libraries = 'durable_steps, pg_net'
durable_steps.database = 'bench'
durable_steps.max_workers = 1
durable_steps.http_max_inflight = $INFLIGHT
pg_net.database_name = 'bench'
max_worker_processes = 16
autovacuum = off
EOF
bench_start
PSQL=("$BINDIR/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$WORK" -p "$PORT" -U postgres)
q() { as_cluster_owner "${PSQL[@]}" -d bench -c "$1"; }
as_cluster_owner "${PSQL[@]}" -d postgres -c 'CREATE DATABASE bench'
q 'CREATE EXTENSION durable_steps; CREATE EXTENSION pg_net;'

pid_of() { # backend_type pattern
	local pid=""
	for _ in $(seq 100); do
		pid=$(q "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE '$1' LIMIT 1")
		[[ -n "$pid" ]] && break
		sleep 0.1
	done
	[[ -n "$pid" ]] || die "no process of type $1"
	echo "$pid"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
now() { date +%s.%N; }

# wait until the query answers t, polling every 100 ms
wait_for() {
	local deadline=$(($(date +%s) + 1800))
	until [[ "$(q "$1")" == t ]]; do
		(($(date +%s) < deadline)) || die "timed out waiting for: $1"
		sleep 0.1
	done
}

report() { # name pid t0 cpu0 lsn0 failed
	local name=$1 pid=$2 t0=$3 cpu0=$4 lsn0=$5 failed=$6
	local t1 cpu1 wal
	t1=$(now)
	cpu1=$(cpu_ticks "$pid")
	wal=$(q "SELECT pg_current_wal_lsn() - '$lsn0'::pg_lsn")
	awk -v n="$N" -v t0="$t0" -v t1="$t1" -v c="$((cpu1 - cpu0))" -v tick="$TICK" -v wal="$wal" \
		-v name="$name" -v failed="$failed" \
		'BEGIN { printf "%-28s %7.0f steps/s  %7.3f s  failed %d  worker CPU %.3f ms/step  WAL %.0f B/step\n",
		         name, n / (t1 - t0), t1 - t0, failed, c * 1000 / tick / n, wal / n }'
	awk -v n="$N" -v t0="$t0" -v t1="$t1" -v name="$name" -v failed="$failed" \
		'BEGIN { printf "%s\t%.1f\t%d\n", name, n / (t1 - t0), failed }' >>"$WORK/rates"
}

HTTP_PID=$(pid_of 'durable_steps http')
NET_PID=$(pid_of 'pg_net%')
echo "nginx on $URL; $N requests per run; durable_steps.http_max_inflight = $INFLIGHT"

# ---- durable_steps ----------------------------------------------------------------------------------
# Store n HTTP steps of run $1, 1,000 per transaction: each new step holds its identity lock
# until its transaction ends (docs/operations.md, "Limits").
store_steps() { # run_id n
	local sql="" i
	for ((i = 0; i < $2; i += 1000)); do
		sql+="SELECT count(ds_http_step('$1', i::text, '{\"url\": \"$URL\", \"expect\": \"json\"}')) FROM generate_series($i + 1, least($i + 1000, $2)) i;"$'\n'
	done
	as_cluster_owner "${PSQL[@]}" -d bench >/dev/null <<<"$sql"
}

ds_run() { # run_id
	q "CHECKPOINT" >/dev/null
	local t0 cpu0 lsn0
	lsn0=$(q "SELECT pg_current_wal_lsn()")
	cpu0=$(cpu_ticks "$HTTP_PID")
	t0=$(now)
	store_steps "$1" "$N"
	echo "  stored in $(awk -v t0="$t0" -v t1="$(now)" 'BEGIN { printf "%.3f", t1 - t0 }') s" >&2
	wait_for "SELECT count(*) = $N FROM durable_steps.steps WHERE run_id = '$1' AND status NOT IN ('pending', 'running', 'retrying')"
	report "durable_steps $1" "$HTTP_PID" "$t0" "$cpu0" "$lsn0" \
		"$(q "SELECT count(*) FROM durable_steps.steps WHERE run_id = '$1' AND status <> 'succeeded'")"
}
ds_run warmup >/dev/null
ds_run measured

# ---- pg_net -----------------------------------------------------------------------------------------
for b in $PGNET_BATCHES; do
	q "ALTER SYSTEM SET pg_net.batch_size = $b" >/dev/null
	q "SELECT pg_reload_conf()" >/dev/null
	sleep 1
	q "TRUNCATE net._http_response" >/dev/null
	q "CHECKPOINT" >/dev/null
	lsn0=$(q "SELECT pg_current_wal_lsn()")
	cpu0=$(cpu_ticks "$NET_PID")
	t0=$(now)
	q "SELECT count(net.http_get('$URL')) FROM generate_series(1, $N)" >/dev/null
	wait_for "SELECT count(*) >= $N FROM net._http_response"
	report "pg_net batch_size $b" "$NET_PID" "$t0" "$cpu0" "$lsn0" \
		"$(q "SELECT count(*) FROM net._http_response WHERE status_code IS DISTINCT FROM 200")"
done
awk -F'\t' '/^durable_steps measured/ { ds = $2 }
     /^pg_net/ && $3 == 0 { if ($2 > best) { best = $2; which = $1 } }
     /^pg_net/ { if ($2 > any) { any = $2; anyw = $1 } }
     END {
         if (best > 0) printf "durable_steps / best pg_net losing nothing (%s): %.2fx\n", which, ds / best
         if (any > 0) printf "durable_steps / fastest pg_net, losses included (%s): %.2fx\n", anyw, ds / any
     }' "$WORK/rates"

# ---- memory of the HTTP worker ----------------------------------------------------------------------
if ((MEM_STEPS > 0)); then
	# resident memory of its own (RssAnon), and of the shared buffers it has touched (RssShmem)
	rss() { awk '/^RssAnon/ { a = $2 } /^RssShmem/ { s = $2 } END { printf "private %d kB, shared buffers touched %d kB", a, s }' "/proc/$HTTP_PID/status"; }
	echo "HTTP worker RSS after the runs above: $(rss)"
	done_steps=0
	while ((done_steps < MEM_STEPS)); do
		q "DELETE FROM durable_steps.steps WHERE run_id LIKE 'mem%'" >/dev/null
		store_steps "mem$done_steps" "$N"
		wait_for "SELECT count(*) = $N FROM durable_steps.steps WHERE run_id = 'mem$done_steps' AND status = 'succeeded'"
		done_steps=$((done_steps + N))
		echo "HTTP worker RSS after $done_steps more steps: $(rss)"
	done
fi
