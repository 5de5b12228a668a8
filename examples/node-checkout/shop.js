// The checkout service of the example: POST /checkout with an Idempotency-Key header
// (examples/README.md, "The checkout"), in Express over node-postgres, with Knex or Drizzle ORM
// as the database layer (ORM=knex, the default, or ORM=drizzle) and durable_steps through its
// client library (clients/node, the package durable-steps). One request:
//
// 1. the library's Express middleware calls ds_idempotent(), which stores, under the client's
//    key, the request and the response of a handler that creates the charge as an HTTP step
//    (ds_http_step): the response (202, the order) commits with the step, and a repeat of the
//    request replays it without running the handler again, with the header
//    `Idempotent-Replayed: true`. A repeat while the first is in flight waits for it
//    (wait => 10 s); another request under the key is refused (DS422 -> 422).
// 2. waitStep() (ds_wait_step) waits, in one statement, for the charge's outcome: no LISTEN
//    (which a transaction-mode PgBouncer cannot carry), no polling loop.
//
// The handler goes to the server as a bind parameter, never spliced into a statement: Knex
// rewrites `?` inside raw SQL, and the handler's own `$1` must reach durable_steps untouched.
//
// Run: DATABASE_URL=postgresql://app@127.0.0.1:6432/shop CHARGE_URL='http://127.0.0.1:8000/charge/{key}' \
//          node shop.js 5000
// It prints "listening on http://127.0.0.1:PORT" once it accepts requests (port 0: any free port).

import { realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

import { DurableStepsError, expressIdempotency, keepRawBody } from 'durable-steps';
import express from 'express';

import { openDrizzleStore } from './store-drizzle.js';
import { openKnexStore } from './store-knex.js';

// The handler ds_idempotent runs once per key: one statement, $1 the stored request. It creates
// the charge as an HTTP step whose run_id is the checkout's key, and answers 202 with the order.
export const HANDLER = `
SELECT 202, jsonb_build_object('order', s.run_id)
  FROM ds_http_step('checkout:' || ($1->>'idempotency_key'), 'charge',
                    jsonb_build_object(
                        'method', 'POST',
                        'url', replace((SELECT value FROM shop_config WHERE name = 'charge_url'),
                                       '{key}', $1->>'idempotency_key'),
                        'headers', jsonb_build_object('Content-Type', 'application/json'),
                        'body', ($1->'body')::text),
                    policy => '{"max_attempts": 5, "initial_delay": "100 ms"}') s
`;

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
    const { DATABASE_URL, CHARGE_URL, ORM = 'knex' } = process.env;
    if (!DATABASE_URL || !CHARGE_URL) {
        throw new Error('DATABASE_URL and CHARGE_URL are required');
    }
    const store = openStore(ORM, DATABASE_URL);
    await store.setup(CHARGE_URL);
    const server = makeApp(store).listen(port, '127.0.0.1', () => {
        const address = /** @type {import('node:net').AddressInfo} */ (server.address());
        console.log(`listening on http://127.0.0.1:${address.port} (ORM=${ORM})`);
    });
    const stop = () => server.close(() => store.close().then(() => process.exit(0)));
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
