// The workflow of the kill trials (workflows.test.mjs), shared by the test process and the worker
// processes it starts and kills (workflow-worker.mjs): both must run the same code.
//
// Five steps -- a SQL step, a charge at a "provider" whose row commits with the step's record
// (transaction: true; the provider's own deduplication counts distinct idempotency keys), a
// second such write, a sleep, an event wait, a last step -- and a point before and after each,
// and inside each step. A worker process started with KILL_AT=<point> kills itself with SIGKILL
// there, the first time it gets there: inside a transaction step, after its write and before the
// step's record commits.

import * as ds from 'durable-steps';

export const KILL_POINTS = [
    'before:reserve', 'after:reserve', 'inside:charge', 'after:charge', 'inside:record',
    'after:record', 'before:sleep', 'after:sleep', 'before:event', 'after:event', 'inside:confirm',
    'after:confirm',
];

function point(name) {
    if (process.env.KILL_AT === name) {
        process.kill(process.pid, 'SIGKILL');
    }
}

export function checkoutWorkflow(name) {
    return ds.workflow(name, async (ctx, input) => {
        point('before:reserve');
        const reserved = await ctx.sql('reserve',
            'INSERT INTO wf_orders (run_id, what) VALUES ($1->>\'run\', \'reserved\') RETURNING what',
            { run: ctx.runId });
        point('after:reserve');
        const charge = await ctx.step('charge', async (s) => {
            const { rows } = await s.client.query(
                'INSERT INTO wf_provider (idempotency_key, attempt) VALUES ($1, $2) RETURNING idempotency_key',
                [s.idempotencyKey, s.attempt]);
            point('inside:charge');
            return { charged: rows[0].idempotency_key };
        }, { transaction: true, retry: { maxAttempts: 5, initialMs: 100 } });
        point('after:charge');
        const recorded = await ctx.step('record', async (s) => {
            await s.client.query('INSERT INTO wf_orders (run_id, what) VALUES ($1, $2)', [ctx.runId, 'recorded']);
            point('inside:record');
            return 'recorded';
        }, { transaction: true, retry: { maxAttempts: 5, initialMs: 100 } });
        point('after:record');
        point('before:sleep');
        await ctx.sleep('cool-off', input.sleepMs ?? 200);
        point('after:sleep');
        point('before:event');
        const shipped = await ctx.waitForEvent('shipped', `shipped:${ctx.runId}`);
        point('after:event');
        const done = await ctx.step('confirm', async (s) => {
            point('inside:confirm');
            return { confirmed: true, attempt: s.attempt };
        }, { retry: { maxAttempts: 5, initialMs: 100 } });
        point('after:confirm');
        return { reserved, charge, recorded, shipped, done };
    }, { retry: { maxAttempts: 20, initialMs: 100, maxMs: 500 } });
}
