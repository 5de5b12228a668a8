#!/usr/bin/env node
// peer.js -- the Absurd 0.4.0 and DBOS Transact 5.3.0 sides of bench/runs_bench.sh.
//
//   node peer.js absurd   register task "three" (three no-op ctx.step calls), print "ready",
//                         on a line "go" start the Absurd worker (startWorker) on queue "bench";
//                         on "stop" (or stdin closing, or SIGTERM) stop it and print one JSON
//                         line of counts. The driver spawns the tasks with SQL
//                         (absurd.spawn_task, in transactions of RUNS_TXN) and decides, from the
//                         queue's task table, when every task completed.
//   node peer.js dbos     register workflow "three" (three no-op DBOS.runStep calls), launch DBOS
//                         (its system schema is created in the bench database), print "ready";
//                         on a line "go" start N workflows with DBOS.startWorkflow (DBOS starts
//                         workflows from its library, not from SQL), await every result and print
//                         one JSON line {"started", "succeeded", "seconds"}; on "stop", shut down.
//
//   node peer.js dsnode   durable_steps' Node client (clients/node, built: dist/cjs): workflow
//                         "three_app" (three no-op ctx.step calls) run by a Worker of
//                         PEER_CONCURRENCY, declared with ds_define_workflow; print "ready", on
//                         "go" start the worker and print "started"; on "stop" stop it. The
//                         driver starts the runs with SQL (ds_start_run, in transactions of
//                         RUNS_TXN), as for Absurd, and reads their end from durable_steps.runs.
//
// All print "ready" only after the library is loaded and connected, so that the driver's timing
// starts with the workload, not with node's start-up.
//
// Environment:
//   PEER_DB           connection string (required), e.g. postgres:///bench?host=/tmp/x&port=5480
//   PEER_N            [2000] workflows the DBOS side starts
//   PEER_CONCURRENCY  [16]   Absurd: startWorker concurrency (tasks in flight)
//   PEER_BATCH        [16]   Absurd: startWorker batchSize (tasks claimed per claim_task call)
//   PEER_POOL         [20]   connection pool size of both
"use strict";

const readline = require("readline");

const mode = process.argv[2];
const db = process.env.PEER_DB;
if (!db) {
  console.error("peer.js: PEER_DB is not set");
  process.exit(2);
}
function intEnv(name, dflt) {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return dflt;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 1) {
    console.error(`peer.js: ${name} must be a positive integer, not '${raw}'`);
    process.exit(2);
  }
  return v;
}
const pool = intEnv("PEER_POOL", 20);

function commands(handlers) {
  const rl = readline.createInterface({ input: process.stdin });
  let done = false;
  const finish = async () => {
    if (done) return;
    done = true;
    await handlers.stop();
    process.exit(0);
  };
  rl.on("line", (line) => {
    const cmd = line.trim();
    if (cmd === "go") handlers.go().catch(fail);
    else if (cmd === "stop") finish().catch(fail);
  });
  rl.on("close", () => finish().catch(fail));
  process.on("SIGTERM", () => finish().catch(fail));
}

function fail(e) {
  console.error(`peer.js ${mode}: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
}

async function absurd() {
  const { Absurd } = require("absurd-sdk");
  const pg = require("pg");
  const concurrency = intEnv("PEER_CONCURRENCY", 16);
  const batchSize = intEnv("PEER_BATCH", 16);
  const dbPool = new pg.Pool({ connectionString: db, max: pool });
  const app = new Absurd({ db: dbPool, queueName: "bench" });
  let completed = 0;
  app.registerTask({ name: "three", queue: "bench" }, async (params, ctx) => {
    await ctx.step("one", async () => 1);
    await ctx.step("two", async () => 2);
    await ctx.step("three", async () => 3);
    completed++;
    return { done: params.i };
  });
  await dbPool.query("SELECT 1"); // connected
  let worker = null;
  commands({
    go: async () => {
      if (worker) return;
      worker = await app.startWorker({ concurrency, batchSize, pollInterval: 0.05 });
      process.stdout.write("started\n");
    },
    stop: async () => {
      if (worker) await worker.close();
      process.stdout.write(JSON.stringify({ completed, concurrency, batchSize, pollInterval: 0.05 }) + "\n");
      await dbPool.end();
    },
  });
  process.stdout.write("ready\n");
}

async function dbos() {
  const { DBOS } = require("@dbos-inc/dbos-sdk");
  const n = intEnv("PEER_N", 2000);
  DBOS.setConfig({ name: "runsbench", systemDatabaseUrl: db, systemDatabasePoolSize: pool, logLevel: "warn" });
  const three = DBOS.registerWorkflow(async (i) => {
    await DBOS.runStep(async () => 1, { name: "one" });
    await DBOS.runStep(async () => 2, { name: "two" });
    await DBOS.runStep(async () => 3, { name: "three" });
    return { done: i };
  }, { name: "three" });
  await DBOS.launch();
  let running = false;
  commands({
    go: async () => {
      if (running) return;
      running = true;
      const t0 = process.hrtime.bigint();
      const handles = [];
      for (let i = 0; i < n; i++) handles.push(DBOS.startWorkflow(three)(i));
      const results = await Promise.all((await Promise.all(handles)).map((h) => h.getResult()));
      const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
      const succeeded = results.filter((r, i) => r && r.done === i).length;
      process.stdout.write(JSON.stringify({ started: n, succeeded, seconds }) + "\n");
    },
    stop: async () => {
      await DBOS.shutdown();
    },
  });
  process.stdout.write("ready\n");
}

async function dsnode() {
  const path = require("path");
  const client = path.join(__dirname, "..", "..", "clients", "node");
  const ds = require(path.join(client, "dist", "cjs", "index.js"));
  const pg = require(path.join(client, "node_modules", "pg"));
  const concurrency = intEnv("PEER_CONCURRENCY", 16);
  const dbPool = new pg.Pool({ connectionString: db, max: pool });
  const three = ds.workflow("three_app", async (ctx, input) => {
    await ctx.step("one", async () => 1);
    await ctx.step("two", async () => 2);
    await ctx.step("three", async () => 3);
    return { done: input.i };
  });
  const worker = new ds.Worker({ pool: dbPool, workflows: [three], concurrency,
                                 logger: { error: console.error, warn() {} } });
  await dbPool.query("SELECT ds_define_workflow('three_app')");
  let started = false;
  commands({
    go: async () => {
      if (started) return;
      started = true;
      await worker.start();
      process.stdout.write("started\n");
    },
    stop: async () => {
      if (started) await worker.stop();
      await dbPool.end();
    },
  });
  process.stdout.write("ready\n");
}

if (mode === "absurd") absurd().catch(fail);
else if (mode === "dsnode") dsnode().catch(fail);
else if (mode === "dbos") dbos().catch(fail);
else {
  console.error("usage: node peer.js absurd|dbos|dsnode");
  process.exit(2);
}
