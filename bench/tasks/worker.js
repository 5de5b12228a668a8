#!/usr/bin/env node
// worker.js -- the Node side of bench/tasks_bench.sh: one system's worker, with a no-op task.
//
//   node worker.js ds|gw|pb
//
//   ds  durable_steps' Node worker (clients/node, built: dist/cjs), new Worker({pool,
//       concurrency, tasks: {noop}}); pg from clients/node/node_modules
//   gw  graphile-worker (bench/graphile/node_modules), run({concurrency, taskList: {noop}, ...})
//   pb  pg-boss (bench/pgboss/node_modules), TB_PB_LOOPS boss.work('noop', {batchSize}) loops
//
// Prints "ready" once its library is loaded (pg-boss: started, its workers not yet), starts the worker on a line "go" on stdin and
// prints "started", stops it gracefully on "stop" (or stdin closing) and prints one JSON line of
// counts. With TB_STARTS (a file), the handler records, for every task whose input has a number
// "i", the wall-clock time it started (performance.timeOrigin + performance.now(), milliseconds
// since the epoch, the same clock as the server's clock_timestamp() on this machine); they are
// written to that file as "i,ms" lines when the worker stops. Without it the handler does nothing.
//
// Environment:
//   TB_CONNECTION   connection string (required)
//   TB_CONCURRENCY  [10]  handlers at once (ds: concurrency; gw: concurrency; pb: see TB_PB_LOOPS)
//   TB_STARTS       []    file of start times (latency runs)
//   TB_GW_CONFIG    [default]  gw: "default" (only concurrency set: everything else is
//                   graphile-worker's default) or "LQ:DELAY": preset.worker.localQueue.size LQ,
//                   completeJobBatchDelay and failJobBatchDelay DELAY, maxPoolSize concurrency + 2
//   TB_PB_LOOPS     [TB_CONCURRENCY]  pb: boss.work() calls (each one loop: fetch a batch, run
//                   the handler, complete the batch, wait out the polling interval)
//   TB_PB_BATCH     [100] pb: batchSize;  TB_PB_POLL [0.5] pb: pollingIntervalSeconds (its minimum)
"use strict";

const path = require("path");
const readline = require("readline");
const { performance } = require("perf_hooks");
const fs = require("fs");

const system = process.argv[2];
const connectionString = process.env.TB_CONNECTION;
const concurrency = Number(process.env.TB_CONCURRENCY || 10);
const startsFile = process.env.TB_STARTS || "";
const bench = path.join(__dirname, "..");
if (!connectionString || !["ds", "gw", "pb"].includes(system) || !(concurrency >= 1)) {
  console.error("usage: TB_CONNECTION=... node worker.js ds|gw|pb");
  process.exit(2);
}

const starts = [];
const record = startsFile
  ? (i) => { starts.push(`${i},${(performance.timeOrigin + performance.now()).toFixed(3)}`); }
  : null;
let done = 0;

function makeSystem() {
  if (system === "ds") {
    const client = path.join(bench, "..", "clients", "node");
    const { Pool } = require(path.join(client, "node_modules", "pg"));
    const { Worker } = require(path.join(client, "dist", "cjs", "index.js"));
    let pool = null;
    let worker = null;
    return {
      settings: () => ({ concurrency, pool: concurrency + 2 }),
      async start() {
        pool = new Pool({ connectionString, max: concurrency + 2 });
        const noop = record
          ? async (input) => { if (input && typeof input.i === "number") record(input.i); }
          : async () => {};
        worker = new Worker({ pool, concurrency, tasks: { noop } });
        worker.on("completed", () => { done++; });
        worker.on("error", (e) => console.error(`durable_steps worker error: ${e.message}`));
        await worker.start();
      },
      async stop() {
        if (worker) await worker.stop();
        if (pool) await pool.end();
      },
    };
  }
  if (system === "gw") {
    const { Logger, run } = require(path.join(bench, "graphile", "node_modules", "graphile-worker"));
    const logger = new Logger(() => (level, message) => {
      if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
    });
    const config = process.env.TB_GW_CONFIG || "default";
    const options = { connectionString, concurrency, noHandleSignals: true, logger };
    if (config !== "default") {
      const m = /^(-?\d+):(-?\d+)$/.exec(config);
      if (!m) throw new Error(`TB_GW_CONFIG: default or LQ:DELAY, not ${config}`);
      options.maxPoolSize = Math.max(10, concurrency + 2);
      options.preset = { worker: { localQueue: { size: Number(m[1]) },
        completeJobBatchDelay: Number(m[2]), failJobBatchDelay: Number(m[2]) } };
    }
    let runner = null;
    return {
      settings: () => ({ config, concurrency, maxPoolSize: options.maxPoolSize ?? "default (10)",
        pollInterval: "default (2000)", preparedStatements: "default (true)",
        localQueue: options.preset ? options.preset.worker.localQueue.size : "default (-1)",
        completeJobBatchDelay: options.preset ? options.preset.worker.completeJobBatchDelay : "default (-1)" }),
      async start() {
        const noop = record
          ? async (payload) => { if (payload && typeof payload.i === "number") record(payload.i); }
          : async () => {};
        runner = await run({ ...options, taskList: { noop } }, undefined, []);
        runner.events.on("job:success", () => { done++; });
      },
      async stop() {
        if (runner) await runner.stop();
      },
    };
  }
  const PgBoss = require(path.join(bench, "pgboss", "node_modules", "pg-boss"));
  const loops = Number(process.env.TB_PB_LOOPS || concurrency);
  const batchSize = Number(process.env.TB_PB_BATCH || 100);
  const pollingIntervalSeconds = Number(process.env.TB_PB_POLL || 0.5);
  let boss = null;
  return {
    settings: () => ({ loops, batchSize, pollingIntervalSeconds, pool: 10 }),
    async prepare() {
      // pg-boss's own start (connections, its schema check, maintenance) before "ready"
      boss = new PgBoss({ connectionString, max: 10, schedule: false });
      boss.on("error", (e) => console.error(`pg-boss error: ${e && e.message ? e.message : e}`));
      await boss.start();
    },
    async start() {
      const handler = record
        ? async (jobs) => {
          for (const job of jobs) if (job.data && typeof job.data.i === "number") record(job.data.i);
          done += jobs.length;
        }
        : async (jobs) => { done += jobs.length; };
      for (let i = 0; i < loops; i++) {
        await boss.work("noop", { batchSize, pollingIntervalSeconds }, handler);
      }
    },
    async stop() {
      if (boss) await boss.stop({ graceful: true, wait: true, timeout: 30000 });
    },
  };
}

const sys = makeSystem();
let started = false;
let stopping = null;
const stop = () => {
  if (stopping) return stopping;
  stopping = (async () => {
    await sys.stop();
    if (startsFile) fs.writeFileSync(startsFile, starts.join("\n") + (starts.length ? "\n" : ""));
    process.stdout.write(JSON.stringify({ system, done, recorded: starts.length, settings: sys.settings() }) + "\n");
  })();
  return stopping;
};
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  const cmd = line.trim();
  try {
    if (cmd === "go" && !started && !stopping) {
      started = true;
      await sys.start();
      process.stdout.write("started\n");
    } else if (cmd === "stop") {
      await stop();
      rl.close();
    }
  } catch (e) {
    console.error(`worker.js: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
});
rl.on("close", () => { stop().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); }); });
process.on("SIGTERM", () => { stop().then(() => process.exit(0)); });
(async () => {
  if (sys.prepare) await sys.prepare();
  process.stdout.write("ready\n");
})().catch((e) => { console.error(`worker.js: ${e && e.stack ? e.stack : e}`); process.exit(1); });
