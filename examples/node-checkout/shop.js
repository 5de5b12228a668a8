// The checkout service of the example: POST /checkout with an Idempotency-Key header
// (examples/README.md, "The checkout"), in Express over node-postgres, with Knex or Drizzle ORM
// as the database layer (ORM=knex, the default, or ORM=drizzle) and durable_steps through its
// client library (clients/node, the package durable-steps). One request:
//
// 1. the library's Express middleware calls ds_idempotent(), which stores, under the client's
//    key, the request and the response of a handler that creates the charge as an HTTP step
//    (ds_http_step) and the receipt as a task (ds_task_step): the response (202, the order)
//    commits with both steps, and a repeat of the request replays it without running the
//    handler again, with the header `Idempotent-Replayed: true`. A repeat while the first is in
//    flight waits for it (wait => 10 s); another request under the key is refused (DS422 -> 422).
// 2. waitStep() (ds_wait_step) waits, in one statement, for the charge's outcome: no LISTEN
//    (which a transaction-mode PgBouncer cannot carry), no polling loop.
//
// The receipt is sent by the task worker this process runs beside the server (the library's
// Worker, started with it and stopped on SIGTERM): its handler POSTs the receipt to the mail
// service with the step's idempotency key, then records it in `receipts` in ctx.transaction(),
// so that the row and the step's outcome commit together.
//
// The order's fulfilment is a workflow in application code (docs/app-workflows.md), `fulfil`,
// started by the same handler with the order: it waits for the event `shipped:<order>` (POST
// /orders/<order>/shipped emits it), records the shipment in `shipments` in the step's own
// transaction, and mails a shipping notice under the step's idempotency key. The same Worker
// runs it.
//
// The handler goes to the server as a bind parameter, never spliced into a statement: Knex
// rewrites `?` inside raw SQL, and the handler's own `$1` must reach durable_steps untouched.
//
// Run: DATABASE_URL=postgresql://app@127.0.0.1:6432/shop CHARGE_URL='http://127.0.0.1:8000/charge/{key}' \
//          MAIL_URL='http://127.0.0.1:8000/mail/{order}' node shop.js 5000
// It prints "listening on http://127.0.0.1:PORT" once it accepts requests (port 0: any free port).
// TASK_LEASE_MS sets the worker's lease (30 000 ms by default).

import { realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

import { DurableStepsError, NonRetriableError, RetryAfterError, Worker, expressIdempotency, keepRawBody, workflow }
    from 'durable-steps';
import express from 'express';

import { openDrizzleStore } from './store-drizzle.js';
import { openKnexStore } from './store-knex.js';

// The handler ds_idempotent runs once per key: one statement, $1 the stored request. It creates
// the charge as an HTTP step whose run_id is the checkout's key, and the receipt as a task of the
// same run (the outbox: it is stored with the order's transaction, or not at all), starts the
// order's fulfilment (the workflow `fulfil`, run key fulfil:<key>), and answers 202 with the
// order.
export const HANDLER = `
SELECT 202, jsonb_build_object('order', s.run_id)
  FROM ds_http_step('checkout:' || ($1->>'idempotency_key'), 'charge',
                    jsonb_build_object(
                        'method', 'POST',
                        'url', replace((SELECT value FROM shop_config WHERE name = 'charge_url'),
                                       '{key}', $1->>'idempotency_key'),
                        'headers', jsonb_build_object('Content-Type', 'application/json'),
                        'body', ($1->'body')::text),
                    policy => '{"max_attempts": 5, "initial_delay": "100 ms"}') s,
       ds_task_step('checkout:' || ($1->>'idempotency_key'), 'receipt', 'send-receipt',
                    jsonb_build_object(
                        'order', 'checkout:' || ($1->>'idempotency_key'),
                        'to', $1->'body'->>'email',
                        'item', $1->'body'->'item',
                        'amount', $1->'body'->'amount'),
                    policy => '{"max_attempts": 10, "initial_delay": "1 s"}') r,
       ds_start_run('fulfil',
                    jsonb_build_object('order', 'checkout:' || ($1->>'idempotency_key'),
                                       'to', $1->'body'->>'email'),
                    run_key => 'fulfil:' || ($1->>'idempotency_key')) f
`;

/**
 * The handler of the task 'send-receipt': sends the receipt to the mail service under the step's
 * idempotency key (the same for every attempt: a retry after a crash is answered from the mail
 * service's record, not sent again), then records it in `receipts` in ctx.transaction(): the row
 * and the step's outcome commit together, or neither does.
 *
 * @param {import('./store-knex.js').CheckoutStore} store
 * @param {string} mailUrl the mail service's URL, `{order}` replaced by the order
 * @returns {import('durable-steps').TaskHandler}
 */
export function sendReceipt(store, mailUrl) {
    return async (input, ctx) => {
        const r = await fetch(mailUrl.replace('{order}', encodeURIComponent(input.order)), {
            method: 'POST',
            headers: { 'Content-Type': 'application/json', 'Idempotency-Key': ctx.idempotencyKey },
            body: JSON.stringify({
                to: input.to,
                subject: `Your order ${input.order}`,
                order: input.order,
                item: input.item,
                amount: input.amount,
            }),
            // aborted at the task's timeout, on cancellation, when the lease is lost or on stop()
            signal: ctx.signal,
        });
        if (r.status === 429 || r.status === 503) {
            const after = Number(r.headers.get('Retry-After'));
            throw new RetryAfterError(`the mail service answered ${r.status}`, after > 0 ? after * 1000 : 5_000);
        }
        if (r.status >= 400 && r.status < 500) {
            // the message itself is refused: retrying would not help
            throw new NonRetriableError(`the mail service refused the receipt: ${r.status} ${await r.text()}`);
        }
        if (!r.ok) {
            throw new Error(`the mail service answered ${r.status}`);   // retried by the policy
        }
        const sent = await r.json();
        return ctx.transaction(async (client) => {
            await store.recordReceipt(client, {
                order: input.order,
                to: input.to,
                messageId: sent.message_id,
                idempotencyKey: ctx.idempotencyKey,
            });
            return { message_id: sent.message_id, to: input.to };
        });
    };
}

/**
 * The order's fulfilment, a workflow in application code: it waits for the order to ship (the
 * event `shipped:<order>`, emitted by POST /orders/<order>/shipped), records the shipment in
 * the step's own transaction (the row commits with the step's record, or neither does), then
 * mails the shipping notice under the step's idempotency key (the same for every attempt: the
 * mail service answers a repeat from its record). A worker killed anywhere in it leaves nothing
 * done twice: the next worker replays what was recorded and goes on.
 *
 * @param {import('./store-knex.js').CheckoutStore} store
 * @param {string} mailUrl the mail service's URL, `{order}` replaced by the notice's tag
 */
export function fulfil(store, mailUrl) {
    return workflow('fulfil', async (ctx, input) => {
        const shipped = await ctx.waitForEvent('shipped', `shipped:${input.order}`, { timeoutMs: 30 * 86_400_000 });
        await ctx.step('record-shipment', (s) => store.recordShipment(/** @type {any} */ (s.client), {
            order: input.order, carrier: shipped.carrier, idempotencyKey: s.idempotencyKey,
        }), { transaction: true });
        const notice = await ctx.step('notify', async (s) => {
            const r = await fetch(mailUrl.replace('{order}', encodeURIComponent(`${input.order}:shipped`)), {
                method: 'POST',
                headers: { 'Content-Type': 'application/json', 'Idempotency-Key': s.idempotencyKey },
                body: JSON.stringify({ to: input.to, subject: `Your order ${input.order} shipped`,
                    order: input.order, carrier: shipped.carrier }),
                signal: s.signal,
            });
            if (!r.ok) {
                throw new Error(`the mail service answered ${r.status}`);   // retried by the policy
            }
            return { message_id: (await r.json()).message_id };
        }, { retry: { maxAttempts: 10, initialMs: 1000 } });
        return { carrier: shipped.carrier, notice };
    });
}

// the statuses ds_wait_step answers for a charge that will not succeed without a person
const DECLINED = new Set(['failed', 'blocked', 'uncertain', 'cancelled']);

/**
 * @param {import('./store-knex.js').CheckoutStore} store
 * @returns {import('express').Express}
 */
export function makeApp(store) {
    const app = express();
    // keepRawBody: the middleware compares a repeat with the first request by its body's bytes
    app.use(express.json({ verify: keepRawBody }));
    const ds = store.durableSteps;

    app.post('/checkout', (req, res, next) => {
        const key = req.get('Idempotency-Key') ?? '';
        if (key.length < 1 || key.length > 200) {
            res.status(400).json({ error: 'an Idempotency-Key header of 1 to 200 characters is required' });
        } else if (req.body === null || typeof req.body !== 'object' || Array.isArray(req.body)) {
            res.status(400).json({ error: 'a JSON object is required' });
        } else if (typeof req.body.email !== 'string' || !req.body.email.includes('@')) {
            res.status(400).json({ error: 'an email address to send the receipt to is required' });
        } else {
            next();
        }
    }, expressIdempotency({
        client: ds,
        scope: 'checkout',
        handler: HANDLER,
        // the handler's $1: the key and the body
        request: ({ key, body }) => ({ idempotency_key: key, body: /** @type {any} */ (body) }),
        wait: '10 s',
        // the route answers: with the charge's outcome, not the stored 202
        respond: false,
    }), async (req, res) => {
        // the stored response, and Idempotent-Replayed already set on a replay
        const order = res.locals.idempotent.body.order;
        const charge = await ds.waitStep(order, 'charge', '10 s');
        if (charge.status === 'succeeded') {
            res.status(201).json({ order, charged: charge.result.body });
        } else if (DECLINED.has(charge.status)) {
            res.status(402).json({ order, status: charge.status, error: charge.errorMessage });
        } else {
            // still being charged: the client asks again with the same key
            res.status(202).json({ order, status: charge.status });
        }
    });

    // the carrier's webhook: the order shipped. The first emit wins; a repeat changes nothing.
    app.post('/orders/:order/shipped', async (req, res) => {
        const carrier = typeof req.body?.carrier === 'string' ? req.body.carrier : '';
        if (carrier === '') {
            res.status(400).json({ error: 'a carrier is required' });
            return;
        }
        const first = await ds.emitEvent(`shipped:${req.params.order}`, { carrier });
        res.status(first ? 202 : 200).json({ order: req.params.order, first });
    });

    // Express 5 passes a rejected handler here: a documented SQLSTATE answers its status
    app.use((/** @type {any} */ err, /** @type {any} */ req, /** @type {any} */ res, /** @type {any} */ next) => {
        if (res.headersSent) {
            next(err);
        } else if (err instanceof DurableStepsError) {
            if (err.httpStatus >= 500) {
                console.error(err);
            }
            res.status(err.httpStatus).json({ error: err.message, sqlstate: err.sqlstate });
        } else if (err.type === 'entity.parse.failed') {
            res.status(400).json({ error: 'a JSON object is required' });
        } else {
            console.error(err);
            res.status(500).json({ error: 'internal error' });
        }
    });
    return app;
}

/**
 * @param {string} orm
 * @param {string} databaseUrl
 */
export function openStore(orm, databaseUrl) {
    if (orm === 'knex') {
        return openKnexStore(databaseUrl);
    }
    if (orm === 'drizzle') {
        return openDrizzleStore(databaseUrl);
    }
    throw new Error(`ORM must be knex or drizzle, not ${JSON.stringify(orm)}`);
}

async function main() {
    const port = Number(process.argv[2] ?? 5000);
    const { DATABASE_URL, CHARGE_URL, MAIL_URL, ORM = 'knex', TASK_LEASE_MS = '30000' } = process.env;
    if (!DATABASE_URL || !CHARGE_URL || !MAIL_URL) {
        throw new Error('DATABASE_URL, CHARGE_URL and MAIL_URL are required');
    }
    const store = openStore(ORM, DATABASE_URL);
    await store.setup(CHARGE_URL);
    // the receipts' worker, in this process: it claims 'send-receipt' tasks as they commit
    // (waiting in ds_wait_for_tasks when none is due: no polling, no LISTEN), up to 5 at once,
    // on the store's pool (which has room for its 5 handlers, their heartbeats and its wait)
    const worker = new Worker({
        pool: store.pool,
        concurrency: 5,
        lease: Number(TASK_LEASE_MS),
        tasks: { 'send-receipt': sendReceipt(store, MAIL_URL) },
        // declared with ds_define_workflow as the worker starts, before the server listens
        workflows: [fulfil(store, MAIL_URL)],
    });
    worker.on('error', (e) => console.error('receipts worker:', e.message));
    await worker.start();
    const server = makeApp(store).listen(port, '127.0.0.1', () => {
        const address = /** @type {import('node:net').AddressInfo} */ (server.address());
        console.log(`listening on http://127.0.0.1:${address.port} (ORM=${ORM})`);
    });
    // SIGTERM: no new requests, no new claims; the requests being answered finish, and the
    // receipts being sent within the worker's grace period (claims not started are given back
    // uncounted); then the pool closes
    let stopping = false;
    const stop = () => {
        if (stopping) {
            return;
        }
        stopping = true;
        Promise.all([new Promise((resolve) => server.close(resolve)), worker.stop()])
            .then(() => store.close())
            .then(() => process.exit(0), (e) => {
                console.error(e);
                process.exit(1);
            });
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
}

// run as a program (node shop.js), not when imported
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
    main().catch((e) => {
        console.error(e);
        process.exit(1);
    });
}
