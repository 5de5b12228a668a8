// The workflow of the kill trials (workflows.test.mjs), shared by the test process and the worker
// processes it starts and kills (workflow-worker.mjs): both must run the same code.
//
// Five steps: a SQL step, a step that calls a "provider" (a row per attempt in wf_provider, keyed
// by the step's idempotency key: the provider's own deduplication counts distinct keys), a step
// whose write commits with its record (transaction: true), a sleep, an event wait, and a last
// step. HANG_STEP names a step whose first attempt never returns, so that a trial can kill the
// worker inside it; MARK rows say how far each process got.

import * as ds from 'durable-steps';

export function checkoutWorkflow(name) {
    return ds.workflow(name, async (ctx, input) => {
        const hang = async (s, id) => {
            if (process.env.HANG_STEP === id && s.attempt === 1) {
                await s.client?.query('SELECT 1');
                await new Promise(() => {});   // killed here
            }
        };
        const reserved = await ctx.sql('reserve',
            'INSERT INTO wf_orders (run_id, what) VALUES ($1->>\'run\', \'reserved\') RETURNING what',
            { run: ctx.runId });
        const charge = await ctx.step('charge', async (s) => {
            await hang(s, 'charge');
            const { rows } = await s.client.query(
                'INSERT INTO wf_provider (idempotency_key, attempt) VALUES ($1, $2) RETURNING idempotency_key',
                [s.idempotencyKey, s.attempt]);
            return { charged: rows[0].idempotency_key };
        }, { transaction: true, retry: { maxAttempts: 5, initialMs: 100 } });
        const recorded = await ctx.step('record', async (s) => {
            await hang(s, 'record');
            await s.client.query('INSERT INTO wf_orders (run_id, what) VALUES ($1, $2)', [ctx.runId, 'recorded']);
            return 'recorded';
        }, { transaction: true, retry: { maxAttempts: 5, initialMs: 100 } });
        await ctx.sleep('cool-off', input.sleepMs ?? 200);
        const shipped = await ctx.waitForEvent('shipped', `shipped:${ctx.runId}`);
        const done = await ctx.step('confirm', async (s) => {
            await hang(s, 'confirm');
            return { confirmed: true, attempt: s.attempt };
        }, { retry: { maxAttempts: 5, initialMs: 100 } });
        return { reserved, charge, recorded, shipped, done };
    }, { retry: { maxAttempts: 20, initialMs: 100, maxMs: 500 } });
}
