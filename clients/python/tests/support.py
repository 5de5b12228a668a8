"""What the tests share: the connection string of the path under test and the fake provider.

The environment is examples/run-tests' (DS_PGHOST, DS_PGPORT, DS_POOLED_HOST, DS_POOLED_PORT,
DS_PGDATABASE, DS_PGUSER, DS_PROVIDER_URL); DS_CLIENT_PATH chooses the path: ``direct`` (the
cluster's socket) or ``pgbouncer`` (PgBouncer in transaction mode).
"""
import json
import os
import time
import urllib.request

import psycopg2

PATH = os.environ.get("DS_CLIENT_PATH", "direct")
PROVIDER = os.environ["DS_PROVIDER_URL"]
# every identity a run of the tests makes is new: the cluster outlives one run of them
STAMP = "%s-%d-%d" % (PATH, os.getpid(), int(time.time() * 1000))


def dsn() -> str:
    db, user = os.environ["DS_PGDATABASE"], os.environ["DS_PGUSER"]
    if PATH == "pgbouncer":
        return "host=%s port=%s dbname=%s user=%s" % (
            os.environ["DS_POOLED_HOST"], os.environ["DS_POOLED_PORT"], db, user)
    return "host=%s port=%s dbname=%s user=%s" % (os.environ["DS_PGHOST"], os.environ["DS_PGPORT"], db, user)


def connect(autocommit: bool = True):
    conn = psycopg2.connect(dsn())
    conn.autocommit = autocommit
    return conn


def server_log_errors(marker: str) -> list:
    """The ERROR lines of the cluster's log (DS_SERVER_LOG) that name ``marker`` (a unique key)."""
    with open(os.environ["DS_SERVER_LOG"], errors="replace") as f:
        return [line for line in f if "ERROR:" in line and marker in line]


def uid(name: str) -> str:
    return "pyclient-%s-%s" % (STAMP, name)


def provider_counts() -> dict:
    with urllib.request.urlopen(PROVIDER + "/counts", timeout=10) as r:
        return json.load(r)


def charge_url(tag: str, query: str = "") -> str:
    return "%s/charge/%s%s" % (PROVIDER, tag, ("?" + query) if query else "")


def has_renew() -> bool:
    """Whether the cluster's durable_steps has ds_idempotent_renew (0.2.0)."""
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT EXISTS (SELECT FROM pg_proc WHERE proname = 'ds_idempotent_renew')")
            return cur.fetchone()[0]
    finally:
        conn.close()


NEEDS_RENEW = "needs ds_idempotent_renew in the extension (durable_steps 0.2.0)"
