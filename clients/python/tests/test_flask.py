"""The Flask decorator, served by Flask's own server (werkzeug, threaded) on 127.0.0.1."""
import concurrent.futures
import json
import logging
import threading
import unittest
import urllib.error
import urllib.request

from flask import Flask, g, request
from psycopg2.pool import ThreadedConnectionPool
from werkzeug.serving import make_server

import durable_steps as ds
from durable_steps.flask import idempotent_view

from .support import charge_url, dsn, provider_counts, uid

CONCURRENT = 20


def make_app(pool):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)    # no line per request
    app = Flask(__name__)
    # the tracebacks of the views that fail on purpose: the tests check what they did instead
    app.logger.setLevel(logging.CRITICAL)
    calls = {"flaky": 0, "plain": 0}

    @app.post("/checkout")
    @idempotent_view(pool, "pyclient-checkout", wait=90)
    def checkout():
        # the charge: an HTTP step keyed by the client's key; the provider answers 1 s late, so
        # the identical requests arrive while the first is in flight
        key = g.idempotency_key
        order = "pyclient-order:" + key
        with ds.flask.connection(pool) as conn:
            ds.http_step(conn, order, "charge", {
                "method": "POST", "url": charge_url(key, "fault=delay&secs=1"),
                "json": request.get_json(), "expect": "json"})
        with ds.flask.connection(pool) as conn:
            charge = ds.wait_step(conn, order, "charge", 60)
        if not charge.succeeded:
            return {"order": order, "status": charge.status}, 402
        return {"order": order, "charged": charge.result["body"]}, 201

    @app.post("/flaky")
    @idempotent_view(pool, "pyclient-flaky")
    def flaky():
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise RuntimeError("the first run fails")
        return {"run": calls["flaky"]}

    @app.post("/plain")
    @idempotent_view(pool, "pyclient-plain")
    def plain():
        calls["plain"] += 1
        return "not JSON", 200, {"Content-Type": "text/plain"}

    @app.post("/quick")
    @idempotent_view(pool, "pyclient-quick", wait=0.3)
    def quick():
        return {"ran": True}

    app.calls = calls
    return app


def post(base, path, body, key=None, timeout=120):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r), r.headers.get("Idempotent-Replayed")
    except urllib.error.HTTPError as e:
        data = e.read()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = data.decode(errors="replace")
        return e.code, answer, e.headers.get("Idempotent-Replayed")


class FlaskDecorator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = ThreadedConnectionPool(1, CONCURRENT + 10, dsn())
        cls.app = make_app(cls.pool)
        cls.server = make_server("127.0.0.1", 0, cls.app, threaded=True)
        cls.base = "http://127.0.0.1:%d" % cls.server.server_port
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.thread.join()
        cls.pool.closeall()

    def setUp(self):
        # every connection each pool connection opens commits its statements: none is left open
        self.assertEqual(self.pool._used, {})

    def test_concurrent_identical_requests_charge_once(self):
        key = uid("flask-dup")
        body = {"item": "book", "amount": 1999}
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            answers = list(pool.map(lambda _: post(self.base, "/checkout", body, key), range(CONCURRENT)))
        self.assertEqual(sorted({a[0] for a in answers}), [201], answers)
        self.assertEqual({a[1]["order"] for a in answers}, {"pyclient-order:" + key})
        self.assertEqual(len({json.dumps(a[1], sort_keys=True) for a in answers}), 1)
        self.assertEqual(answers[0][1]["charged"]["charged"], key)
        fresh = [a for a in answers if a[2] != "true"]
        self.assertEqual(len(fresh), 1, answers)
        self.assertEqual(provider_counts()["charges"].get(key), 1)

        # another body under the key
        status, answer, replayed = post(self.base, "/checkout", {"item": "book", "amount": 1}, key)
        self.assertEqual((status, answer.get("sqlstate"), replayed), (422, "DS422", None))
        # the same body later: replayed, still one charge
        status, answer, replayed = post(self.base, "/checkout", body, key)
        self.assertEqual((status, replayed), (201, "true"))
        self.assertEqual(provider_counts()["charges"].get(key), 1)

    def test_in_flight_past_wait_is_409(self):
        # the key held by a request still running (here: held by begin, as the decorator holds it)
        key = uid("flask-held")
        with ds.flask.connection(self.pool) as conn:
            held = ds.idempotent_begin(conn, "pyclient-quick", key, {
                "method": "POST", "path": "/quick", "query": "", "body": {"a": 1}})
        self.assertEqual(held.state, "new")
        req = urllib.request.Request(self.base + "/quick", data=b'{"a": 1}', method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual((caught.exception.code, caught.exception.headers.get("Retry-After")), (409, "1"))
        self.assertEqual(json.load(caught.exception)["sqlstate"], "DS409")
        # once the holder finishes, the same request (whitespace aside) is its replay
        with ds.flask.connection(self.pool) as conn:
            ds.idempotent_finish(conn, "pyclient-quick", key, held.token, 201, {"ran": "elsewhere"})
        req = urllib.request.Request(self.base + "/quick", data=b'{ "a" : 1 }', method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual((r.status, json.load(r), r.headers.get("Idempotent-Replayed")),
                             (201, {"ran": "elsewhere"}, "true"))

    def test_header_required(self):
        status, answer, _ = post(self.base, "/checkout", {"item": "book"})
        self.assertEqual(status, 400)
        self.assertIn("Idempotency-Key", answer["error"])

    def test_invalid_key_22023(self):
        status, answer, _ = post(self.base, "/checkout", {"item": "book"}, "k" * 300)
        self.assertEqual((status, answer["sqlstate"]), (400, "22023"))

    def test_view_that_raises_frees_the_key(self):
        key = uid("flask-flaky")
        status, _, _ = post(self.base, "/flaky", {"a": 1}, key)
        self.assertEqual(status, 500)
        status, answer, replayed = post(self.base, "/flaky", {"a": 1}, key)
        self.assertEqual((status, answer, replayed), (200, {"run": 2}, None))
        status, answer, replayed = post(self.base, "/flaky", {"a": 1}, key)
        self.assertEqual((status, answer, replayed), (200, {"run": 2}, "true"))
        self.assertEqual(self.app.calls["flaky"], 2)

    def test_non_json_answer_is_refused_and_frees_the_key(self):
        key = uid("flask-plain")
        self.assertEqual(post(self.base, "/plain", {"a": 1}, key)[0], 500)
        self.assertEqual(post(self.base, "/plain", {"a": 1}, key)[0], 500)
        self.assertEqual(self.app.calls["plain"], 2)
