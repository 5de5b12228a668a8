// The Fastify hook against the real cluster and the fake provider, through the CommonJS build
// (required by the package's own name, so through its "exports" map): a checkout endpoint whose
// route, given the stored response (respond: false), waits for the charge and answers it.
'use strict';

const assert = require('node:assert/strict');
const { createHash } = require('node:crypto');
const { after, before, test } = require('node:test');

const Fastify = require('fastify');

const ds = require('durable-steps');
const env = require('./env.cjs');

const pool = env.makePool(30);
const client = new ds.DurableSteps(pool);
// how many times each key's route ran
const routeRuns = new Map();
let app;
let base;

// a new order per run of the handler: a replay answers the first one's
const NEW_ORDER = `SELECT 201, jsonb_build_object('order', gen_random_uuid(), 'user', $1->'user',
                                                   'body', $1->'body')`;

before(async () => {
    app = Fastify();
    // @fastify/jwt's way: the authenticated user as request.user (here: whoever X-User names)
    app.decorateRequest('user', null);
    app.addHook('onRequest', async (request) => {
        if (request.headers['x-user']) {
            request.user = { sub: request.headers['x-user'], scope: 'orders' };
        }
    });
    const checkout = ds.fastifyIdempotency({
        client, scope: 'node-client-fastify', handler: env.CHECKOUT_HANDLER, request: env.checkoutRequest,
        respond: false,
    });
    app.post('/checkout', { preParsing: checkout.preParsing, preHandler: checkout.preHandler }, async (request, reply) => {
        const { body } = request.idempotent;
        const charge = await client.waitStep(body.order, 'charge', '60 s');
        if (charge.status !== 'succeeded') {
            return reply.code(202).send({ order: body.order, status: charge.status });
        }
        return reply.code(201).send({ order: body.order, charged: JSON.parse(charge.result.body) });
    });
    const orders = ds.fastifyIdempotency({
        client: pool, scope: 'node-client-fastify-orders', wait: '1 s',
        handler: `SELECT 201, jsonb_build_object('amount', ($1->'body'->>'amount')::int)`,
    });
    app.post('/orders', { preParsing: orders.preParsing, preHandler: orders }, async () => {
        throw new Error('not reached: the hook answers');
    });
    const newOrder = ds.fastifyIdempotency({ client, scope: 'node-client-fastify-new', handler: NEW_ORDER });
    app.post('/new-order', { ...newOrder }, async () => {
        throw new Error('not reached: the hook answers');
    });
    // without its preParsing part the hook cannot fingerprint a body
    app.post('/no-bytes', { preHandler: newOrder }, async () => {
        throw new Error('not reached: the hook answers');
    });
    // no handler: the route is the handler, run once per key; its JSON answer stored by onSend
    const appOrder = ds.fastifyIdempotency({ client, scope: 'node-client-fastify-app', lease: '2 s' });
    app.post('/app-order', { ...appOrder }, async (request, reply) => {
        const { key } = request.idempotency;
        routeRuns.set(key, (routeRuns.get(key) ?? 0) + 1);
        await env.sleep(Number(request.headers['x-delay'] ?? 0));     // the repeats arrive meanwhile
        if (request.headers['x-fail'] && routeRuns.get(key) === 1) {
            throw new Error('the first run fails');                 // Fastify answers 500
        }
        const { rows } = await pool.query('SELECT gen_random_uuid()::text AS id');
        return reply.code(201).send({ order: rows[0].id, item: request.body.item, run: routeRuns.get(key) });
    });
    base = await app.listen({ port: 0, host: '127.0.0.1' });
});

after(async () => {
    await app.close();
    await pool.end();
});

/** A request of raw bytes: {status, body, replayed}. */
async function send(path, { key, body, type = 'application/json', headers = {} }) {
    const r = await fetch(`${base}${path}`, {
        method: 'POST', body, signal: AbortSignal.timeout(90_000),
        headers: { 'Content-Type': type, ...(key === undefined ? {} : { 'Idempotency-Key': key }), ...headers },
    });
    return { status: r.status, body: await r.json(), replayed: r.headers.get('Idempotent-Replayed') };
}

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
    // the repeats waited for the first's commit in the server: none was refused and retried
    assert.deepEqual(env.serverLogErrors(key), []);
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
    const held = await client.idempotentBegin('node-client-fastify-orders', key, {
        method: 'POST', path: '/orders', query: '', idempotency_key: key, user: null,
        body_sha256: createHash('sha256').update('{"amount":3}').digest('hex'), body: { amount: 3 },
    });
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

test('two end users under one key: each gets his own order (request.user, @fastify/jwt)', async () => {
    const key = env.unique('fastify-users');
    const body = '{"item":"lamp"}';
    const alice = await send('/new-order', { key, body, headers: { 'X-User': 'alice' } });
    const bob = await send('/new-order', { key, body, headers: { 'X-User': 'bob' } });
    assert.equal(alice.status, 201);
    assert.equal(bob.status, 201);
    assert.equal(bob.replayed, null, 'bob got alice\'s stored response');
    assert.deepEqual([alice.body.user, bob.body.user], ['alice', 'bob']);
    assert.notEqual(bob.body.order, alice.body.order);
    assert.deepEqual(await send('/new-order', { key, body, headers: { 'X-User': 'bob' } }), { ...bob, replayed: 'true' });
    const nobody = await send('/new-order', { key, body });
    assert.equal(nobody.replayed, null);
    assert.equal(nobody.body.user, null);
});

test('bodies are compared by their bytes: different bytes under one key are 422', async () => {
    const key = env.unique('fastify-bytes');
    const first = await send('/new-order', { key, body: '{"a":1,"a":2}' });
    assert.equal(first.status, 201);
    assert.deepEqual(first.body.body, { a: 2 });
    const other = await send('/new-order', { key, body: '{"a":2}' });
    assert.equal(other.status, 422);
    assert.equal(other.body.sqlstate, 'DS422');
    assert.equal((await send('/new-order', { key, body: '{"a":1,"a":2}' })).replayed, 'true');
    const { rows } = await pool.query('SELECT request FROM ds_idempotency_keys WHERE key = $1', [key]);
    assert.equal(rows[0].request.body_sha256, createHash('sha256').update('{"a":1,"a":2}').digest('hex'));
    // the hook without its preParsing part: a 500, never a guess
    assert.equal((await send('/no-bytes', { key: env.unique('fastify-no-bytes'), body: '{"a":1}' })).status, 500);
});

test('a body with U+0000 is the client\'s 400, not a 500', async () => {
    const nul = await send('/new-order', { key: env.unique('fastify-nul'), body: '{"item":"a\\u0000b"}' });
    assert.equal(nul.status, 400);
    assert.match(nul.body.error, /U\+0000/);
});

test('no handler: 20 concurrent duplicates run the route once and get 20 identical answers', async () => {
    const key = env.unique('fastify-app-dup');
    const answers = await Promise.all(Array.from({ length: 20 }, () => send('/app-order', {
        key, body: '{"item":"lamp"}', headers: { 'X-Delay': '500' },
    })));
    assert.equal(routeRuns.get(key), 1);
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [201]);
    for (const answer of answers) {
        assert.deepEqual(answer.body, answers[0].body);
    }
    assert.equal(answers[0].body.item, 'lamp');
    assert.equal(answers.filter((a) => a.replayed === 'true').length, 19);
    assert.deepEqual(env.serverLogErrors(key), []);
});

test('no handler: a route that throws is not stored; the retry runs it again', async () => {
    const key = env.unique('fastify-app-500');
    const first = await send('/app-order', { key, body: '{"item":"lamp"}', headers: { 'X-Fail': '1' } });
    assert.equal(first.status, 500);
    const second = await send('/app-order', { key, body: '{"item":"lamp"}' });
    assert.deepEqual([second.status, second.body.run, second.replayed], [201, 2, null]);
    const third = await send('/app-order', { key, body: '{"item":"lamp"}' });
    assert.deepEqual([third.status, third.body, third.replayed], [201, second.body, 'true']);
});
