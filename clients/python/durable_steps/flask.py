"""A Flask decorator that makes a view idempotent under the client's ``Idempotency-Key``.

    from durable_steps.flask import idempotent_view

    @app.post("/checkout")
    @idempotent_view(pool, "checkout")
    def checkout():
        ...                                  # flask.g.idempotency_key is the client's key
        return {"order": order_id}, 201

Over ds_idempotent_begin / ds_idempotent_finish / ds_idempotent_abandon (docs/idempotent-
requests.md, "Application code"). For a request with the header:

- the first request under a key holds it (a committed ``begin``), runs the view, stores the
  view's response with ``finish`` and answers it;
- a repeat of the same request (method, path, query and body; a JSON body compared as JSON)
  answers the stored response with ``Idempotent-Replayed: true``, without running the view;
- a repeat while the first is still running waits for its response, polling ``begin`` every
  ``poll`` seconds at most for ``wait`` seconds, then answers 409 with ``Retry-After: 1``;
- another request under the key is answered 422 (DS422);
- a view that raises abandons the key (the client's retry runs the view again) and the error
  goes on to Flask.

The view's response must be JSON (a dict or list, or a JSON ``Response``): it is stored as the
key's jsonb body. The view runs between two transactions, not inside one: what it changes
elsewhere must itself be idempotent under the key (a step keyed by it, as ``http_step`` makes),
since a process killed before ``finish`` leaves the key held until its ``lease`` runs out, and
the client's retry after that runs the view again.

``pool`` is a psycopg2 connection pool (``getconn``/``putconn``, e.g. ThreadedConnectionPool) or
a function that answers a new connection (closed after use). Each statement here is committed
at once: it works through PgBouncer in transaction mode.
"""
import contextlib
import functools
import json
import time
from typing import Any, Callable, Optional

from flask import Response, current_app, g, jsonify, make_response, request

from .calls import Interval, idempotent_abandon, idempotent_begin, idempotent_finish
from .errors import DurableStepsError, InProgress

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"


@contextlib.contextmanager
def connection(pool):
    """A connection of ``pool`` whose work is committed on leaving (rolled back on an error)."""
    borrowed = hasattr(pool, "getconn")
    conn = pool.getconn() if borrowed else pool()
    broken = False
    try:
        yield conn
        conn.commit()
    except BaseException:
        try:
            conn.rollback()
        except Exception:
            broken = True           # the connection itself failed: never hand it out again
        raise
    finally:
        if borrowed:
            pool.putconn(conn, close=broken or bool(conn.closed))
        else:
            conn.close()


def _error(e: DurableStepsError) -> Response:
    answer = jsonify(error=e.message, sqlstate=e.sqlstate)
    answer.status_code = e.http_status
    return answer


def _request_fingerprint() -> dict:
    data = request.get_data(cache=True, as_text=True)
    body: Any = data
    if request.is_json and data:
        try:
            body = json.loads(data)
        except ValueError:
            pass
    return {"method": request.method, "path": request.path,
            "query": request.query_string.decode("latin-1"), "body": body}


def _stored(status: int, body: Any) -> Response:
    answer = make_response(json.dumps(body), status)
    answer.mimetype = "application/json"
    return answer


def idempotent_view(pool, scope: str, *, required: bool = True, wait: float = 10.0,
                    poll: float = 0.05, ttl: Optional[Interval] = None,
                    lease: Optional[Interval] = None) -> Callable:
    """Decorates a Flask view: one run of it, and one stored response, per Idempotency-Key.

    ``required``: a request without the header is answered 400 (else the view just runs).
    ``wait``/``poll``: how long, and how often at most, a repeat waits for a response in flight.
    ``ttl``, ``lease``: as ds_idempotent_begin's (24 hours, 5 minutes by default).
    """
    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            key = request.headers.get(HEADER)
            if key is None:
                if required:
                    answer = jsonify(error="the %s header is required" % HEADER)
                    answer.status_code = 400
                    return answer
                return view(*args, **kwargs)
            stored = _request_fingerprint()
            deadline = time.monotonic() + wait
            pause = min(0.005, poll)
            while True:
                try:
                    with connection(pool) as conn:
                        began = idempotent_begin(conn, scope, key, stored, ttl=ttl, lease=lease)
                    break
                except InProgress as e:
                    # the first request under the key is running: its response comes with finish
                    if time.monotonic() + pause > deadline:
                        answer = _error(e)
                        answer.headers["Retry-After"] = "1"
                        return answer
                    time.sleep(pause)
                    pause = min(pause * 2, poll)
                except DurableStepsError as e:
                    return _error(e)
            if began.replay:
                answer = _stored(began.status, began.body)
                answer.headers[REPLAYED] = "true"
                return answer
            g.idempotency_key = key
            try:
                answer = make_response(view(*args, **kwargs))
                if not answer.is_json:
                    raise TypeError("an idempotent view answers JSON, not %s" % answer.mimetype)
                body = answer.get_json()
            except BaseException:
                try:
                    with connection(pool) as conn:
                        idempotent_abandon(conn, scope, key, began.token)
                except Exception:
                    # the key stays held until its lease runs out; the view's error matters more
                    current_app.logger.exception("durable_steps: could not abandon key %r", key)
                raise
            try:
                with connection(pool) as conn:
                    idempotent_finish(conn, scope, key, began.token, answer.status_code, body)
            except DurableStepsError as e:
                return _error(e)
            return answer
        return wrapper
    return decorate
