"""The Flask decorator, served by Flask's own server (werkzeug, threaded) on 127.0.0.1."""
import base64
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
import unittest
import unittest.mock
import urllib.error
import urllib.request
import uuid

from flask import Flask, g, request
from psycopg2.pool import ThreadedConnectionPool
from werkzeug.serving import make_server

import durable_steps_client as ds
import durable_steps_client.flask
from durable_steps_client.flask import idempotent_view, user_scope

from .support import NEEDS_RENEW, charge_url, dsn, has_renew, provider_counts, server_log_errors, uid

CONCURRENT = 20


def make_app(pool):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)    # no line per request
    app = Flask(__name__)
    # the tracebacks of the views that fail on purpose: the tests check what they did instead
    app.logger.setLevel(logging.CRITICAL)
    calls = {"flaky": 0, "plain": 0, "order": 0, "slow": 0, "watch": 0}

    @app.before_request
    def load_user():
        # an application's own login: the user in g.user (here: whoever X-User names)
        if request.headers.get("X-User"):
            g.user = {"id": request.headers["X-User"], "name": "someone"}

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

    @app.post("/order")
    @idempotent_view(pool, "pyclient-order")
    def order():
        # a new order per run of the view: a replay answers the first one's
        calls["order"] += 1
        return {"order": str(uuid.uuid4()), "user": g.idempotency_user, "scope": g.idempotency_scope}, 201

    @app.post("/order-by-tenant")
    @idempotent_view(pool, "pyclient-order", user=lambda: request.headers.get("X-Tenant"))
    def order_by_tenant():
        return {"order": str(uuid.uuid4()), "user": g.idempotency_user}, 201

    @app.post("/slow")
    @idempotent_view(pool, "pyclient-slow", lease=2, wait=30)
    def slow():
        # twice its lease: held all along by the renewals
        calls["slow"] += 1
        time.sleep(4)
        return {"run": calls["slow"], "lost": g.idempotency_lease_lost.is_set()}

    @app.post("/watch")
    @idempotent_view(pool, "pyclient-watch", lease="1 second")
    def watch():
        calls["watch"] += 1
        # waits for the loss of the key, at most X-Wait seconds
        lost = g.idempotency_lease_lost.wait(float(request.headers.get("X-Wait", "0")))
        return {"lost": lost}

    app.calls = calls
    return app


def send(base, path, data: bytes, key=None, content_type="application/json", headers=None, timeout=120):
    """A request of raw bytes: (status, answer, Idempotent-Replayed)."""
    headers = {"Content-Type": content_type, **(headers or {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(base + path, data=data, method="POST", headers=headers)
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
        # the repeats waited for the first's finish in the server: none was refused and retried
        self.assertEqual(server_log_errors(key), [])

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
                "method": "POST", "path": "/quick", "query": "",
                "body_sha256": hashlib.sha256(b'{"a": 1}').hexdigest(), "body": {"a": 1}})
        self.assertEqual(held.state, "new")
        req = urllib.request.Request(self.base + "/quick", data=b'{"a": 1}', method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual((caught.exception.code, caught.exception.headers.get("Retry-After")), (409, "1"))
        self.assertEqual(json.load(caught.exception)["sqlstate"], "DS409")
        # once the holder finishes, the same request is its replay
        with ds.flask.connection(self.pool) as conn:
            ds.idempotent_finish(conn, "pyclient-quick", key, held.token, 201, {"ran": "elsewhere"})
        req = urllib.request.Request(self.base + "/quick", data=b'{"a": 1}', method="POST",
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

    def test_end_users_have_their_own_keys(self):
        # the default: g.user (an application's login), HTTP Basic, Flask-Login's current_user
        key = uid("flask-users")
        body = b'{"item": "book"}'
        alice = send(self.base, "/order", body, key, headers={"X-User": "alice"})
        self.assertEqual((alice[0], alice[1]["user"], alice[2]), (201, "alice", None))
        bob = send(self.base, "/order", body, key, headers={"X-User": "bob"})
        self.assertEqual((bob[0], bob[2]), (201, None), "bob got alice's stored response")
        self.assertEqual(bob[1]["user"], "bob")
        self.assertNotEqual(bob[1]["order"], alice[1]["order"])
        self.assertEqual(bob[1]["scope"], "pyclient-order:user:bob")
        basic = {"Authorization": "Basic " + base64.b64encode(b"carol:secret").decode()}
        carol = send(self.base, "/order", body, key, headers=basic)
        self.assertEqual((carol[0], carol[1]["user"], carol[2]), (201, "carol", None))
        anonymous = send(self.base, "/order", body, key)
        self.assertEqual((anonymous[0], anonymous[1]["user"], anonymous[2]), (201, None, None))
        self.assertEqual(anonymous[1]["scope"], "pyclient-order")
        # each one's retry replays his own
        self.assertEqual(send(self.base, "/order", body, key, headers={"X-User": "alice"}),
                         (201, alice[1], "true"))
        self.assertEqual(send(self.base, "/order", body, key, headers=basic), (201, carol[1], "true"))
        self.assertEqual(send(self.base, "/order", body, key), (201, anonymous[1], "true"))

    def test_the_option_user_and_the_scopes_it_makes(self):
        key = uid("flask-tenant")
        long = "t" * 250
        first = send(self.base, "/order-by-tenant", b"{}", key, headers={"X-Tenant": long})
        other = send(self.base, "/order-by-tenant", b"{}", key, headers={"X-Tenant": "acme"})
        self.assertEqual((first[0], other[0], other[2]), (201, 201, None))
        self.assertEqual(send(self.base, "/order-by-tenant", b"{}", key, headers={"X-Tenant": long}),
                         (201, first[1], "true"))
        with ds.flask.connection(self.pool) as conn, conn.cursor() as cur:
            cur.execute("SELECT scope FROM ds_idempotency_keys WHERE key = %s ORDER BY scope", (key,))
            self.assertEqual(sorted(r[0] for r in cur.fetchall()),
                             sorted([user_scope("pyclient-order", long), "pyclient-order:user:acme"]))
        # the encoding: unambiguous, within PostgreSQL's 255 characters, the Node.js client's
        self.assertEqual(user_scope("s", "a:b/ü"), "s:user:a%3Ab%2F%C3%BC")
        self.assertEqual(user_scope("s", "!*'()~="), "s:user:!*'()~%3D")
        self.assertRegex(user_scope("s", "x" * 300), r"^s:user:sha256=[0-9a-f]{64}$")
        self.assertNotEqual(user_scope("s", "\ud800"), user_scope("s", "\ud801"))
        self.assertEqual(user_scope("s", None), "s")
        with self.assertRaises(ValueError):
            idempotent_view(self.pool, "a:user:b")
        with self.assertRaises(ValueError):
            idempotent_view(self.pool, "s" * 179)

    def test_bodies_are_compared_by_their_bytes(self):
        key = uid("flask-bytes")
        first = send(self.base, "/order", b'{"a": 1, "a": 2}', key)
        self.assertEqual(first[0], 201)
        # the same JSON once parsed, other bytes: another request
        self.assertEqual(send(self.base, "/order", b'{"a": 2}', key)[0], 422)
        self.assertEqual(send(self.base, "/order", b'{"a": 1, "a": 2}', key), (201, first[1], "true"))
        # bytes that are not UTF-8 (which a decoding with replacement made the same)
        key = uid("flask-bytes-binary")
        self.assertEqual(send(self.base, "/order", b"\xff\xfe", key, "application/octet-stream")[0], 201)
        status, answer, _ = send(self.base, "/order", b"\xff\xfd", key, "application/octet-stream")
        self.assertEqual((status, answer["sqlstate"]), (422, "DS422"))
        with ds.flask.connection(self.pool) as conn, conn.cursor() as cur:
            cur.execute("SELECT request FROM ds_idempotency_keys WHERE key = %s", (key,))
            stored = cur.fetchone()[0]
        self.assertEqual((stored["body_sha256"], stored["body"]), (hashlib.sha256(b"\xff\xfe").hexdigest(), None))

    def test_a_body_with_nul_is_400(self):
        status, answer, _ = send(self.base, "/order", b'{"item": "a\\u0000b"}', uid("flask-nul"))
        self.assertEqual(status, 400)
        self.assertIn("U+0000", answer["error"])
        status, _, _ = send(self.base, "/order", b'{"item": "\\ud800"}', uid("flask-surrogate"))
        self.assertEqual(status, 400)
        # "\\u0000" is a backslash and five characters; a non-JSON body is stored by its bytes
        self.assertEqual(send(self.base, "/order", b'{"item": "a\\\\u0000b"}', uid("flask-nul-not"))[0], 201)
        self.assertEqual(send(self.base, "/order", b"a\x00b", uid("flask-nul-text"), "text/plain")[0], 201)

    @unittest.skipUnless(has_renew(), NEEDS_RENEW)
    def test_a_view_longer_than_its_lease_runs_once(self):
        # a 4 s view with a 2 s lease; the client's retry at 2.8 s: without the renewals the key
        # would be free again, and the view would run twice
        key = uid("flask-slow")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(send, self.base, "/slow", b"{}", key)
            time.sleep(2.8)
            retry = pool.submit(send, self.base, "/slow", b"{}", key)
            first, retry = first.result(), retry.result()
        self.assertEqual(first, (200, {"run": 1, "lost": False}, None))
        self.assertEqual(retry, (200, {"run": 1, "lost": False}, "true"))
        self.assertEqual(self.app.calls["slow"], 1)

    @unittest.skipUnless(has_renew(), NEEDS_RENEW)
    def test_a_view_that_lost_its_lease_knows_it_and_is_409(self):
        key = uid("flask-watch")
        tokens = []
        begin = durable_steps_client.flask.idempotent_begin

        def recording(*args, **kwargs):
            began = begin(*args, **kwargs)
            tokens.append(began.token)
            return began
        with unittest.mock.patch.object(durable_steps_client.flask, "idempotent_begin", recording):
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                running = pool.submit(send, self.base, "/watch", b"{}", key, headers={"X-Wait": "20"})
                deadline = time.monotonic() + 30
                while not tokens and time.monotonic() < deadline:
                    time.sleep(0.02)
                # someone else frees the key (as an expired lease would let another request
                # take it): the next renewal finds it gone
                with ds.flask.connection(self.pool) as conn:
                    ds.idempotent_abandon(conn, "pyclient-watch", key, tokens[0])
                status, answer, _ = running.result()
        self.assertEqual((status, answer["sqlstate"]), (409, "DS409"))
        self.assertIn("lease", answer["error"])
        # nothing was stored: the client's retry runs the view again
        self.assertEqual(send(self.base, "/watch", b"{}", key), (200, {"lost": False}, None))
        self.assertEqual(self.app.calls["watch"], 2)
