"""Typed calls of durable_steps' SQL functions over a psycopg2 connection.

Each call is one statement, ``SELECT * FROM ds_...(name => %s, ...)``: every argument, the SQL
of a step and a handler included, is a bound value that psycopg2 quotes as a literal; no value is
ever part of the statement's text, so no driver or ORM rewrites a ``$1`` or ``%s`` inside it.
Only the arguments a caller gives are passed, by name, so the extension's defaults apply to the
rest. The result's columns are read into a dataclass.

A call neither commits nor rolls back: it runs in the connection's transaction (in autocommit
mode, each call is its own transaction, as PgBouncer's transaction mode likes best). An error
from PostgreSQL is raised as the DurableStepsError subclass of its SQLSTATE.
"""
import datetime
import uuid
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import psycopg2
from psycopg2.extras import Json

from .errors import StepNotSucceeded, from_exception

Interval = Union[datetime.timedelta, int, float, str]

# the statuses after which a step never changes by itself (docs/steps.md, "Step statuses")
STEP_STOPPED = frozenset(("succeeded", "failed", "blocked", "uncertain", "cancelled"))
RUN_STOPPED = frozenset(("succeeded", "failed", "cancelled", "blocked"))


@dataclass(frozen=True)
class StepResult:
    """A row of the type ds_step_result (docs/reference.md, "The type ds_step_result")."""
    run_id: str
    step_id: str
    status: str
    result: Any
    attempt: int
    max_attempts: Optional[int]
    next_attempt_at: Optional[datetime.datetime]
    error_class: Optional[str]
    error_code: Optional[str]
    error_message: Optional[str]
    error_detail: Optional[str]
    remediation: Optional[str]
    replayed: bool

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def stopped(self) -> bool:
        """The step will not change unless someone re-arms, resolves or cancels it."""
        return self.status in STEP_STOPPED

    def unwrap(self) -> Any:
        """The result of a succeeded step; StepNotSucceeded (DS102) otherwise, as ds_unwrap."""
        if self.status != "succeeded":
            raise StepNotSucceeded("step %s/%s has not succeeded: %s%s" % (
                self.run_id, self.step_id, self.status,
                ": %s" % self.error_message if self.error_message else ""))
        return self.result


@dataclass(frozen=True)
class RunStart:
    """What ds_start_run answers."""
    run_id: str
    status: str
    created: bool


@dataclass(frozen=True)
class RunResult:
    """What ds_wait_run answers."""
    status: str
    output: Any
    error_code: Optional[str]
    error_message: Optional[str]

    @property
    def stopped(self) -> bool:
        return self.status in RUN_STOPPED


@dataclass(frozen=True)
class EventEmitted:
    """What ds_emit_event answers: ``first`` is true for the emit that recorded the event."""
    name: str
    first: bool

    def __bool__(self) -> bool:
        return self.first


@dataclass(frozen=True)
class IdempotentResponse:
    """What ds_idempotent answers: the handler's response, or the stored one (replayed)."""
    status: int
    body: Any
    replayed: bool


@dataclass(frozen=True)
class IdempotentBegin:
    """What ds_idempotent_begin answers: state 'new' (the key is held with ``token``) or
    'replay' (``status`` and ``body`` are the stored response)."""
    state: str
    status: Optional[int]
    body: Any
    token: Optional[uuid.UUID]

    @property
    def replay(self) -> bool:
        return self.state == "replay"


# (argument name, cast) -> how a Python value is bound
def _bind(value: Any, cast: str) -> Tuple[str, Any]:
    if value is None:
        return "NULL::" + cast, None
    if cast == "jsonb":
        return "%s::jsonb", Json(value)
    if cast == "interval":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = datetime.timedelta(seconds=value)
        if isinstance(value, datetime.timedelta):
            # whole microseconds, as PostgreSQL keeps them
            return "make_interval(secs => %s)", value.total_seconds()
        return "%s::interval", str(value)
    if cast == "text[]":
        # one code or class is a list of one, never the list of its characters
        return "%s::text[]", [value] if isinstance(value, str) else list(value)
    if cast == "uuid":
        return "%s::uuid", str(value)
    return "%s::" + cast, value


def _call(conn, function: str, args: Sequence[Tuple[str, str, Any, bool]]) -> List[Dict[str, Any]]:
    """Runs SELECT * FROM function(name => value, ...) and answers its rows as dicts.

    ``conn``: a connection (the call runs on a cursor of its own) or a cursor (the call runs on
    it, in its connection's transaction).

    ``args``: (name, cast, value, always); an argument that is None and not ``always`` is left
    out so that the function's default applies.
    """
    parts, params = [], []
    for name, cast, value, always in args:
        if value is None and not always:
            continue
        text, param = _bind(value, cast)
        parts.append("%s => %s" % (name, text))
        if param is not None:
            params.append(param)
    statement = "SELECT * FROM %s(%s)" % (function, ", ".join(parts))
    try:
        if _is_cursor(conn):
            return _rows(conn, statement, params)
        with conn.cursor() as cur:
            return _rows(cur, statement, params)
    except psycopg2.Error as e:
        if getattr(e, "pgcode", None) is None:
            raise           # not PostgreSQL's answer (a lost connection): psycopg2's own error
        raise from_exception(e) from e


def _is_cursor(conn_or_cursor) -> bool:
    # a DBAPI cursor (psycopg2's, e.g. the one ctx.transaction() yields) runs the call itself
    return hasattr(conn_or_cursor, "execute") and not hasattr(conn_or_cursor, "cursor")


def _rows(cur, statement: str, params: List[Any]) -> List[Dict[str, Any]]:
    cur.execute(statement, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _one(cls, rows: List[Dict[str, Any]]):
    names = [f.name for f in fields(cls)]
    return cls(**{n: rows[0].get(n) for n in names})


def run_step(conn, run_id: str, step_id: str, sql: str, input: Any = None, *,
             policy: Optional[dict] = None, timeout: Optional[Interval] = None,
             nowait: Optional[bool] = None, retry_on: Optional[Sequence[str]] = None,
             fail_on: Optional[Sequence[str]] = None, on_timeout: Optional[str] = None,
             defer: Optional[bool] = None, run_at: Optional[datetime.datetime] = None,
             notify: Optional[str] = None, on_success: Optional[str] = None,
             on_failure: Optional[str] = None, queue: Optional[str] = None,
             priority: Optional[int] = None, expect: Optional[str] = None) -> StepResult:
    """ds_run_step: the durable step ``(run_id, step_id)`` whose body is ``sql`` ($1 = input).

    ``expect='row'``: a body that returns no row fails (DS008, the step is blocked) instead of
    succeeding with None."""
    return _one(StepResult, _call(conn, "ds_run_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True),
        ("sql", "text", sql, True), ("input", "jsonb", input, False),
        ("policy", "jsonb", policy, False), ("timeout", "interval", timeout, False),
        ("nowait", "boolean", nowait, False), ("retry_on", "text[]", retry_on, False),
        ("fail_on", "text[]", fail_on, False), ("on_timeout", "text", on_timeout, False),
        ("defer", "boolean", defer, False), ("run_at", "timestamptz", run_at, False),
        ("notify", "text", notify, False), ("on_success", "text", on_success, False),
        ("on_failure", "text", on_failure, False), ("queue", "text", queue, False),
        ("priority", "integer", priority, False), ("expect", "text", expect, False)]))


def http_step(conn, run_id: str, step_id: str, request: dict, *, policy: Optional[dict] = None,
              idempotency_header: Optional[str] = None, on_success: Optional[str] = None,
              timeout: Optional[Interval] = None, nowait: Optional[bool] = None,
              run_at: Optional[datetime.datetime] = None, notify: Optional[str] = None,
              on_failure: Optional[str] = None, retry_on_status: Optional[Sequence[str]] = None,
              fail_on_status: Optional[Sequence[str]] = None) -> StepResult:
    """ds_http_step: an HTTP step, stored with the transaction and sent by the HTTP worker."""
    return _one(StepResult, _call(conn, "ds_http_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True),
        ("request", "jsonb", request, True), ("policy", "jsonb", policy, False),
        ("idempotency_header", "text", idempotency_header, False),
        ("on_success", "text", on_success, False), ("timeout", "interval", timeout, False),
        ("nowait", "boolean", nowait, False), ("run_at", "timestamptz", run_at, False),
        ("notify", "text", notify, False), ("on_failure", "text", on_failure, False),
        ("retry_on_status", "text[]", retry_on_status, False),
        ("fail_on_status", "text[]", fail_on_status, False)]))


def task_step(conn_or_cursor, run_id: str, step_id: str, task: str, input: Any = None, *,
              policy: Optional[dict] = None, queue: Optional[str] = None,
              priority: Optional[int] = None, run_at: Optional[datetime.datetime] = None,
              timeout: Optional[Interval] = None, notify: Optional[str] = None,
              on_success: Optional[str] = None, on_failure: Optional[str] = None,
              on_lost: Optional[str] = None, nowait: Optional[bool] = None,
              expect: Optional[str] = None) -> StepResult:
    """ds_task_step: the step ``(run_id, step_id)`` whose body is the application's handler of
    ``task`` (durable_steps_client.worker), stored with the transaction; a worker runs it once this
    commits. ``timeout`` is the handler's deadline per attempt; ``on_lost`` is 'retry' (a lost
    lease is a counted lost attempt) or 'uncertain'; ``expect='row'``: a handler that returns
    None blocks it (DS008). Status 'pending' until a worker ran it."""
    return _one(StepResult, _call(conn_or_cursor, "ds_task_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True),
        ("task", "text", task, True), ("input", "jsonb", input, False),
        ("policy", "jsonb", policy, False), ("queue", "text", queue, False),
        ("priority", "integer", priority, False), ("run_at", "timestamptz", run_at, False),
        ("timeout", "interval", timeout, False), ("notify", "text", notify, False),
        ("on_success", "text", on_success, False), ("on_failure", "text", on_failure, False),
        ("on_lost", "text", on_lost, False), ("nowait", "boolean", nowait, False),
        ("expect", "text", expect, False)]))


def wait_step(conn, run_id: str, step_id: str, timeout: Optional[Interval] = None) -> StepResult:
    """ds_wait_step: the step once it has stopped, or as it is when ``timeout`` passes."""
    return _one(StepResult, _call(conn, "ds_wait_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True),
        ("timeout", "interval", timeout, False)]))


def retry_step(conn, run_id: str, step_id: str, input: Any = None, *, sql: Optional[str] = None,
               request: Optional[dict] = None) -> StepResult:
    """ds_retry_step: re-arms a failed, blocked, uncertain or cancelled step."""
    return _one(StepResult, _call(conn, "ds_retry_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True),
        ("input", "jsonb", input, False), ("sql", "text", sql, False),
        ("request", "jsonb", request, False)]))


def cancel_step(conn, run_id: str, step_id: str) -> StepResult:
    """ds_cancel_step: cancels a step that has not finished."""
    return _one(StepResult, _call(conn, "ds_cancel_step", [
        ("run_id", "text", run_id, True), ("step_id", "text", step_id, True)]))


def start_run(conn, workflow: str, input: Any = None, *, run_key: Optional[str] = None,
              policy: Optional[dict] = None) -> RunStart:
    """ds_start_run: stores a run of ``workflow``; the worker starts it once this commits."""
    return _one(RunStart, _call(conn, "ds_start_run", [
        ("workflow", "text", workflow, True), ("input", "jsonb", input, False),
        ("run_key", "text", run_key, False), ("policy", "jsonb", policy, False)]))


def wait_run(conn, run_id: str, timeout: Optional[Interval] = None) -> RunResult:
    """ds_wait_run: the run once it is succeeded, failed, cancelled or blocked, or at timeout."""
    return _one(RunResult, _call(conn, "ds_wait_run", [
        ("run_id", "text", run_id, True), ("timeout", "interval", timeout, False)]))


def emit_event(conn, name: str, payload: Any = None) -> EventEmitted:
    """ds_emit_event: records event ``name`` of the current role; the first emit wins."""
    rows = _call(conn, "ds_emit_event", [("name", "text", name, True),
                                         ("payload", "jsonb", payload, False)])
    return EventEmitted(name=name, first=bool(next(iter(rows[0].values()))))


def idempotent(conn, scope: str, key: str, request: Any, handler: str, *,
               ttl: Optional[Interval] = None, wait: Optional[Interval] = None) -> IdempotentResponse:
    """ds_idempotent: runs the SQL ``handler`` ($1 = request) once per key, replays its response."""
    return _one(IdempotentResponse, _call(conn, "ds_idempotent", [
        ("scope", "text", scope, True), ("key", "text", key, True),
        ("request", "jsonb", request, True), ("handler", "text", handler, True),
        ("ttl", "interval", ttl, False), ("wait", "interval", wait, False)]))


def idempotent_begin(conn, scope: str, key: str, request: Any, *, ttl: Optional[Interval] = None,
                     lease: Optional[Interval] = None,
                     wait: Optional[Interval] = None) -> IdempotentBegin:
    """ds_idempotent_begin: holds the key for application code, or answers its stored response.
    A repeat while the key is held raises InProgress (DS409): at once, or once ``wait`` has
    passed without the holder finishing, abandoning the key or losing its lease (the wait is
    woken by that commit; it does not poll)."""
    row = _call(conn, "ds_idempotent_begin", [
        ("scope", "text", scope, True), ("key", "text", key, True),
        ("request", "jsonb", request, True), ("ttl", "interval", ttl, False),
        ("lease", "interval", lease, False), ("wait", "interval", wait, False)])[0]
    token = row.get("token")
    return IdempotentBegin(state=row["state"], status=row.get("status"), body=row.get("body"),
                           token=uuid.UUID(str(token)) if token is not None else None)


def idempotent_finish(conn, scope: str, key: str, token: Union[uuid.UUID, str], status: int,
                      body: Any) -> None:
    """ds_idempotent_finish: stores the response of a key held with ``token``."""
    _call(conn, "ds_idempotent_finish", [
        ("scope", "text", scope, True), ("key", "text", key, True), ("token", "uuid", token, True),
        ("status", "integer", status, True), ("body", "jsonb", body, True)])


def idempotent_abandon(conn, scope: str, key: str, token: Union[uuid.UUID, str]) -> None:
    """ds_idempotent_abandon: frees a held key, so that the client's retry starts afresh."""
    _call(conn, "ds_idempotent_abandon", [
        ("scope", "text", scope, True), ("key", "text", key, True), ("token", "uuid", token, True)])


def idempotent_renew(conn, scope: str, key: str, token: Union[uuid.UUID, str], *,
                     lease: Optional[Interval] = None) -> datetime.datetime:
    """ds_idempotent_renew: extends the lease of a key held with ``token`` (by ``lease``, 5
    minutes by default) while its work goes on; the lease's new end. InProgress (DS409) when
    the token no longer holds the key, StepNotFound (DS404) when the key does not exist."""
    rows = _call(conn, "ds_idempotent_renew", [
        ("scope", "text", scope, True), ("key", "text", key, True), ("token", "uuid", token, True),
        ("lease", "interval", lease, False)])
    return next(iter(rows[0].values()))
