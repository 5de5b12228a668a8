// Type-checked by ./build (tsconfig.check.json, no output): the declarations of the CommonJS
// build, required through the package's "exports" map.

import ds = require('durable-steps');
import pg = require('pg');

export async function typed(): Promise<void> {
    const client = new ds.DurableSteps(new pg.Pool());
    const run: ds.RunOutcome<{ doubled: number }> = await client.waitRun<{ doubled: number }>('run', '10 s');
    const doubled: number | undefined = run.output?.doubled;
    const emitted: boolean = await ds.emitEvent(new pg.Pool(), 'shipped:1', { carrier: 'DHL' });
    const err: unknown = ds.toDurableStepsError(new Error('x'));
    if (err instanceof ds.SqlSyntaxError) {
        const code: string | null = err.sqlstate;
        void code;
    }
    void doubled;
    void emitted;
    const worker = new ds.Worker({
        pool: new pg.Pool(), tasks: {
            charge: (input: { amount: number }, ctx) => ctx.transaction(async (c) => {
                const r: pg.QueryResult = await c.query('SELECT $1::int AS amount', [input.amount]);
                if (ctx.signal.aborted) {
                    throw new ds.NonRetriableError('aborted');
                }
                return r.rows[0];
            }),
        },
    });
    worker.on('lost', (task: ds.TaskContext, reason: Error) => void [task.attemptKey, reason.message]);
    await worker.start();
    await worker.stop();
}
