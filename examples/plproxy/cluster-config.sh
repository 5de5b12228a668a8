#!/usr/bin/env bash
# cluster-config.sh -- the proxy's PL/Proxy cluster 'durable_steps' (SQL/MED), written from what
# the partition servers say they own (examples/plproxy/README.md).
#
#   examples/plproxy/cluster-config.sh 'host=ds-a dbname=app' 'host=ds-b dbname=app' > cluster.sql
#   psql -X -v ON_ERROR_STOP=1 -f cluster.sql 'host=proxy dbname=app'
#
# Each argument is a libpq connection string of one partition server, as the proxy reaches it
# (without user or password: the user mapping gives those). The script asks each server for
# durable_steps.partition_count and durable_steps.partitions, checks that the servers agree on
# the count and that every partition has exactly one owner, and writes the server 'durable_steps'
# with options p0..pN-1 (CREATE the first time, ALTER ... SET after a partition moved), and a
# user mapping for PUBLIC (the proxy connects as the calling role: PL/Proxy adds user=<role>).
# Run it again after moving a partition: the proxy routes by the new map from the next call on.
# PSQL (default psql) is the client used to ask the servers.
set -euo pipefail

psql=${PSQL:-psql}
[ $# -ge 1 ] || { echo "usage: $0 'partition server conninfo'..." >&2; exit 2; }

count=
declare -a owner
for conn in "$@"; do
    IFS='|' read -r n parts < <("$psql" -X -At -v ON_ERROR_STOP=1 -d "$conn" -c \
        "SELECT current_setting('durable_steps.partition_count') || '|' || current_setting('durable_steps.partitions')")
    if [ "$n" = 0 ]; then
        echo "$conn: durable_steps.partition_count is 0 (not partitioned)" >&2; exit 1
    fi
    if [ -n "$count" ] && [ "$n" != "$count" ]; then
        echo "$conn: durable_steps.partition_count is $n, another server has $count" >&2; exit 1
    fi
    count=$n
    for p in ${parts//,/ }; do
        if [ -n "${owner[$p]:-}" ]; then
            echo "partition $p is owned by both '${owner[$p]}' and '$conn'" >&2; exit 1
        fi
        owner[p]=$conn
    done
done

create=()
alter=()
for ((p = 0; p < count; p++)); do
    if [ -z "${owner[$p]:-}" ]; then
        echo "partition $p has no owner among the servers given (a move in progress?)" >&2; exit 1
    fi
    # a connection string in a SQL literal
    lit=${owner[$p]//\'/\'\'}
    create+=("p$p '$lit'")
    alter+=("SET p$p '$lit'")
done

join() { local IFS=,; echo "$*"; }
cat <<EOF
-- PL/Proxy cluster 'durable_steps': $count partitions, written by examples/plproxy/cluster-config.sh
DO \$do\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_foreign_server WHERE srvname = 'durable_steps') THEN
        CREATE SERVER durable_steps FOREIGN DATA WRAPPER plproxy
            OPTIONS (connection_lifetime '1800', $(join "${create[@]}"));
        CREATE USER MAPPING FOR PUBLIC SERVER durable_steps;
        GRANT USAGE ON FOREIGN SERVER durable_steps TO PUBLIC;
    ELSE
        ALTER SERVER durable_steps OPTIONS ($(join "${alter[@]}"));
    END IF;
END
\$do\$;
EOF
