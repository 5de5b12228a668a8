// Type-checked by ./build (tsconfig.check.json, no output): the declarations of the ES module build
// as an application in TypeScript uses them, through the package's "exports" map, with Express's,
// Fastify's and node-postgres's own types. A declaration that does not fit them fails the build.

import express from 'express';
import Fastify from 'fastify';
import pg from 'pg';

import {
    DurableSteps,
    InProgressError,
    StepConflictError,
    expressIdempotency,
    fastifyIdempotency,
    keepRawBody,
    userScope,
    runStep,
    taskStep,
    Worker,
    BlockedError,
    LeaseLostError,
    NonRetriableError,
    RetryAfterError,
    type FailureClass,
    type TaskContext,
    type HttpResponse,
    type IdempotentResult,
    type StepResult,
} from 'durable-steps';

const pool = new pg.Pool();
const ds = new DurableSteps(pool);

export async function typed(): Promise<void> {
    const step: StepResult<{ total: number }> = await ds.runStep<{ total: number }>('order:1', 'total',
        'SELECT jsonb_build_object($$total$$, 1)', { input: { a: [1, 'x', null] }, timeout: 1000, retryOn: ['40001'] });
    const total: number | undefined = step.result?.total;
    const due: Date | null = step.nextAttemptAt;
    const charge: StepResult<HttpResponse<string>> = await ds.httpStep<string>('order:1', 'charge',
        { method: 'POST', url: 'https://example.com/', headers: { 'Content-Type': 'application/json' } });
    const status: number | undefined = charge.result?.status;
    const client = await pool.connect();
    await runStep(client, 'order:1', 'other', 'SELECT 1');
    client.release();
    const begun = await ds.idempotentBegin('orders', 'k', {});
    if (begun.state === 'new') {
        const token: string = begun.token;
        await ds.idempotentFinish('orders', 'k', token, 201, { ok: true });
    }
    try {
        await ds.startRun('checkout', { order: 1 }, { runKey: 'checkout:1' });
    } catch (e) {
        if (e instanceof StepConflictError || e instanceof InProgressError) {
            const code: string | null = e.sqlstate;
            const http: number = e.httpStatus;
            void code;
            void http;
        }
    }
    void total;
    void due;
    void status;
}

const app = express();
app.post('/orders', express.json({ verify: keepRawBody }),
    expressIdempotency({ client: pool, scope: 'orders', handler: 'SELECT 201, $1' }));
// the end user, from Express's own request type
app.post('/tenant', expressIdempotency({
    client: pool, scope: 'tenant', handler: 'SELECT 201, $1', limit: 1 << 20,
    user: (req: express.Request) => req.get('X-Tenant') ?? null,
}));
const scoped: string = userScope('orders', 'alice');
void scoped;
app.post('/later', expressIdempotency({ client: ds, scope: 'later', handler: 'SELECT 201, $1', respond: false }),
    (_req, res) => {
        const answer = res.locals.idempotent as IdempotentResult;
        res.status(answer.status).json(answer.body);
    });

const fastify = Fastify();
const hooks = fastifyIdempotency({ client: ds, scope: 'orders', handler: 'SELECT 201, $1' });
fastify.post('/orders', { preParsing: hooks.preParsing, preHandler: hooks.preHandler }, async () => 'not reached');
fastify.post('/spread', { ...hooks }, async () => 'not reached');
const all = fastifyIdempotency({ client: pool, scope: 'all', handler: 'SELECT 201, $1', required: false });
fastify.addHook('preParsing', all.preParsing);
fastify.addHook('preHandler', all);

// a Worker over node-postgres's Pool: ctx.transaction lends a pg.PoolClient
export async function worker(): Promise<void> {
    const w = new Worker({
        pool, concurrency: 4, lease: 10_000, queues: ['mail'], tasks: {
            'send-receipt': async (input: { order: number }, ctx) => {
                const key: string = ctx.idempotencyKey;
                const aborted: boolean = ctx.signal.aborted;
                return { sent: input.order, key, aborted, attempt: ctx.attempt };
            },
            'record-payment': (_input, ctx) => ctx.transaction(async (client) => {
                const r: pg.QueryResult = await client.query('SELECT 1 AS one');
                return { recorded: r.rows.length };
            }),
            'fail': () => {
                throw new RetryAfterError('later', 500);
            },
            'block': () => {
                throw new BlockedError('bad address', 'correct the address');
            },
        },
    });
    w.on('error', (e: Error, task: TaskContext | null) => void [e, task?.runId]);
    w.on('failed', (_task, _e, cls: FailureClass) => void cls);
    await w.start();
    await w.stop();
    const step: StepResult = await ds.taskStep('order:1', 'receipt', 'send-receipt', { order: 1 },
        { queue: 'mail', priority: 1, timeout: 5000, onLost: 'uncertain', policy: { max_attempts: 3 } });
    await taskStep(pool, 'order:1', 'receipt', 'send-receipt');
    const lost = new LeaseLostError('gone');
    const delay: number | null = new RetryAfterError('x', 1).delayMs;
    const blocked: string | null = new BlockedError('x', 'y').remediation;
    void [step, lost.httpStatus, delay, blocked, new NonRetriableError('no')];
}
