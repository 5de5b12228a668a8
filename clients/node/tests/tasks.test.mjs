// Tasks: steps whose body is a handler of the application, stored with taskStep and run by a
// Worker, against the real cluster (directly and through PgBouncer in transaction mode, ./test).
// Every test has task names of its own: the cluster is shared by both paths and every run.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import * as ds from 'durable-steps';
import pg from 'pg';

import env from './env.cjs';

const { DurableSteps, Worker, NonRetriableError, RetryAfterError, BlockedError, LeaseLostError } = ds;
const pool = env.makePool(40);
const client = new DurableSteps(pool);
const EFFECTS = 'node_task_effects';

/** A logger that keeps what it is given (the tests expect some warnings: lost leases). */
function quietLogger() {
    const lines = [];
    const keep = (level) => (message) => lines.push(`${level}: ${message}`);
    return { lines, error: keep('error'), warn: keep('warn'), info: keep('info'), debug: keep('debug') };
}

/** A worker over its own pool (room for its handlers' transactions and heartbeats). */
function makeWorker(tasks, options = {}) {
    const own = env.makePool((options.concurrency ?? 10) + 4);
    const logger = quietLogger();
    const worker = new Worker({ pool: own, tasks, logger, pollInterval: 5_000, ...options });
    const errors = [];
    worker.on('error', (e) => errors.push(e));
    return {
        worker, logger, errors, pool: own,
        async close() {
            await worker.stop();
            await own.end();
        },
    };
}

async function step(runId, stepId) {
    const { rows } = await pool.query(
        'SELECT status, attempt, error_class, error_code, error_message, remediation, result FROM ds_steps'
        + ' WHERE run_id = $1 AND step_id = $2', [runId, stepId]);
    return rows[0];
}

/** The step once it has stopped (succeeded, failed, blocked, cancelled, ...). */
async function stopped(runId, stepId) {
    return env.until(`${runId}/${stepId} to stop`, async () => {
        const s = await client.waitStep(runId, stepId, '5 s');
        return ['pending', 'running', 'retrying'].includes(s.status) ? null : s;
    }, 30_000);
}

before(async () => {
    await pool.query(`CREATE TABLE IF NOT EXISTS ${EFFECTS} (
        run_id text NOT NULL, step_id text NOT NULL, attempt integer NOT NULL, note text,
        PRIMARY KEY (run_id, step_id, attempt))`);
});

after(() => pool.end());

describe('a task stored with taskStep', () => {
    test('is run by a Worker and completes with the handler\'s result', async () => {
        const task = env.unique('double');
        const run = env.unique('run');
        const seen = [];
        const w = makeWorker({
            [task]: async (input, ctx) => {
                seen.push({ ...ctx, signal: ctx.signal.aborted });
                return { doubled: input.n * 2 };
            },
        });
        try {
            const stored = await client.taskStep(run, 'double', task, { n: 21 }, { policy: { max_attempts: 3 } });
            assert.equal(stored.status, 'pending');
            assert.equal(stored.replayed, false);
            await w.worker.start();
            const done = await stopped(run, 'double');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { doubled: 42 });
            assert.equal(done.attempt, 1);
            assert.equal(seen.length, 1);
            const [ctx] = seen;
            assert.equal(ctx.runId, run);
            assert.equal(ctx.stepId, 'double');
            assert.equal(ctx.task, task);
            assert.equal(ctx.attempt, 1);
            assert.equal(ctx.maxAttempts, 3);
            assert.equal(ctx.signal, false);
            assert.ok(ctx.idempotencyKey && ctx.attemptKey && ctx.idempotencyKey !== ctx.attemptKey);
            // the same definition replays; another is DS422
            const again = await ds.taskStep(pool, run, 'double', task, { n: 21 });
            assert.equal(again.replayed, true);
            await assert.rejects(client.taskStep(run, 'double', task, { n: 22 }), ds.StepConflictError);
            assert.deepEqual(w.errors, []);
        } finally {
            await w.close();
        }
    });

    test('ctx.transaction commits the handler\'s write and the outcome together', async () => {
        const task = env.unique('record');
        const run = env.unique('run');
        const w = makeWorker({
            [task]: (input, ctx) => ctx.transaction(async (c) => {
                await c.query(`INSERT INTO ${EFFECTS} VALUES ($1, $2, $3, $4)`,
                    [ctx.runId, ctx.stepId, ctx.attempt, input.note]);
                return { recorded: true };
            }),
        });
        try {
            await client.taskStep(run, 'pay', task, { note: 'paid' });
            await w.worker.start();
            const done = await stopped(run, 'pay');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { recorded: true });
            const { rows } = await pool.query(`SELECT attempt, note FROM ${EFFECTS} WHERE run_id = $1`, [run]);
            assert.deepEqual(rows, [{ attempt: 1, note: 'paid' }]);
        } finally {
            await w.close();
        }
    });
});

describe('an idle worker', () => {
    test('waits without polling and starts a task as soon as it is stored', async () => {
        const task = env.unique('idle');
        const run = env.unique('run');
        const own = env.makePool(8);
        const claims = [];
        // the worker's pool, counting its claims
        const counting = {
            options: own.options,
            connect: () => own.connect(),
            query(text, values) {
                if (text.includes('ds_claim_tasks')) {
                    claims.push(Date.now());
                }
                return own.query(text, values);
            },
        };
        let startedAt = null;
        const worker = new Worker({
            pool: counting, tasks: { [task]: () => { startedAt = Date.now(); return 'woken'; } },
            pollInterval: 60_000, concurrency: 2, logger: quietLogger(),
        });
        try {
            await worker.start();
            await env.until('the worker to wait', async () => {
                const r = await pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity
                                             WHERE query LIKE 'CALL ds_wait_for_tasks%' AND state = 'active'`);
                return r.rows[0].n > 0;
            }, 10_000);
            const before = claims.length;
            await env.sleep(1_000);   // what must not happen: a claim while nothing is due
            assert.equal(claims.length, before, 'an idle worker claimed again');
            const storedAt = Date.now();
            await client.taskStep(run, 's', task);
            const done = await stopped(run, 's');
            assert.equal(done.result, 'woken');
            // woken by the commit, far sooner than pollInterval
            assert.ok(startedAt - storedAt < 2_000, `the handler started ${startedAt - storedAt} ms after the commit`);
        } finally {
            await worker.stop();
            await own.end();
        }
    });
});

describe('a handler\'s errors', () => {
    test('NonRetriableError fails the step at once', async () => {
        const task = env.unique('refuse');
        const run = env.unique('run');
        const w = makeWorker({
            [task]: () => {
                throw new NonRetriableError('card declined');
            },
        });
        try {
            await client.taskStep(run, 's', task, null, { policy: { max_attempts: 5 } });
            await w.worker.start();
            const done = await stopped(run, 's');
            assert.equal(done.status, 'failed');
            assert.equal(done.attempt, 1);
            assert.equal(done.errorCode, 'DS001');
            assert.equal(done.errorMessage, 'card declined');
            assert.match(done.errorDetail ?? '', /NonRetriableError: card declined/);
        } finally {
            await w.close();
        }
    });

    test('RetryAfterError retries after its delay; another error is retried by the policy', async () => {
        const task = env.unique('later');
        const run = env.unique('run');
        const starts = [];
        const w = makeWorker({
            [task]: (input, ctx) => {
                starts.push(Date.now());
                if (ctx.attempt === 1) {
                    throw new RetryAfterError('busy', 300);
                }
                if (ctx.attempt === 2) {
                    throw Object.assign(new Error('provider unreachable'), { code: 'ECONNREFUSED' });
                }
                return { attempt: ctx.attempt };
            },
        });
        try {
            await client.taskStep(run, 's', task, null,
                { policy: { max_attempts: 3, initial_delay: '10 ms', backoff: 'fixed' } });
            await w.worker.start();
            const done = await stopped(run, 's');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { attempt: 3 });
            assert.ok(starts[1] - starts[0] >= 250, `the retry came ${starts[1] - starts[0]} ms after`);
            const { rows } = await pool.query(
                'SELECT attempt, class, error_code, error_message FROM ds_attempts WHERE run_id = $1 ORDER BY attempt', [run]);
            assert.deepEqual(rows.slice(0, 2).map((r) => [r.attempt, r.class, r.error_code, r.error_message]),
                [[1, 'retryable', 'DS002', 'busy'], [2, 'retryable', 'ECONNREFUSED', 'provider unreachable']]);
        } finally {
            await w.close();
        }
    });

    test('BlockedError blocks the step with its remediation; retryStep re-arms it', async () => {
        const task = env.unique('block');
        const run = env.unique('run');
        const w = makeWorker({
            [task]: (input, ctx) => {
                if (ctx.attempt === 1) {
                    throw new BlockedError('no address', 'give the order an address');
                }
                return { shipped: ctx.attempt };
            },
        });
        try {
            await client.taskStep(run, 'ship', task, { address: null });
            await w.worker.start();
            const blocked = await stopped(run, 'ship');
            assert.equal(blocked.status, 'blocked');
            assert.equal(blocked.remediation, 'give the order an address');
            assert.equal(blocked.errorMessage, 'no address');
            await client.retryStep(run, 'ship');
            const done = await stopped(run, 'ship');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { shipped: 2 });
        } finally {
            await w.close();
        }
    });

    test('a blocked task re-armed with corrected input runs with it', async () => {
        const task = env.unique('correct');
        const run = env.unique('run');
        const w = makeWorker({
            [task]: (input) => {
                if (!input.address) {
                    throw new BlockedError('no address', 'give the order an address');
                }
                return { shipped: input.address };
            },
        });
        try {
            await client.taskStep(run, 'ship', task, { address: null });
            await w.worker.start();
            assert.equal((await stopped(run, 'ship')).status, 'blocked');
            await client.retryStep(run, 'ship', { input: { address: '1 Main St' } });
            const done = await stopped(run, 'ship');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { shipped: '1 Main St' });
        } finally {
            await w.close();
        }
    });
});

describe('leases', () => {
    test('heartbeats keep a handler running three times the lease alive', async () => {
        const task = env.unique('slow');
        const run = env.unique('run');
        let aborted = null;
        const w = makeWorker({
            [task]: async (input, ctx) => {
                await env.sleep(3_300);
                aborted = ctx.signal.aborted;
                return 'slow but held';
            },
        }, { lease: 1_000 });
        const lost = [];
        w.worker.on('lost', (t, reason) => lost.push(reason));
        try {
            await client.taskStep(run, 's', task);
            await w.worker.start();
            const done = await stopped(run, 's');
            assert.equal(done.status, 'succeeded');
            assert.equal(done.attempt, 1);
            assert.equal(done.result, 'slow but held');
            assert.equal(aborted, false);
            assert.deepEqual(lost, []);
            assert.deepEqual(w.errors, []);
        } finally {
            await w.close();
        }
    });

    test('ds_cancel_step aborts ctx.signal', async () => {
        const task = env.unique('cancel');
        const run = env.unique('run');
        let started = false;
        let reason = null;
        const w = makeWorker({
            [task]: (input, ctx) => new Promise((resolve, reject) => {
                started = true;
                ctx.signal.addEventListener('abort', () => {
                    reason = ctx.signal.reason;
                    reject(ctx.signal.reason);
                });
            }),
        }, { lease: 1_000 });
        try {
            await client.taskStep(run, 's', task);
            await w.worker.start();
            await env.until('the handler to start', () => started, 10_000);
            const cancelled = await client.cancelStep(run, 's');
            assert.equal(cancelled.status, 'cancelled');
            await env.until('the signal to be aborted', () => reason, 10_000);
            assert.ok(reason instanceof LeaseLostError, String(reason));
            assert.match(reason.message, /cancel/);
            await env.until('the handler to settle', () => w.worker.active === 0, 10_000);
            assert.equal((await step(run, 's')).status, 'cancelled');
        } finally {
            await w.close();
        }
    });

    test('the task\'s timeout aborts ctx.signal', async () => {
        const task = env.unique('deadline');
        const run = env.unique('run');
        let reason = null;
        let deadline = null;
        const w = makeWorker({
            [task]: (input, ctx) => new Promise((resolve, reject) => {
                deadline = ctx.deadline;
                ctx.signal.addEventListener('abort', () => {
                    reason = ctx.signal.reason;
                    reject(ctx.signal.reason);
                });
            }),
        }, { lease: 5_000 });
        try {
            const storedAt = Date.now();
            await client.taskStep(run, 's', task, null,
                { timeout: 300, policy: { max_attempts: 2, initial_delay: '1 hour', max_delay: '1 hour' } });
            await w.worker.start();
            await env.until('the signal to be aborted', () => reason, 10_000);
            assert.ok(reason instanceof ds.StepTimeoutError, String(reason));
            assert.ok(deadline instanceof Date && deadline.getTime() - storedAt < 5_000, String(deadline));
            await env.until('the handler to settle', () => w.worker.active === 0, 10_000);
        } finally {
            await w.close();
        }
    });

    test('a handler cut off from its heartbeats past its lease: its transaction keeps nothing', async () => {
        const task = env.unique('partitioned');
        const run = env.unique('run');
        const own = env.makePool(8);
        // the worker's pool, whose heartbeats never get an answer (a pause, a partition)
        const deaf = {
            options: own.options,
            connect: () => own.connect(),
            query: (text, values) => (text.includes('ds_heartbeat') ? new Promise(() => {}) : own.query(text, values)),
        };
        let outcome = null;
        let aborted = null;
        const lost = [];
        const worker = new Worker({
            pool: deaf, lease: 300, logger: quietLogger(), tasks: {
                [task]: async (input, ctx) => {
                    try {
                        return await ctx.transaction(async (c) => {
                            await c.query(`INSERT INTO ${EFFECTS} VALUES ($1, $2, $3, 'cut off')`,
                                [ctx.runId, ctx.stepId, ctx.attempt]);
                            await env.until('the attempt to be recorded lost', async () => {
                                const r = await pool.query(`SELECT 1 FROM ds_attempts WHERE run_id = $1 AND attempt = 1
                                                               AND finished_at IS NOT NULL`, [ctx.runId]);
                                return r.rows.length > 0;
                            }, 30_000);
                            // the worker's own clock ends the lease too (after the server's, or
                            // before it: both run out at the same time)
                            await env.until('the worker to abort the signal', () => ctx.signal.aborted, 10_000);
                            aborted = ctx.signal.reason;
                            return 'too late';
                        });
                    } catch (e) {
                        outcome = e;
                        throw e;
                    }
                },
            },
        });
        worker.on('lost', (t, reason) => lost.push(reason));
        try {
            await client.taskStep(run, 's', task, null, { policy: { max_attempts: 3, initial_delay: '1 hour', max_delay: '1 hour' } });
            await worker.start();
            await env.until('the handler to settle', () => outcome, 30_000);
            assert.ok(outcome instanceof LeaseLostError, String(outcome));
            assert.equal(outcome.sqlstate, 'DS410');
            // the worker's own clock told the handler
            assert.ok(aborted instanceof LeaseLostError, String(aborted));
            await env.until('the worker to let it go', () => worker.active === 0, 10_000);
            assert.equal(lost.length, 1);
            const { rows } = await pool.query(`SELECT * FROM ${EFFECTS} WHERE run_id = $1`, [run]);
            assert.deepEqual(rows, []);
            const s = await step(run, 's');
            assert.equal(s.status, 'retrying');
            assert.equal(s.error_code, 'DS007');
        } finally {
            await worker.stop();
            await own.end();
        }
    });

    test('a claim inside a transaction block is ActiveSqlTransactionError', async () => {
        const c = await pool.connect();
        try {
            await c.query('BEGIN');
            const e = await c.query('SELECT * FROM ds_claim_tasks($1::text[])', [[env.unique('none')]])
                .then(() => null, ds.toDurableStepsError);
            assert.ok(e instanceof ds.ActiveSqlTransactionError, String(e));
            await c.query('ROLLBACK');
        } finally {
            c.release();
        }
    });

    test('a stale token is refused with LeaseLostError and its transaction rolls back', async () => {
        const task = env.unique('stale');
        const run = env.unique('run');
        await client.taskStep(run, 's', task, null, { policy: { max_attempts: 3, initial_delay: '1 hour', max_delay: '1 hour' } });
        const { rows } = await pool.query('SELECT * FROM ds_claim_tasks($1::text[], 1, $2::interval)',
            [[task], '100 ms']);
        assert.equal(rows.length, 1);
        const { token, attempt } = rows[0];
        assert.equal(attempt, 1);
        // the background worker records the lease that ran out as a lost attempt
        const lostAttempt = await env.until('the lease to be recorded lost', async () => {
            const r = await pool.query(
                'SELECT class, error_code FROM ds_attempts WHERE run_id = $1 AND step_id = $2 AND attempt = 1'
                + ' AND finished_at IS NOT NULL', [run, 's']);
            return r.rows[0];
        }, 30_000);
        assert.equal(lostAttempt.error_code, 'DS007');
        const c = await pool.connect();
        try {
            await c.query('BEGIN');
            await c.query(`INSERT INTO ${EFFECTS} VALUES ($1, 's', 1, 'stale')`, [run]);
            const e = await c.query('SELECT ds_complete_task($1, $2::jsonb)', [token, '"late"'])
                .then(() => null, ds.toDurableStepsError);
            assert.ok(e instanceof LeaseLostError, String(e));
            assert.equal(e.sqlstate, 'DS410');
            await c.query('ROLLBACK');
            const f = await c.query('SELECT ds_fail_task($1, $2, $3)', [token, 'Late', 'too late'])
                .then(() => null, ds.toDurableStepsError);
            assert.ok(f instanceof LeaseLostError, String(f));
        } finally {
            c.release();
        }
        const { rows: effects } = await pool.query(`SELECT * FROM ${EFFECTS} WHERE run_id = $1`, [run]);
        assert.deepEqual(effects, []);
        const s = await step(run, 's');
        assert.notEqual(s.status, 'succeeded');
    });
});

describe('stop()', () => {
    test('lets a running handler finish, then claims nothing more', async () => {
        const task = env.unique('graceful');
        const run = env.unique('run');
        let started = false;
        let release;
        const gate = new Promise((resolve) => {
            release = resolve;
        });
        const w = makeWorker({
            [task]: async (input, ctx) => {
                started = true;
                await gate;
                return { aborted: ctx.signal.aborted };
            },
        });
        try {
            await client.taskStep(run, 'first', task);
            await w.worker.start();
            await env.until('the handler to start', () => started, 10_000);
            const stopping = w.worker.stop();
            setTimeout(release, 200);
            await stopping;
            const first = await step(run, 'first');
            assert.equal(first.status, 'succeeded');
            assert.deepEqual(first.result, { aborted: false });
            // a stopped worker holds no connection and has nothing left to run: it claims nothing
            assert.equal(w.worker.active, 0);
            assert.equal(w.pool.totalCount, w.pool.idleCount);
            await client.taskStep(run, 'second', task);
            assert.equal((await step(run, 'second')).attempt, 0);
        } finally {
            await w.close();
        }
    });

    test('aborts a handler past its grace period; claims not started are given back uncounted', async () => {
        const task = env.unique('grace');
        const run = env.unique('run');
        let started = false;
        const w = makeWorker({
            [task]: (input, ctx) => new Promise((resolve, reject) => {
                started = true;
                ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason));
            }),
        }, { graceMs: 200 });
        try {
            await client.taskStep(run, 'stuck', task, null, { policy: { max_attempts: 3, initial_delay: '1 hour', max_delay: '1 hour' } });
            await w.worker.start();
            await env.until('the handler to start', () => started, 10_000);
            await w.worker.stop();
            const stuck = await step(run, 'stuck');
            assert.equal(stuck.status, 'retrying');
            assert.equal(stuck.error_code, 'WorkerStoppedError');
        } finally {
            await w.close();
        }
        // stop() while the first claim is on its way: what it claims is released, not counted
        const other = makeWorker({
            [task]: () => assert.fail('a released claim must not run'),
        });
        try {
            await client.taskStep(run, 'released', task);
            const starting = other.worker.start();
            const stopping = other.worker.stop();
            await starting;
            await stopping;
            const released = await step(run, 'released');
            assert.equal(released.status, 'pending');
            assert.equal(released.attempt, 0);
        } finally {
            await other.close();
        }
    });
});

describe('what an application does around the worker', () => {
    test('a handler that does not await its ctx.transaction: its failure fails the attempt', async () => {
        const task = env.unique('unawaited');
        const run = env.unique('run');
        const w = makeWorker({
            [task]: (input, ctx) => {
                // not awaited: the worker waits for it, and its failure is the attempt's
                ctx.transaction(async (c) => {
                    await c.query(`INSERT INTO ${EFFECTS} VALUES ($1, $2, $3, 'unawaited')`, [run, 's', ctx.attempt]);
                    throw new NonRetriableError('the write was refused');
                }).catch(() => {});
                return { claimed: 'success' };
            },
        });
        try {
            await client.taskStep(run, 's', task, null, { policy: { max_attempts: 3 } });
            await w.worker.start();
            const done = await stopped(run, 's');
            assert.equal(done.status, 'failed');
            assert.equal(done.errorMessage, 'the write was refused');
            const { rows } = await pool.query(`SELECT count(*)::int AS n FROM ${EFFECTS} WHERE run_id = $1`, [run]);
            assert.equal(rows[0].n, 0);
        } finally {
            await w.close();
        }
    });

    test('an application\'s own type parser for timestamptz does not disturb the worker', async () => {
        const task = env.unique('parsers');
        const run = env.unique('run');
        const types = { getTypeParser: (oid, format) => (oid === 1184 ? (v) => `ts:${v}` : pg.types.getTypeParser(oid, format)) };
        const own = new pg.Pool({ ...env.connection(), max: 14, types });
        const worker = new Worker({ pool: own, logger: quietLogger(), pollInterval: 5_000, lease: 2_000,
            tasks: { [task]: async (input, ctx) => ({ deadline: ctx.deadline === null ? null : 'date' }) } });
        try {
            await client.taskStep(run, 's', task, null, { timeout: '1 min' });
            await worker.start();
            const done = await stopped(run, 's');
            assert.equal(done.status, 'succeeded');
            assert.deepEqual(done.result, { deadline: 'date' });
        } finally {
            await worker.stop();
            await own.end();
        }
    });
});

describe('batched completions and claims ahead', () => {
    test('successes of the same moment go in one ds_complete_tasks; a stale token does not affect the others', async () => {
        const task = env.unique('batched');
        const run = env.unique('run');
        const own = env.makePool(8);
        const batches = [];
        // the worker's pool, which notes the batches it records
        const noting = {
            options: own.options,
            connect: () => own.connect(),
            query: (text, values) => {
                if (text.includes('ds_complete_tasks')) {
                    batches.push(values[0].length);
                }
                return own.query(text, values);
            },
        };
        const completed = [];
        const lost = [];
        const errors = [];
        const worker = new Worker({
            pool: noting, concurrency: 3, prefetch: 0, completeBatchDelayMs: 300, logger: quietLogger(),
            tasks: {
                [task]: async (input, ctx) => {
                    if (input.cancel) {
                        // cancelled after its handler ran and before its success is recorded
                        await pool.query('SELECT ds_cancel_step($1, $2)', [ctx.runId, ctx.stepId]);
                    }
                    return { n: input.n };
                },
            },
        });
        worker.on('completed', (t, result) => completed.push([t.stepId, result]));
        worker.on('lost', (t) => lost.push(t.stepId));
        worker.on('error', (e) => errors.push(e));
        try {
            await client.taskStep(run, 'a', task, { n: 1 });
            await client.taskStep(run, 'b', task, { n: 2, cancel: true });
            await client.taskStep(run, 'c', task, { n: 3 });
            await worker.start();
            await env.until('the batch to be recorded', () => completed.length + lost.length === 3, 20_000);
            assert.deepEqual(batches, [3]);
            assert.deepEqual(completed.sort(), [['a', { n: 1 }], ['c', { n: 3 }]]);
            assert.deepEqual(lost, ['b']);
            assert.deepEqual(errors, []);
            assert.deepEqual((await step(run, 'a')).result, { n: 1 });
            assert.equal((await step(run, 'b')).status, 'cancelled');
            assert.deepEqual((await step(run, 'c')).result, { n: 3 });
        } finally {
            await worker.stop();
            await own.end();
        }
    });

    test('claimed tasks waiting in the buffer are given back uncounted at stop()', async () => {
        const task = env.unique('prefetched');
        const run = env.unique('run');
        let started = 0;
        let release;
        const gate = new Promise((resolve) => {
            release = resolve;
        });
        const w = makeWorker({
            [task]: async () => {
                started++;
                await gate;
                return 'done';
            },
        }, { concurrency: 1, prefetch: 2 });
        try {
            for (const id of ['s1', 's2', 's3']) {
                await client.taskStep(run, id, task);
            }
            await w.worker.start();
            await env.until('the first handler to start', () => started === 1, 10_000);
            // one running, two claimed ahead
            const { rows: [claimed] } = await pool.query(
                `SELECT count(*)::int AS n FROM ds_steps WHERE run_id = $1 AND status = 'running'`, [run]);
            assert.equal(claimed.n, 3);
            const stopping = w.worker.stop();
            setTimeout(release, 100);
            await stopping;
            assert.equal(started, 1);
            const done = ['s1', 's2', 's3'].map((id) => step(run, id));
            const [s1, s2, s3] = await Promise.all(done);
            assert.equal(s1.status, 'succeeded');
            for (const s of [s2, s3]) {
                assert.equal(s.status, 'pending');
                assert.equal(s.attempt, 0);
            }
            assert.deepEqual(w.errors, []);
        } finally {
            await w.close();
        }
    });

    test('a buffered task that waits half its lease is given back, then runs as attempt 1', async () => {
        const task = env.unique('aged');
        const run = env.unique('run');
        const order = [];
        const w = makeWorker({
            [task]: async (input, ctx) => {
                order.push([ctx.stepId, ctx.attempt]);
                if (order.length === 1) {
                    // the first to start holds the only slot past the lease of the one buffered
                    await env.sleep(1_500);
                }
                return ctx.attempt;
            },
        }, { concurrency: 1, prefetch: 1, lease: 600 });
        try {
            await client.taskStep(run, 'one', task);
            await client.taskStep(run, 'two', task);
            await w.worker.start();
            for (const id of ['one', 'two']) {
                assert.equal((await stopped(run, id)).status, 'succeeded');
            }
            // the buffered one was given back uncounted: its only attempt is 1, never lost
            assert.equal(order.length, 2);
            const { rows } = await pool.query(
                'SELECT attempt, class FROM ds_attempts WHERE run_id = $1 AND step_id = $2', [run, order[1][0]]);
            assert.deepEqual(rows, [{ attempt: 1, class: 'completed' }]);
            assert.equal(order[1][1], 1);
            assert.deepEqual(w.errors, []);
        } finally {
            await w.close();
        }
    });
});

test('two workers x concurrency 10 over 2,000 tasks: each step completes once, each attempt runs once', async () => {
    const task = env.unique('many');
    const run = env.unique('run');
    const N = 2_000;
    const runs = new Map();   // attempt key -> handler runs
    const handler = (input, ctx) => {
        runs.set(ctx.attemptKey, (runs.get(ctx.attemptKey) ?? 0) + 1);
        return ctx.transaction(async (c) => {
            await c.query(`INSERT INTO ${EFFECTS} VALUES ($1, $2, $3, $4)`,
                [ctx.runId, ctx.stepId, ctx.attempt, ctx.attemptKey]);
            return input.i;
        });
    };
    const a = makeWorker({ [task]: handler }, { concurrency: 10 });
    const b = makeWorker({ [task]: handler }, { concurrency: 10 });
    try {
        await a.worker.start();
        await b.worker.start();
        for (let from = 1; from <= N; from += 500) {
            await pool.query(`SELECT count(ds_task_step($1, 'n' || i, $2, jsonb_build_object('i', i)))
                                FROM generate_series($3::int, $4::int) AS i`, [run, task, from, from + 499]);
        }
        await env.until('every task to complete', async () => {
            const r = await pool.query(
                `SELECT count(*)::int AS n FROM ds_steps WHERE run_id = $1 AND status = 'succeeded'`, [run]);
            return r.rows[0].n === N;
        }, 45_000);
        const { rows: [counts] } = await pool.query(
            `SELECT count(*)::int AS effects, count(DISTINCT step_id)::int AS steps, count(DISTINCT note)::int AS keys
               FROM ${EFFECTS} WHERE run_id = $1`, [run]);
        assert.deepEqual(counts, { effects: N, steps: N, keys: N });
        const { rows: [wrong] } = await pool.query(
            `SELECT count(*)::int AS n FROM ds_steps WHERE run_id = $1 AND result <> to_jsonb(substr(step_id, 2)::int)`,
            [run]);
        assert.equal(wrong.n, 0);
        assert.equal(runs.size, N);
        assert.ok([...runs.values()].every((n) => n === 1), 'an attempt ran twice');
        assert.deepEqual([...a.errors, ...b.errors], []);
    } finally {
        await a.close();
        await b.close();
    }
});
