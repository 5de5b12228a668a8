// The Express middleware against the real cluster and the fake provider: an idempotent checkout
// endpoint whose handler creates the charge as an HTTP step, answered from the stored response.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { after, before, test } from 'node:test';

import express from 'express';

import { DurableSteps, expressIdempotency, keepRawBody, userScope } from 'durable-steps';

import env from './env.cjs';

const pool = env.makePool(30);
const client = new DurableSteps(pool);
// how many times each key's route ran
const routeRuns = new Map();
let server;
let base;

// a new order per run of the handler: a replay answers the first one's
const NEW_ORDER = `SELECT 201, jsonb_build_object('order', gen_random_uuid(), 'user', $1->'user',
                                                   'body', $1->'body')`;

before(async () => {
    const app = express();
    const json = express.json({ verify: keepRawBody });
    // Passport's way: the authenticated user as req.user (here: whoever X-User names)
    app.use((req, _res, next) => {
        if (req.get('X-User')) {
            req.user = { id: req.get('X-User'), displayName: 'someone' };
        }
        next();
    });
    app.post('/checkout', json, expressIdempotency({
        client: pool, scope: 'node-client-express', handler: env.CHECKOUT_HANDLER, request: env.checkoutRequest,
    }));
    // respond: false -- the route answers, with the stored response in res.locals.idempotent
    app.post('/orders', json, expressIdempotency({
        client, scope: 'node-client-express-orders', respond: false,
        handler: `SELECT 201, jsonb_build_object('amount', ($1->'body'->>'amount')::int)`,
    }), (req, res) => {
        const { status, body, replayed, key } = res.locals.idempotent;
        res.status(status).json({ ...body, key, replayed });
    });
    app.post('/new-order', json, expressIdempotency({ client, scope: 'node-client-express-new', handler: NEW_ORDER }));
    app.post('/new-order-by-header', json, expressIdempotency({
        client, scope: 'node-client-express-new', handler: NEW_ORDER, user: (req) => req.get('X-Tenant') ?? null,
    }));
    // a JSON parser that does not keep the bytes: the middleware cannot fingerprint the body
    app.post('/no-bytes', express.json(), expressIdempotency({ client, scope: 'node-client-express-new', handler: NEW_ORDER }));
    // no parser at all: the middleware reads the body itself
    app.post('/raw', expressIdempotency({ client, scope: 'node-client-express-raw', handler: NEW_ORDER, limit: 64 }));
    // no handler: the route is the handler, run once per key in application code
    app.post('/app-order', json, expressIdempotency({ client, scope: 'node-client-express-app', lease: '2 s' }),
        async (req, res) => {
            const { key } = res.locals.idempotency;
            routeRuns.set(key, (routeRuns.get(key) ?? 0) + 1);
            await env.sleep(Number(req.get('X-Delay') ?? 0));     // the repeats arrive meanwhile
            const { rows } = await pool.query('SELECT gen_random_uuid()::text AS id');
            if (req.get('X-Fail') && routeRuns.get(key) === 1) {
                res.status(503).json({ error: 'the first run fails' });
            } else if (req.get('X-Text') && routeRuns.get(key) === 1) {
                res.type('text/plain').send('not JSON');
            } else {
                res.status(201).json({ order: rows[0].id, item: req.body.item, run: routeRuns.get(key) });
            }
        });
    // a route that waits until its key's lease is lost
    app.post('/app-watch', json, expressIdempotency({ client, scope: 'node-client-express-watch', lease: '600 ms' }),
        async (_req, res) => {
            const { signal } = res.locals.idempotency;
            await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
            res.status(200).json({ lost: signal.aborted });
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

/** A request of raw bytes: {status, body, replayed}. */
async function send(path, { key, body, type = 'application/json', headers = {} }) {
    const r = await fetch(`${base}${path}`, {
        method: 'POST', body, signal: AbortSignal.timeout(90_000),
        headers: { 'Content-Type': type, ...(key === undefined ? {} : { 'Idempotency-Key': key }), ...headers },
    });
    const text = await r.text();
    let answer;
    try {
        answer = JSON.parse(text);
    } catch {
        answer = text;
    }
    return { status: r.status, body: answer, replayed: r.headers.get('Idempotent-Replayed') };
}

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
    // the repeats waited for the first's commit in the server: none was refused and retried
    assert.deepEqual(env.serverLogErrors(key), []);

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

test('two end users under one key: each gets his own order (req.user, Passport)', async () => {
    const key = env.unique('express-users');
    const body = '{"item":"book","amount":1999}';
    const alice = await send('/new-order', { key, body, headers: { 'X-User': 'alice' } });
    assert.equal(alice.status, 201);
    assert.equal(alice.body.user, 'alice');
    const bob = await send('/new-order', { key, body, headers: { 'X-User': 'bob' } });
    assert.equal(bob.status, 201);
    assert.equal(bob.replayed, null, 'bob got alice\'s stored response');
    assert.equal(bob.body.user, 'bob');
    assert.notEqual(bob.body.order, alice.body.order);
    // each one's retry replays his own; an anonymous request has the key space of the scope alone
    assert.deepEqual(await send('/new-order', { key, body, headers: { 'X-User': 'alice' } }),
        { ...alice, replayed: 'true' });
    assert.deepEqual(await send('/new-order', { key, body, headers: { 'X-User': 'bob' } }),
        { ...bob, replayed: 'true' });
    const nobody = await send('/new-order', { key, body });
    assert.equal(nobody.replayed, null);
    assert.equal(nobody.body.user, null);
    // the entries, as the role sees them: the user is in the scope
    const { rows } = await pool.query(
        'SELECT scope FROM ds_idempotency_keys WHERE key = $1 ORDER BY scope', [key]);
    assert.deepEqual(rows.map((r) => r.scope), ['node-client-express-new', 'node-client-express-new:user:alice',
        'node-client-express-new:user:bob']);
});

test('the option user names the end user; a long or odd identity is encoded or hashed', async () => {
    const key = env.unique('express-tenant');
    const body = '{"item":"pen"}';
    const odd = 'acme:user:x/ü';
    const a = await send('/new-order-by-header', { key, body, headers: { 'X-Tenant': encodeURIComponent(odd) } });
    const b = await send('/new-order-by-header', { key, body, headers: { 'X-Tenant': 'b'.repeat(250) } });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(b.replayed, null);
    assert.equal((await send('/new-order-by-header', { key, body, headers: { 'X-Tenant': 'b'.repeat(250) } })).replayed, 'true');
    const { rows } = await pool.query('SELECT scope FROM ds_idempotency_keys WHERE key = $1 ORDER BY scope', [key]);
    assert.deepEqual(rows.map((r) => r.scope).sort(), [
        userScope('node-client-express-new', 'b'.repeat(250)),
        userScope('node-client-express-new', encodeURIComponent(odd)),
    ].sort());
    // the encoding: unambiguous, within PostgreSQL's 255 characters
    assert.equal(userScope('s', 'a:b'), 's:user:a%3Ab');
    assert.equal(userScope('s', null), 's');
    assert.match(userScope('s', 'x'.repeat(300)), /^s:user:sha256=[0-9a-f]{64}$/);
    assert.notEqual(userScope('s', '\ud800'), userScope('s', '\ud801'));
    assert.throws(() => expressIdempotency({ client, scope: 'a:user:b', handler: NEW_ORDER }), /:user:/);
    assert.throws(() => expressIdempotency({ client, scope: 's'.repeat(179), handler: NEW_ORDER }), /178/);
});

test('bodies are compared by their bytes: different bytes under one key are 422', async () => {
    const key = env.unique('express-bytes');
    const first = await send('/new-order', { key, body: '{"a":1,"a":2}' });
    assert.equal(first.status, 201);
    assert.deepEqual(first.body.body, { a: 2 });
    // the same JSON once parsed, other bytes: another request
    const other = await send('/new-order', { key, body: '{"a":2}' });
    assert.equal(other.status, 422);
    assert.equal(other.body.sqlstate, 'DS422');
    assert.equal((await send('/new-order', { key, body: '{"a":1,"a":2}' })).replayed, 'true');

    // bodies no JSON parser takes (stored as null): their bytes tell them apart
    const raw = env.unique('express-bytes-text');
    const text = await send('/new-order', { key: raw, body: 'pay 10', type: 'text/plain' });
    assert.equal(text.status, 201);
    assert.equal(text.body.body, null);
    assert.equal((await send('/new-order', { key: raw, body: 'pay 10000', type: 'text/plain' })).status, 422);
    assert.equal((await send('/new-order', { key: raw, body: 'pay 10', type: 'text/plain' })).replayed, 'true');
    const { rows } = await pool.query('SELECT request FROM ds_idempotency_keys WHERE key = $1', [raw]);
    assert.equal(rows[0].request.body_sha256, createHash('sha256').update('pay 10').digest('hex'));
});

test('a body no parser read is read by the middleware; one read without its bytes is a 500', async () => {
    const key = env.unique('express-raw');
    const first = await send('/raw', { key, body: '\x00\x01 bytes', type: 'application/octet-stream' });
    assert.equal(first.status, 201);
    assert.equal((await send('/raw', { key, body: '\x00\x02 bytes', type: 'application/octet-stream' })).status, 422);
    assert.equal((await send('/raw', { key: env.unique('express-raw-big'), body: 'x'.repeat(65) })).status, 413);
    const lost = await send('/no-bytes', { key: env.unique('express-no-bytes'), body: '{"a":1}' });
    assert.equal(lost.status, 500);
});

test('a body with U+0000 is the client\'s 400, not a 500', async () => {
    const key = env.unique('express-nul');
    const nul = await send('/new-order', { key, body: '{"item":"a\\u0000b"}' });
    assert.equal(nul.status, 400);
    assert.match(nul.body.error, /U\+0000/);
    // a backslash and "u0000" are characters like others
    const escaped = await send('/new-order', { key, body: '{"item":"a\\\\u0000b"}' });
    assert.equal(escaped.status, 201);
    assert.equal(escaped.body.body.item, 'a\\u0000b');
});

test('no handler: 20 concurrent duplicates run the route once and get 20 identical answers', async () => {
    const key = env.unique('express-app-dup');
    const answers = await Promise.all(Array.from({ length: 20 }, () => send('/app-order', {
        key, body: '{"item":"pen"}', headers: { 'X-Delay': '500' },
    })));
    assert.equal(routeRuns.get(key), 1);
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [201]);
    // the same JSON (the replays' keys in jsonb's order)
    for (const answer of answers) {
        assert.deepEqual(answer.body, answers[0].body);
    }
    assert.equal(answers[0].body.item, 'pen');
    assert.equal(answers.filter((a) => a.replayed === 'true').length, 19);
    // the repeats waited in the server for the first's finish: none was refused and retried
    assert.deepEqual(env.serverLogErrors(key), []);
    // another body under the key
    const other = await send('/app-order', { key, body: '{"item":"ink"}' });
    assert.deepEqual([other.status, other.body.sqlstate], [422, 'DS422']);
    assert.equal(routeRuns.get(key), 1);
});

test('no handler: an answer of 500 or more, or not JSON, is not stored; the retry runs the route again', async () => {
    const failed = env.unique('express-app-503');
    const first = await send('/app-order', { key: failed, body: '{"item":"pen"}', headers: { 'X-Fail': '1' } });
    assert.equal(first.status, 503);
    const second = await send('/app-order', { key: failed, body: '{"item":"pen"}', headers: { 'X-Fail': '1' } });
    assert.deepEqual([second.status, second.body.run, second.replayed], [201, 2, null]);
    const third = await send('/app-order', { key: failed, body: '{"item":"pen"}' });
    assert.deepEqual([third.status, third.body, third.replayed], [201, second.body, 'true']);

    const text = env.unique('express-app-text');
    const plain = await send('/app-order', { key: text, body: '{"item":"pen"}', headers: { 'X-Text': '1' } });
    assert.deepEqual([plain.status, plain.body], [200, 'not JSON']);
    // the key was abandoned once the response was over
    await env.until('the key abandoned', async () => (await pool.query(
        'SELECT count(*)::int AS n FROM ds_idempotency_keys WHERE key = $1', [text])).rows[0].n === 0, 10_000);
    const again = await send('/app-order', { key: text, body: '{"item":"pen"}', headers: { 'X-Text': '1' } });
    assert.deepEqual([again.status, again.body.run], [201, 2]);
});

test('no handler: a route whose key was taken from it is told by its signal and answered 409', async () => {
    const key = env.unique('express-app-lost');
    const answer = send('/app-watch', { key, body: '{}' });
    await env.until('the key held', async () => (await pool.query(
        "SELECT count(*)::int AS n FROM ds_idempotency_keys WHERE key = $1 AND state = 'held'", [key])).rows[0].n === 1);
    // an operator deletes the entry: the next renewal is refused (DS404)
    execFileSync('sh', ['-c', env.ADMIN_PSQL], { input: `DELETE FROM durable_steps.idempotency_keys WHERE key = '${key}';` });
    const lost = await answer;
    assert.equal(lost.status, 409);
    assert.equal(lost.body.sqlstate, 'DS409');
    assert.match(lost.body.error, /not stored/);
});
