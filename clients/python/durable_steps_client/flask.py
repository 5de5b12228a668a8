"""A Flask decorator that makes a view idempotent under the client's ``Idempotency-Key``.

    from durable_steps_client.flask import idempotent_view

    @app.post("/checkout")
    @idempotent_view(pool, "checkout")
    def checkout():
        ...     # flask.g.idempotency_key: the client's key; g.idempotency_scope: its scope
        return {"order": order_id}, 201

Over ds_idempotent_begin / ds_idempotent_renew / ds_idempotent_finish / ds_idempotent_abandon
(docs/idempotent-requests.md, "Application code"). For a request with the header:

- the key is the end user's own: the scope passed to SQL is ``scope`` with the user's identity
  (``user``; by default Flask-Login's current user, the HTTP Basic user or ``g.user``), so that
  two users of one service never share a key (``user_scope``);
- the first request under a key holds it (a committed ``begin``), runs the view, stores the
  view's response with ``finish`` and answers it. While the view runs, a thread renews the key's
  lease every third of it; a view that outlives its lease anyway (the renewals failed) learns it
  from ``g.idempotency_lease_lost`` (a ``threading.Event``), and its request is answered 409;
- a repeat of the same request (method, path, query and the body's bytes) answers the stored
  response with ``Idempotent-Replayed: true``, without running the view;
- a repeat while the first is still running waits up to ``wait`` seconds for its response
  (``begin`` with ``wait``: the first's finish wakes it, nothing polls), then answers 409 with
  ``Retry-After: 1``. The waiting request holds one of the pool's connections meanwhile: give the
  pool (and PgBouncer's pool) room for the repeats you expect and for the first's finish;
- another request under the key is answered 422 (DS422); a JSON body with the character U+0000,
  which jsonb cannot store, 400;
- a view that raises, or answers 500 or more, abandons the key (the client's retry runs the
  view again): the error goes on to Flask, the answer out as it is. The Node.js client's
  middleware without a handler does the same for a route.

The view's response must be JSON (a dict or list, or a JSON ``Response``): it is stored as the
key's jsonb body. The view runs between two transactions, not inside one: what it changes
elsewhere must itself be idempotent under the key (a step keyed by the scope and the key, as
``http_step`` makes), since a process killed before ``finish`` leaves the key held until its
``lease`` runs out, and the client's retry after that runs the view again.

``pool`` is a psycopg2 connection pool (``getconn``/``putconn``, e.g. ThreadedConnectionPool) or
a function that answers a new connection (closed after use). Each statement here is committed
at once: it works through PgBouncer in transaction mode.
"""
import contextlib
import datetime
import functools
import hashlib
import json
import re
import threading
from typing import Any, Callable, Optional
from urllib.parse import quote

from flask import Response, current_app, g, jsonify, make_response, request

from .calls import (Interval, idempotent_abandon, idempotent_begin, idempotent_finish,
                    idempotent_renew)
from .errors import DurableStepsError, InProgress, StepNotFound, UndefinedFunction

try:
    import flask_login
except ImportError:         # Flask-Login is optional: without it, no user of its own
    flask_login = None

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"

USER_MARK = ":user:"
HASHED_MARK = "sha256="
MAX_SCOPE = 255
#: the longest ``scope`` idempotent_view takes: room for ':user:sha256=<64 hex digits>'
MAX_USER_SCOPE = MAX_SCOPE - len(USER_MARK) - len(HASHED_MARK) - 64
# encodeURIComponent's unreserved characters, beside quote's own (letters, digits, "_.-~")
_UNRESERVED = "!*'()"
# the escape of U+0000 in JSON text, not preceded by a backslash of its own
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# the lease of ds_idempotent_begin and ds_idempotent_renew without one
DEFAULT_LEASE = 300.0


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


def user_scope(scope: str, user: Optional[str]) -> str:
    """The scope of ``user``'s keys under ``scope``: ``scope`` itself for no user, else
    ``<scope>:user:<user, as encodeURIComponent encodes it>``, or
    ``<scope>:user:sha256=<hex of the user's UTF-8>`` when that would be longer than 255
    characters (a user with an unpaired surrogate: of its UTF-16LE). The encoded part has no
    ':' and never starts with a raw '=', so no two (scope, user) meet, given scopes without
    ':user:'. The Node.js client's userScope answers the same."""
    if user is None:
        return scope
    try:
        part = quote(user, safe=_UNRESERVED)
    except UnicodeEncodeError:
        part = HASHED_MARK + hashlib.sha256(user.encode("utf-16-le", "surrogatepass")).hexdigest()
    if len(scope) + len(USER_MARK) + len(part) > MAX_SCOPE:
        part = HASHED_MARK + hashlib.sha256(user.encode("utf-8")).hexdigest()
    return scope + USER_MARK + part


def identity_of(user: Any) -> Optional[str]:
    """A user's identity as user_scope takes it: None, False or '' for none; a string or an
    integer as it is; an object by its ``get_id()`` (Flask-Login's), or its (or a dict's) ``id``,
    ``sub`` or ``username``. Another value is a TypeError: give idempotent_view a ``user``."""
    if user is None or user is False or user == "":
        return None
    if isinstance(user, str):
        return user
    if isinstance(user, int) and not isinstance(user, bool):
        return str(user)
    if callable(getattr(user, "get_id", None)):
        return identity_of(user.get_id())
    for name in ("id", "sub", "username"):
        value = user.get(name) if isinstance(user, dict) else getattr(user, name, None)
        if (isinstance(value, str) and value) or (isinstance(value, int) and not isinstance(value, bool)):
            return str(value)
    raise TypeError("idempotent_view: cannot tell who the user is (%s, without get_id, id, sub or "
                    "username): give idempotent_view a user=" % type(user).__name__)


def current_user_identity() -> Optional[str]:
    """The default ``user`` of idempotent_view: the authenticated user of the request.

    Flask-Login's ``current_user`` when Flask-Login is installed and set up on the app and the
    user is authenticated (by ``get_id()``); else the user name of HTTP Basic authentication
    (``request.authorization.username``); else ``g.user`` (identity_of); else None (anonymous).
    """
    if flask_login is not None and hasattr(current_app, "login_manager"):
        user = flask_login.current_user
        if user is not None and user.is_authenticated:
            return identity_of(user.get_id())
    auth = request.authorization
    if auth is not None and getattr(auth, "username", None):
        return auth.username
    return identity_of(g.get("user"))


def _check_scope(scope: Any) -> None:
    if not isinstance(scope, str) or not scope:
        raise ValueError("idempotent_view: the scope must be a non-empty string")
    if USER_MARK in scope:
        raise ValueError("idempotent_view: a scope must not contain %r (the users' part of scopes)"
                         % USER_MARK)
    if len(scope) > MAX_USER_SCOPE:
        raise ValueError("idempotent_view: a scope of at most %d characters, for the room of its users"
                         % MAX_USER_SCOPE)


def _error(e: DurableStepsError) -> Response:
    answer = jsonify(error=e.message, sqlstate=e.sqlstate)
    answer.status_code = e.http_status
    return answer


def _bad_request(message: str) -> Response:
    answer = jsonify(error=message)
    answer.status_code = 400
    return answer


def _no_constant(name: str):
    raise ValueError("%s is not JSON that jsonb holds" % name)


def _request_fingerprint() -> dict:
    """The stored request: method, path, query and the SHA-256 of the body's bytes, which make
    two requests the same or not, and the body itself for whoever reads the entry: as JSON (a
    JSON body), as text (UTF-8 without U+0000), else None."""
    data = request.get_data(cache=True)
    body: Any = None
    try:
        text: Optional[str] = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        if request.is_json:
            try:
                body = json.loads(text, parse_constant=_no_constant)
            except ValueError:
                text = text if "\0" not in text else None
                body = text
        elif "\0" not in text:
            body = text
    return {"method": request.method, "path": request.path,
            "query": request.query_string.decode("latin-1"),
            "body_sha256": hashlib.sha256(data).hexdigest(), "body": body}


def _unstorable(stored: dict) -> bool:
    """jsonb refuses U+0000 (22P05) and unpaired surrogates: the client's request is wrong."""
    text = json.dumps(stored, ensure_ascii=False)
    if _NUL_ESCAPE.search(text):
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _stored(status: int, body: Any) -> Response:
    answer = make_response(json.dumps(body), status)
    answer.mimetype = "application/json"
    return answer


class _Lease:
    """Renews a held key's lease every third of it while the view runs, in a daemon thread.
    ``lost`` is set once the key is no longer held with the token (DS409, DS404)."""

    def __init__(self, pool, scope: str, key: str, token, lease: Optional[Interval], seconds: float,
                 logger):
        self.pool, self.scope, self.key, self.token, self.lease = pool, scope, key, token, lease
        self.every = max(seconds / 3.0, 0.01)
        self.logger = logger
        self.lost = threading.Event()
        self.error: Optional[DurableStepsError] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="durable_steps lease of %s" % key)

    def __enter__(self) -> "_Lease":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                with connection(self.pool) as conn:
                    idempotent_renew(conn, self.scope, self.key, self.token, lease=self.lease)
            except (InProgress, StepNotFound) as e:
                self.error = e
                self.lost.set()
                return
            except UndefinedFunction:
                # an extension before ds_idempotent_renew: the lease runs as begin set it
                self.logger.warning("durable_steps: ds_idempotent_renew is missing: "
                                    "ALTER EXTENSION durable_steps UPDATE")
                return
            except Exception:
                # a failed renewal (a lost connection): the next one may do; the lease is long
                # enough for two more
                self.logger.exception("durable_steps: could not renew the lease of key %r", self.key)


def _seconds(pool, lease: Optional[Interval]) -> float:
    if lease is None:
        return DEFAULT_LEASE
    if isinstance(lease, datetime.timedelta):
        return lease.total_seconds()
    if isinstance(lease, (int, float)) and not isinstance(lease, bool):
        return float(lease)
    with connection(pool) as conn, conn.cursor() as cur:     # PostgreSQL's reading of the text
        cur.execute("SELECT extract(epoch FROM %s::interval)::float8", (str(lease),))
        return cur.fetchone()[0]


def idempotent_view(pool, scope: str, *, user: Optional[Callable[[], Optional[str]]] = None,
                    required: bool = True, wait: float = 10.0,
                    ttl: Optional[Interval] = None, lease: Optional[Interval] = None) -> Callable:
    """Decorates a Flask view: one run of it, and one stored response, per Idempotency-Key and
    end user.

    ``user``: a function of no arguments (in the request's context) that answers the end user's
    identity, or None for an anonymous request; ``current_user_identity`` by default. A key is
    the user's own: the scope passed to SQL is ``user_scope(scope, user())``. ``lambda: None``
    shares the keys among every user of the service.
    ``required``: a request without the header is answered 400 (else the view just runs).
    ``wait``: how long a repeat waits for a response in flight (seconds), then 409.
    ``ttl``, ``lease``: as ds_idempotent_begin's (24 hours, 5 minutes by default); the lease is
    renewed every third of it while the view runs.
    ``scope``: 1 to 178 characters (the rest is the users' room), without ':user:'.
    """
    _check_scope(scope)
    who = user if user is not None else current_user_identity
    lease_seconds: list = []        # the lease in seconds, read once

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            key = request.headers.get(HEADER)
            if key is None:
                if required:
                    return _bad_request("the %s header is required" % HEADER)
                return view(*args, **kwargs)
            if "\0" in key:
                return _bad_request("the %s header has the character U+0000" % HEADER)
            identity = identity_of(who())
            scoped = user_scope(scope, identity)
            stored = _request_fingerprint()
            if _unstorable(stored):
                return _bad_request("the request has the character U+0000 (\\u0000) or an "
                                    "unpaired surrogate, which cannot be stored")
            if not lease_seconds:
                lease_seconds.append(_seconds(pool, lease))
            try:
                with connection(pool) as conn:
                    began = idempotent_begin(conn, scoped, key, stored, ttl=ttl, lease=lease,
                                             wait=datetime.timedelta(seconds=wait))
            except InProgress as e:
                # the first request under the key still runs after the wait
                answer = _error(e)
                answer.headers["Retry-After"] = "1"
                return answer
            except DurableStepsError as e:
                return _error(e)
            if began.replay:
                answer = _stored(began.status, began.body)
                answer.headers[REPLAYED] = "true"
                return answer
            g.idempotency_key = key
            g.idempotency_user = identity
            g.idempotency_scope = scoped
            held = _Lease(pool, scoped, key, began.token, lease, lease_seconds[0], current_app.logger)
            g.idempotency_lease_lost = held.lost
            def abandon():
                if not held.lost.is_set():
                    try:
                        with connection(pool) as conn:
                            idempotent_abandon(conn, scoped, key, began.token)
                    except Exception:
                        # the key stays held until its lease runs out; the view's error matters more
                        current_app.logger.exception("durable_steps: could not abandon key %r", key)

            try:
                with held:
                    answer = make_response(view(*args, **kwargs))
                if answer.status_code < 500 and not answer.is_json:
                    raise TypeError("an idempotent view answers JSON, not %s" % answer.mimetype)
            except BaseException:
                abandon()
                raise
            if answer.status_code >= 500:
                abandon()
                return answer
            body = answer.get_json()
            if held.lost.is_set():
                # another request may hold the key now, and run the view again: this one's
                # response is not the key's
                current_app.logger.warning("durable_steps: key %r lost its lease while the view ran", key)
                answer = _error(InProgress(
                    "the key's lease ran out while the request ran (%s): its response is not "
                    "stored" % (held.error.message if held.error else "lost")))
                answer.headers["Retry-After"] = "1"
                return answer
            try:
                with connection(pool) as conn:
                    idempotent_finish(conn, scoped, key, began.token, answer.status_code, body)
            except DurableStepsError as e:
                return _error(e)
            return answer
        return wrapper
    return decorate
