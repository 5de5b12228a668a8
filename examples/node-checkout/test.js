// Tests of the Node checkout example (examples/README.md), run by ./test (examples/run-tests).
//
// For each path to the database -- direct, and through PgBouncer in transaction mode -- and each
// database layer (ORM=knex, ORM=drizzle), it starts the service (shop.js, with its receipts'
// worker) as a real process and, against the fake provider and its mail sink:
//
//   * 20 concurrent identical requests under one key: one charge at the provider; every answer
//     is the same order, charged; exactly one was not replayed (the rest say Idempotent-Replayed);
//     one receipt delivered by the sink, to the order's address, with the task step's idempotency
//     key, recorded once in `receipts` with that key; the step succeeded in one attempt
//   * the order's fulfilment, the workflow `fulfil` started with it: the carrier's webhook
//     (POST /orders/<order>/shipped) twice at once, one first emit; the run succeeds, the
//     shipment recorded once in its step's transaction, one shipping notice delivered under the
//     notify step's idempotency key
//   * another body under that key: 422 with sqlstate DS422 and the server's message, not the
//     statement's text; a body without an email address: 400
//   * SIGTERM while a receipt is in flight at the sink (which answers 3 s late): the service exits
//     0 once the worker's handler recorded it; the step succeeded in one attempt, one delivery
//   * the service killed (SIGKILL) while its charge is in flight at the provider (which answers
//     8 s late) and its receipt in flight at the sink (which delivers it and answers 8 s late):
//     the client's retry with the same key, to a restarted service, gets the order charged,
//     replayed, and the provider charged once; the killed attempt's lease runs out, it is
//     recorded lost, and the restarted worker sends the receipt again under the same key: the
//     sink answers it from its record (one delivery, two requests, one key), the step succeeded
//     on its second attempt, and `receipts` has its one row
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
import pg from 'pg';

const HERE = dirname(fileURLToPath(import.meta.url));
const PROVIDER = required('DS_PROVIDER_URL');
const MAIL_URL = `${PROVIDER}/mail/{order}`;
// the receipts' worker's lease in the tests: a killed worker's attempt is recorded lost soon
const LEASE_MS = '4000';
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

// the statuses of a step that will not change without a person
const DECLINED = new Set(['failed', 'blocked', 'uncertain', 'cancelled']);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function providerCounts() {
    const r = await fetch(`${PROVIDER}/counts`, { signal: AbortSignal.timeout(10_000) });
    return r.json();
}

/**
 * Starts shop.js on a free port; resolves once it listens.
 * @returns {Promise<{proc: import('node:child_process').ChildProcess, base: string}>}
 */
function startService(orm, databaseUrl, chargeUrl, mailUrl = MAIL_URL) {
    const logName = join(process.env.TMPDIR || tmpdir(), `shop-${orm}-${process.pid}-${Date.now()}.log`);
    const log = openSync(logName, 'w');
    const proc = spawn(process.execPath, [join(HERE, 'shop.js'), '0'], {
        env: { ...process.env, DATABASE_URL: databaseUrl, CHARGE_URL: chargeUrl, MAIL_URL: mailUrl, ORM: orm,
               TASK_LEASE_MS: LEASE_MS },
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

/**
 * Waits for the receipt's task step to stop (succeeded, or failed for good), as ds_wait_step
 * answers it, then reads what the database and the sink say of it.
 */
async function receiptOf(db, order, timeoutMs = 90_000) {
    const deadline = Date.now() + timeoutMs;
    const stopped = (status) => status === 'succeeded' || DECLINED.has(status);
    let step = await db.waitStep(order, 'receipt', '10 s');
    while (!stopped(step.status) && Date.now() < deadline) {
        step = await db.waitStep(order, 'receipt', '10 s');
    }
    const { rows: attempts } = await db.db.query(
        `SELECT attempt, class, error_code, idempotency_key FROM ds_attempts
          WHERE run_id = $1 AND step_id = 'receipt' ORDER BY attempt`, [order]);
    const { rows: recorded } = await db.db.query(
        'SELECT sent_to, message_id, idempotency_key FROM receipts WHERE order_id = $1', [order]);
    const counts = await providerCounts();
    return {
        step,
        attempts,
        keys: [...new Set(attempts.map((a) => a.idempotency_key))],
        recorded,
        delivered: counts.mail[order] ?? 0,
        requests: counts.mail_requests[order] ?? 0,
        sentKeys: counts.mail_keys[order] ?? [],
        messages: counts.mail_messages[order] ?? [],
    };
}

/**
 * The order's fulfilment run (the workflow `fulfil`) once it has finished, with what the
 * database and the sink say of its shipment and its notice.
 */
async function fulfilmentOf(db, key, timeoutMs = 90_000) {
    const runId = `fulfil:${key}`;
    const order = `checkout:${key}`;
    const deadline = Date.now() + timeoutMs;
    let run = await db.waitRun(runId, '10 s');
    while (!['succeeded', 'failed', 'cancelled'].includes(run.status) && Date.now() < deadline) {
        run = await db.waitRun(runId, '10 s');
    }
    const { rows: steps } = await db.db.query(
        `SELECT a.step_id, a.attempt, a.idempotency_key FROM ds_attempts a
          WHERE a.run_id = $1 AND a.step_id IN ('record-shipment', 'notify') ORDER BY a.step_id, a.attempt`, [runId]);
    const { rows: shipped } = await db.db.query(
        'SELECT carrier, idempotency_key FROM shipments WHERE order_id = $1', [order]);
    const counts = await providerCounts();
    const tag = `${order}:shipped`;
    return {
        run, steps, shipped,
        delivered: counts.mail[tag] ?? 0,
        sentKeys: counts.mail_keys[tag] ?? [],
        messages: counts.mail_messages[tag] ?? [],
    };
}

async function scenarios(path, orm, databaseUrl, db) {
    const name = `${path}/${orm}`;
    const stamp = `${path}-${orm}-${Date.now()}`;
    const chargeUrl = `${PROVIDER}/charge/{key}`;

    let { proc, base } = await startService(orm, databaseUrl, chargeUrl);
    try {
        // 20 concurrent identical requests
        const key = `node-${stamp}-dup`;
        const body = { item: 'book', amount: 1999, email: 'ada@example.com' };
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

        // the receipt: one task step for the 20 requests, one delivery under the step's key
        const receipt = await receiptOf(db, `checkout:${key}`);
        check(receipt.step.status === 'succeeded' && receipt.step.attempt === 1,
            `${name}: the receipt's task succeeded in one attempt (${receipt.step.status}, attempt ${receipt.step.attempt})`);
        check(receipt.delivered === 1 && receipt.keys.length === 1
                && receipt.sentKeys.length >= 1 && receipt.sentKeys.every((k) => k === receipt.keys[0]),
            `${name}: one receipt delivered, with the step's idempotency key (${receipt.delivered} delivered, `
            + `keys sent ${JSON.stringify(receipt.sentKeys)}, the step's ${JSON.stringify(receipt.keys)})`);
        check(receipt.messages.length === 1 && receipt.messages[0].to === 'ada@example.com'
                && receipt.messages[0].order === `checkout:${key}` && receipt.messages[0].amount === 1999,
            `${name}: the receipt went to the order's address with the order (${JSON.stringify(receipt.messages)})`);
        check(receipt.recorded.length === 1 && receipt.recorded[0].idempotency_key === receipt.keys[0]
                && receipt.recorded[0].message_id === receipt.step.result?.message_id,
            `${name}: the receipt recorded once, with the step's outcome (${JSON.stringify(receipt.recorded)} ${JSON.stringify(receipt.step.result)})`);

        // the fulfilment: one run for the 20 requests, started with the order; the carrier's
        // webhook twice at once (the first emit wins); one shipment recorded in the step's
        // transaction, one notice under the notify step's key
        const shipping = await Promise.all([1, 2].map(() => fetch(
            `${base}/orders/${encodeURIComponent(`checkout:${key}`)}/shipped`, {
                method: 'POST', headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ carrier: 'DHL' }), signal: AbortSignal.timeout(30_000),
            }).then((r) => r.status)));
        check(shipping.sort().join() === '200,202',
            `${name}: the carrier's webhook twice: one first emit (202), one repeat (200) (${shipping})`);
        const fulfilment = await fulfilmentOf(db, key);
        check(fulfilment.run.status === 'succeeded' && fulfilment.run.output?.carrier === 'DHL'
                && typeof fulfilment.run.output?.notice?.message_id === 'string',
            `${name}: the fulfilment workflow succeeded (${JSON.stringify(fulfilment.run)})`);
        const keyOf = (id) => fulfilment.steps.filter((st) => st.step_id === id).map((st) => st.idempotency_key);
        check(fulfilment.shipped.length === 1 && fulfilment.shipped[0].carrier === 'DHL'
                && keyOf('record-shipment').length === 1 && fulfilment.shipped[0].idempotency_key === keyOf('record-shipment')[0],
            `${name}: the shipment recorded once, in its step's transaction (${JSON.stringify(fulfilment.shipped)} ${JSON.stringify(fulfilment.steps)})`);
        check(fulfilment.delivered === 1 && fulfilment.sentKeys.length >= 1
                && fulfilment.sentKeys.every((k) => k === keyOf('notify')[0])
                && fulfilment.messages[0]?.to === 'ada@example.com',
            `${name}: one shipping notice to the order's address, with the notify step's key (${fulfilment.delivered} `
            + `delivered, keys ${JSON.stringify(fulfilment.sentKeys)}, the step's ${JSON.stringify(keyOf('notify'))})`);

        // another body under the key
        const other = await post(base, key, { item: 'book', amount: 1, email: 'ada@example.com' });
        check(other.status === 422 && other.body.sqlstate === 'DS422',
            `${name}: another body under the key is refused with 422 / DS422 (${other.status} ${JSON.stringify(other.body)})`);
        check(typeof other.body.error === 'string' && other.body.error.length > 0
                && !other.body.error.includes('ds_idempotent') && !other.body.error.includes('jsonb'),
            `${name}: the 422 carries the server's message, not the statement (${JSON.stringify(other.body.error)})`);
        const noAddress = await post(base, `${key}-no-address`, { item: 'book', amount: 1 });
        check(noAddress.status === 400, `${name}: a body without an email address is answered 400 (${noAddress.status})`);
    } finally {
        await kill(proc);
    }

    // SIGTERM while a receipt is in flight at the mail sink (which answers 3 s late): the service
    // stops gracefully, its worker lets the handler finish and record the receipt, and it exits 0
    {
        const key = `node-${stamp}-term`;
        ({ proc, base } = await startService(orm, databaseUrl, chargeUrl, `${MAIL_URL}?fault=delay&secs=3`));
        try {
            const answer = await untilCharged(base, key, { item: 'pen', amount: 250, email: 'alan@example.com' },
                await post(base, key, { item: 'pen', amount: 250, email: 'alan@example.com' }));
            check(answer.status === 201, `${name}: a checkout before SIGTERM answered 201 (${answer.status})`);
            const deadline = Date.now() + 60_000;
            while (Date.now() < deadline && ((await providerCounts()).mail_requests[`checkout:${key}`] ?? 0) === 0) {
                await sleep(50);
            }
            const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
            proc.kill('SIGTERM');
            const timeout = sleep(30_000).then(() => ({ code: 'still running 30 s after SIGTERM', signal: null }));
            const { code, signal } = await Promise.race([exited, timeout]);
            check(code === 0 && signal === null, `${name}: SIGTERM with a receipt in flight: the service exited 0 (${code ?? signal})`);
            const receipt = await receiptOf(db, `checkout:${key}`, 10_000);
            check(receipt.step.status === 'succeeded' && receipt.step.attempt === 1 && receipt.delivered === 1
                    && receipt.requests === 1 && receipt.recorded.length === 1,
                `${name}: the receipt in flight at SIGTERM was sent and recorded before the exit (${receipt.step.status}, `
                + `attempt ${receipt.step.attempt}, ${receipt.delivered} delivered, ${receipt.recorded.length} recorded)`);
        } finally {
            await kill(proc);
        }
    }

    // the service killed while the charge is in flight at the provider and the receipt at the
    // mail sink (both answer 8 s late, within the service's 10 s wait: time enough to kill it
    // first, even on a loaded machine)
    const key = `node-${stamp}-kill`;
    const order = { item: 'lamp', amount: 4500, email: 'grace@example.com' };
    ({ proc, base } = await startService(orm, databaseUrl, `${PROVIDER}/charge/{key}?fault=delay&secs=8`,
        `${MAIL_URL}?fault=delay&secs=8`));
    try {
        const pending = post(base, key, order).then(() => 'answered', () => 'cut off');
        const deadline = Date.now() + 60_000;
        let counts = await providerCounts();
        while (Date.now() < deadline
               && ((counts.requests[key] ?? 0) === 0 || (counts.mail_requests[`checkout:${key}`] ?? 0) === 0)) {
            await sleep(50);
            counts = await providerCounts();
        }
        const requests = counts.requests[key] ?? 0;
        check(requests === 1, `${name}: the charge reached the provider (${requests} request)`);
        const sent = counts.mail_requests[`checkout:${key}`] ?? 0;
        check(sent === 1, `${name}: the receipt reached the mail sink (${sent} request)`);
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
        const receipt = await receiptOf(db, `checkout:${key}`);
        check(receipt.step.status === 'succeeded' && receipt.step.attempt === 2,
            `${name}: the receipt's task succeeded on its second attempt (${receipt.step.status}, attempt ${receipt.step.attempt})`);
        check(receipt.attempts.length === 2 && receipt.attempts[0].error_code === 'DS007',
            `${name}: the killed attempt was recorded lost (${JSON.stringify(receipt.attempts)})`);
        check(receipt.delivered === 1 && receipt.requests === 2 && receipt.keys.length === 1
                && receipt.sentKeys.length === 2 && receipt.sentKeys.every((k) => k === receipt.keys[0]),
            `${name}: the receipt delivered once across the kill, both sends with the step's key (${receipt.delivered} `
            + `delivered of ${receipt.requests} requests, keys sent ${JSON.stringify(receipt.sentKeys)}, the step's ${JSON.stringify(receipt.keys)})`);
        check(receipt.recorded.length === 1 && receipt.recorded[0].sent_to === 'grace@example.com'
                && receipt.recorded[0].idempotency_key === receipt.keys[0],
            `${name}: the receipt recorded once (${JSON.stringify(receipt.recorded)})`);
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
        // the test's own view of the database, through the same path
        const pool = new pg.Pool({ connectionString: url, max: 2 });
        const db = new ds.DurableSteps(pool);
        try {
            for (const orm of ['knex', 'drizzle']) {
                try {
                    await scenarios(path, orm, url, db);
                } catch (e) {
                    check(false, `${path}/${orm}: ${e.stack ?? e}`);
                }
            }
        } finally {
            await pool.end();
        }
    }
    console.log(`${failures} failed`);
    process.exit(failures ? 1 : 0);
}

await main();
