"""The receipts' worker of the checkout example: runs the task 'send-receipt' that the checkout
stores with each order (ds_task_step in shop.py's handler), in a process of its own, and the
order's fulfilment, the workflow `fulfil` that the same handler starts.

For each receipt it POSTs the message to the mail service with the step's idempotency key (the
same for every attempt: a retry after a crash is answered from the mail service's record, not
sent again), then records it in `receipts` inside ctx.transaction(): the row and the step's
outcome commit together, or neither does.

It is the deployment's second process, beside the web server (a Procfile's `worker:` line, a
second systemd unit or container), not a thread of Flask's: README.md says why. SIGTERM or
SIGINT stops it gracefully (the client's Worker.run() handles them): no more claims, the
receipts being sent finish within 10 s, claims not started are given back uncounted.

The fulfilment (docs/app-workflows.md) waits for the order to ship (the event shipped:<order>,
which shop.py's webhook emits), records the shipment in `shipments` in its step's own transaction
(the row commits with the step's record, or neither does), then mails a shipping notice under
the step's idempotency key. A worker killed anywhere in it leaves nothing done twice: the next
one replays what was recorded and goes on. shop.py declares it (ds_define_workflow) with its
schema; this worker does not declare it again.

Run: PYTHONPATH=../../clients/python DATABASE_URL=postgresql://app@127.0.0.1:6432/shop \\
         MAIL_URL='http://127.0.0.1:8000/mail/{order}' python3 receipts.py
TASK_LEASE sets the worker's lease in seconds (30 by default).
"""
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request

import psycopg2
from sqlalchemy.engine import make_url

import durable_steps_client as ds


def connector(database_url):
    """The DATABASE_URL of the web process (SQLAlchemy's) as a function that opens a psycopg2
    connection: the worker opens and closes its own, in autocommit and in transactions."""
    url = make_url(database_url)
    args = url.translate_connect_args(username="user", database="dbname")
    args.update(url.query)              # host=/socket/dir, port=..., sslmode=...
    return lambda: psycopg2.connect(**args)


def send_mail(mail_url, tag, message, key):
    """POSTs `message` to the mail service under idempotency key `key`; its answer."""
    req = urllib.request.Request(
        mail_url.replace("{order}", urllib.parse.quote(tag, safe="")),
        data=json.dumps(message).encode(), method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.load(r)


def fulfilment(mail_url):
    """The workflow `fulfil`: the order's shipment, then its notice."""
    @ds.workflow("fulfil")
    def fulfil(ctx, input):
        shipped = ctx.wait_for_event("shipped", "shipped:" + input["order"], timeout=30 * 86400)

        def record_shipment(s):
            s.cursor.execute("INSERT INTO shipments (order_id, carrier, idempotency_key) "
                             "VALUES (%s, %s, %s)",
                             (input["order"], shipped["carrier"], s.idempotency_key))
        ctx.step("record-shipment", record_shipment, transaction=True)
        notice = ctx.step("notify", lambda s: {"message_id": send_mail(
            mail_url, input["order"] + ":shipped",
            {"to": input["to"], "subject": "Your order %s shipped" % input["order"],
             "order": input["order"], "carrier": shipped["carrier"]},
            s.idempotency_key)["message_id"]},
            retry={"max_attempts": 10, "initial_ms": 1000})
        return {"carrier": shipped["carrier"], "notice": notice}
    return fulfil


def make_worker(database_url, mail_url, lease=30.0):
    # 5 handlers at once: each holds a connection while it records its outcome
    worker = ds.Worker(connector(database_url), concurrency=5, lease=lease,
                       workflows=[fulfilment(mail_url)], define_workflows=False)

    @worker.task("send-receipt")
    def send_receipt(input, ctx):
        message = {"to": input["to"], "subject": "Your order %s" % input["order"],
                   "order": input["order"], "item": input["item"], "amount": input["amount"]}
        req = urllib.request.Request(
            mail_url.replace("{order}", urllib.parse.quote(input["order"], safe="")),
            data=json.dumps(message).encode(), method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key})
        try:
            # a thread cannot be interrupted: the timeout bounds the attempt (well within the
            # lease, which the worker's heartbeats keep meanwhile)
            with urllib.request.urlopen(req, timeout=20) as r:
                sent = json.load(r)
        except urllib.error.HTTPError as e:
            if e.code in (429, 503):
                after = e.headers.get("Retry-After", "")
                raise ds.RetryAfterError("the mail service answered %d" % e.code,
                                         float(after) if after.isdigit() else 5.0)
            if 400 <= e.code < 500:
                # the message itself is refused: retrying would not help
                raise ds.NonRetriableError("the mail service refused the receipt: %d %s"
                                           % (e.code, e.read()[:200].decode("utf-8", "replace")))
            raise                           # retried by the step's policy
        # sent: record it with the step's outcome (refused, and rolled back, if the lease is gone)
        with ctx.transaction() as cur:
            cur.execute("INSERT INTO receipts (order_id, sent_to, message_id, idempotency_key) "
                        "VALUES (%s, %s, %s, %s)",
                        (input["order"], input["to"], sent["message_id"], ctx.idempotency_key))
            # the step's result, recorded in this transaction with the row
            return {"message_id": sent["message_id"], "to": input["to"]}

    return worker


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    make_worker(os.environ["DATABASE_URL"], os.environ["MAIL_URL"],
                lease=float(os.environ.get("TASK_LEASE", "30"))).run()
