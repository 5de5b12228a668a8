// The Fastify hook against the real cluster and the fake provider, through the CommonJS build
// (required by the package's own name, so through its "exports" map): a checkout endpoint whose
// route, given the stored response (respond: false), waits for the charge and answers it.
'use strict';

const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');

const Fastify = require('fastify');

const ds = require('durable-steps');
const env = require('./env.cjs');

const pool = env.makePool(30);
const client = new ds.DurableSteps(pool);
let app;
let base;

before(async () => {
    app = Fastify();
    app.post('/checkout', {
        preHandler: ds.fastifyIdempotency({
            client, scope: 'node-client-fastify', handler: env.CHECKOUT_HANDLER, request: env.checkoutRequest,
            respond: false,
        }),
    }, async (request, reply) => {
        const { body } = request.idempotent;
        const charge = await client.waitStep(body.order, 'charge', '60 s');
        if (charge.status !== 'succeeded') {
            return reply.code(202).send({ order: body.order, status: charge.status });
        }
        return reply.code(201).send({ order: body.order, charged: JSON.parse(charge.result.body) });
    });
    app.post('/orders', {
        preHandler: ds.fastifyIdempotency({
            client: pool, scope: 'node-client-fastify-orders', wait: '1 s',
            handler: `SELECT 201, jsonb_build_object('amount', ($1->'body'->>'amount')::int)`,
        }),
    }, async () => {
        throw new Error('not reached: the hook answers');
    });
    base = await app.listen({ port: 0, host: '127.0.0.1' });
});

after(async () => {
    await app.close();
    await pool.end();
});

async function post(path, key, body) {
    const r = await fetch(`${base}${path}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
        body: JSON.stringify(body), signal: AbortSignal.timeout(90_000),
    });
    return { status: r.status, body: await r.json(), replayed: r.headers.get('Idempotent-Replayed') };
}

test('the CommonJS build is the one required', () => {
    assert.match(require.resolve('durable-steps'), /[/\\]dist[/\\]cjs[/\\]index\.js$/);
});

test('20 concurrent identical requests: one charge, exactly one answer not replayed', async () => {
    const key = env.unique('fastify-dup');
    const body = { item: 'lamp', amount: 4500 };
    const answers = await Promise.all(Array.from({ length: 20 }, () => post('/checkout', key, body)));
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [201]);
    assert.deepEqual([...new Set(answers.map((a) => a.body.order))], [`checkout:${key}`]);
    for (const a of answers) {
        assert.equal(a.body.charged.charged, key);
        assert.equal(a.body.charged.charge, 1);
        assert.deepEqual(JSON.parse(a.body.charged.received), body);
    }
    assert.equal(answers.filter((a) => a.replayed !== 'true').length, 1);
    const counts = await env.providerCounts();
    assert.equal(counts.charges[key], 1);
    assert.equal(counts.requests[key], 1);

    const other = await post('/checkout', key, { item: 'lamp', amount: 1 });
    assert.equal(other.status, 422);
    assert.equal(other.body.sqlstate, 'DS422');
    assert.equal((await env.providerCounts()).charges[key], 1);
});

test('the hook answers the stored response itself by default', async () => {
    const key = env.unique('fastify-orders');
    const first = await post('/orders', key, { amount: 70 });
    assert.deepEqual(first, { status: 201, body: { amount: 70 }, replayed: null });
    const again = await post('/orders', key, { amount: 70 });
    assert.deepEqual(again, { status: 201, body: { amount: 70 }, replayed: 'true' });
});

test('a key in flight past the wait is answered 409 with Retry-After', async () => {
    // the key held by application code (ds_idempotent_begin): ds_idempotent cannot take it
    const key = env.unique('fastify-held');
    const held = await client.idempotentBegin('node-client-fastify-orders', key,
        { method: 'POST', path: '/orders', idempotency_key: key, body: { amount: 3 } });
    assert.equal(held.state, 'new');
    const r = await fetch(`${base}/orders`, {
        method: 'POST', headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
        body: JSON.stringify({ amount: 3 }), signal: AbortSignal.timeout(90_000),
    });
    assert.equal(r.status, 409);
    assert.equal(r.headers.get('Retry-After'), '1');
    assert.equal((await r.json()).sqlstate, 'DS409');
    await client.idempotentAbandon('node-client-fastify-orders', key, held.token);
});
