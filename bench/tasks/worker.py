"""worker.py -- the Python side of bench/tasks_bench.sh: durable_steps' Python worker
(clients/python, over psycopg2 from Debian's python3-psycopg2) with a no-op task.

    python3 worker.py

The protocol of worker.js: prints "ready" once loaded, starts the worker on a line "go" on
stdin (Worker(dsn, concurrency=TB_CONCURRENCY), @worker.task("noop"), worker.run() in the main
thread) and prints "started", stops it on "stop" (worker.stop(); run() returns once the
handlers are done) and prints one JSON line. With TB_STARTS (a file), the handler records, for
every task whose input has a number "i", time.time() * 1000 when it started (the wall clock,
the same clock as the server's clock_timestamp() on this machine), written as "i,ms" lines.

Environment: TB_DSN (libpq DSN, required), TB_CONCURRENCY [10], TB_STARTS [].
"""
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

import durable_steps_client as ds  # noqa: E402

dsn = os.environ["TB_DSN"]
concurrency = int(os.environ.get("TB_CONCURRENCY", "10"))
starts_file = os.environ.get("TB_STARTS", "")
starts = []
done = [0]
lock = threading.Lock()

worker = ds.Worker(dsn, concurrency=concurrency)

if starts_file:
    @worker.task("noop")
    def noop(input, ctx):
        t = time.time() * 1000.0
        if isinstance(input, dict) and isinstance(input.get("i"), int):
            starts.append("%d,%.3f" % (input["i"], t))   # list.append is atomic under the GIL
        return None
else:
    @worker.task("noop")
    def noop(input, ctx):
        return None


def read_commands():
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    worker.stop()


print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "go":
        break
else:
    sys.exit(0)
threading.Thread(target=read_commands, daemon=True).start()
print("started", flush=True)
worker.run()
if starts_file:
    with open(starts_file, "w") as f:
        f.write("".join(s + "\n" for s in starts))
print(json.dumps({"system": "py", "recorded": len(starts),
                  "settings": {"concurrency": concurrency}}), flush=True)
