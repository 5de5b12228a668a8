// Tests of the Node checkout example (examples/README.md), run by ./test (examples/run-tests).
//
// For each path to the database -- direct, and through PgBouncer in transaction mode -- and each
// database layer (ORM=knex, ORM=drizzle), it starts the service (shop.js) as a real process and,
// against the fake provider:
//
//   * 20 concurrent identical requests under one key: one charge at the provider; every answer
//     is the same order, charged; exactly one was not replayed (the rest say Idempotent-Replayed)
//   * another body under that key: 422 with sqlstate DS422 and the server's message, not the
//     statement's text
//   * the service killed (SIGKILL) while its charge is in flight at the provider (which answers
//     8 s late): the client's retry with the same key, to a restarted service, gets the order
//     charged, replayed, and the provider charged once
//
// and, without a database, the SQLSTATE mapping of the client library (durable-steps) that the
// service's answers rely on. Prints "ok - ..." or
// "not ok - ..." per check and exits non-zero when one failed.

import { spawn } from 'node:child_process';
import { openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import * as ds from 'durable-steps';

const HERE = dirname(fileURLToPath(import.meta.url));
const PROVIDER = required('DS_PROVIDER_URL');
let failures = 0;

function required(name) {
    const value = process.env[name];
    if (!value) {
        throw new Error(`${name} is not set (examples/run-tests sets it)`);
    }
    return value;
}

function check(ok, what) {
    console.log(`${ok ? 'ok' : 'not ok'} - ${what}`);
    if (!ok) {
        failures++;
    }
}

// jsonb orders an object's keys its own way: compare with the keys sorted
const sorted = (v) => (v && typeof v === 'object' && !Array.isArray(v)
    ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted(v[k])])) : v);
const sameJson = (a, b) => JSON.stringify(sorted(a)) === JSON.stringify(sorted(b));

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function providerCounts() {
    const r = await fetch(`${PROVIDER}/counts`, { signal: AbortSignal.timeout(10_000) });
    return r.json();
}

/**
 * Starts shop.js on a free port; resolves once it listens.
 * @returns {Promise<{proc: import('node:child_process').ChildProcess, base: string}>}
 */
function startService(orm, databaseUrl, chargeUrl) {
    const logName = join(process.env.TMPDIR || tmpdir(), `shop-${orm}-${process.pid}-${Date.now()}.log`);
    const log = openSync(logName, 'w');
    const proc = spawn(process.execPath, [join(HERE, 'shop.js'), '0'], {
        env: { ...process.env, DATABASE_URL: databaseUrl, CHARGE_URL: chargeUrl, ORM: orm },
        stdio: ['ignore', 'pipe', log],
    });
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
            proc.kill('SIGKILL');
            reject(new Error(`the service did not start within 30 s: see ${logName}`));
        }, 30_000);
        proc.on('exit', (code, signal) => {
            clearTimeout(timer);
            reject(new Error(`the service exited (${code ?? signal}) before listening: see ${logName}`));
        });
        const lines = createInterface({ input: proc.stdout });
        lines.on('line', (line) => {
            const m = /^listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
            if (m) {
                clearTimeout(timer);
                resolve({ proc, base: m[1] });
            }
        });
    });
}

function kill(proc) {
    return new Promise((resolve) => {
        if (proc.exitCode !== null || proc.signalCode !== null) {
            resolve();
            return;
        }
        proc.once('exit', () => resolve());
        proc.kill('SIGKILL');
    });
}

/** @returns {Promise<{status: number, body: any, replayed: string|null}>} */
async function post(base, key, body, timeoutMs = 30_000) {
    const r = await fetch(`${base}/checkout`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
    });
    return { status: r.status, body: await r.json(), replayed: r.headers.get('Idempotent-Replayed') };
}

/** Asks again with the same key while the service answers 202 (still being charged), as a client does. */
async function untilCharged(base, key, body, answer, timeoutMs = 60_000) {
    const deadline = Date.now() + timeoutMs;
    while (answer.status === 202 && Date.now() < deadline) {
        await sleep(200);
        answer = await post(base, key, body);
    }
    return answer;
}

async function scenarios(path, orm, databaseUrl) {
    const name = `${path}/${orm}`;
    const stamp = `${path}-${orm}-${Date.now()}`;
    const chargeUrl = `${PROVIDER}/charge/{key}`;

    let { proc, base } = await startService(orm, databaseUrl, chargeUrl);
    try {
        // 20 concurrent identical requests
        const key = `node-${stamp}-dup`;
        const body = { item: 'book', amount: 1999 };
        const first = await Promise.all(Array.from({ length: 20 }, () => post(base, key, body)));
        // (on a loaded machine the charge may outlast the service's 10 s wait: a 202 is asked again)
        const answers = await Promise.all(first.map((a) => untilCharged(base, key, body, a)));
        const statuses = [...new Set(answers.map((a) => a.status))].sort();
        check(statuses.length === 1 && statuses[0] === 201,
            `${name}: 20 identical requests all answered 201 (got ${statuses})`);
        const orders = [...new Set(answers.map((a) => a.body.order))];
        check(orders.length === 1 && orders[0] === `checkout:${key}`,
            `${name}: one order for all of them (${orders})`);
        // the provider's answer, the text of its body: {charged: tag, charge: n, received: the
        // body it was sent}
        const charged = answers.filter((a) => {
            const p = typeof a.body.charged === 'string' ? JSON.parse(a.body.charged) : null;
            return p?.charged === key && p.charge === 1 && sameJson(JSON.parse(p.received), body);
        });
        check(charged.length === 20,
            `${name}: every answer carries the provider's answer to the one charge of the body (${charged.length})`);
        const fresh = first.filter((a) => a.replayed !== 'true');
        check(fresh.length === 1, `${name}: exactly one answer was not replayed (${fresh.length})`);
        const charges = (await providerCounts()).charges[key] ?? 0;
        check(charges === 1, `${name}: the provider charged once (${charges})`);

        // another body under the key
        const other = await post(base, key, { item: 'book', amount: 1 });
        check(other.status === 422 && other.body.sqlstate === 'DS422',
            `${name}: another body under the key is refused with 422 / DS422 (${other.status} ${JSON.stringify(other.body)})`);
        check(typeof other.body.error === 'string' && other.body.error.length > 0
                && !other.body.error.includes('ds_idempotent') && !other.body.error.includes('jsonb'),
            `${name}: the 422 carries the server's message, not the statement (${JSON.stringify(other.body.error)})`);
    } finally {
        await kill(proc);
    }

    // the service killed while the charge is in flight (the provider answers 8 s late, within
    // the service's 10 s wait: time enough to kill it first, even on a loaded machine)
    const key = `node-${stamp}-kill`;
    const order = { item: 'lamp', amount: 4500 };
    ({ proc, base } = await startService(orm, databaseUrl, `${PROVIDER}/charge/{key}?fault=delay&secs=8`));
    try {
        const pending = post(base, key, order).then(() => 'answered', () => 'cut off');
        const deadline = Date.now() + 60_000;
        while (Date.now() < deadline && ((await providerCounts()).requests[key] ?? 0) === 0) {
            await sleep(50);
        }
        const requests = (await providerCounts()).requests[key] ?? 0;
        check(requests === 1, `${name}: the charge reached the provider (${requests} request)`);
        await kill(proc);
        check(await pending === 'cut off', `${name}: the client's first request was cut off with the service`);
    } finally {
        await kill(proc);
    }
    ({ proc, base } = await startService(orm, databaseUrl, chargeUrl));
    try {
        const answer = await untilCharged(base, key, order, await post(base, key, order));
        check(answer.status === 201 && answer.replayed === 'true' && answer.body.order === `checkout:${key}`,
            `${name}: the client's retry got the order charged, replayed (${answer.status} ${JSON.stringify(answer.body)} ${answer.replayed})`);
        const charges = (await providerCounts()).charges[key] ?? 0;
        check(charges === 1, `${name}: the provider charged once across the kill (${charges})`);
    } finally {
        await kill(proc);
    }
}

function mappingChecks() {
    // node-postgres's DatabaseError carries code and severity; Drizzle wraps it as `cause`
    const pgError = Object.assign(new Error('idempotency key "k" is in flight'), { code: 'DS409', severity: 'ERROR' });
    const direct = ds.toDurableStepsError(pgError);
    check(direct instanceof ds.InProgressError && direct.httpStatus === 409 && direct.sqlstate === 'DS409'
            && direct.message === pgError.message,
        'DS409 maps to InProgressError, HTTP 409, with the server\'s message');
    const wrapped = ds.toDurableStepsError(new Error('Failed query: SELECT ...', { cause: pgError }));
    check(wrapped instanceof ds.InProgressError && wrapped.message === pgError.message,
        'a wrapped error (Drizzle\'s DrizzleQueryError) maps by its cause');
    // the statuses the service answers for the SQLSTATEs of the checkout's calls
    const expected = { DS001: 422, DS002: 503, DS003: 409, DS102: 502, DS103: 409, DS404: 404, DS409: 409,
                       DS422: 422, 42501: 403 };
    const got = Object.fromEntries(Object.keys(expected).map((code) => [code, ds.ERRORS_BY_SQLSTATE.get(code)?.httpStatus]));
    check(JSON.stringify(got) === JSON.stringify(expected),
        `the documented SQLSTATEs have their classes and HTTP statuses (${JSON.stringify(got)})`);
    const other = ds.toDurableStepsError(Object.assign(new Error('division by zero'), { code: '22012', severity: 'ERROR' }));
    check(other.constructor === ds.DurableStepsError && other.httpStatus === 500 && other.sqlstate === '22012',
        'another SQLSTATE stays DurableStepsError, HTTP 500, with its code');
}

async function main() {
    mappingChecks();
    const host = required('DS_PGHOST');
    const port = required('DS_PGPORT');
    const db = required('DS_PGDATABASE');
    const user = required('DS_PGUSER');
    const paths = [
        ['direct', `postgresql://${user}@/${db}?host=${encodeURIComponent(host)}&port=${port}`],
        ['pgbouncer', `postgresql://${user}@${required('DS_POOLED_HOST')}:${required('DS_POOLED_PORT')}/${db}`],
    ];
    for (const [path, url] of paths) {
        for (const orm of ['knex', 'drizzle']) {
            try {
                await scenarios(path, orm, url);
            } catch (e) {
                check(false, `${path}/${orm}: ${e.stack ?? e}`);
            }
        }
    }
    console.log(`${failures} failed`);
    process.exit(failures ? 1 : 0);
}

await main();
