# bench/lib.sh -- the throwaway cluster both benchmark drivers run on. Sourced, not run.
#
# The sourcing script sets BINDIR (PostgreSQL's bin directory), PORT and BENCH_NAME (its name,
# for messages and the settings' comment) and defines die(). Then:
#
#   bench_workdir           sets WORK (a new mktemp directory), PGDATA_DIR and LOG; as root,
#                           hands WORK to the account that will run the cluster
#   bench_initdb LOCALE     initdb, and the settings every benchmark uses (Unix socket in WORK
#                           only, synchronous_commit and fsync on, shared_buffers 256MB); the
#                           caller appends its own settings to "$PGDATA_DIR/postgresql.conf"
#   bench_start             starts the server
#   bench_stop RC           in the caller's EXIT trap: stops the server if it runs and, when RC
#                           is not 0, shows the end of its log
#   as_cluster_owner CMD..  runs CMD as the account that owns the cluster
#   bench_positive VAR..    dies unless each named variable holds a positive integer
#   bench_on_exit           the EXIT trap of a driver with nothing else to clean up: ends its
#                           background jobs, stops the server, removes WORK

# initdb refuses root: as root, the cluster runs as an unprivileged account
RUNAS=()
if [[ "$(id -u)" == 0 ]]; then
	OS_USER="${BENCH_OS_USER:-postgres}"
	id "$OS_USER" >/dev/null 2>&1 || die "running as root needs an account '$OS_USER' (BENCH_OS_USER)"
	RUNAS=(runuser -u "$OS_USER" --)
fi
as_cluster_owner() { ${RUNAS[@]+"${RUNAS[@]}"} "$@"; }

bench_workdir() {
	# mktemp replaces the X's with a unique name
	WORK="$(mktemp -d "${TMPDIR:-/tmp}/ds_$BENCH_NAME.XXXXXX")"
	chmod 755 "$WORK"
	PGDATA_DIR="$WORK/data"
	LOG="$WORK/server.log"
	if ((${#RUNAS[@]})); then
		chown "$OS_USER" "$WORK"
	fi
}

bench_initdb() {
	as_cluster_owner "$BINDIR/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 \
		--locale="$1" >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
	cat >>"$PGDATA_DIR/postgresql.conf" <<EOF

# $BENCH_NAME
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
synchronous_commit = on
fsync = on
shared_buffers = 256MB
max_connections = 50
EOF
}

bench_start() {
	as_cluster_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -l "$LOG" -w -t 60 start >/dev/null ||
		die "the server did not start"
}

bench_stop() {
	if [[ -f "$PGDATA_DIR/postmaster.pid" ]]; then
		as_cluster_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 60 stop >/dev/null 2>&1 ||
			as_cluster_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
	fi
	if (($1 != 0)) && [[ -f "$LOG" ]]; then
		echo "$BENCH_NAME: failed (status $1); last lines of the server log:" >&2
		tail -n 25 "$LOG" >&2 || true
	fi
}

bench_positive() {
	local v
	for v in "$@"; do
		[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not '${!v}'"
	done
}

bench_on_exit() {
	local rc=$?
	jobs -p | xargs -r kill 2>/dev/null || true
	bench_stop "$rc"
	[[ -n "${WORK:-}" ]] && rm -rf "$WORK"
	exit "$rc"
}
