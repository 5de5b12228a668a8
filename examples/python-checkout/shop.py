"""The checkout service of the example: POST /checkout with an Idempotency-Key header.

Flask over SQLAlchemy (Core) and psycopg2, all from Debian's packages. One request:

1. ds_idempotent() stores, under the client's key, the request and the response of a handler
   that creates the charge as an HTTP step (ds_http_step): the response (202, the order) commits
   with the step, and a repeat of the request replays it without running the handler again. A
   repeat while the first is in flight waits for it (wait => 10 s); another request under the
   key is refused (DS422 -> 422).
2. ds_wait_step() waits, in one statement, for the charge's outcome: no LISTEN (which a
   transaction-mode PgBouncer cannot carry), no polling loop.

The same handler stores the order's receipt as a task (ds_task_step), with the order's
transaction (the outbox); receipts.py, the worker process of the deployment, sends it. It also
starts the order's fulfilment, the workflow `fulfil` written in Python (receipts.py runs it,
docs/app-workflows.md), which waits for the carrier's webhook: POST /orders/<order>/shipped
emits the event `shipped:<order>`.

The calls go through the Python client of durable_steps (clients/python, the package
durable_steps_client) on the DBAPI connection under SQLAlchemy's: it passes every SQL text -- the
handler here -- as a bound value, never spliced into a statement (SQLAlchemy's text() rewrites
`:name` and psycopg2 rewrites `%s`, so the handler's own `$1` must reach durable_steps
untouched), reads the results into dataclasses, and raises the exception class of each
documented SQLSTATE (durable_steps_client.Conflict for DS422, ...), which carries its HTTP status.

Run: PYTHONPATH=../../clients/python DATABASE_URL=postgresql://app@127.0.0.1:6432/shop \
         CHARGE_URL='http://127.0.0.1:8000/charge/{key}' python3 shop.py 5000
and the receipts' worker beside it: python3 receipts.py (README.md).
"""
import os
import sys

from flask import Flask, jsonify, request
from sqlalchemy import create_engine, text

import durable_steps_client as ds

# The handler ds_idempotent runs once per key: one statement, $1 the stored request. It creates
# the charge as an HTTP step whose run_id is the checkout's key, and the receipt as a task of the
# same run (stored with the order's transaction, or not at all), starts the order's fulfilment
# (the workflow `fulfil`, run key fulfil:<key>), and answers 202 with the order.
HANDLER = """
SELECT 202, jsonb_build_object('order', s.run_id)
  FROM ds_http_step('checkout:' || ($1->>'idempotency_key'), 'charge',
                    jsonb_build_object(
                        'method', 'POST',
                        'url', replace((SELECT value FROM shop_config WHERE name = 'charge_url'),
                                       '{key}', $1->>'idempotency_key'),
                        'headers', jsonb_build_object('Content-Type', 'application/json'),
                        'body', ($1->'body')::text),
                    policy => '{"max_attempts": 5, "initial_delay": "100 ms"}') s,
       ds_task_step('checkout:' || ($1->>'idempotency_key'), 'receipt', 'send-receipt',
                    jsonb_build_object(
                        'order', 'checkout:' || ($1->>'idempotency_key'),
                        'to', $1->'body'->>'email',
                        'item', $1->'body'->'item',
                        'amount', $1->'body'->'amount'),
                    policy => '{"max_attempts": 10, "initial_delay": "1 s"}') r,
       ds_start_run('fulfil',
                    jsonb_build_object('order', 'checkout:' || ($1->>'idempotency_key'),
                                       'to', $1->'body'->>'email'),
                    run_key => 'fulfil:' || ($1->>'idempotency_key')) f
"""

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS shop_config (name text PRIMARY KEY, value text NOT NULL)",
    # the receipts sent, each written by the task's handler with the step's outcome (receipts.py)
    "CREATE TABLE IF NOT EXISTS receipts (order_id text PRIMARY KEY, sent_to text NOT NULL, "
    "message_id text NOT NULL, idempotency_key text NOT NULL, "
    "sent_at timestamptz NOT NULL DEFAULT now())",
    # the shipments, each written by the fulfilment's step with its record (receipts.py)
    "CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY, carrier text NOT NULL, "
    "idempotency_key text NOT NULL, shipped_at timestamptz NOT NULL DEFAULT now())",
    # the application workflow the handler starts: declared here, with the schema, so that it
    # exists before the first order whichever process starts first (receipts.py runs it)
    "SELECT ds_define_workflow('fulfil')",
]


def make_app(database_url, charge_url):
    # behind PgBouncer in transaction mode every statement here is its own transaction, and
    # psycopg2 prepares nothing by name: nothing is left on a server connection for another client
    engine = create_engine(database_url, pool_size=30, max_overflow=10, pool_pre_ping=True,
                           isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        for statement in SCHEMA:
            c.execute(text(statement))
        c.execute(text("INSERT INTO shop_config VALUES ('charge_url', :url) "
                       "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"), {"url": charge_url})

    app = Flask(__name__)

    @app.errorhandler(ds.DurableStepsError)
    def durable_steps_error(e):
        return jsonify(error=e.message, sqlstate=e.sqlstate), e.http_status

    @app.post("/checkout")
    def checkout():
        key = request.headers.get("Idempotency-Key", "")
        if not 1 <= len(key) <= 200:
            return jsonify(error="an Idempotency-Key header of 1 to 200 characters is required"), 400
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            return jsonify(error="a JSON object is required"), 400
        if not isinstance(body.get("email"), str) or "@" not in body["email"]:
            return jsonify(error="an email address to send the receipt to is required"), 400
        stored = {"idempotency_key": key, "body": body}
        # the DBAPI (psycopg2) connection under SQLAlchemy's, in autocommit: each call is a
        # transaction; a durable_steps error is raised as its class (the handler above answers it)
        with engine.connect() as c:
            order = ds.idempotent(c.connection, "checkout", key, stored, HANDLER, wait="10 s")
            run_id = order.body["order"]
            charge = ds.wait_step(c.connection, run_id, "charge", "10 s")
        headers = {"Idempotent-Replayed": "true"} if order.replayed else {}
        if charge.status == "succeeded":
            return jsonify(order=run_id, charged=charge.result["body"]), 201, headers
        if charge.stopped:          # failed, blocked, uncertain or cancelled
            return jsonify(order=run_id, status=charge.status, error=charge.error_message), 402, headers
        # still being charged: the client asks again with the same key
        return jsonify(order=run_id, status=charge.status), 202, headers

    @app.post("/orders/<order>/shipped")
    def shipped(order):
        # the carrier's webhook: the first emit wins, a repeat changes nothing
        body = request.get_json(silent=True)
        carrier = body.get("carrier") if isinstance(body, dict) else None
        if not isinstance(carrier, str) or not carrier:
            return jsonify(error="a carrier is required"), 400
        with engine.connect() as c:
            emitted = ds.emit_event(c.connection, "shipped:" + order, {"carrier": carrier})
        return jsonify(order=order, first=emitted.first), 202 if emitted.first else 200

    return app


def create_app():
    """The app of DATABASE_URL and CHARGE_URL, for a WSGI server (gunicorn 'shop:create_app()')
    or `flask --app shop run`."""
    return make_app(os.environ["DATABASE_URL"], os.environ["CHARGE_URL"])


if __name__ == "__main__":
    port = int(sys.argv[1])
    app = create_app()
    app.run(host="127.0.0.1", port=port, threaded=True)
