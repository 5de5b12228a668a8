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
}
