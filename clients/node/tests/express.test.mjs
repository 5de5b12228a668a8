// The Express middleware against the real cluster and the fake provider: an idempotent checkout
// endpoint whose handler creates the charge as an HTTP step, answered from the stored response.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import express from 'express';

import { DurableSteps, expressIdempotency } from 'durable-steps';

import env from './env.cjs';

const pool = env.makePool(30);
const client = new DurableSteps(pool);
let server;
let base;

before(async () => {
    const app = express();
    app.use(express.json());
    app.post('/checkout', expressIdempotency({
        client: pool, scope: 'node-client-express', handler: env.CHECKOUT_HANDLER, request: env.checkoutRequest,
    }));
    // respond: false -- the route answers, with the stored response in res.locals.idempotent
    app.post('/orders', expressIdempotency({
        client, scope: 'node-client-express-orders', respond: false,
        handler: `SELECT 201, jsonb_build_object('amount', ($1->'body'->>'amount')::int)`,
    }), (req, res) => {
        const { status, body, replayed, key } = res.locals.idempotent;
        res.status(status).json({ ...body, key, replayed });
    });
    await new Promise((resolve) => {
        server = app.listen(0, '127.0.0.1', resolve);
    });
    base = `http://127.0.0.1:${server.address().port}`;
});

after(async () => {
    await new Promise((resolve) => server.close(resolve));
    await pool.end();
});

async function post(path, key, body) {
    const headers = { 'Content-Type': 'application/json' };
    if (key !== undefined) {
        headers['Idempotency-Key'] = key;
    }
    const r = await fetch(`${base}${path}`, {
        method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(90_000),
    });
    return { status: r.status, body: await r.json(), replayed: r.headers.get('Idempotent-Replayed') };
}

test('20 concurrent identical requests: one charge, exactly one answer not replayed', async () => {
    const key = env.unique('express-dup');
    const body = { item: 'book', amount: 1999 };
    const answers = await Promise.all(Array.from({ length: 20 }, () => post('/checkout', key, body)));
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [202]);
    assert.deepEqual([...new Set(answers.map((a) => JSON.stringify(a.body)))],
        [JSON.stringify({ order: `checkout:${key}` })]);
    assert.equal(answers.filter((a) => a.replayed !== 'true').length, 1);
    assert.equal(answers.filter((a) => a.replayed === 'true').length, 19);

    // the charge, sent by the HTTP worker after the first request committed
    const charge = await client.waitStep(`checkout:${key}`, 'charge', '60 s');
    assert.equal(charge.status, 'succeeded');
    assert.equal(charge.result.status, 200);
    assert.deepEqual(JSON.parse(JSON.parse(charge.result.body).received), body);
    const counts = await env.providerCounts();
    assert.equal(counts.charges[key], 1);
    assert.equal(counts.requests[key], 1);

    // another body under the key: 422, DS422, the server's message
    const other = await post('/checkout', key, { item: 'book', amount: 1 });
    assert.equal(other.status, 422);
    assert.equal(other.body.sqlstate, 'DS422');
    assert.ok(other.body.error.length > 0);
    assert.equal((await env.providerCounts()).charges[key], 1);
});

test('a request without the key is answered 400, one with a key too long too', async () => {
    const none = await post('/checkout', undefined, { amount: 1 });
    assert.equal(none.status, 400);
    assert.match(none.body.error, /Idempotency-Key/);
    const long = await post('/checkout', 'k'.repeat(256), { amount: 1 });
    assert.equal(long.status, 400);
});

test('respond: false hands the stored response to the route', async () => {
    const key = env.unique('express-orders');
    const first = await post('/orders', key, { amount: 70 });
    assert.deepEqual(first, { status: 201, body: { amount: 70, key, replayed: false }, replayed: null });
    const again = await post('/orders', key, { amount: 70 });
    assert.deepEqual(again, { status: 201, body: { amount: 70, key, replayed: true }, replayed: 'true' });
});
