#!/usr/bin/env node
// boss.js -- the pg-boss 10.4.2 side of bench/hold_bench.sh.
//
//   node boss.js migrate   install the pgboss schema (boss.start with migrate), create the queue
//                          PB_QUEUE (policy standard: pg-boss gives it its own partition of
//                          pgboss.job), print the partition's table name, stop
//   node boss.js work      start pg-boss, print "ready"; on a line "go" start PB_WORKERS
//                          boss.work() loops on PB_QUEUE with the no-op handler
//                          (async (jobs) => {}; pg-boss completes the batch when it returns);
//                          on "stop" (or stdin closing, or SIGTERM) stop gracefully and print one
//                          JSON line of counts
//
// The driver inserts the jobs with SQL and measures from pgboss.job's created_on and
// completed_on; this program only runs the workers.
//
// Environment:
//   PB_CONNECTION   connection string (required), e.g. postgres:///bench?host=/tmp/x&port=5530
//   PB_QUEUE        [noop]  queue name
//   PB_WORKERS      [2]     boss.work() calls (pg-boss 10 has no teamSize: one loop per call)
//   PB_BATCH        [100]   batchSize of each loop (jobs fetched per fetch)
//   PB_POLL_SECONDS [0.5]   pollingIntervalSeconds (pg-boss's minimum: a loop fetches at most once
//                           per interval)
//   PB_POOL         [10]    max pool size
"use strict";

const readline = require("readline");
const PgBoss = require("pg-boss");

const mode = process.argv[2];
const connectionString = process.env.PB_CONNECTION;
if (!connectionString) {
  console.error("boss.js: PB_CONNECTION is not set");
  process.exit(2);
}
function numEnv(name, dflt) {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return dflt;
  const v = Number(raw);
  if (!Number.isFinite(v) || v <= 0) {
    console.error(`boss.js: ${name} must be a positive number, not '${raw}'`);
    process.exit(2);
  }
  return v;
}
const queue = process.env.PB_QUEUE || "noop";
const workers = numEnv("PB_WORKERS", 2);
const batchSize = numEnv("PB_BATCH", 100);
const pollingIntervalSeconds = numEnv("PB_POLL_SECONDS", 0.5);
const max = numEnv("PB_POOL", 10);

function newBoss(extra) {
  const boss = new PgBoss({ connectionString, max, schedule: false, ...extra });
  boss.on("error", (e) => console.error(`pg-boss error: ${e && e.message ? e.message : e}`));
  return boss;
}

async function migrate() {
  const boss = newBoss({ supervise: false });
  await boss.start();
  await boss.createQueue(queue, { policy: "standard" });
  const q = await boss.getQueue(queue);
  process.stdout.write(`${q && q.partitionName ? q.partitionName : ""}\n`);
  await boss.stop({ graceful: true, wait: true });
}

async function work() {
  const boss = newBoss({});
  await boss.start();
  let completed = 0;
  let started = false;
  let stopping = null;
  const stop = () => {
    if (stopping) return stopping;
    stopping = (async () => {
      await boss.stop({ graceful: true, wait: true, timeout: 30000 });
      process.stdout.write(JSON.stringify({ completed, workers, batchSize, pollingIntervalSeconds }) + "\n");
    })();
    return stopping;
  };
  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    const cmd = line.trim();
    if (cmd === "go" && !started && !stopping) {
      started = true;
      for (let i = 0; i < workers; i++) {
        await boss.work(queue, { batchSize, pollingIntervalSeconds }, async (jobs) => {
          completed += jobs.length;
        });
      }
      process.stdout.write("started\n");
    } else if (cmd === "stop") {
      await stop();
      rl.close();
    }
  });
  rl.on("close", () => { stop().then(() => process.exit(0)); });
  process.on("SIGTERM", () => { stop().then(() => process.exit(0)); });
  process.stdout.write("ready\n");
}

(async () => {
  if (mode === "migrate") await migrate();
  else if (mode === "work") await work();
  else {
    console.error("usage: node boss.js migrate|work");
    process.exit(2);
  }
})().catch((e) => {
  console.error(`boss.js: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
