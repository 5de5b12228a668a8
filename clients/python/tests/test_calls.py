"""Every call against the real cluster: its typed result, and the arguments passed as values."""
import datetime
import threading
import time
import unittest
import uuid

import durable_steps_client as ds
from durable_steps_client import calls

from .support import NEEDS_RENEW, charge_url, connect, has_renew, provider_counts, uid

WORKFLOW = """
CREATE OR REPLACE FUNCTION pyclient_workflow(run_id text, input jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    doubled jsonb;
    event jsonb;
BEGIN
    doubled := ds_step('double', 'SELECT to_jsonb(($1->>''n'')::int * 2)', input);
    event := ds_await_event('event', input->>'event', '1 minute');
    RETURN jsonb_build_object('doubled', doubled, 'event', event);
END $$
"""


class Calls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conn = connect()

    @classmethod
    def tearDownClass(cls):
        cls.conn.close()

    def test_run_step_typed_and_replayed(self):
        run = uid("run")
        # text a driver or an ORM would rewrite if it were spliced into the statement
        sql = "SELECT jsonb_build_object('n', ($1->>'n')::int + 1, 'text', '100%s :name %(x)s $2')"
        first = ds.run_step(self.conn, run, "add", sql, {"n": 41})
        self.assertIsInstance(first, ds.StepResult)
        self.assertEqual(first.status, "succeeded")
        self.assertEqual(first.result, {"n": 42, "text": "100%s :name %(x)s $2"})
        self.assertEqual((first.run_id, first.step_id, first.attempt), (run, "add", 1))
        self.assertIs(first.replayed, False)
        self.assertIsInstance(first.max_attempts, int)
        self.assertTrue(first.succeeded and first.stopped)
        self.assertEqual(first.unwrap(), first.result)
        again = ds.run_step(self.conn, run, "add", sql, {"n": 41})
        self.assertIs(again.replayed, True)
        self.assertEqual(again.result, first.result)

    def test_run_step_expect_row(self):
        sql = "SELECT n FROM (VALUES (1), (2)) v(n) WHERE n = ($1->>'n')::int"
        none = ds.run_step(self.conn, uid("expect-none"), "s", sql, {"n": 3}, expect="row")
        self.assertEqual((none.status, none.error_code), ("blocked", "DS008"))
        self.assertIs(ds.BY_SQLSTATE[none.error_code], ds.errors.NoRow)
        one = ds.run_step(self.conn, uid("expect-one"), "s", sql, {"n": 2}, expect="row")
        self.assertEqual((one.status, one.result), ("succeeded", 2))

    def test_run_step_deferred_and_wait_step_timeout(self):
        run = uid("deferred")
        later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        step = ds.run_step(self.conn, run, "later", "SELECT 1", run_at=later, queue="pyclient",
                           policy={"max_attempts": 3}, timeout=datetime.timedelta(seconds=5))
        self.assertEqual(step.status, "pending")
        self.assertIsInstance(step.next_attempt_at, datetime.datetime)
        self.assertLess(abs((step.next_attempt_at - later).total_seconds()), 1)
        self.assertEqual(step.max_attempts, 3)
        self.assertIsNone(step.result)
        self.assertFalse(step.stopped)
        with self.assertRaises(ds.StepNotSucceeded):
            step.unwrap()
        # the step does not stop within the timeout: ds_wait_step answers it as it is
        waited = ds.wait_step(self.conn, run, "later", 0.2)
        self.assertEqual(waited.status, "pending")
        cancelled = ds.cancel_step(self.conn, run, "later")
        self.assertEqual(cancelled.status, "cancelled")
        self.assertTrue(cancelled.stopped)

    def test_retry_step_with_corrected_input(self):
        run = uid("retry")
        sql = "SELECT to_jsonb(($1->>'n')::int)"
        # 22P02 (class 22, a data exception) is correctable: the step is blocked
        blocked = ds.run_step(self.conn, run, "s", sql, {"n": "x"})
        self.assertEqual((blocked.status, blocked.error_class, blocked.error_code),
                         ("blocked", "correctable", "22P02"))
        self.assertIsInstance(blocked.remediation, str)
        self.assertTrue(blocked.stopped)
        rearmed = ds.retry_step(self.conn, run, "s", {"n": 5})
        self.assertEqual(rearmed.status, "pending")
        done = ds.run_step(self.conn, run, "s", sql, {"n": 5})
        self.assertEqual((done.status, done.result, done.attempt), ("succeeded", 5, 2))

    def test_http_step_and_wait_step(self):
        run, tag = uid("http"), uid("charge")
        request = {"method": "POST", "url": charge_url(tag), "json": {"amount": 100}, "expect": "json"}
        created = ds.http_step(self.conn, run, "charge", request, policy={"max_attempts": 3},
                               timeout=10)
        self.assertIsInstance(created, ds.StepResult)
        self.assertIn(created.status, ("pending", "running", "succeeded"))
        done = ds.wait_step(self.conn, run, "charge", datetime.timedelta(seconds=60))
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.result["status"], 200)
        self.assertEqual(done.result["body"]["charged"], tag)
        self.assertEqual(provider_counts()["charges"].get(tag), 1)
        # a repeat creates nothing and sends nothing
        repeat = ds.http_step(self.conn, run, "charge", request)
        self.assertEqual((repeat.status, repeat.replayed), ("succeeded", True))
        self.assertEqual(provider_counts()["charges"].get(tag), 1)

    def test_start_run_emit_event_wait_run(self):
        self.conn.cursor().execute(WORKFLOW)
        key, event = uid("run-key"), uid("event")
        started = ds.start_run(self.conn, "pyclient_workflow", {"n": 21, "event": event},
                               run_key=key, policy={"max_attempts": 2})
        self.assertEqual(started, ds.RunStart(run_id=key, status=started.status, created=True))
        self.assertEqual(started.status, "pending")
        again = ds.start_run(self.conn, "pyclient_workflow", {"n": 21, "event": event}, run_key=key)
        self.assertIs(again.created, False)
        # the run waits for the event: ds_wait_run answers it as it is at the timeout
        waiting = ds.wait_run(self.conn, key, 0.3)
        self.assertIsInstance(waiting, ds.RunResult)
        self.assertFalse(waiting.stopped, waiting)
        emitted = ds.emit_event(self.conn, event, {"carrier": "DHL"})
        self.assertEqual(emitted, ds.EventEmitted(name=event, first=True))
        self.assertFalse(ds.emit_event(self.conn, event, {"carrier": "UPS"}))
        done = ds.wait_run(self.conn, key, 60)
        self.assertEqual(done.status, "succeeded", done)
        self.assertEqual(done.output, {"doubled": 42, "event": {"carrier": "DHL"}})
        self.assertIsNone(done.error_code)
        # an anonymous run: the run id is a UUID
        anonymous = ds.start_run(self.conn, "pyclient_workflow", {"n": 1, "event": event})
        uuid.UUID(anonymous.run_id)
        self.assertEqual(ds.wait_run(self.conn, anonymous.run_id, 60).output,
                         {"doubled": 2, "event": {"carrier": "DHL"}})

    def test_idempotent(self):
        key = uid("idem")
        handler = "SELECT 201, jsonb_build_object('echo', $1->'item', 'text', '50%s :x')"
        first = ds.idempotent(self.conn, "pyclient", key, {"item": "book"}, handler, ttl="1 hour")
        self.assertEqual(first, ds.IdempotentResponse(201, {"echo": "book", "text": "50%s :x"}, False))
        again = ds.idempotent(self.conn, "pyclient", key, {"item": "book"}, handler, wait=1)
        self.assertEqual(again, ds.IdempotentResponse(201, {"echo": "book", "text": "50%s :x"}, True))
        with self.assertRaises(ds.StepConflict) as caught:
            ds.idempotent(self.conn, "pyclient", key, {"item": "lamp"}, handler)
        self.assertEqual((caught.exception.sqlstate, caught.exception.http_status), ("DS422", 422))

    def test_idempotent_begin_finish_abandon(self):
        key = uid("begin")
        began = ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1}, lease="1 minute")
        self.assertEqual((began.state, began.status, began.body), ("new", None, None))
        self.assertIsInstance(began.token, uuid.UUID)
        with self.assertRaises(ds.InProgress) as caught:
            ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1})
        self.assertEqual(caught.exception.http_status, 409)
        with self.assertRaises(ds.InProgress):
            ds.idempotent_finish(self.conn, "pyclient", key, uuid.uuid4(), 200, {})
        self.assertIsNone(ds.idempotent_finish(self.conn, "pyclient", key, began.token, 201, {"order": 9}))
        replay = ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1})
        self.assertEqual(replay, ds.IdempotentBegin("replay", 201, {"order": 9}, None))
        self.assertTrue(replay.replay)

        held = ds.idempotent_begin(self.conn, "pyclient", key + "-b", {"a": 2})
        self.assertIsNone(ds.idempotent_abandon(self.conn, "pyclient", key + "-b", str(held.token)))
        afresh = ds.idempotent_begin(self.conn, "pyclient", key + "-b", {"a": 2})
        self.assertEqual(afresh.state, "new")
        self.assertNotEqual(afresh.token, held.token)
        with self.assertRaises(ds.StepNotFound) as caught:
            ds.idempotent_abandon(self.conn, "pyclient", uid("nothing"), uuid.uuid4())
        self.assertEqual((caught.exception.sqlstate, caught.exception.http_status), ("DS404", 404))

    def test_idempotent_begin_waits_for_the_holder(self):
        key = uid("begin-wait")
        began = ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1})
        with self.assertRaises(ds.InProgress):
            ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1}, wait=0.1)
        answers = []
        waiter = connect()

        def repeat():
            answers.append(ds.idempotent_begin(waiter, "pyclient", key, {"a": 1}, wait="1 minute"))

        thread = threading.Thread(target=repeat)
        thread.start()
        try:
            # the repeat sleeps in the server until the holder's finish commits
            deadline = time.monotonic() + 30
            while True:
                with self.conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                " AND state = 'active' AND wait_event IS NOT NULL"
                                " AND strpos(query, 'ds_idempotent_begin') > 0 AND strpos(query, %s) > 0",
                                (key,))
                    if cur.fetchone()[0] == 1:
                        break
                self.assertLess(time.monotonic(), deadline, "the repeat never waited")
                time.sleep(0.01)
            ds.idempotent_finish(self.conn, "pyclient", key, began.token, 201, {"order": 1})
        finally:
            thread.join(60)
            waiter.close()
        self.assertEqual(answers, [ds.IdempotentBegin("replay", 201, {"order": 1}, None)])


    @unittest.skipUnless(has_renew(), NEEDS_RENEW)
    def test_idempotent_renew(self):
        key = uid("renew")
        began = ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1}, lease=1)
        until = ds.idempotent_renew(self.conn, "pyclient", key, began.token, lease="1 hour")
        self.assertIsInstance(until, datetime.datetime)
        self.assertIsNotNone(until.tzinfo)
        self.assertGreater(until, datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=59))
        time.sleep(1.2)     # past the first lease: still held, by the renewal
        with self.assertRaises(ds.InProgress):
            ds.idempotent_begin(self.conn, "pyclient", key, {"a": 1})
        self.assertIsInstance(ds.idempotent_renew(self.conn, "pyclient", key, str(began.token)),
                              datetime.datetime)
        with self.assertRaises(ds.InProgress):      # DS409: not held with this token
            ds.idempotent_renew(self.conn, "pyclient", key, uuid.uuid4())
        with self.assertRaises(ds.StepNotFound):    # DS404: no such key
            ds.idempotent_renew(self.conn, "pyclient", uid("nothing"), uuid.uuid4())
        ds.idempotent_abandon(self.conn, "pyclient", key, began.token)


class Errors(unittest.TestCase):
    """The class of each SQLSTATE, raised by real calls."""

    @classmethod
    def setUpClass(cls):
        cls.conn = connect()

    @classmethod
    def tearDownClass(cls):
        cls.conn.close()

    def test_every_class_under_one_base(self):
        self.assertGreaterEqual(len(ds.BY_SQLSTATE), 35)
        for code, cls in ds.BY_SQLSTATE.items():
            self.assertTrue(issubclass(cls, ds.DurableStepsError))
            self.assertEqual(cls.sqlstate, code)
            self.assertIs(getattr(ds, cls.__name__), cls)

    def test_syntax_error_42601(self):
        with self.assertRaises(ds.SqlSyntaxError) as caught:
            ds.run_step(self.conn, uid("syntax"), "s", "SELEC 1")
        self.assertEqual(caught.exception.sqlstate, "42601")
        self.assertIsNotNone(caught.exception.pgerror)
        with self.assertRaises(ds.SqlSyntaxError):
            ds.run_step(self.conn, uid("two"), "s", "SELECT 1; SELECT 2")

    def test_conflict_DS422(self):
        run = uid("conflict")
        ds.run_step(self.conn, run, "s", "SELECT 1")
        with self.assertRaises(ds.Conflict) as caught:
            ds.run_step(self.conn, run, "s", "SELECT 2")
        self.assertIsInstance(caught.exception, ds.StepConflict)
        self.assertIn("DS422", str(caught.exception))

    def test_not_found_DS404(self):
        with self.assertRaises(ds.NotFound):
            ds.retry_step(self.conn, uid("missing"), "s")

    def test_invalid_state_DS103(self):
        run = uid("finished")
        ds.run_step(self.conn, run, "s", "SELECT 1")
        with self.assertRaises(ds.InvalidStepState) as caught:
            ds.cancel_step(self.conn, run, "s")
        self.assertEqual(caught.exception.http_status, 409)

    def test_in_progress_DS409_nowait(self):
        run = uid("held")
        holder = connect(autocommit=False)
        try:
            # an open transaction creates the step and holds it until it ends
            ds.run_step(holder, run, "s", "SELECT 1", defer=True)
            with self.assertRaises(ds.InFlight) as caught:
                ds.run_step(self.conn, run, "s", "SELECT 1", nowait=True)
            self.assertEqual(caught.exception.sqlstate, "DS409")
        finally:
            holder.rollback()
            holder.close()

    def test_in_progress_waits_without_nowait(self):
        run = uid("waits")
        holder = connect(autocommit=False)
        got = {}
        try:
            ds.run_step(holder, run, "s", "SELECT 7", defer=True)

            def call():
                with connect() as other:
                    got["step"] = ds.run_step(other, run, "s", "SELECT 7")
            waiter = threading.Thread(target=call)
            waiter.start()
            # the second call waits on the holder's lock (seen in pg_stat_activity), not done
            deadline = time.monotonic() + 20
            waiting = False
            while not waiting and time.monotonic() < deadline:
                with self.conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                "AND query LIKE '%%ds_run_step%%' AND query LIKE %s", ("%" + run + "%",))
                    waiting = cur.fetchone()[0] == 1
                if not waiting:
                    time.sleep(0.02)
            self.assertTrue(waiting, "the second call waits for the holding transaction")
            self.assertTrue(waiter.is_alive())
            holder.commit()
            waiter.join(60)
            self.assertFalse(waiter.is_alive(), "the waiting call ended once the holder committed")
            self.assertEqual(got["step"].result, 7)
        finally:
            holder.close()

    def test_invalid_parameter_22023(self):
        with self.assertRaises(ds.InvalidParameterValue) as caught:
            ds.run_step(self.conn, "", "s", "SELECT 1")
        self.assertEqual(caught.exception.http_status, 400)

    def test_undefined_workflow_42883(self):
        with self.assertRaises(ds.UndefinedFunction):
            ds.start_run(self.conn, "pyclient_no_such_workflow")

    def test_from_exception_of_a_raw_driver_error(self):
        run = uid("raw")
        # due in an hour, so no worker can have run it when ds_wait_step looks
        later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        ds.run_step(self.conn, run, "s", "SELECT 1", run_at=later)
        import psycopg2
        with self.assertRaises(psycopg2.Error) as caught:
            with self.conn.cursor() as cur:
                cur.execute("SELECT ds_unwrap(ds_wait_step(%s, 's', '0 s'))", (run,))
        e = ds.from_exception(caught.exception)
        self.assertIsInstance(e, ds.StepNotSucceeded)
        self.assertEqual((e.sqlstate, e.pgerror), ("DS102", caught.exception))

        class Wrapped(Exception):   # the shape of SQLAlchemy's DBAPIError: the driver's in .orig
            orig = caught.exception
        self.assertIsInstance(ds.from_exception(Wrapped()), ds.StepNotSucceeded)

    def test_unknown_sqlstate_is_the_base(self):
        import psycopg2
        with self.assertRaises(psycopg2.Error) as caught:
            with self.conn.cursor() as cur:
                cur.execute("SELECT 1/0")
        e = ds.from_exception(caught.exception)
        self.assertIs(type(e), ds.DurableStepsError)
        self.assertEqual((e.sqlstate, e.http_status), ("22012", 500))

    def test_binding_of_arguments(self):
        # an interval is passed as seconds, text[] as an array, NULL as the function's default
        self.assertEqual(calls._bind(datetime.timedelta(seconds=1.5), "interval"),
                         ("make_interval(secs => %s)", 1.5))
        self.assertEqual(calls._bind(["23505"], "text[]"), ("%s::text[]", ["23505"]))
        # one code given as a string is a list of one, not of its characters
        self.assertEqual(calls._bind("22012", "text[]"), ("%s::text[]", ["22012"]))
        step = ds.run_step(self.conn, "py:" + uuid.uuid4().hex, "div", "SELECT 1/0",
                           retry_on="22012", policy={"max_attempts": 3})
        self.assertEqual((step.status, step.error_code), ("retrying", "22012"))
        with self.conn.cursor() as cur:
            cur.execute("SELECT make_interval(secs => %s) = interval '1.5 s'", (1.5,))
            self.assertTrue(cur.fetchone()[0])
