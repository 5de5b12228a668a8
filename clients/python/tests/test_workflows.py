"""Application workflows against the real cluster (docs/app-workflows.md): @workflow functions
run by a Worker on the engine's runs, replayed by later segments, retried, changed under runs in
flight, cancelled, and their worker killed inside a step.

Every wait is for a condition (ds_wait_run, a row, a step's state), never a sleep that hopes."""
import json
import os
import random
import signal
import string
import subprocess
import sys
import threading
import time
import unittest

import durable_steps_client as ds
from durable_steps_client import RetryAfterError, StepFailed, Worker, workflow

from .support import charge_url, connect, dsn, provider_counts

TABLES = """
CREATE TABLE IF NOT EXISTS pywf_orders (run_id text NOT NULL, what text NOT NULL);
CREATE TABLE IF NOT EXISTS pywf_provider (idempotency_key text NOT NULL, attempt integer NOT NULL,
                                         PRIMARY KEY (idempotency_key, attempt));
"""

# the workflow of the kill trial, in a worker process of its own; HANG names the step whose first
# attempt never returns (the test kills the process there)
PROCESS = """
import logging, os, sys, threading, durable_steps_client as ds
logging.basicConfig(level=logging.CRITICAL)

@ds.workflow(sys.argv[2], retry={"max_attempts": 20, "initial_ms": 100, "max_ms": 500})
def checkout(ctx, input):
    def charge(s):
        if os.environ.get("HANG") == "charge" and s.attempt == 1:
            print("inside", flush=True)
            threading.Event().wait()
        s.cursor.execute("INSERT INTO pywf_provider VALUES (%s, %s)", (s.idempotency_key, s.attempt))
        return {"charged": s.idempotency_key}
    def record(s):
        if os.environ.get("HANG") == "record" and s.attempt == 1:
            print("inside", flush=True)
            threading.Event().wait()
        s.cursor.execute("INSERT INTO pywf_orders VALUES (%s, 'recorded')", (ctx.run_id,))
        return "recorded"
    ctx.sql("reserve", "INSERT INTO pywf_orders VALUES ($1->>'run', 'reserved') RETURNING what",
            {"run": ctx.run_id})
    ctx.step("charge", charge, transaction=True, retry={"max_attempts": 5, "initial_ms": 100})
    ctx.step("record", record, transaction=True, retry={"max_attempts": 5, "initial_ms": 100})
    ctx.sleep("cool-off", 0.1)
    shipped = ctx.wait_for_event("shipped", "shipped:" + ctx.run_id)
    return {"shipped": shipped}

worker = ds.Worker(sys.argv[1], workflows=[checkout], lease=1.5, wait_timeout=1)
print("ready", flush=True)
worker.run()
"""


def name(what: str) -> str:
    suffix = "".join(random.choice(string.ascii_lowercase) for _ in range(6))
    return ("pywf_%s_%d_%s" % (what, os.getpid(), suffix))[:63]


class Running:
    """A Worker running in a thread of the test, stopped at the end."""

    def __init__(self, *workflows):
        self.worker = Worker(dsn(), workflows=list(workflows), lease=2.0, wait_timeout=1.0)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self):
        self.worker.define()
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(30)


class WorkflowTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conn = connect()
        with cls.conn.cursor() as cur:
            cur.execute(TABLES)

    @classmethod
    def tearDownClass(cls):
        cls.conn.close()

    def q(self, sql, *params):
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def start(self, wf, input, run_key=None):
        return ds.start_run(self.conn, wf.name, input, run_key=run_key).run_id

    def finished(self, run_id, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            r = ds.wait_run(self.conn, run_id, timeout="5 s")
            if r.status in ("succeeded", "failed", "cancelled"):
                return r
        self.fail("run %s did not finish" % run_id)

    def until(self, what, probe, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.05)
        self.fail("timed out waiting for %s" % what)

    def steps(self, run_id):
        rows = self.q("SELECT step_id, kind, status, attempt FROM ds_steps WHERE run_id = %s", run_id)
        return {r[0]: r[1:] for r in rows}

    def test_runs_steps_sleeps_waits_and_returns_replaying_completed_steps(self):
        calls = {"quote": 0, "charge": 0}

        @workflow(name("basic"))
        def basic(ctx, input):
            stock = ctx.sql("reserve", "SELECT ($1->>'qty')::int * 10", input)

            def quote(s):
                calls["quote"] += 1
                return {"price": 1999}
            price = ctx.step("quote", quote)

            def charge(s):
                calls["charge"] += 1
                s.cursor.execute("INSERT INTO pywf_orders VALUES (%s, 'charged')", (ctx.run_id,))
                return {"charged": price["price"]}
            charged = ctx.step("charge", charge, transaction=True)
            ctx.sleep("cool-off", 0.3)
            shipped = ctx.wait_for_event("shipped", "shipped:" + ctx.run_id)
            return {"stock": stock, "charged": charged, "shipped": shipped, "segment": ctx.segment}

        with Running(basic):
            run = "order:" + basic.name
            self.assertEqual(self.start(basic, {"qty": 2}, run), run)
            again = ds.start_run(self.conn, basic.name, {"qty": 2}, run_key=run)
            self.assertFalse(again.created)
            with self.assertRaises(ds.StepConflict):
                ds.start_run(self.conn, basic.name, {"qty": 3}, run_key=run)
            self.until("the run to wait for the event", lambda: "shipped" in (
                self.q("SELECT coalesce(wait_reason, '') FROM ds_runs WHERE run_id = %s", run)[0][0]))
            ds.emit_event(self.conn, "shipped:" + run, {"carrier": "DHL"})
            done = self.finished(run)
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.output, {"stock": 20, "charged": {"charged": 1999},
                                       "shipped": {"carrier": "DHL"}, "segment": 3})
        self.assertEqual(calls, {"quote": 1, "charge": 1})
        self.assertEqual(self.q("SELECT count(*) FROM pywf_orders WHERE run_id = %s", run)[0][0], 1)
        kinds = {k: v[0] for k, v in self.steps(run).items()}
        self.assertEqual([kinds["reserve"], kinds["quote"], kinds["cool-off"], kinds["shipped"]],
                         ["sql", "task", "sleep", "event"])

    def test_waits_for_an_http_step_and_a_task_in_the_engine(self):
        task_name = name("double")
        tag = name("charge")
        seen = {}

        @workflow(name("http_task"))
        def waiting(ctx, input):
            charge = ctx.http("charge", {"method": "POST", "url": charge_url(tag), "expect": "json",
                                         "headers": {"Content-Type": "application/json"},
                                         "body": json.dumps({"amount": input["amount"]})},
                              retry={"max_attempts": 3, "initial_ms": 100})
            seen.setdefault("segment", ctx.segment)     # the first segment that has the response
            doubled = ctx.task("double", task_name, {"n": input["amount"]})
            try:
                ctx.task("refuse", task_name, {"n": -1}, retry={"max_attempts": 1})
                refused = None
            except StepFailed as e:
                refused = e.status
            return {"status": charge["status"], "charged": charge["body"]["charged"],
                    "doubled": doubled, "refused": refused}

        running = Running(waiting)

        @running.worker.task(task_name)
        def double(input, ctx):
            if input["n"] < 0:
                raise ds.NonRetriableError("no negative amounts")
            return input["n"] * 2

        with running:
            run = self.start(waiting, {"amount": 21})
            done = self.finished(run)
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.output, {"status": 200, "charged": tag, "doubled": 42,
                                       "refused": "failed"})
        self.assertEqual(seen["segment"], 2)
        self.assertEqual(provider_counts()["charges"].get(tag), 1)

    def test_retries_with_growing_attempts_and_a_failed_step_raises_into_the_workflow(self):
        seen = []

        @workflow(name("retry"))
        def flaky_wf(ctx, input):
            def flaky(s):
                seen.append(s.attempt)
                if s.attempt == 1:
                    raise ValueError("try again")
                if s.attempt == 2:
                    raise RetryAfterError("later", 0.05)
                return s.attempt
            value = ctx.step("flaky", flaky, retry={"max_attempts": 5, "initial_ms": 10})
            try:
                ctx.step("doomed", lambda s: 1 / 0, retry={"max_attempts": 2, "initial_ms": 10})
                caught = None
            except StepFailed as e:
                caught = str(e)
            return {"flaky": value, "caught": caught}

        with Running(flaky_wf):
            run = self.start(flaky_wf, {})
            done = self.finished(run)
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.output["flaky"], 3)
        self.assertEqual(seen, [1, 2, 3])
        self.assertIn("ZeroDivisionError", done.output["caught"])
        steps = self.steps(run)
        self.assertEqual((steps["flaky"][2], steps["doomed"][1], steps["doomed"][2]),
                         (3, "failed", 2))

    def test_map_runs_a_step_per_item_and_raises_the_first_failed_item(self):
        calls = []

        @workflow(name("map"))
        def map_wf(ctx, input):
            squares = ctx.map("sq", [1, 2, 3], lambda n, s: calls.append(n) or n * n)
            try:
                ctx.map("bad", [1, 2, 3], lambda n, s: 1 / (n - 2),
                        retry={"max_attempts": 1})
                caught = None
            except StepFailed as e:
                caught = str(e)
            ctx.sleep("nap", 1.5)   # a later segment replays the maps
            return {"squares": squares, "caught": caught}

        with Running(map_wf):
            run = self.start(map_wf, {})
            done = self.finished(run)
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.output["squares"], [1, 4, 9])
        self.assertIn("bad/2", done.output["caught"])
        self.assertEqual(calls, [1, 2, 3], "each item ran once; the second segment replayed them")
        steps = self.steps(run)
        self.assertEqual([steps["bad/%d" % n][1] for n in (1, 2, 3)],
                         ["succeeded", "failed", "succeeded"])

    def test_a_changed_workflow_stops_clearly_and_patched_answers_by_history(self):
        version = {"v": 1}

        @workflow(name("patch"), retry={"max_attempts": 1})
        def changing(ctx, input):
            ctx.step("one", lambda s: 1)
            ctx.sleep("pause", 0.3)
            patched = None
            if version["v"] == 2:
                ctx.step("inserted", lambda s: "new")
            elif version["v"] == 3:
                patched = ctx.patched("receipt-v2")
                if patched:
                    ctx.step("receipt", lambda s: "sent")
            ctx.step("two", lambda s: 2)
            ctx.sleep("pause-2", 0.3)
            return {"patched": patched}

        with Running(changing):
            a = self.start(changing, {"run": "a"})
            self.until("run a to pass two", lambda: "pause-2" in self.steps(a))
            version["v"] = 2
            self.assertEqual(self.finished(a).status, "failed")
            message = self.q("SELECT error_message FROM ds_steps WHERE run_id = %s AND "
                             "step_id LIKE 'ds.segment:%%' AND status = 'failed'", a)[0][0]
            self.assertIn("ctx.patched()", message)
            self.assertNotIn("inserted", self.steps(a))
            version["v"] = 1
            b = self.start(changing, {"run": "b"})
            self.until("run b to pass two", lambda: "pause-2" in self.steps(b))
            version["v"] = 3
            self.assertEqual(self.finished(b).output, {"patched": False})
            c = self.start(changing, {"run": "c"})
            self.assertEqual(self.finished(c).output, {"patched": True})
            self.assertEqual(self.steps(c)["receipt"][1], "succeeded")

    def test_cancel_sets_the_running_steps_cancelled_and_no_later_step_starts(self):
        stopped = threading.Event()
        later = []

        @workflow(name("cancel"))
        def long_wf(ctx, input):
            def long(s):
                s.cancelled.wait(30)
                stopped.set()
                raise RuntimeError("cancelled")
            ctx.step("long", long)
            ctx.step("after", lambda s: later.append(1))

        with Running(long_wf):
            run = self.start(long_wf, {})
            self.until("the long step to run",
                       lambda: self.steps(run).get("long", (None, None))[1] == "running")
            self.assertEqual(self.q("SELECT ds_cancel_run(%s)", run)[0][0], "cancelled")
            self.assertTrue(stopped.wait(20))
        self.assertEqual(later, [])
        self.assertNotIn("after", self.steps(run))

    def test_bad_definitions_are_refused(self):
        with self.assertRaises(ValueError):
            workflow("")(lambda ctx, input: 1)
        with self.assertRaises(ValueError):
            workflow("x" * 64)(lambda ctx, input: 1)
        with self.assertRaises(ValueError):
            workflow("ok", retry={"maxAttempts": 3})(lambda ctx, input: 1)
        with self.assertRaises(TypeError):
            Worker(dsn(), workflows=[lambda ctx, input: 1])

    @unittest.skipIf(os.environ.get("DS_CLIENT_PATH") == "pgbouncer", "run on the direct path")
    def test_sigkill_inside_a_step_completes_the_run_with_each_effect_once(self):
        for hang in ("charge", "record"):
            with self.subTest(hang=hang):
                wf_name = name("kill_" + hang)
                env = dict(os.environ, HANG=hang)
                first = subprocess.Popen([sys.executable, "-c", PROCESS, dsn(), wf_name], env=env,
                                         stdout=subprocess.PIPE, text=True)
                self.assertEqual(first.stdout.readline().strip(), "ready")
                # the worker defines the workflow when it runs: wait for the function
                self.until("the workflow's function", lambda: self.q(
                    "SELECT to_regprocedure(%s) IS NOT NULL", wf_name + "(text, jsonb)")[0][0])
                run = ds.start_run(self.conn, wf_name, {}).run_id
                ds.emit_event(self.conn, "shipped:" + run, {"ok": True})
                self.assertEqual(first.stdout.readline().strip(), "inside")
                first.send_signal(signal.SIGKILL)
                first.wait()
                second = subprocess.Popen([sys.executable, "-c", PROCESS, dsn(), wf_name],
                                          env=dict(os.environ, HANG=""), stdout=subprocess.PIPE,
                                          text=True)
                try:
                    done = self.finished(run)
                    self.assertEqual(done.status, "succeeded", done)
                    self.assertEqual(self.q("SELECT what, count(*) FROM pywf_orders WHERE run_id = %s "
                                            "GROUP BY what ORDER BY what", run),
                                     [("recorded", 1), ("reserved", 1)])
                    self.assertEqual(self.q("SELECT count(DISTINCT idempotency_key), count(*) FROM "
                                            "pywf_provider WHERE idempotency_key LIKE %s",
                                            run + ":%")[0], (1, 1))
                    self.assertEqual(self.steps(run)[hang][2], 2)
                finally:
                    second.send_signal(signal.SIGTERM)
                    second.wait(30)
                    first.stdout.close()
                    second.stdout.close()


if __name__ == "__main__":
    unittest.main()
