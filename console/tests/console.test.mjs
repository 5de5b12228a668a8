// The console in a real headless Chromium (Debian's, driven by playwright-core) against the real
// cluster of examples/run-tests: mounted in Express (with actions, read-only, and as a role with
// fewer rights) and in Fastify, and served on its own by durable-steps-console. It seeds what an
// operator meets -- a step blocked for corrected input, one whose SQL, input, error and HTTP body
// carry script payloads, a waiting run, a task, idempotency keys -- and acts on them as a person
// would. A screenshot of each page goes to DS_CONSOLE_SCREENSHOTS (console/screenshots/).

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { request } from 'node:http';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import express from 'express';
import Fastify from 'fastify';
import pg from 'pg';
import { chromium } from 'playwright-core';

import { DurableSteps } from 'durable-steps';
import { durableConsole, fastifyConsole } from 'durable-steps-console';

const here = dirname(fileURLToPath(import.meta.url));
const env = (name) => {
    const value = process.env[name];
    if (!value) {
        throw new Error(`${name} is not set (examples/run-tests sets it)`);
    }
    return value;
};
const connection = { host: env('DS_PGHOST'), port: Number(env('DS_PGPORT')), database: env('DS_PGDATABASE'), user: env('DS_PGUSER') };
const PROVIDER = env('DS_PROVIDER_URL');
const shots = process.env.DS_CONSOLE_SCREENSHOTS || join(here, '..', 'screenshots');
const stamp = `${process.pid}-${Date.now()}`;
const id = (what) => `console-${what}-${stamp}`;
const admin = (sql) => execFileSync('sh', ['-c', env('DS_ADMIN_PSQL')], { input: sql });

const pool = new pg.Pool({ ...connection, max: 10 });
const ds = new DurableSteps(pool);
const actionsLog = [];
let server;
let fastify;
let base;
let fastifyBase;
let browser;
let page;

// what the tests act on
const blocked = { run: id('order'), step: 'reserve' };
const hostile = { run: id('hostile'), step: '<img src=x onerror="window.__xss=\'run id\'">' };
const PAYLOAD_SQL = `SELECT ds_blocked('<script>window.__xss="error"</script> refused',
    'fix it: <img src=x onerror="window.__xss=''remediation''">') /* <script>window.__xss="sql"</script> */`;
let waitingRun;
let httpRun;

const stepPath = (mount, run, step) => `/${mount}/step?${new URLSearchParams({ run, step })}`;
const runPath = (mount, run) => `/${mount}/run?${new URLSearchParams({ id: run })}`;

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
        await new Promise((resolve) => setTimeout(resolve, 100));
    }
}

async function shot(name) {
    await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

/** No payload ran: nothing set window.__xss, and no element a payload would make exists. */
async function assertInert() {
    assert.equal(await page.evaluate(() => window.__xss), undefined);
    assert.equal(await page.locator('main img').count(), 0);
    assert.equal(await page.locator('main script').count(), 0);
}

before(async () => {
    mkdirSync(shots, { recursive: true });
    // a role with fewer rights than the steps' owner: it sees every step (durable_steps_admin) but
    // may re-arm another role's step only as it was defined; the pool's role may become it
    admin(`DO $$ BEGIN
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_limited') THEN
                 CREATE ROLE console_limited NOLOGIN;
             END IF;
           END $$;
           GRANT durable_steps_admin TO console_limited;
           GRANT console_limited TO ${connection.user};
           DO $$ BEGIN
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_plain') THEN
                 CREATE ROLE console_plain NOLOGIN;
             END IF;
           END $$;
           GRANT console_plain TO ${connection.user};`);

    // a step blocked until its input is corrected
    await ds.runStep(blocked.run, blocked.step,
        `SELECT CASE WHEN ($1->>'qty')::int > 0 THEN ($1->>'qty')::int
                     ELSE ds_blocked('qty must be positive', 'send a positive qty')::text::int END`, { input: { qty: 0 } });
    // a step whose every text is a payload, under a hostile step id
    await ds.runStep(hostile.run, hostile.step, PAYLOAD_SQL, { input: { note: "<script>window.__xss='input'</script>" } });
    // an HTTP step whose response body carries a payload (the fake provider echoes the request)
    httpRun = id('http');
    await ds.httpStep(httpRun, 'charge', {
        method: 'POST', url: `${PROVIDER}/charge/${httpRun}`, json: { note: '<script>window.__xss="http body"</script>' },
    });
    await ds.waitStep(httpRun, 'charge', '60 s');
    // a run waiting for an event, to be cancelled
    await pool.query(`CREATE OR REPLACE FUNCTION console_wait(run_id text, input jsonb) RETURNS jsonb
                      LANGUAGE plpgsql AS $$
                      BEGIN
                          PERFORM ds_await_event('wait', 'console-event:' || run_id, '1 hour');
                          RETURN '{}';
                      END $$`);
    waitingRun = (await ds.startRun('console_wait', { order: '<b>bold?</b>' })).runId;
    await until('the run to wait', async () => (await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [waitingRun])).rows[0]?.status === 'waiting');
    // a task waiting for a worker, and idempotency keys
    await ds.taskStep(id('tasks'), 'email', 'console-email', { to: '<script>x</script>' });
    await ds.idempotentBegin('console', id('held'), { amount: 1 });
    const done = await ds.idempotentBegin('console', id('done'), { amount: 2 });
    await ds.idempotentFinish('console', id('done'), done.token, 201, { order: '<i>7</i>' });

    const app = express();
    app.use('/durable', durableConsole({ pool, actions: true, refreshSeconds: 2, log: (e) => actionsLog.push(e) }));
    // read-only, as a role of no privileges of its own
    app.use('/readonly', durableConsole({ pool, role: () => 'console_plain' }));
    app.use('/limited', durableConsole({ pool, actions: true, role: () => 'console_limited', log: (e) => actionsLog.push(e) }));
    app.use('/none', durableConsole({ pool, role: () => 'NONE' }));
    await new Promise((resolve) => {
        server = app.listen(0, '127.0.0.1', resolve);
    });
    base = `http://127.0.0.1:${server.address().port}`;
    fastify = Fastify();
    await fastify.register(fastifyConsole({ pool, actions: true, log: (e) => actionsLog.push(e) }), { prefix: '/ops' });
    fastifyBase = await fastify.listen({ port: 0, host: '127.0.0.1' });

    browser = await chromium.launch({ executablePath: process.env.DS_CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
    page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('dialog', (d) => {
        throw new Error(`a dialog opened: ${d.message()}`);
    });
});

after(async () => {
    await browser?.close();
    await fastify?.close();
    await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
    await pool.end();
});

test('every page renders with real data', async () => {
    const visits = [
        ['overview', '/durable/', 'Overview', 'Attempts, last hour'],
        ['inbox', '/durable/inbox', 'Needs a person', blocked.run],
        ['runs', '/durable/runs', 'Runs', waitingRun],
        ['run', runPath('durable', waitingRun), 'Run', 'console-event:'],
        ['step', stepPath('durable', blocked.run, blocked.step), 'Step', 'send a positive qty'],
        ['http-step', stepPath('durable', httpRun, 'charge'), 'Step', 'Response'],
        ['tasks', '/durable/tasks', 'Tasks', 'console-email'],
        ['schedules', '/durable/schedules', 'Schedules', ''],
        ['keys', '/durable/keys', 'Idempotency keys', id('done')],
    ];
    for (const [name, url, heading, text] of visits) {
        const response = await page.goto(base + url);
        assert.equal(response.status(), 200, url);
        assert.match(await page.locator('h1').first().innerText(), new RegExp(heading), url);
        if (text) {
            assert.ok((await page.locator('main').innerText()).includes(text), `${url} shows ${text}`);
        }
        await assertInert();
        await shot(name);
    }
    // the chart reads the server's counters, which durable_steps_admin may (the pool's role may not)
    await page.goto(`${base}/limited/`);
    assert.ok(await page.locator('svg.chart rect').count() > 0, 'the chart of the last hour has bars');
    await shot('overview-admin');
    await page.goto(`${base}/readonly/`);
    assert.match(await page.locator('main').innerText(), /members of pg_monitor or durable_steps_admin may/);
});

test('every piece of step text is rendered as text: SQL, input, errors, ids, HTTP bodies', async () => {
    await page.goto(base + stepPath('durable', hostile.run, hostile.step));
    const text = await page.locator('main').innerText();
    for (const payload of ['<script>window.__xss="sql"</script>', "<script>window.__xss='input'</script>",
        '<script>window.__xss="error"</script>', 'onerror="window.__xss=\'remediation\'"', hostile.step]) {
        assert.ok(text.includes(payload), `shows ${payload} as text`);
    }
    await assertInert();
    await shot('payloads-step');
    await page.goto(`${base}/durable/inbox`);
    await assertInert();
    await page.goto(base + stepPath('durable', httpRun, 'charge'));
    assert.ok((await page.locator('main').innerText()).includes('window.__xss=\\"http body\\"'));
    await assertInert();
    // the live refresh puts the server's escaped fragment in place: still inert
    await page.goto(`${base}/durable/inbox`);
    await page.waitForSelector('main[data-refreshed]', { timeout: 15_000 });
    await assertInert();
});

test('a blocked step re-armed with corrected input is seen to succeed', async () => {
    await page.goto(base + stepPath('durable', blocked.run, blocked.step));
    const form = page.locator('form.action', { has: page.locator('button', { hasText: 'Re-arm' }) });
    await form.locator('textarea[name=input]').fill('{"qty": 2}');
    await form.locator('button').click();
    assert.match(await page.locator('main').innerText(), /You are about to re-arm step .* with a corrected input/);
    await shot('confirm');
    await page.locator('main button', { hasText: 'Confirm' }).click();
    assert.equal(await page.locator('h1').innerText(), 'Done');
    await shot('done');
    // the worker runs it again; the step's page shows it succeed
    await until('the step to succeed', async () => {
        await page.goto(base + stepPath('durable', blocked.run, blocked.step));
        return (await page.locator('h1 .status').innerText()) === 'succeeded';
    });
    assert.deepEqual((await ds.waitStep(blocked.run, blocked.step, '1 s')).result, 2);
    assert.ok(actionsLog.some((e) => e.action === 'rearm' && e.ok && e.description.includes(blocked.run)));
});

test('a run is cancelled from its page', async () => {
    await page.goto(base + runPath('durable', waitingRun));
    await page.locator('form.action button', { hasText: 'Cancel the run' }).click();
    await page.locator('main button', { hasText: 'Confirm' }).click();
    assert.match(await page.locator('main').innerText(), /the run is cancelled/);
    assert.equal((await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [waitingRun])).rows[0].status, 'cancelled');
});

test("an action beyond the operator's rights shows the database's error", async () => {
    const other = { run: id('limited'), step: 'reserve' };
    await ds.runStep(other.run, other.step, `SELECT ds_blocked('no', 'yes')`);
    await page.goto(base + stepPath('limited', other.run, other.step));
    const form = page.locator('form.action', { has: page.locator('button', { hasText: 'Re-arm' }) });
    await form.locator('textarea[name=input]').fill('{"corrected": true}');
    await form.locator('button').click();
    await page.locator('main button', { hasText: 'Confirm' }).click();
    const text = await page.locator('main').innerText();
    assert.equal(await page.locator('h1').innerText(), 'Refused');
    assert.match(text, /SQLSTATE 42501/);
    assert.match(text, new RegExp(`step ${other.run}/reserve belongs to role ${connection.user}`));
    await shot('refused');
    assert.equal((await pool.query('SELECT status FROM ds_steps WHERE run_id = $1', [other.run])).rows[0].status, 'blocked');
    assert.ok(actionsLog.some((e) => e.role === 'console_limited' && !e.ok && e.sqlstate === '42501'));
});

test('a POST without the CSRF token, or from another site, is refused; a read-only console has no actions', async () => {
    const run = (await ds.startRun('console_wait', {})).runId;
    await page.goto(base + runPath('durable', run));
    const token = await page.locator('form.action input[name=csrf]').first().inputValue();
    // the cookie the browser sends to this mount path, as it sends it
    const cookies = (await page.context().cookies(`${base}/durable/`)).filter((c) => c.path === '/durable')
        .map((c) => `${c.name}=${c.value}`).join('; ');
    const post = (path, body, headers = {}) => fetch(base + path, {
        method: 'POST', body: new URLSearchParams(body), redirect: 'manual',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: cookies, ...headers },
    });
    const none = await post('/durable/actions/cancel-run', { run_id: run, confirm: '1' });
    assert.equal(none.status, 403);
    const wrong = await post('/durable/actions/cancel-run', { run_id: run, confirm: '1', csrf: 'f'.repeat(64) });
    assert.equal(wrong.status, 403);
    const noCookie = await fetch(`${base}/durable/actions/cancel-run`, {
        method: 'POST', body: new URLSearchParams({ run_id: run, confirm: '1', csrf: token }),
        headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    });
    assert.equal(noCookie.status, 403);
    const elsewhere = await post('/durable/actions/cancel-run', { run_id: run, confirm: '1', csrf: token }, { Origin: 'http://evil.example' });
    assert.equal(elsewhere.status, 403);
    // a redirect's Origin, null, is no origin of this site
    const redirected = await post('/durable/actions/cancel-run', { run_id: run, confirm: '1', csrf: token }, { Origin: 'null' });
    assert.equal(redirected.status, 403);
    // a cookie planted beside ours (a sibling subdomain's): its value is no token, the form's
    // token is the HMAC of the cookie, which only the console can make
    const planted = 'a'.repeat(64);
    const forged = await fetch(`${base}/durable/actions/cancel-run`, {
        method: 'POST', body: new URLSearchParams({ run_id: run, confirm: '1', csrf: planted }),
        headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: `${cookies}; ds_console_csrf=${planted}` },
    });
    assert.equal(forged.status, 403);
    // not a form: refused before anything is read
    const json = await fetch(`${base}/durable/actions/cancel-run`, {
        method: 'POST', body: JSON.stringify({ run_id: run, confirm: '1', csrf: token }),
        headers: { 'Content-Type': 'application/json', Cookie: cookies },
    });
    assert.equal(json.status, 400);
    assert.notEqual((await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [run])).rows[0].status, 'cancelled');
    // with the token, from the page's own origin: done
    const ok = await post('/durable/actions/cancel-run', { run_id: run, confirm: '1', csrf: token }, { Origin: base });
    assert.equal(ok.status, 200);
    assert.equal((await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [run])).rows[0].status, 'cancelled');

    await page.goto(base + runPath('readonly', waitingRun));
    assert.equal(await page.locator('form').count(), 0);
    assert.match(await page.locator('header .mode').innerText(), /read-only/);
    const refused = await post('/readonly/actions/cancel-run', { run_id: run, confirm: '1', csrf: token });
    assert.equal(refused.status, 403);
});

test('mounted in Fastify: pages and an action', async () => {
    await page.goto(`${fastifyBase}/ops/inbox`);
    assert.ok((await page.locator('main').innerText()).includes(hostile.run));
    await assertInert();
    const run = (await ds.startRun('console_wait', {})).runId;
    await until('the run to wait', async () => (await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [run])).rows[0]?.status === 'waiting');
    await page.goto(fastifyBase + runPath('ops', run));
    await page.locator('form.action button', { hasText: 'Cancel the run' }).click();
    await page.locator('main button', { hasText: 'Confirm' }).click();
    assert.match(await page.locator('main').innerText(), /the run is cancelled/);
});

test('on its own: HTTP Basic required, then the pages', async () => {
    const child = spawn(process.execPath, [join(here, '..', 'dist', 'esm', 'main.js'), '--port', '0',
        '--database-url', `postgresql://${connection.user}@/${connection.database}?host=${encodeURIComponent(connection.host)}&port=${connection.port}`],
    { env: { ...process.env, DS_CONSOLE_USER: 'ops', DS_CONSOLE_PASSWORD: 'a secret' }, stdio: ['ignore', 'pipe', 'inherit'] });
    try {
        const url = await new Promise((resolve, reject) => {
            let out = '';
            child.stdout.on('data', (d) => {
                out += d;
                const m = /(http:\/\/[^ ]+)/.exec(out);
                if (m) {
                    resolve(m[1]);
                }
            });
            child.on('exit', (code) => reject(new Error(`durable-steps-console exited with ${code}`)));
        });
        assert.equal((await fetch(url)).status, 401);
        assert.equal((await fetch(url, { headers: { Authorization: `Basic ${Buffer.from('ops:wrong').toString('base64')}` } })).status, 401);
        const context = await browser.newContext({ httpCredentials: { username: 'ops', password: 'a secret' } });
        const own = await context.newPage();
        await own.goto(url + 'inbox');
        assert.ok((await own.locator('main').innerText()).includes(hostile.run));
        assert.match(await own.locator('header .mode').innerText(), /read-only/);
        await own.screenshot({ path: join(shots, 'standalone-inbox.png'), fullPage: true });
        await context.close();
    } finally {
        child.kill('SIGTERM');
    }
});

test('hostile requests: odd cookies, ids and paths, unknown assets, the role none', async () => {
    // a cookie of another application with a % in it: the pages still answer
    const odd = await fetch(`${base}/durable/inbox`, { headers: { Cookie: 'other=50%off; x=%E0' } });
    assert.equal(odd.status, 200);
    for (const name of ['constructor', '__proto__', 'toString', '../../package.json']) {
        const r = await fetch(`${base}/durable/assets/${name}`);
        assert.ok([400, 404].includes(r.status), `${name}: ${r.status}`);
    }
    // dot and empty segments are refused, not resolved past a guard on a sub-path
    // (sent as written: fetch would resolve them first)
    for (const path of ['/durable/zz/%2e%2e/actions/cancel-step', '/durable/zz/../actions/cancel-step',
        '/durable//x/actions/cancel-step']) {
        const status = await new Promise((resolve, reject) => {
            const r = request(base + '/', { method: 'POST', path, headers: { 'Content-Type': 'application/x-www-form-urlencoded' } },
                (res) => {
                    res.resume();
                    resolve(res.statusCode);
                });
            r.on('error', reject);
            r.end('a=1');
        });
        assert.equal(status, 400, path);
    }
    // ids of any text have their page
    await ds.runStep('..', `.-${stamp}`, 'SELECT 1');
    await page.goto(base + stepPath('durable', '..', `.-${stamp}`));
    assert.match(await page.locator('h1').innerText(), /Step \.\. \/ \.-/);
    // an offset past any number is the first page
    assert.equal((await fetch(`${base}/durable/inbox?offset=Infinity`)).status, 200);
    assert.equal((await fetch(`${base}/durable/inbox?offset=1e21&status=`)).status, 200);
    // the role none would be the pool's own: refused
    assert.equal((await fetch(`${base}/none/`)).status, 403);
});
