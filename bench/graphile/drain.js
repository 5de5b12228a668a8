#!/usr/bin/env node
// drain.js -- the graphile-worker side of bench/worker_bench.sh.
//
//   node drain.js migrate            install/upgrade the graphile_worker schema, then exit
//   node drain.js drain              print "ready", wait for a line "go" on stdin, start a worker
//                                    (library mode, run()) with the no-op task, and keep it
//                                    running until stdin says "stop" (or closes) or SIGTERM;
//                                    then stop it gracefully and print one JSON line of counts
//
// The driver (bench/worker_bench.sh) adds the jobs, takes the measurements (time, WAL,
// pg_stat_database commits) and decides when the queue is empty; this program only runs the
// worker, so that both systems are measured by the same code.
//
// Environment:
//   GW_CONNECTION      connection string (required), e.g. postgres:///bench?host=/tmp/x&port=5460
//   GW_CONCURRENCY     [4]    concurrent jobs (option `concurrency`, preset `concurrentJobs`)
//   GW_LOCAL_QUEUE     [5000] preset.worker.localQueue.size: jobs fetched and locked per query
//                             (graphile-worker 0.17's job batching; -1 disables it)
//   GW_COMPLETE_DELAY  [0]    preset.worker.completeJobBatchDelay in ms (-1 disables batching)
//   GW_FAIL_DELAY      [0]    preset.worker.failJobBatchDelay in ms (-1 disables batching)
//   GW_POOL            [concurrency + 2, at least 10]  maxPoolSize
//   GW_POLL_MS         [2000] pollInterval (the worker LISTENs for new jobs; polling is a backstop)
"use strict";

const readline = require("readline");
const { Logger, run, runMigrations } = require("graphile-worker");

const mode = process.argv[2];
const connectionString = process.env.GW_CONNECTION;
if (!connectionString) {
  console.error("drain.js: GW_CONNECTION is not set");
  process.exit(2);
}

function intEnv(name, dflt) {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return dflt;
  const v = Number(raw);
  if (!Number.isInteger(v)) {
    console.error(`drain.js: ${name} must be an integer, not '${raw}'`);
    process.exit(2);
  }
  return v;
}

// graphile-worker logs through its own logger; keep warnings and errors, drop the chatter
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
});

async function migrate() {
  await runMigrations({ connectionString, logger });
}

async function drain() {
  const concurrency = intEnv("GW_CONCURRENCY", 4);
  const localQueueSize = intEnv("GW_LOCAL_QUEUE", 5000);
  const completeJobBatchDelay = intEnv("GW_COMPLETE_DELAY", 0);
  const failJobBatchDelay = intEnv("GW_FAIL_DELAY", 0);
  const maxPoolSize = intEnv("GW_POOL", Math.max(10, concurrency + 2));
  const pollInterval = intEnv("GW_POLL_MS", 2000);

  let succeeded = 0;
  let errored = 0;
  let runner = null;
  let stopping = null;

  const taskList = {
    noop: async () => {},
  };

  const stop = () => {
    if (stopping) return stopping;
    stopping = (async () => {
      if (runner) await runner.stop();
      process.stdout.write(
        JSON.stringify({ succeeded, errored, concurrency, localQueueSize, completeJobBatchDelay,
                         failJobBatchDelay, maxPoolSize, pollInterval }) + "\n");
    })();
    return stopping;
  };

  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    const cmd = line.trim();
    if (cmd === "go" && !runner && !stopping) {
      runner = await run(
        {
          connectionString,
          concurrency,
          maxPoolSize,
          pollInterval,
          noHandleSignals: true,
          logger,
          taskList,
          preset: {
            worker: {
              localQueue: { size: localQueueSize },
              completeJobBatchDelay,
              failJobBatchDelay,
            },
          },
        },
        undefined,
        [] // no cron items: do not look for a crontab file
      );
      runner.events.on("job:success", () => { succeeded++; });
      runner.events.on("job:error", () => { errored++; });
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
  if (mode === "migrate") {
    await migrate();
  } else if (mode === "drain") {
    await drain();
  } else {
    console.error("usage: node drain.js migrate|drain");
    process.exit(2);
  }
})().catch((e) => {
  console.error(`drain.js: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
