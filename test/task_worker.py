#!/usr/bin/env python3
"""A task worker process for the TAP tests of tasks (test/t/098_task_workers.pl): the Python
client's Worker (clients/python) with handlers that act as an application's would. Stdlib and
psycopg2 only.

    task_worker.py DSN NAME MARKDIR [PROVIDER_URL]

NAME is the worker's name (ds_steps.worker). MARKDIR is where a handler writes a marker file,
"<step_id>.<attempt>", at the point a test waits for before it sends the process a signal.
The worker runs until SIGTERM (a graceful stop), or until killed. Handlers, by task name:

    charge   POSTs PROVIDER_URL/charge/<step_id> with the task's idempotency key as its
             Idempotency-Key; on attempt input["hang_on"], after the provider answered, writes
             its marker and hangs (until the process is killed); returns the provider's answer
    effect   in ctx.transaction(): inserts (step_id, attempt, NAME) into effects; on attempt
             input["pause_on"], after the insert, writes its marker and waits input["pause"]
             seconds (the test stops the process meanwhile); returns {"attempt": n}
    tick     does nothing; returns {"attempt": n} (test/t/101_limits.pl counts when each started)
"""
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

import durable_steps_client as ds  # noqa: E402


def main() -> None:
    dsn, name, markdir = sys.argv[1], sys.argv[2], sys.argv[3]
    provider = sys.argv[4] if len(sys.argv) > 4 else None
    worker = ds.Worker(dsn, concurrency=10, lease=1.0, worker=name, grace=2.0, wait_timeout=5.0)

    def mark(ctx: ds.TaskContext) -> None:
        path = os.path.join(markdir, f"{ctx.step_id}.{ctx.attempt}")
        with open(path + ".tmp", "w") as f:
            f.write(name)
        os.rename(path + ".tmp", path)

    @worker.task("charge")
    def charge(input, ctx):
        request = urllib.request.Request(
            f"{provider}/charge/{ctx.step_id}", data=json.dumps(input).encode(), method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read() or b"null")
        if ctx.attempt == input.get("hang_on"):
            mark(ctx)
            while True:             # until SIGKILL: the attempt's lease runs out
                time.sleep(1)
        return {"provider": answer}

    @worker.task("tick")
    def tick(input, ctx):
        return {"attempt": ctx.attempt}

    @worker.task("effect")
    def effect(input, ctx):
        with ctx.transaction() as cur:
            cur.execute("INSERT INTO effects (step_id, attempt, worker) VALUES (%s, %s, %s)",
                        (ctx.step_id, ctx.attempt, name))
            if ctx.attempt == input.get("pause_on"):
                mark(ctx)
                time.sleep(input.get("pause", 3))
            return {"attempt": ctx.attempt}

    worker.run()


if __name__ == "__main__":
    main()
