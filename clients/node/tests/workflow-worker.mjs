// A worker process of the kill trials (workflows.test.mjs): runs workflow argv[2] until it is
// killed or gets SIGTERM; prints "ready" once it has started.

import * as ds from 'durable-steps';

import env from './env.cjs';
import { checkoutWorkflow } from './workflow-defs.mjs';

const pool = env.makePool(8);
const worker = new ds.Worker({
    pool, workflows: [checkoutWorkflow(process.argv[2])], lease: Number(process.env.LEASE_MS ?? 2000),
    pollInterval: 1000, logger: { error() {}, warn() {} },
});
await worker.start();
process.stdout.write('ready\n');
process.on('SIGTERM', async () => {
    await worker.stop();
    await pool.end();
});
