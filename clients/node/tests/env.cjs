// What the tests share: the connection of the path under test, the fake provider, polling.
//
// ./test runs every test file twice: DS_CLIENT_PATH=direct connects to the cluster's socket
// (DS_PGHOST, DS_PGPORT), DS_CLIENT_PATH=pgbouncer to PgBouncer in transaction mode
// (DS_POOLED_HOST, DS_POOLED_PORT), both as DS_PGUSER to DS_PGDATABASE (examples/run-tests).
'use strict';

const pg = require('pg');

function required(name) {
    const value = process.env[name];
    if (!value) {
        throw new Error(`${name} is not set (examples/run-tests sets it; see ./test)`);
    }
    return value;
}

const path = process.env.DS_CLIENT_PATH || 'direct';
if (path !== 'direct' && path !== 'pgbouncer') {
    throw new Error(`DS_CLIENT_PATH must be direct or pgbouncer, not ${path}`);
}

function connection() {
    const pooled = path === 'pgbouncer';
    return {
        host: required(pooled ? 'DS_POOLED_HOST' : 'DS_PGHOST'),
        port: Number(required(pooled ? 'DS_POOLED_PORT' : 'DS_PGPORT')),
        database: required('DS_PGDATABASE'),
        user: required('DS_PGUSER'),
    };
}

/** A pool on the path under test; an idle connection lost must not end the test process. */
function makePool(max = 30) {
    const pool = new pg.Pool({ ...connection(), max });
    pool.on('error', (e) => console.error('# idle connection lost:', e.message));
    return pool;
}

const PROVIDER = required('DS_PROVIDER_URL');
/** a psql command line connected as superuser (for what the tests' role may not do) */
const ADMIN_PSQL = required('DS_ADMIN_PSQL');

async function providerCounts() {
    const r = await fetch(`${PROVIDER}/counts`, { signal: AbortSignal.timeout(10_000) });
    return r.json();
}

/** Unique names per run and path: the cluster is shared by both paths and every run. */
function unique(what) {
    return `node-${path}-${what}-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `probe` until it returns a truthy value (that value), failing after `ms`. */
async function until(what, probe, ms = 60_000) {
    const deadline = Date.now() + ms;
    for (;;) {
        const value = await probe();
        if (value) {
            return value;
        }
        if (Date.now() > deadline) {
            throw new Error(`timed out after ${ms} ms waiting for ${what}`);
        }
        await sleep(50);
    }
}

/**
 * The handler of the checkout endpoints of the middleware tests: creates the charge as an HTTP
 * step (run id `checkout:<key>`) to the URL the stored request carries, and answers 202 with the
 * order. Its `?`-free `$1` reaches the server as written: it is a bind parameter.
 */
const CHECKOUT_HANDLER = `
SELECT 202, jsonb_build_object('order', s.run_id)
  FROM ds_http_step('checkout:' || ($1->>'key'), 'charge',
                    jsonb_build_object('method', 'POST', 'url', $1->>'charge_url',
                                       'headers', jsonb_build_object('Content-Type', 'application/json'),
                                       'body', ($1->'body')::text),
                    policy => '{"max_attempts": 5, "initial_delay": "100 ms"}') s`;

/** The stored request of the checkout endpoints: the client's key and body, and where to charge. */
function checkoutRequest(r) {
    return { key: r.key, body: r.body, charge_url: `${PROVIDER}/charge/${encodeURIComponent(r.key)}` };
}

/** The ERROR lines of the cluster's log (DS_SERVER_LOG) that name `marker` (a unique key). */
function serverLogErrors(marker) {
    const text = require('node:fs').readFileSync(required('DS_SERVER_LOG'), 'utf8');
    return text.split('\n').filter((line) => line.includes('ERROR:') && line.includes(marker));
}

module.exports = {
    path, connection, makePool, PROVIDER, ADMIN_PSQL, providerCounts, unique, sleep, until, CHECKOUT_HANDLER,
    checkoutRequest, serverLogErrors,
};
