"""Tasks against the real cluster: the Worker runs stored tasks in threads, records their
outcomes (with the handler's own transaction's writes), keeps long handlers alive, sees
cancellations and stops gracefully; a stale token is refused with LeaseLost.

Every wait is for a condition (ds_wait_step, an Event a handler sets, a row count), never a
sleep that hopes something happened by then."""
import collections
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import unittest

import psycopg2

import durable_steps_client as ds
from durable_steps_client import Worker

from .support import connect, dsn, uid

# a worker process: run() in its main thread handles SIGTERM; the handler says when it started
# and returns once the test writes a line to its stdin
PROCESS = """
import logging, sys, durable_steps_client as ds
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
worker = ds.Worker(sys.argv[1], concurrency=1, grace=20)

@worker.task(sys.argv[2])
def handler(input, ctx):
    print("started", flush=True)
    sys.stdin.readline()
    return {"cancelled": ctx.cancelled.is_set()}

worker.run()
print("stopped", flush=True)
"""

EFFECTS = """
CREATE TABLE IF NOT EXISTS pyclient_task_effects (
    run_id text NOT NULL,
    step_id text NOT NULL,
    attempt_key text NOT NULL,
    PRIMARY KEY (run_id, step_id)
)"""
INSERT = "INSERT INTO pyclient_task_effects (run_id, step_id, attempt_key) VALUES (%s, %s, %s)"


def new_connection():
    return psycopg2.connect(dsn())


class Records(logging.Handler):
    """A logger's records, in a queue the test waits on."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: "queue.Queue[logging.LogRecord]" = queue.Queue()

    def emit(self, record):
        self.records.put(record)

    def wait_for(self, test, timeout):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            try:
                record = self.records.get(timeout=left)
            except queue.Empty:
                return None
            if test(record):
                return record


class Tasks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conn = connect()
        with cls.conn.cursor() as cur:
            cur.execute(EFFECTS)

    @classmethod
    def tearDownClass(cls):
        cls.conn.close()

    def start(self, handlers, **options):
        """A Worker over ``handlers`` running in a thread of its own; stopped after the test."""
        options.setdefault("concurrency", 4)
        options.setdefault("lease", 5.0)
        options.setdefault("grace", 5.0)
        worker = Worker(new_connection, tasks=handlers, **options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.addCleanup(self.stop, worker, thread)
        return worker, thread

    def stop(self, worker, thread):
        worker.stop()
        thread.join(20)
        self.assertFalse(thread.is_alive(), "the worker did not stop")

    def wait(self, run, step, timeout=20):
        return ds.wait_step(self.conn, run, step, timeout)

    def effects(self, run):
        with self.conn.cursor() as cur:
            cur.execute("SELECT step_id, attempt_key FROM pyclient_task_effects WHERE run_id = %s",
                        (run,))
            return dict(cur.fetchall())

    def waiting(self, task, timeout=20):
        """Until a session is inside ds_wait_for_tasks for ``task`` (the worker is idle)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND "
                            "query LIKE 'CALL ds_wait_for_tasks%%' AND strpos(query, %s) > 0",
                            (task,))
                if cur.fetchone()[0] > 0:
                    return
            time.sleep(0.02)
        self.fail("the worker never waited in ds_wait_for_tasks")

    def test_a_stored_task_runs_and_completes(self):
        task, run = uid("double"), uid("double-run")
        seen = []

        def double(input, ctx):
            seen.append(ctx)
            return {"doubled": input["n"] * 2}

        # an idle worker waits in ds_wait_for_tasks (a minute at most, here): the commit that
        # stores the task wakes it at once, no polling
        self.start({task: double}, wait_timeout=60)
        self.waiting(task)
        began = time.monotonic()
        stored = ds.task_step(self.conn, run, "s", task, {"n": 21}, policy={"max_attempts": 3})
        self.assertIsInstance(stored, ds.StepResult)
        self.assertIn(stored.status, ("pending", "running", "succeeded"))
        done = self.wait(run, "s")
        self.assertLess(time.monotonic() - began, 10)
        self.assertEqual((done.status, done.result, done.attempt), ("succeeded", {"doubled": 42}, 1))
        self.assertEqual(len(seen), 1)
        ctx = seen[0]
        self.assertEqual((ctx.run_id, ctx.step_id, ctx.task, ctx.attempt, ctx.max_attempts),
                         (run, "s", task, 1, 3))
        self.assertTrue(ctx.idempotency_key and ctx.attempt_key)
        self.assertNotEqual(ctx.idempotency_key, ctx.attempt_key)
        self.assertFalse(ctx.cancelled.is_set())
        # the same definition replays; another is DS422
        again = ds.task_step(self.conn, run, "s", task, {"n": 21}, policy={"max_attempts": 3})
        self.assertEqual((again.status, again.result, again.replayed),
                         ("succeeded", {"doubled": 42}, True))
        with self.assertRaises(ds.StepConflict):
            ds.task_step(self.conn, run, "s", task, {"n": 22})
        self.assertEqual(len(seen), 1)

    def test_transaction_commits_the_handlers_write_with_the_outcome(self):
        task, run = uid("record"), uid("record-run")

        def record(input, ctx):
            with ctx.transaction() as cur:
                cur.execute(INSERT, (ctx.run_id, ctx.step_id, ctx.attempt_key))
                if input.get("decline"):
                    raise ds.NonRetriableError("declined")
                return {"recorded": ctx.attempt_key}

        self.start({task: record})
        # a cursor of the caller's transaction stores the task with the caller's own writes
        with connect(autocommit=False) as conn, conn.cursor() as cur:
            ds.task_step(cur, run, "ok", task, {})
            ds.task_step(cur, run, "declined", task, {"decline": True})
        ok, declined = self.wait(run, "ok"), self.wait(run, "declined")
        self.assertEqual(ok.status, "succeeded")
        self.assertEqual(self.effects(run), {"ok": ok.result["recorded"]})
        self.assertEqual((declined.status, declined.error_class, declined.error_code,
                          declined.error_message),
                         ("failed", "permanent", "NonRetriableError", "declined"))

    def test_non_retriable_error_fails_the_step(self):
        task, run = uid("decline"), uid("decline-run")

        class CardDeclined(ds.NonRetriableError):
            pass

        def charge(input, ctx):
            raise CardDeclined("no funds")

        self.start({task: charge})
        ds.task_step(self.conn, run, "charge", task, policy={"max_attempts": 5})
        step = self.wait(run, "charge")
        self.assertEqual((step.status, step.error_class, step.error_code, step.error_message,
                          step.attempt), ("failed", "permanent", "CardDeclined", "no funds", 1))

    def test_expect_row_blocks_a_handler_that_returns_none(self):
        task, run = uid("expecting"), uid("expecting-run")
        self.start({task: lambda input, ctx: None if input["n"] == 0 else {"n": input["n"]}})
        ds.task_step(self.conn, run, "none", task, {"n": 0}, expect="row")
        ds.task_step(self.conn, run, "some", task, {"n": 1}, expect="row")
        none, some = self.wait(run, "none"), self.wait(run, "some")
        self.assertEqual((none.status, none.error_code), ("blocked", "DS008"))
        self.assertEqual((some.status, some.result), ("succeeded", {"n": 1}))

    def test_other_exceptions_are_retryable_with_their_traceback(self):
        task, run = uid("boom"), uid("boom-run")

        def boom(input, ctx):
            raise ValueError("boom %d" % ctx.attempt)

        self.start({task: boom})
        ds.task_step(self.conn, run, "s", task, policy={"max_attempts": 1})
        step = self.wait(run, "s")
        self.assertEqual((step.status, step.error_code, step.error_message),
                         ("failed", "ValueError", "boom 1"))
        self.assertIn("Traceback", step.error_detail)
        self.assertIn("ValueError: boom 1", step.error_detail)

    def test_retry_after_error_retries_after_its_delay(self):
        task, run = uid("later"), uid("later-run")
        times = []

        def later(input, ctx):
            times.append(time.monotonic())
            if ctx.attempt == 1:
                raise ds.RetryAfterError("busy", 0.5)
            return {"attempt": ctx.attempt}

        self.start({task: later})
        ds.task_step(self.conn, run, "s", task, policy={"max_attempts": 3})
        step = self.wait(run, "s")
        self.assertEqual((step.status, step.result, step.attempt), ("succeeded", {"attempt": 2}, 2))
        self.assertEqual(len(times), 2)
        self.assertGreaterEqual(times[1] - times[0], 0.4)

    def test_blocked_error_blocks_until_retried_with_corrected_input(self):
        task, run = uid("address"), uid("address-run")

        def address(input, ctx):
            if not input.get("address"):
                raise ds.BlockedError("no address", "give the order an address")
            return input["address"]

        self.start({task: address})
        ds.task_step(self.conn, run, "ship", task, {"address": None})
        step = self.wait(run, "ship")
        self.assertEqual((step.status, step.error_class, step.error_code, step.remediation),
                         ("blocked", "correctable", "BlockedError", "give the order an address"))
        ds.retry_step(self.conn, run, "ship", {"address": "1 Main St"})
        step = self.wait(run, "ship")
        self.assertEqual((step.status, step.result), ("succeeded", "1 Main St"))

    def test_stop_lets_a_running_handler_finish_and_claims_no_more(self):
        task, run = uid("graceful"), uid("graceful-run")
        started, finish = threading.Event(), threading.Event()

        def slow(input, ctx):
            started.set()
            finish.wait(20)
            return {"cancelled": ctx.cancelled.is_set()}

        worker, thread = self.start({task: slow}, concurrency=1, grace=20)
        ds.task_step(self.conn, run, "first", task)
        self.assertTrue(started.wait(20))
        worker.stop()
        ds.task_step(self.conn, run, "second", task)
        self.assertTrue(thread.is_alive())          # it waits for the running handler
        finish.set()
        thread.join(20)
        self.assertFalse(thread.is_alive())
        self.assertEqual(self.wait(run, "first").result, {"cancelled": False})
        second = ds.wait_step(self.conn, run, "second", 0)
        self.assertEqual((second.status, second.attempt), ("pending", 0))

    def test_a_claim_not_started_at_stop_is_released_uncounted(self):
        task, run = uid("release"), uid("release-run")
        ran = []
        worker, thread = self.start({task: lambda input, ctx: ran.append(ctx)}, concurrency=1)
        claimed = worker._start

        def stop_first(row, sent):
            worker.stop()                   # stop() came while the claim's answer was on its way
            claimed(row, sent)

        worker._start = stop_first
        ds.task_step(self.conn, run, "s", task)
        thread.join(20)
        self.assertFalse(thread.is_alive())
        self.assertEqual(ran, [])
        step = ds.wait_step(self.conn, run, "s", 0)
        self.assertEqual((step.status, step.attempt), ("pending", 0))

    def test_stop_cancels_a_handler_past_the_grace_period(self):
        task, run = uid("stubborn"), uid("stubborn-run")
        started, reasons = threading.Event(), []

        def stubborn(input, ctx):
            started.set()
            if ctx.cancelled.wait(20):
                reasons.append(ctx.cancel_reason)
                raise RuntimeError("stopped")
            return "never cancelled"

        worker, thread = self.start({task: stubborn}, grace=0.3)
        ds.task_step(self.conn, run, "s", task, policy={"max_attempts": 3})
        self.assertTrue(started.wait(20))
        worker.stop()
        thread.join(20)
        self.assertFalse(thread.is_alive())
        self.assertEqual(reasons, ["stopping"])
        step = ds.wait_step(self.conn, run, "s", 0)
        self.assertEqual((step.status, step.attempt, step.error_code), ("retrying", 1, "RuntimeError"))

    def line(self, proc, test):
        """The first line the process prints that passes ``test`` (its output until then)."""
        for line in proc.stdout:
            if test(line.strip()):
                return line.strip()
        self.fail("the worker process ended first")

    def test_sigterm_stops_a_worker_process_gracefully(self):
        task, run = uid("sigterm"), uid("sigterm-run")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-c", PROCESS, dsn(), task], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ds.task_step(self.conn, run, "s", task)
            self.assertEqual(self.line(proc, lambda line: line == "started"), "started")
            proc.send_signal(signal.SIGTERM)
            self.assertIn("stopping", self.line(proc, lambda line: "stopping" in line))
            ds.task_step(self.conn, run, "after", task)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual((proc.returncode, out.strip().splitlines()[-1]), (0, "stopped"))
        self.assertEqual(self.wait(run, "s").result, {"cancelled": False})
        self.assertEqual(ds.wait_step(self.conn, run, "after", 0).attempt, 0)

    def test_heartbeats_keep_a_handler_three_times_the_lease_alive(self):
        task, run = uid("long"), uid("long-run")

        def long(input, ctx):
            # three times the lease of work: cancelled would be set if the lease were lost
            cancelled = ctx.cancelled.wait(3.0)
            return {"cancelled": cancelled, "reason": ctx.cancel_reason}

        self.start({task: long}, lease=1.0)
        ds.task_step(self.conn, run, "s", task, policy={"max_attempts": 3})
        step = self.wait(run, "s")
        self.assertEqual((step.status, step.result, step.attempt),
                         ("succeeded", {"cancelled": False, "reason": None}, 1))

    def test_cancel_step_sets_ctx_cancelled(self):
        task, run = uid("cancel"), uid("cancel-run")
        started, ended, reasons = threading.Event(), threading.Event(), []

        def cancellable(input, ctx):
            started.set()
            try:
                if ctx.cancelled.wait(20):
                    reasons.append(ctx.cancel_reason)
                    raise RuntimeError("cancelled")
                return "not cancelled"
            finally:
                ended.set()

        self.start({task: cancellable}, lease=1.5)
        ds.task_step(self.conn, run, "s", task)
        self.assertTrue(started.wait(20))
        self.assertEqual(ds.cancel_step(self.conn, run, "s").status, "cancelled")
        # the next heartbeat (every half second) answers held = false, cancelled = true
        self.assertTrue(ended.wait(10))
        self.assertEqual(reasons, ["cancelled"])
        self.assertEqual(ds.wait_step(self.conn, run, "s", 0).status, "cancelled")

    def test_the_deadline_sets_ctx_cancelled(self):
        task, run = uid("deadline"), uid("deadline-run")
        seen = []

        def slow(input, ctx):
            cancelled = ctx.cancelled.wait(20)
            seen.append((cancelled, ctx.cancel_reason, ctx.deadline))
            raise RuntimeError("too slow")

        self.start({task: slow})
        began = time.monotonic()
        ds.task_step(self.conn, run, "s", task, timeout=1, policy={"max_attempts": 1})
        step = self.wait(run, "s")
        self.assertLess(time.monotonic() - began, 15)
        # the lease ends with the deadline: the attempt is the step's timeout, DS004
        self.assertEqual((step.status, step.error_code), ("failed", "DS004"))
        self.assertEqual(len(seen), 1)
        cancelled, reason, deadline = seen[0]
        self.assertEqual((cancelled, reason), (True, "deadline"))
        self.assertIsNotNone(deadline)

    def test_a_stale_token_raises_lease_lost_and_rolls_the_write_back(self):
        task, run = uid("stale"), uid("stale-run")
        records = Records()
        logger = logging.getLogger("durable_steps_client.worker.test-%s" % task)
        logger.addHandler(records)
        logger.propagate = False
        seen = {}

        def late(input, ctx):
            with ctx.transaction() as cur:
                cur.execute(INSERT, (ctx.run_id, ctx.step_id, ctx.attempt_key))
                # no heartbeats: the lease runs out; the background worker records the attempt
                # lost (DS007) and, with no attempt left, fails the step -- wait for that
                conn = connect()
                try:
                    seen["step"] = ds.wait_step(conn, ctx.run_id, ctx.step_id, 30)
                finally:
                    conn.close()
                seen["token"] = ctx.token
                return {"late": True}

        self.start({task: late}, lease=1.0, heartbeat=3600, logger=logger)
        ds.task_step(self.conn, run, "s", task, policy={"max_attempts": 1})
        record = records.wait_for(lambda r: r.exc_info is not None, 40)
        self.assertIsNotNone(record, "the worker logged no LeaseLost")
        self.assertIsInstance(record.exc_info[1], ds.LeaseLost)
        self.assertEqual(record.exc_info[1].sqlstate, "DS410")
        self.assertEqual((seen["step"].status, seen["step"].error_code), ("failed", "DS007"))
        self.assertEqual(self.effects(run), {})
        step = ds.wait_step(self.conn, run, "s", 0)
        self.assertEqual((step.status, step.error_code), ("failed", "DS007"))
        # the same refusal in a transaction of the caller's: LeaseLost, and nothing written
        conn = connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                cur.execute(INSERT, (run, "by-hand", "x"))
                with self.assertRaises(psycopg2.Error) as raised:
                    cur.execute("SELECT ds_complete_task(%s, %s::jsonb)", (seen["token"], "{}"))
            self.assertIsInstance(ds.from_exception(raised.exception), ds.LeaseLost)
            conn.rollback()
        finally:
            conn.close()
        self.assertEqual(self.effects(run), {})

    def test_a_claim_inside_a_transaction_block_is_25001(self):
        conn = connect(autocommit=False)
        try:
            with conn.cursor() as cur, self.assertRaises(psycopg2.Error) as raised:
                cur.execute("SELECT * FROM ds_claim_tasks(%s::text[])", ([uid("none")],))
            self.assertIsInstance(ds.from_exception(raised.exception), ds.ActiveSqlTransaction)
        finally:
            conn.rollback()
            conn.close()

    def test_concurrency_10_over_1000_tasks_completes_each_step_once(self):
        task, run = uid("many"), uid("many-run")
        lock, runs = threading.Lock(), collections.Counter()

        def one(input, ctx):
            with lock:
                runs[ctx.step_id] += 1
            with ctx.transaction() as cur:
                cur.execute(INSERT, (ctx.run_id, ctx.step_id, ctx.attempt_key))
                return input["i"]

        with self.conn.cursor() as cur:
            for first in range(1, 1001, 250):
                cur.execute("SELECT count(*) FROM generate_series(%s, %s) AS i, "
                            "LATERAL ds_task_step(%s, 's' || i, %s, jsonb_build_object('i', i))",
                            (first, first + 249, run, task))
        self.start({task: one}, concurrency=10)
        end = time.monotonic() + 60
        with self.conn.cursor() as cur:
            while True:
                cur.execute("SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) "
                            "FROM ds_steps WHERE run_id = %s", (run,))
                done, total = cur.fetchone()
                if done == 1000 or time.monotonic() > end:
                    break
                time.sleep(0.05)
            self.assertEqual((done, total), (1000, 1000))
            cur.execute("SELECT count(*) FILTER (WHERE attempt = 1 AND result = to_jsonb("
                        "substr(step_id, 2)::int)) FROM ds_steps WHERE run_id = %s", (run,))
            self.assertEqual(cur.fetchone()[0], 1000)
        self.assertEqual(len(runs), 1000)
        self.assertEqual(set(runs.values()), {1})
        self.assertEqual(len(self.effects(run)), 1000)


if __name__ == "__main__":
    unittest.main()
