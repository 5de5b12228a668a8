"""Application workflows (docs/app-workflows.md): a workflow written in Python, run by the Worker
on the engine's runs.

    @workflow("checkout", retry={"max_attempts": 5})
    def checkout(ctx, input):
        ctx.sql("reserve", "UPDATE stock SET qty = qty - 1 WHERE sku = $1->>'sku' RETURNING qty", input)
        charge = ctx.step("charge", lambda s: payments.charge(input, idempotency_key=s.idempotency_key),
                          retry={"max_attempts": 3}, timeout=10.0)
        shipped = ctx.wait_for_event("shipped", "shipped:%s" % input["order"], timeout=7 * 86400)
        ctx.sleep("cool-off", 60)
        if ctx.patched("receipt-v2"):
            ctx.step("receipt", lambda s: send_receipt(input))
        return {"charge": charge, "shipped": shipped}

    worker = Worker(dsn, workflows=[checkout])
    worker.run()

Each *segment* of a run is one attempt of task ``ds.workflow:<name>``, run by the Worker in one of
its threads; its steps are tasks ``ds.step:<name>`` of the same run whose attempts the segment
claims itself (``ds_claim_task``), under its own lease. A segment reads the run's recorded steps
in one query, replays them, runs each new step and records it as it completes, and goes on until
the workflow returns (the run's output) or must sleep or wait for an event: the run then waits in
the engine, and the next segment replays from the start. The same protocol as the Node client's
(clients/node/src/workflow.ts).
"""
import contextlib
import datetime
import json
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import psycopg2
from psycopg2.extras import Json, RealDictCursor

from .errors import (BlockedError, EventTimeout, LeaseLost, NonRetriableError, RetryAfterError,
                     TaskError, from_exception)

__all__ = ["workflow", "Workflow", "WorkflowContext", "StepContext", "StepFailed",
           "WorkflowMismatch"]

MAX_NAME = 63
WAIT_IN_SEGMENT = 30.0          # a retry or a lease held elsewhere shorter than this is waited out
MAX_DAYS = 366


class StepFailed(NonRetriableError):
    """A step that failed for good, raised into the workflow at the step's call. Caught, the
    workflow goes on; uncaught, the run fails (it is non-retriable)."""

    def __init__(self, step_id: str, status: str, error_code: Optional[str], message: str):
        super().__init__("step %s %s%s: %s" % (step_id, status,
                                                " (%s)" % error_code if error_code else "",
                                                message))
        self.step_id, self.status, self.error_code = step_id, status, error_code


class WorkflowMismatch(NonRetriableError):
    """The run's recorded history no longer matches the code: never silently."""


class _Suspended(BaseException):
    """Raised through the workflow's code where its segment ends; a BaseException, so that an
    ``except Exception`` in the workflow does not swallow it."""

    def __init__(self, answer: Dict[str, Any]):
        super().__init__("the workflow waits: this segment ends here")
        self.answer = answer


def retry_policy(retry: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The engine's policy for the seed's names (max_attempts, initial_ms, max_ms, multiplier)."""
    if retry is None:
        return None
    known = {"max_attempts": "max_attempts", "initial_ms": "initial_delay",
             "max_ms": "max_delay", "multiplier": "multiplier"}
    out: Dict[str, Any] = {}
    for key, value in retry.items():
        if key not in known:
            raise ValueError("retry has no option %s (it has %s)" % (key, ", ".join(known)))
        if key == "max_attempts":
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
                raise ValueError("retry max_attempts must be an integer from 1 to 1000, not %r"
                                 % (value,))
        elif key == "multiplier":
            if not isinstance(value, (int, float)) or not 1 <= value <= 100:
                raise ValueError("retry multiplier must be a number from 1 to 100, not %r" % (value,))
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or \
                not 0 <= value <= 86400000 * MAX_DAYS:
            raise ValueError("retry %s must be a number of milliseconds, not %r" % (key, value))
        out[known[key]] = value
    return out


def _check_id(what: str, value: Any) -> None:
    if not isinstance(value, str) or not value or len(value.encode()) > 200 or \
            value.startswith("ds."):
        raise ValueError("%s must be a string of 1 to 200 bytes that does not start with "
                         "\"ds.\", not %r" % (what, value))


def _check_seconds(what: str, value: Any, minimum: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not minimum <= value <= 86400 * MAX_DAYS:
        raise ValueError("%s must be a number of seconds from %s, not %r" % (what, minimum, value))
    return float(value)


class Workflow:
    """A workflow definition (``@workflow(name)``), for ``Worker(workflows=[...])``."""

    def __init__(self, name: str, fn: Callable[["WorkflowContext", Any], Any],
                 retry: Optional[Mapping[str, Any]] = None):
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME:
            raise ValueError("a workflow name must be a string of 1 to %d bytes" % MAX_NAME)
        if not callable(fn):
            raise TypeError("a workflow is a function (ctx, input)")
        self.name = name
        self.task_name = "ds.workflow:" + name
        self.step_task_name = "ds.step:" + name
        self.policy = retry_policy(retry)
        self.fn = fn

    def __call__(self, ctx: "WorkflowContext", input: Any) -> Any:
        return self.fn(ctx, input)


def workflow(name: str, *, retry: Optional[Mapping[str, Any]] = None
             ) -> Callable[[Callable[["WorkflowContext", Any], Any]], Workflow]:
    """The decorator ``@workflow('checkout')``: the function becomes a Workflow."""
    def decorate(fn: Callable[["WorkflowContext", Any], Any]) -> Workflow:
        return Workflow(name, fn, retry)
    return decorate


class StepContext:
    """What a step's function gets, once per attempt. ``cancelled`` (a threading.Event) is set
    at the step's timeout, when the run is cancelled, when a lease is lost; ``cursor`` is the
    transaction's cursor of a ``transaction=True`` step (None otherwise)."""

    def __init__(self, row: Mapping[str, Any], step_id: str, cancelled: threading.Event,
                 cursor: Any):
        self.step_id = step_id
        self.attempt: int = row["attempt"]
        self.max_attempts: int = row["max_attempts"]
        self.idempotency_key: str = row["idempotency_key"]
        self.attempt_key: str = row["attempt_key"]
        self.cancelled = cancelled
        self.cursor = cursor


class _Segment:
    def __init__(self, wf: Workflow, worker: Any, task_ctx: Any, conn: Any,
                 history: Dict[str, Dict[str, Any]], segment: int):
        self.wf, self.worker, self.task, self.conn = wf, worker, task_ctx, conn
        self.history = history
        self.segment = segment
        self.seq = 0
        self.used: set = set()
        self.suspension: Optional[Dict[str, Any]] = None

    def query(self, statement: str, params: tuple) -> Dict[str, Any]:
        with self.conn.cursor(cursor_factory=RealDictCursor) as cur:
            cur.execute(statement, params)
            return cur.fetchone() if cur.description else {}

    def enter(self, step_id: str, what: str) -> None:
        if self.suspension is not None:
            raise _Suspended(self.suspension)
        if self.task.cancelled.is_set():
            raise LeaseLost("the segment was stopped (%s)" % self.task.cancel_reason)
        _check_id("%s's id" % what, step_id)
        if step_id in self.used:
            raise WorkflowMismatch("step id %s is used twice in workflow %s: each step, sleep and "
                                   "event wait needs an id of its own" % (step_id, self.wf.name))
        self.used.add(step_id)
        # a call the run never made, while it recorded calls this execution has not reached:
        # the history went past this point under other code
        ahead = [] if step_id in self.history else self.unreplayed()
        if ahead:
            raise WorkflowMismatch("workflow %s reaches a new call %s where run %s recorded %s "
                                   "after it: its code changed under a run in flight; put the "
                                   "change behind ctx.patched()"
                                   % (self.wf.name, step_id, self.task.run_id, ", ".join(ahead)))

    def unreplayed(self) -> list:
        """The calls the run recorded that this execution has not reached yet."""
        return [k for k in self.history if not k.startswith("ds.") and k not in self.used]

    def recorded_as(self, step_id: str, kind: str, call: str) -> Optional[Dict[str, Any]]:
        """The step recorded under `step_id`, which must be of `kind` (WorkflowMismatch
        otherwise); None when nothing is recorded."""
        recorded = self.history.get(step_id)
        if recorded is not None and recorded["kind"] != kind:
            raise WorkflowMismatch("workflow %s calls %s where run %s recorded a %s step of that id: "
                                   "its code changed under a run in flight; put the change behind "
                                   "ctx.patched()" % (self.wf.name, call, self.task.run_id,
                                                      recorded["kind"]))
        return recorded

    def suspend(self, answer: Dict[str, Any]) -> None:
        self.suspension = answer
        raise _Suspended(answer)

    def failed(self, row: Mapping[str, Any], step_id: str) -> StepFailed:
        return StepFailed(step_id, row["status"], row.get("error_code"),
                          row.get("error_message") or "")

    def claim(self, step_id: str, create: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """ds_claim_task on the step; with ``create``, the step is stored first (ds_task_step,
        which answers a step that exists as it stands) in the same statement: one commit."""
        lease = datetime.timedelta(seconds=self.worker.lease)
        if create is None:
            return self.query(
                "SELECT c.*, clock_timestamp() AS now "
                "FROM ds_claim_task(%s, %s, %s::interval, %s) AS c",
                (self.task.token, step_id, lease, self.worker.name))
        # the claim names the stored step's id: it runs after the store
        return self.query(
            "SELECT c.*, clock_timestamp() AS now "
            "FROM ds_task_step(%s, %s, %s, %s, %s, timeout => %s::interval) AS s, "
            "LATERAL ds_claim_task(%s, s.step_id, %s::interval, %s) AS c",
            (self.task.run_id, step_id, self.wf.step_task_name, Json(create["input"]),
             None if create["policy"] is None else Json(create["policy"]), create["timeout"],
             self.task.token, lease, self.worker.name))

    def settle(self, step_id: str, row: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """A claim's answer without a token: the value (in a dict), a raise, a wait here, or the
        segment's end."""
        status = row["status"]
        if status == "succeeded":
            return {"value": row["result"]}
        if status in ("failed", "cancelled", "blocked", "uncertain"):
            raise self.failed(row, step_id)
        until = row.get("lease_expires_at") if status == "running" else row.get("next_attempt_at")
        wait = 1.0 if until is None else (until - row["now"]).total_seconds()
        if wait <= WAIT_IN_SEGMENT:
            if self.task.cancelled.wait(max(wait, 0.0) + 0.005):
                raise LeaseLost("the segment was stopped (%s)" % self.task.cancel_reason)
            return None
        self.suspend({"then": "sleep",
                      "step": "ds.wait:%s:%d:%d" % (step_id, row["attempt"], self.segment),
                      "ms": int(wait * 1000) + 1})
        return None

    # -- the calls of the workflow --------------------------------------------------------------

    def step(self, step_id: str, fn: Callable[[StepContext], Any], *,
             retry: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None,
             transaction: bool = False) -> Any:
        self.enter(step_id, "a step")
        if not callable(fn):
            raise TypeError("step %s: fn must be a function of the step's context" % step_id)
        if timeout is not None:
            timeout = _check_seconds("timeout", timeout, 0.001)
        policy = retry_policy(retry)
        self.seq += 1
        seq = self.seq
        recorded = self.history.get(step_id)
        if recorded is not None:
            if recorded["kind"] != "task" or recorded["seq"] is None:
                raise WorkflowMismatch(
                    "workflow %s calls ctx.step(%r) where run %s recorded a %s step of that id: its "
                    "code changed under a run in flight; put the change behind ctx.patched()"
                    % (self.wf.name, step_id, self.task.run_id, recorded["kind"]))
            if recorded["seq"] != seq:
                raise WorkflowMismatch(
                    "workflow %s reaches step %s as its step %d, but run %s recorded it as step %d: "
                    "its code changed under a run in flight; put the change behind ctx.patched()"
                    % (self.wf.name, step_id, seq, self.task.run_id, recorded["seq"]))
            if recorded["status"] == "succeeded":
                return recorded["result"]
            if recorded["status"] in ("failed", "cancelled"):
                raise self.failed(recorded, step_id)
        row: Optional[Dict[str, Any]] = None
        if recorded is None:
            row = self.claim(step_id, {
                "input": {"seq": seq}, "policy": policy,
                "timeout": None if timeout is None else datetime.timedelta(seconds=timeout)})
        while True:
            if row is None:
                row = self.claim(step_id)
            if row["token"] is not None:
                done = self.attempt(step_id, row, fn, transaction)
                if done is not None:
                    return done["value"]
            else:
                settled = self.settle(step_id, row)
                if settled is not None:
                    return settled["value"]
            row = None

    def attempt(self, step_id: str, row: Mapping[str, Any], fn: Callable[[StepContext], Any],
                transaction: bool) -> Optional[Dict[str, Any]]:
        """One attempt: fn under the step's lease (a heartbeat thread), its outcome recorded."""
        token = row["token"]
        cancelled = threading.Event()
        stop = threading.Event()

        def beat() -> None:
            # the step's lease is kept for as long as fn runs, whatever tells fn to give up: a
            # lease let go while fn still runs would let the next segment run the step beside it
            conn = None
            try:
                conn = self.worker._autocommit()
                deadline = None if row["deadline"] is None else \
                    time.monotonic() + (row["deadline"] - row["now"]).total_seconds()
                while not stop.wait(min(self.worker.heartbeat, 1.0)):
                    if self.task.cancelled.is_set() or \
                            (deadline is not None and time.monotonic() >= deadline):
                        cancelled.set()
                    with conn.cursor() as cur:
                        cur.execute("SELECT held FROM ds_heartbeat(%s, %s::interval)",
                                    (token, datetime.timedelta(seconds=self.worker.lease)))
                        if not cur.fetchone()[0]:
                            cancelled.set()
            except Exception:
                cancelled.set()
            finally:
                if conn is not None:
                    conn.close()

        beater = threading.Thread(target=beat, daemon=True, name="durable_steps step heartbeat")
        beater.start()
        tx = None
        failure: BaseException
        try:
            try:
                if transaction:
                    tx = self.worker._connect()
                    tx.autocommit = False
                    with tx.cursor(cursor_factory=RealDictCursor) as cur:
                        value = fn(StepContext(row, step_id, cancelled, cur))
                        text = _serialized(value)
                        cur.execute("SELECT 1 FROM ds_complete_task(%s, %s::jsonb)", (token, text))
                    tx.commit()
                else:
                    value = fn(StepContext(row, step_id, cancelled, None))
                    text = _serialized(value)
                    self.query("SELECT 1 FROM ds_complete_task(%s, %s::jsonb)", (token, text))
                return {"value": json.loads(text)}
            except psycopg2.Error as e:
                error: BaseException = from_exception(e) if getattr(e, "pgcode", None) else e
                if self.task.cancelled.is_set():
                    raise error
                if isinstance(error, LeaseLost):
                    return None         # the step's lease was gone: nothing recorded, its state decides
                failure = error
            except _Suspended:
                raise
            except BaseException as e:  # noqa: B902 -- a step's SystemExit fails it too
                if self.task.cancelled.is_set():
                    raise
                failure = e
        finally:
            # the step's transaction ends before its failure is recorded: the failure waits for
            # the step's lock, which that transaction may hold
            if tx is not None:
                try:
                    tx.rollback()
                except Exception:
                    pass
                tx.close()
            stop.set()
            beater.join()
        self.fail(token, failure)
        return None

    def fail(self, token: str, e: BaseException) -> None:
        klass, retry_after, remediation, detail = "retryable", None, None, None
        if isinstance(e, TaskError):
            code, message, klass = e.code, e.message, e.failure_class
            if isinstance(e, RetryAfterError):
                retry_after = datetime.timedelta(seconds=min(max(e.delay_seconds, 0.0), 86400.0))
            if isinstance(e, BlockedError):
                # a blocked step of an application workflow fails it (docs/app-workflows.md)
                klass, remediation = "permanent", None
        else:
            code = type(e).__name__
            message = str(e) or code
            detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-8000:]
        if isinstance(e, _Unserializable):
            klass = "permanent"     # a result that is not JSON fails the same way every time
        try:
            self.query("SELECT 1 FROM ds_fail_task(%s, %s, %s, %s, %s, %s::interval, %s)",
                       (token, code[:64], message[:8000], detail, klass, retry_after, remediation))
        except psycopg2.Error as refused:
            # the lease was gone (its deadline, a cancellation, a lost lease): the step's state,
            # recorded by whoever ended the attempt, decides
            if getattr(refused, "pgcode", None) != "DS410":
                raise

    def fenced_sql(self, step_id: str, sql: str, input: Any, policy: Optional[Dict[str, Any]],
                   timeout: Optional[float]) -> Dict[str, Any]:
        """ds_run_step on the run, in a transaction that first holds the segment's lease (a
        heartbeat, whose lock on the segment lasts to the commit): a segment whose lease is gone,
        or whose run was cancelled, runs no SQL step, and a cancellation waits for the step."""
        with self.conn.cursor(cursor_factory=RealDictCursor) as cur:
            cur.execute("BEGIN")
            try:
                cur.execute("SELECT held FROM ds_heartbeat(%s, %s::interval)",
                            (self.task.token, datetime.timedelta(seconds=self.worker.lease)))
                if not cur.fetchone()["held"]:
                    raise LeaseLost("segment %s of run %s no longer holds its lease: SQL step %s "
                                    "does not start" % (self.task.step_id, self.task.run_id, step_id))
                cur.execute(
                    "SELECT r.status, r.result, r.attempt, r.next_attempt_at, r.error_code, "
                    "r.error_message, NULL::timestamptz AS lease_expires_at, "
                    "clock_timestamp() AS now "
                    "FROM ds_run_step(%s, %s, %s, %s, %s, %s::interval) AS r",
                    (self.task.run_id, step_id, sql, None if input is None else Json(input),
                     None if policy is None else Json(policy),
                     None if timeout is None else datetime.timedelta(seconds=timeout)))
                row = cur.fetchone()
                cur.execute("COMMIT")
                return row
            except BaseException:
                if not self.conn.closed:
                    cur.execute("ROLLBACK")
                raise

    def sql(self, step_id: str, sql: str, input: Any = None, *,
            retry: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None) -> Any:
        self.enter(step_id, "a SQL step")
        recorded = self.recorded_as(step_id, "sql", "ctx.sql(%r)" % step_id)
        if recorded is not None and recorded["status"] == "succeeded":
            return recorded["result"]
        if recorded is not None and recorded["status"] in ("failed", "cancelled"):
            raise self.failed(recorded, step_id)
        policy = retry_policy(retry)
        if timeout is not None:
            timeout = _check_seconds("timeout", timeout, 0.001)
        while True:
            row = self.fenced_sql(step_id, sql, input, policy, timeout)
            if row["status"] == "running":       # run by another session now: look again soon
                row = dict(row, status="retrying",
                           next_attempt_at=row["now"] + datetime.timedelta(milliseconds=50))
            settled = self.settle(step_id, row)
            if settled is not None:
                return settled["value"]

    def waited_for(self, step_id: str, recorded: Optional[Dict[str, Any]],
                   answer: Dict[str, Any]) -> Any:
        """An HTTP step or a task that the run waits for in the engine: its result, or its
        failure; the segment ends here while it has neither."""
        if recorded is not None and recorded["status"] == "succeeded":
            return recorded["result"]
        if recorded is not None and recorded["status"] in ("failed", "cancelled", "blocked",
                                                             "uncertain"):
            raise self.failed(recorded, step_id)
        self.suspend(answer)

    def http(self, step_id: str, request: Mapping[str, Any], *,
             retry: Optional[Mapping[str, Any]] = None, idempotency_header: str = "Idempotency-Key",
             timeout: Optional[float] = None) -> Any:
        self.enter(step_id, "an HTTP step")
        if not isinstance(request, Mapping):
            raise TypeError("HTTP step %s: the request is a dict ({method, url, ...})" % step_id)
        answer: Dict[str, Any] = {"then": "http", "step": step_id, "request": dict(request),
                                  "policy": retry_policy(retry),
                                  "idempotency_header": idempotency_header}
        if timeout is not None:
            answer["timeout_ms"] = int(_check_seconds("HTTP step %s: timeout" % step_id, timeout,
                                                      0.001) * 1000 + 0.999)
        return self.waited_for(step_id, self.recorded_as(step_id, "http", "ctx.http(%r)" % step_id),
                               answer)

    def task_step(self, step_id: str, task: str, input: Any = None, *,
                  retry: Optional[Mapping[str, Any]] = None, queue: str = "default",
                  priority: int = 0, timeout: Optional[float] = None) -> Any:
        self.enter(step_id, "a task")
        if not isinstance(task, str) or not task:
            raise ValueError("task %s: the task's name must be a non-empty string" % step_id)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError("task %s: priority must be an integer" % step_id)
        recorded = self.recorded_as(step_id, "task", "ctx.task(%r)" % step_id)
        if recorded is not None and recorded["seq"] is not None:
            raise WorkflowMismatch("workflow %s calls ctx.task(%r) where run %s recorded a ctx.step "
                                   "of that id: its code changed under a run in flight; put the "
                                   "change behind ctx.patched()" % (self.wf.name, step_id,
                                                                    self.task.run_id))
        answer: Dict[str, Any] = {"then": "task", "step": step_id, "task": task, "input": input,
                                  "policy": retry_policy(retry), "queue": queue,
                                  "priority": priority}
        if timeout is not None:
            answer["timeout_ms"] = int(_check_seconds("task %s: timeout" % step_id, timeout,
                                                      0.001) * 1000 + 0.999)
        return self.waited_for(step_id, recorded, answer)

    def sleep(self, step_id: str, seconds: float) -> None:
        self.enter(step_id, "a sleep")
        seconds = _check_seconds("sleep %s" % step_id, seconds, 0)
        recorded = self.recorded_as(step_id, "sleep", "ctx.sleep(%r)" % step_id)
        if recorded is not None and recorded["status"] == "succeeded":
            return
        self.suspend({"then": "sleep", "step": step_id, "ms": int(seconds * 1000 + 0.999)})

    def wait_for_event(self, step_id: str, event: str, *, timeout: Optional[float] = None) -> Any:
        self.enter(step_id, "an event wait")
        if not isinstance(event, str) or not event:
            raise ValueError("event wait %s: the event's name must be a non-empty string" % step_id)
        if timeout is not None:
            timeout = _check_seconds("event wait %s: timeout" % step_id, timeout, 0.001)
        recorded = self.recorded_as(step_id, "event", "ctx.wait_for_event(%r)" % step_id)
        if recorded is not None and recorded["status"] == "succeeded":
            return recorded["result"]
        if recorded is not None and recorded["status"] == "failed":
            raise EventTimeout("event %s was not emitted within its timeout (wait %s)"
                               % (event, step_id))
        answer: Dict[str, Any] = {"then": "event", "step": step_id, "event": event}
        if timeout is not None:
            answer["timeout_ms"] = int(timeout * 1000 + 0.999)
        self.suspend(answer)

    def patched(self, change_id: str) -> bool:
        if self.suspension is not None:
            raise _Suspended(self.suspension)
        _check_id("a change id", change_id)
        step_id = "ds.patch:" + change_id
        recorded = self.history.get(step_id)
        if recorded is not None and recorded["status"] == "succeeded":
            return recorded["result"] is True
        value = not self.unreplayed()
        row = self.claim(step_id, {"input": None, "policy": None, "timeout": None}) \
            if recorded is None else None
        while True:
            if row is None:
                row = self.claim(step_id)
            if row["token"] is not None:
                try:
                    self.query("SELECT 1 FROM ds_complete_task(%s, %s::jsonb)",
                               (row["token"], Json(value)))
                    return value
                except psycopg2.Error as e:
                    if getattr(e, "pgcode", None) != "DS410":
                        raise
                row = None
                continue
            settled = self.settle(step_id, row)
            if settled is not None:
                return settled["value"] is True
            row = None


class _Unserializable(TypeError):
    """A step's result that is not JSON."""


def _serialized(value: Any) -> str:
    """The value as JSON, as the step records it and a later segment reads it back."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as e:
        raise _Unserializable("the step's result is not JSON: %s" % e) from e


class WorkflowContext:
    """What a workflow function gets: ``step``, ``map``, ``sql``, ``http``, ``task``, ``sleep`` (seconds),
    ``wait_for_event``, ``patched``; ``run_id``, ``segment``, ``cancelled`` (the segment's
    threading.Event: the run was cancelled, a lease was lost, the worker stops)."""

    def __init__(self, seg: _Segment, segment: int):
        self._seg = seg
        self.run_id: str = seg.task.run_id
        self.workflow: str = seg.wf.name
        self.segment = segment
        self.cancelled: threading.Event = seg.task.cancelled

    def step(self, step_id: str, fn: Callable[[StepContext], Any], *,
             retry: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None,
             transaction: bool = False) -> Any:
        return self._seg.step(step_id, fn, retry=retry, timeout=timeout, transaction=transaction)

    def map(self, step_id: str, items: Sequence[Any], fn: Callable[[Any, StepContext], Any], *,
            retry: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None,
            transaction: bool = False) -> List[Any]:
        """One step per item, ``"<step_id>/<n>"`` (n from 1), ``fn(item, step_context)`` for each,
        one after the other; their results in the order of ``items``. Each item is a step of its
        own: retried by its policy, replayed once it succeeded. An item that failed for good
        raises its ``StepFailed`` once the others have run (the first by number)."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise TypeError("map %s: items must be a list" % step_id)
        if not callable(fn):
            raise TypeError("map %s: fn must be a function of an item and the step's context"
                            % step_id)
        results: List[Any] = []
        failures: List[StepFailed] = []
        for n, item in enumerate(items, 1):
            try:
                results.append(self._seg.step(
                    "%s/%d" % (step_id, n), lambda s, item=item: fn(item, s), retry=retry,
                    timeout=timeout, transaction=transaction))
            except StepFailed as e:
                failures.append(e)
                results.append(None)
        if failures:
            raise failures[0]
        return results

    def sql(self, step_id: str, sql: str, input: Any = None, *,
            retry: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None) -> Any:
        return self._seg.sql(step_id, sql, input, retry=retry, timeout=timeout)

    def http(self, step_id: str, request: Mapping[str, Any], *,
             retry: Optional[Mapping[str, Any]] = None, idempotency_header: str = "Idempotency-Key",
             timeout: Optional[float] = None) -> Any:
        """An HTTP step the extension's HTTP worker sends with the step's idempotency key; the
        run waits for its response without holding a worker ({status, headers, body})."""
        return self._seg.http(step_id, request, retry=retry,
                              idempotency_header=idempotency_header, timeout=timeout)

    def task(self, step_id: str, task: str, input: Any = None, *,
             retry: Optional[Mapping[str, Any]] = None, queue: str = "default", priority: int = 0,
             timeout: Optional[float] = None) -> Any:
        """A task another worker runs; the run waits for its result without holding a worker."""
        return self._seg.task_step(step_id, task, input, retry=retry, queue=queue,
                                   priority=priority, timeout=timeout)

    def sleep(self, step_id: str, seconds: float) -> None:
        self._seg.sleep(step_id, seconds)

    def wait_for_event(self, step_id: str, event: str, *, timeout: Optional[float] = None) -> Any:
        return self._seg.wait_for_event(step_id, event, timeout=timeout)

    def patched(self, change_id: str) -> bool:
        return self._seg.patched(change_id)


HISTORY = """
SELECT s.step_id, s.kind, s.status, s.result, s.error_code, s.error_message,
       CASE WHEN s.kind = 'task' AND s.task LIKE 'ds.step:%%'
                 AND jsonb_typeof(s.input -> 'seq') = 'number'
            THEN (s.input ->> 'seq')::integer END AS seq
  FROM ds_steps s WHERE s.run_id = %s"""


def segment_handler(wf: Workflow, worker: Any) -> Callable[[Any, Any], Any]:
    """The handler of task ``ds.workflow:<name>``: one segment of a run."""
    def handle(input: Any, task_ctx: Any) -> Dict[str, Any]:
        segment = int(task_ctx.step_id[len("ds.segment:"):] or 1)
        with contextlib.closing(worker._autocommit()) as conn:
            history: Dict[str, Dict[str, Any]] = {}
            # only segments record a run's steps, and the turns its sleeps and event waits after
            # a segment: the first attempt of the first segment has nothing to read
            if segment > 1 or task_ctx.attempt > 1:
                with conn.cursor(cursor_factory=RealDictCursor) as cur:
                    cur.execute(HISTORY, (task_ctx.run_id,))
                    history = {r["step_id"]: dict(r) for r in cur.fetchall()}
            seg = _Segment(wf, worker, task_ctx, conn, history, segment)
            try:
                output = wf.fn(WorkflowContext(seg, segment), input)
            except _Suspended as s:
                return s.answer
            if seg.suspension is not None:       # the workflow caught it: the segment ends there
                return seg.suspension
            return {"then": "return", "output": output}
    return handle
