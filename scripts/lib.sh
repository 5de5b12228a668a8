# shellcheck shell=bash
# scripts/lib.sh -- helpers shared by scripts/test and scripts/demo (sourced, not executed).
#
# What they do, in order of use:
#   ds_install_packages   install the Debian packages the build, the tests and the demo need
#                         (apt only when something is missing; as root, or through sudo)
#   ds_make_workdir       copy the source tree (tracked + untracked non-ignored files, no .git)
#                         into a fresh temporary directory owned by the user that runs the tests
#   ds_build_install DIR  `make` in DIR as that user, then `make install` as root
#   ds_as_runner_in DIR CMD...  run CMD in DIR as that user: `postgres` when we are root (initdb
#                         refuses root), the current user otherwise
#
# Nothing here builds in, or writes to, the source tree itself.

DS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# bison, flex and zlib1g-dev build the other PostgreSQL majors from their release sources
# (scripts/pg-build); python3-croniter is the oracle of the schedule syntax (TAP 075);
# prometheus-postgres-exporter serves the metrics of monitoring/ (TAP 081); pgbouncer and Flask,
# SQLAlchemy and psycopg2 run the examples (examples/run-tests); postgresql-15-plproxy is the
# proxy of examples/plproxy (TAP 085); postgresql-15-auto-failover (pg_autoctl and its monitor
# extension) runs TAP 088; chromium is the browser of the console's tests (console/test).
DS_PACKAGES=(postgresql-15 postgresql-server-dev-15 libcurl4-openssl-dev postgresql-15-cron
             libipc-run-perl make gcc python3 perl ca-certificates bison flex zlib1g-dev
             python3-croniter prometheus-postgres-exporter pgbouncer python3-flask
             python3-sqlalchemy python3-psycopg2 python3-pip python3-venv
             postgresql-15-plproxy postgresql-15-auto-failover chromium)
DS_PACKAGES+=(liblz4-dev libzstd-dev libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev libicu-dev)  # Citus for TAP 086 (scripts/citus-build)

# The PostgreSQL to build and test against: PG_CONFIG when the caller names one (scripts/test
# --pg N sets it for each major of the matrix; a user's own packages are picked the same way),
# otherwise Debian's PostgreSQL 15 -- not /usr/bin/pg_config, which picks the newest installed
# version. DS_PG_BINDIR is that PostgreSQL's bin directory.
if [ -n "${PG_CONFIG:-}" ] && [ "$PG_CONFIG" != pg_config ]; then
    if [ -x "$PG_CONFIG" ]; then
        DS_PG_BINDIR=$("$PG_CONFIG" --bindir)
    else
        DS_PG_BINDIR=$(dirname "$PG_CONFIG")	# not installed yet: ds_install_packages may bring it
    fi
else
    DS_PG_BINDIR=${DS_PG_BINDIR:-/usr/lib/postgresql/15/bin}
    PG_CONFIG="$DS_PG_BINDIR/pg_config"
fi
export PG_CONFIG

# One locale whatever the caller's environment: the temporary instances' initdb takes its encoding
# from it (UTF8 under C.UTF-8, but SQL_ASCII under a bare C or unset locale, which changes how
# psql aligns non-ASCII output and so the expected files). Debian 12 always has C.UTF-8.
export LANG=C.UTF-8
unset LC_ALL LC_CTYPE LC_COLLATE LC_MESSAGES LC_NUMERIC LC_MONETARY LC_TIME LANGUAGE

ds_log() { printf '==> %s\n' "$*" >&2; }
ds_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Run a command as root: directly when we are root, otherwise through sudo.
ds_as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        ds_die "need root for: $* (run as root, or install sudo)"
    fi
}

# The user that builds and runs PostgreSQL: never root.
if [ "$(id -u)" -eq 0 ]; then
    DS_RUNNER=postgres
else
    DS_RUNNER=$(id -un)
fi

# Run a command as DS_RUNNER inside directory $1 (under $DS_WORK, which that user owns), with HOME
# and TMPDIR in $DS_WORK too, so that nothing touches a directory the user may not be able to read.
ds_as_runner_in() {
    local dir=$1
    shift
    if [ "$(id -u)" -eq 0 ]; then
        (cd "$dir" && runuser -u "$DS_RUNNER" -- \
            env HOME="$DS_WORK" TMPDIR="$DS_WORK/tmp" PG_CONFIG="$PG_CONFIG" "$@")
    else
        (cd "$dir" && env TMPDIR="$DS_WORK/tmp" "$@")
    fi
}

ds_install_packages() {
    local missing=() p
    for p in "${DS_PACKAGES[@]}"; do
        if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        ds_log "Debian packages: all ${#DS_PACKAGES[@]} already installed"
        return 0
    fi
    local log
    log=$(mktemp "${TMPDIR:-/tmp}/durable_steps_apt.XXXXXX.log")
    ds_log "Debian packages missing: ${missing[*]} -- installing (log: $log)"
    if ! { ds_as_root apt-get update && ds_as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends "${DS_PACKAGES[@]}" </dev/null; } \
            >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        ds_die "apt-get failed (whole log: $log)"
    fi
    [ -x "$DS_PG_BINDIR/pg_config" ] || [ -x "$PG_CONFIG" ] || ds_die "$PG_CONFIG not found after installing packages"
}

# Create a fresh work directory holding a copy of the source tree in $DS_WORK, owned by DS_RUNNER.
# Callers remove it (ds_cleanup_workdir) from their EXIT trap; the logs the scripts name are in it.
DS_WORK=
ds_make_workdir() {
    local prefix=$1
    if [ "$(id -u)" -eq 0 ]; then
        # /tmp rather than $TMPDIR: the postgres user must be able to reach it
        DS_WORK=$(mktemp -d "/tmp/${prefix}.XXXXXX")
    else
        DS_WORK=$(mktemp -d "${TMPDIR:-/tmp}/${prefix}.XXXXXX")
    fi
    chmod 755 "$DS_WORK"
    mkdir -p "$DS_WORK/src" "$DS_WORK/tmp"
    if git -C "$DS_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # tracked files (as they are on disk, edits included) and untracked files not ignored
        (cd "$DS_ROOT" && git ls-files -z --cached --others --exclude-standard \
            | while IFS= read -r -d '' f; do
                  [ -e "$f" ] && printf '%s\0' "$f"
              done \
            | tar --null --no-recursion -T - -cf -) | tar -C "$DS_WORK/src" -xf -
    else
        (cd "$DS_ROOT" && tar --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
            --exclude=./.demo --exclude=./tmp_check --exclude=./test/tmp_instance -cf - .) \
            | tar -C "$DS_WORK/src" -xf -
    fi
    if [ "$(id -u)" -eq 0 ]; then
        chown -R "$DS_RUNNER": "$DS_WORK"
    fi
}

# ds_cleanup_workdir [STATUS] -- from an EXIT trap: STATUS defaults to the exit status. The logs
# the scripts name ("log: $DS_WORK/...") live in the work directory, so a failed run keeps it
# (and says where); a successful run removes it and says that those logs went with it.
ds_cleanup_workdir() {
    local rc=${1:-$?}
    if [ -n "$DS_WORK" ] && [ -d "$DS_WORK" ]; then
        if [ -n "${DS_KEEP_WORKDIR:-}" ]; then
            ds_log "kept work directory $DS_WORK (DS_KEEP_WORKDIR is set)"
        elif [ "$rc" -ne 0 ]; then
            ds_log "kept work directory $DS_WORK: the run failed, the logs named above are there (remove it with: rm -rf $DS_WORK)"
        else
            rm -rf "$DS_WORK"
            ds_log "removed work directory $DS_WORK and the logs named above (DS_KEEP_WORKDIR=1 keeps it)"
        fi
    fi
}

# Build in the copy as DS_RUNNER, install as root, the output in $DS_WORK/build.log (shown when
# either fails). Fails the caller on a compile error.
ds_build_install() {
    local src=$1 jobs log=$DS_WORK/build.log
    jobs=$(nproc 2>/dev/null || echo 2)
    ds_log "building and installing durable_steps (make -j$jobs; log: $log)"
    if ! { ds_as_runner_in "$src" make -j"$jobs" WERROR=1 PG_CONFIG="$PG_CONFIG" \
            && (cd "$src" && ds_as_root make install PG_CONFIG="$PG_CONFIG"); } >"$log" 2>&1; then
        echo "----- $log -----" >&2
        cat "$log" >&2
        echo "----- end of $log -----" >&2
        return 1
    fi
}
