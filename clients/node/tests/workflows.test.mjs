// Application workflows (docs/app-workflows.md): workflow() run by a Worker on the engine's runs,
// against the real cluster (directly and through PgBouncer in transaction mode, ./test). Every
// test has workflow names of its own: the cluster is shared by both paths and every run.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import * as ds from 'durable-steps';

import env from './env.cjs';
import { KILL_POINTS } from './workflow-defs.mjs';

const { DurableSteps, Worker, workflow, NonRetriableError, RetryAfterError, StepFailedError } = ds;
const pool = env.makePool(20);
const client = new DurableSteps(pool);

/** A workflow name of this test (at most 63 bytes: it becomes a function's name). */
function wfName(what) {
    return `wf_${what}_${process.pid}_${Math.random().toString(36).slice(2, 8)}`.slice(0, 63);
}

function makeWorker(workflows, options = {}) {
    const own = env.makePool(12);
    const worker = new Worker({
        pool: own, workflows, lease: 2000, pollInterval: 1000,
        logger: { error() {}, warn() {} }, ...options,
    });
    return {
        worker,
        async close() {
            await worker.stop();
            await own.end();
        },
    };
}

/** Runs `fn` beside a started worker of `workflows`, and stops the worker after it. */
async function withWorker(workflows, fn, options = {}) {
    const w = makeWorker(workflows, options);
    try {
        await w.worker.start();
        return await fn(w);
    } finally {
        await w.close();
    }
}

/** A run of workflow `name` started, and its end. */
async function runToEnd(name, input) {
    const { runId } = await client.startRun(name, input);
    return { runId, done: await finished(runId) };
}

/** The run once it has finished. */
async function finished(runId, ms = 60_000) {
    return env.until(`run ${runId} to finish`, async () => {
        const r = await client.waitRun(runId, '5 s');
        return ['succeeded', 'failed', 'cancelled'].includes(r.status) ? r : null;
    }, ms);
}

async function steps(runId) {
    const { rows } = await pool.query(
        'SELECT step_id, kind, status, attempt, error_code FROM ds_steps WHERE run_id = $1 ORDER BY step_id', [runId]);
    return Object.fromEntries(rows.map((r) => [r.step_id, r]));
}

async function runState(runId) {
    const { rows } = await pool.query('SELECT status, wait_reason FROM ds_runs WHERE run_id = $1', [runId]);
    return rows[0];
}

before(async () => {
    await pool.query(`CREATE TABLE IF NOT EXISTS wf_orders (run_id text NOT NULL, what text NOT NULL)`);
    await pool.query(`CREATE TABLE IF NOT EXISTS wf_provider (
        idempotency_key text NOT NULL, attempt integer NOT NULL, PRIMARY KEY (idempotency_key, attempt))`);
});

after(() => pool.end());

describe('a workflow', () => {
    test('runs its steps, sleeps, waits for an event and returns; completed steps never run again', async () => {
        const name = wfName('basic');
        const calls = { quote: 0, charge: 0 };
        const signals = [];
        const wf = workflow(name, async (ctx, input) => {
            const stock = await ctx.sql('reserve', 'SELECT ($1->>\'qty\')::int * 10 AS left', input);
            const quote = await ctx.step('quote', (s) => {
                calls.quote++;
                signals.push(s.signal.aborted);
                return { price: 1999, key: s.idempotencyKey };
            });
            const charge = await ctx.step('charge', async (s) => {
                calls.charge++;
                await s.client.query('INSERT INTO wf_orders VALUES ($1, $2)', [ctx.runId, 'charged']);
                return { charged: quote.price };
            }, { transaction: true });
            await ctx.sleep('cool-off', 300);
            const shipped = await ctx.waitForEvent('shipped', `shipped:${ctx.runId}`);
            return { stock, charge, shipped, segment: ctx.segment };
        });
        const w = makeWorker([wf]);
        try {
            await w.worker.start();
            const run = `order:${name}`;
            // started twice at once from Node and once from SQL, in the same namespace: one run
            const [a, b, { rows: [sql] }] = await Promise.all([
                client.startRun(name, { qty: 2 }, { runKey: run }),
                client.startRun(name, { qty: 2 }, { runKey: run }),
                pool.query('SELECT run_id, created FROM ds_start_run($1, $2::jsonb, run_key => $3)',
                    [name, '{"qty": 2}', run]),
            ]);
            assert.deepEqual([a.runId, b.runId, sql.run_id], [run, run, run]);
            assert.equal([a.created, b.created, sql.created].filter(Boolean).length, 1, 'one of them created it');
            // another input under the key: the run-key conflict
            await assert.rejects(client.startRun(name, { qty: 3 }, { runKey: run }), (e) => e.sqlstate === 'DS422');

            await env.until('the run to wait for the event', async () =>
                (await runState(run))?.wait_reason?.includes('shipped') ? true : null);
            assert.equal(await client.emitEvent(`shipped:${run}`, { carrier: 'DHL' }), true);
            const done = await finished(run);
            assert.equal(done.status, 'succeeded', JSON.stringify(done));
            assert.equal(done.output.stock, 20, 'a SQL step of one column answers its value');
            assert.deepEqual(done.output.charge, { charged: 1999 });
            assert.deepEqual(done.output.shipped, { carrier: 'DHL' });
            assert.equal(done.output.segment, 3, 'segments: before the sleep, before the event, after it');
            assert.deepEqual(calls, { quote: 1, charge: 1 }, 'the later segments replayed the steps');
            assert.deepEqual(signals, [false]);
            const { rows } = await pool.query('SELECT count(*)::int AS n FROM wf_orders WHERE run_id = $1', [run]);
            assert.equal(rows[0].n, 1);
            const s = await steps(run);
            assert.deepEqual([s.reserve.kind, s.quote.kind, s['cool-off'].kind, s.shipped.kind],
                ['sql', 'task', 'sleep', 'event']);
        } finally {
            await w.close();
        }
    });

    test('waits for an HTTP step and a task in the engine, holding no worker', async () => {
        const name = wfName('http_task');
        const taskName = `${name}_double`;
        const tag = `${name}-charge`;
        let segmentsWhileWaiting = 0;
        const wf = workflow(name, async (ctx, input) => {
            const charge = await ctx.http('charge', {
                method: 'POST', url: `${env.PROVIDER}/charge/${tag}`, expect: 'json',
                headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ amount: input.amount }),
            }, { retry: { maxAttempts: 3, initialMs: 100 } });
            segmentsWhileWaiting ||= ctx.segment;   // the first segment that has the response
            const doubled = await ctx.task('double', taskName, { n: input.amount });
            let refused = null;
            try {
                await ctx.task('refuse', taskName, { n: -1 }, { retry: { maxAttempts: 1 } });
            } catch (e) {
                refused = e instanceof StepFailedError ? e.status : String(e);
            }
            return { status: charge.status, charged: charge.body.charged, doubled, refused };
        });
        const w = makeWorker([wf], {
            tasks: {
                [taskName]: (input) => {
                    if (input.n < 0) {
                        throw new NonRetriableError('no negative amounts');
                    }
                    return input.n * 2;
                },
            },
        });
        try {
            await w.worker.start();
            const { runId } = await client.startRun(name, { amount: 21 });
            const done = await finished(runId);
            assert.equal(done.status, 'succeeded', JSON.stringify(done));
            assert.deepEqual(done.output, { status: 200, charged: tag, doubled: 42, refused: 'failed' });
            assert.equal(segmentsWhileWaiting, 2, 'the run waited for the charge between two segments');
            assert.equal((await env.providerCounts()).charges[tag], 1, 'one charge');
            const s = await steps(runId);
            assert.deepEqual([s.charge.kind, s.double.kind, s.refuse.status], ['http', 'task', 'failed']);
        } finally {
            await w.close();
        }
    });

    test('runs steps side by side (Promise.all, ctx.map within its concurrency) and replays them in order', async () => {
        const name = wfName('fanout');
        const spans = [];
        let calls = 0;
        const span = async (what) => {
            calls++;
            const start = Date.now();
            await new Promise((r) => setTimeout(r, 80));
            spans.push({ what, start, end: Date.now() });
            return what;
        };
        const wf = workflow(name, async (ctx) => {
            const pair = await Promise.all([ctx.step('left', () => span('left')), ctx.step('right', () => span('right'))]);
            const squares = await ctx.map('sq', [1, 2, 3, 4, 5, 6, 7, 8, 9], async (n) => {
                await span(`sq${n}`);
                return n * n;
            }, { concurrency: 3 });
            let failed = null;
            try {
                await ctx.map('bad', [1, 2, 3], (n) => {
                    if (n === 2) throw new NonRetriableError(`item ${n} is bad`);
                    return n;
                });
            } catch (e) {
                failed = e instanceof StepFailedError ? e.message : String(e);
            }
            await ctx.sleep('nap', 1500);   // a later segment replays everything above
            return { pair, squares, failed, segment: ctx.segment };
        });
        await withWorker([wf], async () => {
            const { runId, done } = await runToEnd(name, {});
            assert.equal(done.status, 'succeeded', JSON.stringify(done));
            assert.deepEqual(done.output.pair, ['left', 'right']);
            assert.deepEqual(done.output.squares, [1, 4, 9, 16, 25, 36, 49, 64, 81], 'the results in order');
            assert.match(done.output.failed, /bad\/2/, 'the failed item throws, naming it');
            assert.equal(done.output.segment, 2, 'the run went on in a second segment');
            assert.equal(calls, 11, 'every step ran once: the second segment replayed them');
            const overlap = (list) => Math.max(...list.map((a) =>
                list.filter((b) => b.start <= a.start && b.end > a.start).length));
            const [left, right] = ['left', 'right'].map((w) => spans.find((x) => x.what === w));
            assert.ok(left.start < right.end && right.start < left.end, 'Promise.all ran both at once');
            const sq = spans.filter((x) => x.what.startsWith('sq'));
            assert.ok(overlap(sq) <= 3, `at most 3 items at once (saw ${overlap(sq)})`);
            assert.ok(overlap(sq) >= 2, 'items ran side by side');
            const s = await steps(runId);
            assert.deepEqual(['sq/1', 'sq/9', 'bad/1', 'bad/2', 'bad/3'].map((k) => s[k].status),
                ['succeeded', 'succeeded', 'succeeded', 'failed', 'succeeded']);
        });
    });

    test('retries a step with growing attempts; a step that used up its attempts throws into the workflow', async () => {
        const name = wfName('retry');
        const seen = [];
        const wf = workflow(name, async (ctx) => {
            const flaky = await ctx.step('flaky', (s) => {
                seen.push(s.attempt);
                if (s.attempt === 1) {
                    throw new Error('try again');
                }
                if (s.attempt === 2) {
                    throw new RetryAfterError('later', 50);
                }
                return s.attempt;
            }, { retry: { maxAttempts: 5, initialMs: 10 } });
            let caught = null;
            try {
                await ctx.step('doomed', () => {
                    throw new Error('card declined');
                }, { retry: { maxAttempts: 2, initialMs: 10 } });
            } catch (e) {
                caught = { name: e.name, failed: e instanceof StepFailedError, message: e.message };
            }
            return { flaky, caught };
        });
        const { runId, done } = await withWorker([wf], () => runToEnd(name, {}));
        assert.equal(done.status, 'succeeded', JSON.stringify(done));
        assert.equal(done.output.flaky, 3);
        assert.deepEqual(seen, [1, 2, 3]);
        assert.equal(done.output.caught.failed, true);
        assert.match(done.output.caught.message, /card declined/);
        const s = await steps(runId);
        assert.deepEqual([s.flaky.attempt, s.doomed.attempt, s.doomed.status], [3, 2, 'failed']);
    });

    test('a step past its timeout is retried, its late failure no error of the workflow', async () => {
        const name = wfName('timeout');
        const wf = workflow(name, async (ctx) => ctx.step('slow', (s) => new Promise((resolve, reject) => {
            if (s.attempt > 1) {
                resolve(s.attempt);
                return;
            }
            // ignores its timeout for a while, then fails: its lease ended with the deadline
            s.signal.addEventListener('abort', () => setTimeout(() => reject(new Error('too late')), 300));
        }), { timeoutMs: 300, retry: { maxAttempts: 3, initialMs: 10 } }));
        const { runId, done } = await withWorker([wf], () => runToEnd(name, {}));
        assert.equal(done.status, 'succeeded', JSON.stringify(done));
        assert.equal(done.output, 2);
        const { rows } = await pool.query(
            "SELECT attempt, error_code FROM ds_attempts WHERE run_id = $1 AND step_id = 'slow' ORDER BY attempt", [runId]);
        assert.deepEqual(rows.map((r) => r.attempt), [1, 2]);
        assert.equal(rows[0].error_code, 'DS004', 'the first attempt timed out');
    });

    test('an uncaught failure fails the run with its error', async () => {
        const name = wfName('fails');
        const wf = workflow(name, async (ctx) => {
            await ctx.step('doomed', () => {
                throw new NonRetriableError('out of stock');
            });
            return 'unreachable';
        });
        const w = makeWorker([wf]);
        try {
            await w.worker.start();
            const { runId } = await client.startRun(name, {});
            const done = await finished(runId);
            assert.equal(done.status, 'failed');
            const { rows } = await pool.query(
                "SELECT error_message FROM ds_steps WHERE run_id = $1 AND step_id = 'ds.segment:1'", [runId]);
            assert.match(rows[0].error_message, /step doomed failed \(DS001\): out of stock/);
            assert.equal((await steps(runId)).doomed.attempt, 1, 'a non-retriable error is not tried again');
        } finally {
            await w.close();
        }
    });

    test('a run whose code changed stops with an error that names ctx.patched; patched() answers by history', async () => {
        const name = wfName('patch');
        let version = 1;
        const wf = workflow(name, async (ctx) => {
            await ctx.step('one', () => 1);
            await ctx.sleep('pause', 300);
            let patched = null;
            if (version === 2) {
                await ctx.step('inserted', () => 'new');     // unguarded: 'two' moves
            } else if (version === 4) {
                await ctx.sleep('inserted-nap', 10);         // unguarded, of another kind
            } else if (version === 3) {
                patched = await ctx.patched('receipt-v2');
                if (patched) {
                    await ctx.step('receipt', () => 'sent');
                }
            }
            await ctx.step('two', () => 2);
            await ctx.sleep('pause-2', 300);
            return { patched };
        }, { retry: { maxAttempts: 1 } });
        const w = makeWorker([wf]);
        try {
            await w.worker.start();
            // run a: 'one' and 'two' recorded on version 1, then version 2's code meets them
            const a = (await client.startRun(name, { run: 'a' })).runId;
            await env.until('run a to sleep after two', async () => (await steps(a))['pause-2'] ? true : null);
            version = 2;
            const aDone = await finished(a);
            assert.equal(aDone.status, 'failed', 'never silently');
            const { rows } = await pool.query(
                "SELECT error_message FROM ds_steps WHERE run_id = $1 AND step_id LIKE 'ds.segment:%' AND status = 'failed'", [a]);
            assert.match(rows[0].error_message, /ctx\.patched\(\)/);
            assert.equal((await steps(a)).inserted, undefined, 'the step in another place never ran');
            // run d: the same with a sleep put in front of a recorded step
            version = 1;
            const d = (await client.startRun(name, { run: 'd' })).runId;
            await env.until('run d to sleep after two', async () => (await steps(d))['pause-2'] ? true : null);
            version = 4;
            assert.equal((await finished(d)).status, 'failed', 'a new call of any kind before a recorded one');
            const { rows: dRows } = await pool.query(
                "SELECT error_message FROM ds_steps WHERE run_id = $1 AND step_id LIKE 'ds.segment:%' AND status = 'failed'", [d]);
            assert.match(dRows[0].error_message, /inserted-nap.*ctx\.patched\(\)/);
            // run b: past the change point on version 1; version 3 guards the change: false for b
            version = 1;
            const b = (await client.startRun(name, { run: 'b' })).runId;
            await env.until('run b to sleep after two', async () => (await steps(b))['pause-2'] ? true : null);
            version = 3;
            const bDone = await finished(b);
            assert.equal(bDone.status, 'succeeded', JSON.stringify(bDone));
            assert.deepEqual(bDone.output, { patched: false });
            assert.equal((await steps(b)).receipt, undefined);
            // run c: reaches the change point on version 3: true, recorded, and answered again
            const c = (await client.startRun(name, { run: 'c' })).runId;
            const cDone = await finished(c);
            assert.deepEqual(cDone.output, { patched: true });
            assert.equal((await steps(c)).receipt.status, 'succeeded');
        } finally {
            await w.close();
        }
    });

    test('ds_cancel_run aborts the running step\'s signal, and no later step starts', async () => {
        const name = wfName('cancel');
        let aborted = null;
        let later = 0;
        const wf = workflow(name, async (ctx) => {
            await ctx.step('long', (s) => new Promise((resolve, reject) => {
                s.signal.addEventListener('abort', () => {
                    aborted = s.signal.reason?.message ?? 'aborted';
                    reject(s.signal.reason);
                });
            }));
            await ctx.step('after', () => {
                later++;
            });
        });
        const w = makeWorker([wf]);
        try {
            await w.worker.start();
            const { runId } = await client.startRun(name, {});
            await env.until('the long step to run', async () => (await steps(runId)).long?.status === 'running' ? true : null);
            assert.equal(await client.cancelRun(runId), 'cancelled');
            await env.until('the step\'s signal to abort', async () => aborted !== null, 20_000);
            assert.equal(later, 0);
            assert.equal((await steps(runId)).after, undefined);
            assert.equal((await runState(runId)).status, 'cancelled');
        } finally {
            await w.close();
        }
    });

    test('bad definitions and calls are refused with clear errors', async () => {
        assert.throws(() => workflow('', () => 1), RangeError);
        assert.throws(() => workflow('x'.repeat(64), () => 1), RangeError);
        assert.throws(() => workflow('ok', null), TypeError);
        assert.throws(() => workflow('ok', () => 1, { retry: { maxAtempts: 3 } }), /no option maxAtempts/);
        assert.throws(() => workflow('ok', () => 1, { retry: { maxAttempts: 0 } }), RangeError);
        const name = wfName('bad');
        const wf = workflow(name, async (ctx) => {
            const errors = [];
            for (const f of [() => ctx.step('', () => 1), () => ctx.step('ds.x', () => 1),
                () => ctx.sleep('s', -1), () => ctx.waitForEvent('e', '')]) {
                await f().catch((e) => errors.push(e.name));
            }
            await ctx.step('twice', () => 1);
            await ctx.step('twice', () => 2).catch((e) => errors.push(e.name));
            return errors;
        });
        const w = makeWorker([wf]);
        try {
            await w.worker.start();
            const { runId } = await client.startRun(name, {});
            const done = await finished(runId);
            assert.deepEqual(done.output, ['RangeError', 'RangeError', 'RangeError', 'RangeError', 'WorkflowMismatchError']);
        } finally {
            await w.close();
        }
        // a SQL workflow's name cannot be taken
        await pool.query(`CREATE OR REPLACE FUNCTION ${name}_sql(run_id text, input jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT NULL::jsonb'`);
        await assert.rejects(pool.query('SELECT ds_define_workflow($1)', [`${name}_sql`]).catch((e) => {
            throw ds.toDurableStepsError(e);
        }), ds.DuplicateFunctionError);
    });
});

describe('kill trials', { skip: process.env.DS_CLIENT_PATH === 'pgbouncer' && 'run on the direct path' }, () => {
    const here = fileURLToPath(new URL('.', import.meta.url));

    function startWorker(name, killAt) {
        const child = spawn(process.execPath, [`${here}/workflow-worker.mjs`, name], {
            env: { ...process.env, KILL_AT: killAt ?? '', LEASE_MS: '1500' },
            stdio: ['ignore', 'pipe', 'inherit'],
        });
        const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve(sig ?? code)));
        const ready = new Promise((resolve, reject) => {
            child.stdout.on('data', (d) => (String(d).includes('ready') ? resolve() : undefined));
            exited.then((how) => reject(new Error(`worker exited (${how}) before it was ready`)));
        });
        return { child, ready, exited };
    }

    // every point, in an order of its own each time (the seed is printed to repeat it)
    const seed = Number(process.env.DS_KILL_SEED ?? Date.now() % 100_000);
    let state = seed;
    const random = () => {
        state = (state * 1_103_515_245 + 12_345) % 2_147_483_648;
        return state / 2_147_483_648;
    };
    const order = [...KILL_POINTS].sort(() => random() - 0.5);
    test(`SIGKILL at every point of a five-step workflow (seed ${seed}, DS_KILL_SEED repeats it): every run completes, each effect once, attempts only grow`, async () => {
        for (const killAt of order) {
            const name = wfName(`kill_${killAt.replace(':', '_')}`);
            const first = startWorker(name, killAt);
            await first.ready;
            const { runId } = await client.startRun(name, { sleepMs: Math.floor(random() * 300) });
            // emitted before the run waits: the wait finds it
            await client.emitEvent(`shipped:${runId}`, { ok: true });
            assert.equal(await first.exited, 'SIGKILL', `the worker died at ${killAt}`);
            const second = startWorker(name, null);
            await second.ready;
            try {
                const done = await finished(runId);
                assert.equal(done.status, 'succeeded', `${killAt}: ${JSON.stringify(done)}`);
                const { rows: orders } = await pool.query(
                    'SELECT what, count(*)::int AS n FROM wf_orders WHERE run_id = $1 GROUP BY what ORDER BY what', [runId]);
                assert.deepEqual(orders, [{ what: 'recorded', n: 1 }, { what: 'reserved', n: 1 }], killAt);
                const { rows: provider } = await pool.query(
                    'SELECT count(DISTINCT idempotency_key)::int AS keys, count(*)::int AS n FROM wf_provider WHERE idempotency_key LIKE $1',
                    [`${runId}:%`]);
                assert.deepEqual(provider, [{ keys: 1, n: 1 }], `${killAt}: the charge committed once, with its record`);
                const s = await steps(runId);
                const killedIn = killAt.startsWith('inside:') ? killAt.slice('inside:'.length) : null;
                for (const id of ['charge', 'record', 'confirm']) {
                    assert.equal(s[id].status, 'succeeded', `${killAt}: ${id}`);
                    assert.equal(s[id].attempt, id === killedIn ? 2 : 1,
                        `${killAt}: ${id}: the killed attempt counted, the next numbered after it`);
                }
                const { rows: attempts } = await pool.query(
                    `SELECT step_id, array_agg(attempt ORDER BY attempt) AS numbers FROM ds_attempts
                      WHERE run_id = $1 GROUP BY step_id`, [runId]);
                for (const a of attempts) {
                    assert.deepEqual(a.numbers, [...new Set(a.numbers)].sort((x, y) => x - y), `${killAt}: ${a.step_id}`);
                }
            } finally {
                second.child.kill('SIGTERM');
                await second.exited;
            }
        }
    });
});
