"""A worker that runs tasks -- steps whose body is application code -- in threads.

    worker = Worker(lambda: psycopg2.connect(dsn), concurrency=10)

    @worker.task("send-receipt")
    def send_receipt(input, ctx):
        mailer.send(input, idempotency_key=ctx.idempotency_key)

    @worker.task("record-payment")
    def record_payment(input, ctx):
        with ctx.transaction() as cur:
            cur.execute("INSERT INTO payments ...", ...)
            return {"recorded": True}    # the outcome commits with the INSERT, or neither does

    worker.run()                          # blocks; SIGTERM or SIGINT stops it gracefully

The worker claims due tasks of the names it has handlers for with ``ds_claim_tasks`` -- a batch,
as many as it has free threads -- and runs each handler in a thread of its own. When nothing is
due it waits in ``CALL ds_wait_for_tasks``, which returns as soon as a commit makes a task due:
an idle worker sends no statements, and holds no LISTEN (it works through PgBouncer in
transaction mode). While a handler runs, the worker renews its lease with ``ds_heartbeat`` every
third of it. The handler's return value is the step's result (``ds_complete_task``); what it
raises chooses the failure (``ds_fail_task``): ``NonRetriableError`` fails the step,
``RetryAfterError`` retries it after a delay, ``BlockedError`` blocks it for a person, anything
else is a retryable failure named by the exception's class, its traceback as the detail.

See clients/python/README.md, "Tasks".
"""
import contextlib
import datetime
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import psycopg2
import psycopg2.extensions
from psycopg2.extras import Json

from .errors import (BlockedError, DurableStepsError, LeaseLost, RetryAfterError, TaskError,
                     from_exception)
from .workflows import Workflow, segment_handler

__all__ = ["Worker", "TaskContext", "Handler"]

Handler = Callable[[Any, "TaskContext"], Any]
ConnectionFactory = Callable[[], Any]

CLAIM = "SELECT * FROM ds_claim_tasks(%s::text[], %s, %s::interval, %s, %s::text[])"
WAIT = "CALL ds_wait_for_tasks(%s::text[], %s::interval, %s::text[])"
HEARTBEAT = "SELECT * FROM ds_heartbeat(%s, %s::interval)"
COMPLETE = "SELECT ds_complete_task(%s, %s::jsonb)"
FAIL = "SELECT ds_fail_task(%s, %s, %s, %s, %s, %s::interval, %s)"
RELEASE = "SELECT ds_release_task(%s)"

# bounds of what a failure records: error_code is 1..64 bytes (docs/tasks.md, "Failures"); the
# server cuts the message and the detail to 8 kB, the traceback's end is the part worth keeping
MAX_CODE_BYTES = 64
MAX_CLAIM = 1000                # the most ds_claim_tasks takes at once
# libpq's TCP keepalives and user timeout for the connections the worker opens from a DSN
TCP_LIVENESS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                "keepalives_count": 3, "tcp_user_timeout": 30000}
MAX_RETRY_AFTER = 86400.0       # the longest retry_after ds_fail_task takes, in seconds
MAX_MESSAGE = 8000
MAX_DETAIL = 8000

# why ctx.cancelled was set (ctx.cancel_reason)
DEADLINE = "deadline"            # the step's timeout for this attempt passed
CANCELLED = "cancelled"          # ds_cancel_step
LEASE_LOST = "lease_lost"        # the lease is gone (ran out, the attempt was recorded lost)
STOPPING = "stopping"            # stop() and its grace period passed


class TaskContext:
    """What a handler learns of its attempt, and its way to commit its writes with the outcome.

    ``cancelled`` (a ``threading.Event``) is set when the handler should give up: at the
    attempt's deadline (the step's ``timeout``), when the step is cancelled, when the lease is
    lost, and ``grace`` seconds after ``stop()``; ``cancel_reason`` then says which
    ('deadline', 'cancelled', 'lease_lost', 'stopping'). ``idempotency_key`` is the same for
    every attempt of the step (pass it to providers); ``attempt_key`` differs per attempt.
    """

    def __init__(self, worker: "Worker", row: Mapping[str, Any]):
        self.run_id: str = row["run_id"]
        self.step_id: str = row["step_id"]
        self.task: str = row["task"]
        self.attempt: int = row["attempt"]
        self.max_attempts: Optional[int] = row["max_attempts"]
        self.idempotency_key: str = row["idempotency_key"]
        self.attempt_key: str = row["attempt_key"]
        self.token: str = row["token"]
        self.deadline: Optional[datetime.datetime] = row["deadline"]
        self.cancelled = threading.Event()
        self.cancel_reason: Optional[str] = None
        self.logger: logging.Logger = worker.logger
        self._worker = worker
        self._lock = threading.Lock()
        self._open = False
        self._pending: Optional[Any] = None      # the connection whose commit awaits the result

    def _cancel(self, reason: str) -> None:
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
        self.cancelled.set()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor on a fresh connection, in a transaction that records the step's outcome.

        Leaving the block by an exception rolls the transaction back (the handler's failure is
        then recorded on its own). Leaving it cleanly keeps the transaction open until the
        handler returns: the worker then runs ``ds_complete_task(token, <the handler's return
        value>)`` in it and commits, so the writes and the outcome commit together or not at
        all. Return from inside the block (or right after it): work after the block runs with
        the transaction open. If the lease is gone by then (DS410) the transaction rolls back,
        writes and all, and the worker logs ``LeaseLost``; if the handler raises after the
        block, it rolls back too. One such transaction per attempt.
        """
        with self._lock:
            if self._open or self._pending is not None:
                raise RuntimeError("one ctx.transaction() per attempt: its commit awaits the "
                                   "handler's return")
            self._open = True
        conn = None
        try:
            conn = self._worker._connect()
            conn.autocommit = False
            cur = conn.cursor()
            yield cur
        except BaseException:
            if conn is not None:
                _close(conn, rollback=True)
            raise
        else:
            with self._lock:
                self._pending = conn
        finally:
            with self._lock:
                self._open = False

    def _take_pending(self) -> Optional[Any]:
        with self._lock:
            conn, self._pending = self._pending, None
            return conn

    def __repr__(self) -> str:
        return "<TaskContext %s %s/%s attempt %d>" % (self.task, self.run_id, self.step_id,
                                                      self.attempt)


@dataclass
class _Attempt:
    ctx: TaskContext
    input: Any
    handler: Handler
    lease_end: float                    # time.monotonic() past which the lease may be gone
    next_beat: float
    deadline: Optional[float]           # time.monotonic() of ctx.deadline
    started: bool = False
    done: bool = field(default=False)
    # the lease is known gone (a heartbeat said so, or it ran out): no more heartbeats
    gone: bool = False


class Worker:
    """Runs the handlers of tasks in ``concurrency`` threads (see the module's documentation).

    ``connect``: a function of no arguments that answers a new psycopg2 connection (for
    instance ``lambda: psycopg2.connect(dsn)``), or a DSN. The worker opens its own connections
    with it: one to claim and wait, one for heartbeats, one per busy thread to record outcomes,
    and a fresh one for each ``ctx.transaction()``; it never leaves state on them (no LISTEN, no
    session SET), so they may go through PgBouncer in transaction mode.

    ``lease`` (seconds): how long a claim holds a task without a heartbeat; heartbeats come every
    ``heartbeat`` seconds (a third of the lease by default). ``queues``: claim only tasks of
    those queues (all queues by default). ``worker``: the worker's name in ds_claim_tasks
    (``hostname:pid`` by default). ``grace``: how long stop() lets running handlers finish
    before it sets their ``ctx.cancelled``. ``wait_timeout``: how long one
    ``ds_wait_for_tasks`` waits at most (it returns at once when a task becomes due).
    """

    def __init__(self, connect: Union[str, ConnectionFactory], *, concurrency: int = 10,
                 lease: float = 30.0, queues: Optional[Sequence[str]] = None,
                 worker: Optional[str] = None, grace: float = 10.0,
                 heartbeat: Optional[float] = None, wait_timeout: float = 30.0,
                 tasks: Optional[Mapping[str, Handler]] = None,
                 workflows: Optional[Sequence[Workflow]] = None, define_workflows: bool = True,
                 logger: Optional[logging.Logger] = None):
        if isinstance(connect, str):
            # a connection that stops answering without closing (a half-open TCP connection)
            # is given up by the kernel within about 30 s, not the default two hours: settings
            # the DSN does not choose itself
            given = psycopg2.extensions.parse_dsn(connect)
            extra: Dict[str, Any] = {k: v for k, v in TCP_LIVENESS.items() if k not in given}
            dsn = connect
            self._factory: ConnectionFactory = lambda: psycopg2.connect(dsn, **extra)
        elif callable(connect):
            self._factory = connect
        else:
            raise TypeError("connect: a DSN or a function that answers a new connection")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease <= 0 or grace < 0 or wait_timeout <= 0:
            raise ValueError("lease and wait_timeout must be positive, grace not negative")
        if heartbeat is not None and heartbeat <= 0:
            raise ValueError("heartbeat must be positive")
        self.concurrency = concurrency
        self.lease = float(lease)
        self.heartbeat = float(heartbeat) if heartbeat is not None else self.lease / 3.0
        self.queues: Optional[List[str]] = None if queues is None else (
            [queues] if isinstance(queues, str) else list(queues))
        self.name = worker or "%s:%d" % (socket.gethostname(), os.getpid())
        self.grace = float(grace)
        self.wait_timeout = float(wait_timeout)
        self.logger = logger or logging.getLogger("durable_steps_client.worker")
        self._handlers: Dict[str, Handler] = {}
        self._cond = threading.Condition()
        self._running = False
        self._reset()
        for name, handler in (tasks or {}).items():
            self.register(name, handler)
        self._workflows: List[Workflow] = []
        self.define_workflows = define_workflows
        for wf in workflows or ():
            self.add_workflow(wf)

    def _reset(self) -> None:
        # a run's state; a handler's thread abandoned by a run (a second stop()) keeps its own
        # queue and leaves the next run's alone (its generation is another)
        self._generation = getattr(self, "_generation", 0) + 1
        self._stopping = False
        self._stops = 0
        self._abandon = False
        self._grace_end: Optional[float] = None
        self._graced = False
        self._free = self.concurrency
        self._attempts: Dict[str, _Attempt] = {}
        self._queue: "queue.Queue[Optional[_Attempt]]" = queue.Queue()
        self._wake = threading.Event()            # the monitor recomputes its next moment
        self._halt = threading.Event()            # set by stop(): backoffs end at once
        self._monitor_stop = threading.Event()    # set by run() once the handlers are done
        self._wait_lock = threading.Lock()
        self._waiting: Optional[Any] = None       # the connection inside ds_wait_for_tasks

    # -- registration --------------------------------------------------------------------------

    def register(self, name: str, handler: Handler) -> None:
        """Makes ``handler(input, ctx)`` the handler of the tasks named ``name``."""
        if not isinstance(name, str) or not name:
            raise ValueError("a task's name is a non-empty string")
        if not callable(handler):
            raise TypeError("a task's handler is a function of (input, ctx)")
        if self._running:
            raise RuntimeError("register tasks before run()")
        self._handlers[name] = handler

    def task(self, name: str) -> Callable[[Handler], Handler]:
        """The decorator ``@worker.task('send-receipt')`` that registers ``handler(input, ctx)``."""
        def decorate(handler: Handler) -> Handler:
            self.register(name, handler)
            return handler
        return decorate

    def add_workflow(self, wf: Workflow) -> None:
        """Runs application workflow ``wf`` (``@workflow(name)``, docs/app-workflows.md): its
        segments are tasks ``ds.workflow:<name>``. run() declares it with ds_define_workflow
        first, unless ``define_workflows`` is False (the role needs CREATE on the current
        schema)."""
        if not isinstance(wf, Workflow):
            raise TypeError("add_workflow takes a @workflow(name) definition")
        if wf.task_name in self._handlers:
            raise ValueError("workflow %s is given twice" % wf.name)
        self.register(wf.task_name, segment_handler(wf, self))
        self._workflows.append(wf)

    def define(self) -> None:
        """Declares the worker's workflows now (ds_define_workflow), so that ds_start_run finds
        them; run() does it too unless ``define_workflows`` is False."""
        if not self._workflows:
            return
        conn = self._autocommit()
        try:
            with conn.cursor() as cur:
                for wf in self._workflows:
                    cur.execute("SELECT ds_define_workflow(%s, %s::jsonb)",
                                (wf.name, _json(wf.policy)))
        finally:
            _close(conn)

    @property
    def tasks(self) -> List[str]:
        return sorted(self._handlers)

    # -- running and stopping ------------------------------------------------------------------

    def run(self) -> None:
        """Claims and runs tasks until stop() (or SIGTERM / SIGINT, whose handlers it installs
        when called in the main thread, and restores on return), then returns once every
        running handler has returned; after a stop() that came before it, it returns at once.
        A second stop() (a second signal) sets every handler's ``ctx.cancelled`` at once and
        returns without waiting for them (their leases run out: counted lost attempts)."""
        if not self._handlers:
            raise ValueError("no task handlers: register one with @worker.task(name)")
        if self.define_workflows:
            self.define()
        with self._cond:
            if self._running:
                raise RuntimeError("this worker is already running")
            self._running = True
        previous: Dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        threads = [threading.Thread(target=self._serve, args=(self._queue, self._generation),
                                    daemon=True, name="durable_steps task %d" % i)
                   for i in range(self.concurrency)]
        monitor = threading.Thread(target=self._monitor, daemon=True,
                                   name="durable_steps heartbeats")
        dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                      name="durable_steps claims")
        try:
            for t in threads:
                t.start()
            monitor.start()
            dispatcher.start()
            self.logger.info("durable_steps worker %s: tasks %s, concurrency %d", self.name,
                             ", ".join(self.tasks), self.concurrency)
            # a second stop() returns even from a claim or wait that hangs (daemon threads)
            while dispatcher.is_alive() and not self._abandon:
                dispatcher.join(0.2 if self._stopping else 1.0)
                if self._stopping:
                    self._interrupt_wait()       # a cancel that came before the wait began
            for _ in threads:
                self._queue.put(None)            # after the claims: those not started go back
            for t in threads:
                while t.is_alive() and not self._abandon:
                    t.join(0.2)
            if self._abandon and any(t.is_alive() for t in threads):
                self.logger.warning("durable_steps worker %s: stopped with handlers still "
                                    "running; their leases will run out", self.name)
        finally:
            with self._cond:
                self._stopping = True
                self._halt.set()
                self._cond.notify_all()
            self._monitor_stop.set()
            self._wake.set()
            monitor.join(None if not self._abandon else 1.0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with self._cond:
                self._running = False
                self._reset()               # the next run() starts afresh

    def stop(self, interrupt: bool = True) -> None:
        """Stops claiming; running handlers have ``grace`` seconds to return before their
        ``ctx.cancelled`` is set. Returns at once (run() returns when they are done); any thread
        may call it. A second call cancels every handler at once and lets run() return."""
        with self._cond:
            self._stops += 1
            now = time.monotonic()
            if not self._stopping:
                self._stopping = True
                self._grace_end = now + self.grace
            if self._stops > 1:
                self._grace_end = now
                self._abandon = True
                for attempt in self._attempts.values():
                    attempt.ctx._cancel(STOPPING)
            self._halt.set()
            self._cond.notify_all()
        self._wake.set()
        if interrupt:
            self._interrupt_wait()

    def _on_signal(self, signum: int, frame: Any) -> None:
        # no network I/O in a signal handler: run() interrupts the wait (the loop below calls
        # _interrupt_wait while stopping)
        self.logger.info("durable_steps worker %s: signal %d, stopping", self.name, signum)
        self.stop(interrupt=False)

    def _interrupt_wait(self) -> None:
        with self._wait_lock:
            conn = self._waiting
            if conn is not None:
                try:
                    conn.cancel()
                except Exception:
                    pass

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> Any:
        return self._factory()

    def _autocommit(self) -> Any:
        conn = self._connect()
        conn.autocommit = True
        return conn

    # -- claiming ------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        conn = None
        failures = 0
        idle_wakes = 0
        names = self.tasks
        lease = datetime.timedelta(seconds=self.lease)
        waited = datetime.timedelta(seconds=self.wait_timeout)
        try:
            while True:
                with self._cond:
                    while self._free == 0 and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        return
                    free = self._free
                try:
                    if conn is None:
                        conn = self._autocommit()
                    sent = time.monotonic()
                    with conn.cursor() as cur:
                        cur.execute(CLAIM, (names, min(free, MAX_CLAIM), lease, self.name,
                                            self.queues))
                        cols = [d[0] for d in cur.description]
                        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
                    failures = 0
                    if rows:
                        idle_wakes = 0
                        for row in rows:
                            self._start(row, sent)
                        continue
                    with self._wait_lock:
                        if self._stopping:
                            return
                        self._waiting = conn
                    try:
                        with conn.cursor() as cur:
                            cur.execute(WAIT, (names, waited, self.queues))
                            due = bool(cur.fetchone()[0])
                    finally:
                        with self._wait_lock:
                            self._waiting = None
                    # woken while nothing could be claimed (due elsewhere, or held back by a
                    # queue's limit): after a few in a row, back off a little
                    idle_wakes = idle_wakes + 1 if due else 0
                    if idle_wakes > 3:
                        self._halt.wait(min(0.01 * 2 ** (idle_wakes - 3), 1.0))
                except psycopg2.extensions.QueryCanceledError:
                    if self._stopping:
                        return
                    self.logger.warning("durable_steps worker %s: a claim or wait was cancelled",
                                        self.name)
                except Exception as e:            # psycopg2's, or the connect function's
                    if self._stopping:
                        return
                    failures += 1
                    delay = min(0.1 * 2 ** failures, 10.0)
                    self.logger.error("durable_steps worker %s: claiming failed (%s); again in "
                                      "%.1f s", self.name, _describe(e), delay)
                    if conn is not None:
                        _close(conn)
                        conn = None
                    self._halt.wait(delay)
        finally:
            if conn is not None:
                _close(conn)

    def _start(self, row: Dict[str, Any], sent: float) -> None:
        ctx = TaskContext(self, row)
        deadline = None
        if ctx.deadline is not None:
            deadline = time.monotonic() + (ctx.deadline.timestamp() - time.time())
        attempt = _Attempt(ctx=ctx, input=row["input"], handler=self._handlers[row["task"]],
                           lease_end=sent + self.lease, next_beat=sent + self.heartbeat,
                           deadline=deadline)
        with self._cond:
            self._free -= 1
            self._attempts[ctx.token] = attempt
        self._queue.put(attempt)
        self._wake.set()

    # -- running handlers ----------------------------------------------------------------------

    def _serve(self, attempts: "queue.Queue[Optional[_Attempt]]", generation: int) -> None:
        box = _Conn(self)
        try:
            while True:
                attempt = attempts.get()
                if attempt is None:
                    return
                try:
                    if self._stopping or self._generation != generation:
                        self._release(box, attempt)
                    else:
                        self._run(box, attempt)
                except Exception:
                    self.logger.exception("durable_steps worker %s: task %r", self.name,
                                          attempt.ctx)
                finally:
                    attempt.done = True
                    with self._cond:
                        if self._generation == generation:
                            self._attempts.pop(attempt.ctx.token, None)
                            self._free += 1
                            self._cond.notify_all()
        finally:
            box.close()

    def _release(self, box: "_Conn", attempt: _Attempt) -> None:
        """Gives back a claim whose handler never started: not a counted attempt."""
        try:
            box.execute(RELEASE, (attempt.ctx.token,))
        except psycopg2.Error as e:
            self.logger.warning("durable_steps worker %s: could not release %r (%s): its lease "
                                "will run out", self.name, attempt.ctx, _describe(e))

    def _run(self, box: "_Conn", attempt: _Attempt) -> None:
        ctx = attempt.ctx
        attempt.started = True
        try:
            result = attempt.handler(attempt.input, ctx)
        except BaseException as e:           # noqa: B902 -- a handler's SystemExit fails it too
            pending = ctx._take_pending()
            if pending is not None:
                _close(pending, rollback=True)
            self._fail(box, ctx, e)
            return
        pending = ctx._take_pending()
        if pending is None:
            try:
                box.execute(COMPLETE, (ctx.token, _json(result)))
            except (psycopg2.Error, TypeError, ValueError) as e:
                self._outcome_failed(box, ctx, e)
            return
        # the handler's own transaction: the outcome commits with its writes
        try:
            with pending.cursor() as cur:
                cur.execute(COMPLETE, (ctx.token, _json(result)))
            pending.commit()
        except (psycopg2.Error, TypeError, ValueError) as e:
            _close(pending, rollback=True)
            pending = None
            self._outcome_failed(box, ctx, e)
        finally:
            if pending is not None:
                _close(pending)

    def _outcome_failed(self, box: "_Conn", ctx: TaskContext, e: BaseException) -> None:
        """Completing failed: a stale token (DS410) is only logged; anything else (a result
        that is not JSON, a deferred constraint that failed at COMMIT) fails the attempt."""
        error: BaseException = e
        if isinstance(e, psycopg2.Error) and getattr(e, "pgcode", None) is not None:
            error = from_exception(e)
            error.__cause__ = e
        if isinstance(error, LeaseLost):
            ctx._cancel(LEASE_LOST)
            self.logger.warning("durable_steps worker %s: %r lost its lease; its outcome and its "
                                "transaction's writes were rolled back", self.name, ctx,
                                exc_info=error)
            return
        if isinstance(e, psycopg2.Error) and getattr(e, "pgcode", None) is None:
            # the connection broke: the outcome may or may not have committed; the lease decides
            self.logger.error("durable_steps worker %s: completing %r failed (%s)", self.name,
                              ctx, _describe(e))
            return
        self._fail(box, ctx, error)

    def _fail(self, box: "_Conn", ctx: TaskContext, e: BaseException) -> None:
        klass, retry_after, remediation = "retryable", None, None
        if isinstance(e, TaskError):
            code, message = e.code, e.message
            klass = e.failure_class
            if isinstance(e, RetryAfterError):
                # ds_fail_task takes 0 to 24 hours, as ds_retry_after() does
                retry_after = datetime.timedelta(
                    seconds=min(max(float(e.delay_seconds), 0.0), MAX_RETRY_AFTER))
            if isinstance(e, BlockedError):
                remediation = e.remediation
            detail = None
        else:
            code = type(e).__name__
            message = str(e) or code
            detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            if len(detail) > MAX_DETAIL:
                detail = "...\n" + detail[-(MAX_DETAIL - 4):]
        code = str(code or "error").encode("utf-8")[:MAX_CODE_BYTES].decode("utf-8", "ignore")
        message = str(message)[:MAX_MESSAGE]
        try:
            box.execute(FAIL, (ctx.token, code, message, detail, klass, retry_after, remediation))
        except psycopg2.Error as err:
            if getattr(err, "pgcode", None) is not None and isinstance(from_exception(err),
                                                                         LeaseLost):
                ctx._cancel(LEASE_LOST)
                # expected of a cancelled step; otherwise worth a look
                level = logging.INFO if ctx.cancel_reason == CANCELLED else logging.WARNING
                self.logger.log(level, "durable_steps worker %s: %r failed (%s: %s) after "
                                "losing its lease (%s)", self.name, ctx, code, message,
                                ctx.cancel_reason)
                return
            self.logger.error("durable_steps worker %s: could not record the failure of %r "
                              "(%s: %s): %s", self.name, ctx, code, message, _describe(err))
            return
        self.logger.info("durable_steps worker %s: %r failed, %s: %s: %s", self.name, ctx, klass,
                         code, message)

    # -- heartbeats, deadlines, grace ----------------------------------------------------------

    def _monitor(self) -> None:
        box = _Conn(self)
        extend = datetime.timedelta(seconds=self.lease)
        try:
            while not self._monitor_stop.is_set():
                with self._cond:
                    attempts = [a for a in self._attempts.values() if not a.done]
                    grace_end = self._grace_end
                now = time.monotonic()
                if grace_end is not None and now >= grace_end and not self._graced:
                    self._graced = True
                    for a in attempts:
                        a.ctx._cancel(STOPPING)
                soon = now + self.heartbeat / 2.0
                # a handler told to stop (grace over) still holds its lease while it returns
                live = [a for a in attempts if not a.gone and
                        (not a.ctx.cancelled.is_set() or a.ctx.cancel_reason == STOPPING)]
                for a in live:
                    if a.deadline is not None and now >= a.deadline:
                        a.gone = True               # the lease ends with the deadline
                        a.ctx._cancel(DEADLINE)
                        continue
                    if now >= a.lease_end:
                        a.gone = True
                        a.ctx._cancel(LEASE_LOST)
                        self.logger.warning("durable_steps worker %s: no heartbeat of %r held "
                                            "its lease in time", self.name, a.ctx)
                        continue
                    if a.next_beat <= soon:        # early by half a period at most: batched
                        self._beat(box, a, extend)
                now = time.monotonic()
                live = [a for a in live if not a.gone and
                        (not a.ctx.cancelled.is_set() or a.ctx.cancel_reason == STOPPING)]
                moments = [a.next_beat for a in live] + [a.lease_end for a in live]
                moments += [a.deadline for a in live
                            if a.deadline is not None and not a.ctx.cancelled.is_set()]
                if grace_end is not None and not self._graced:
                    moments.append(grace_end)
                timeout = max(min(moments) - now, 0.0) if moments else None
                self._wake.wait(timeout)
                self._wake.clear()
        finally:
            box.close()

    def _beat(self, box: "_Conn", attempt: _Attempt, extend: datetime.timedelta) -> None:
        sent = time.monotonic()
        try:
            row = box.fetchone(HEARTBEAT, (attempt.ctx.token, extend))
        except Exception as e:
            # a lost connection: try again soon; the lease's end is what cancels the handler
            attempt.next_beat = sent + min(1.0, self.heartbeat)
            self.logger.warning("durable_steps worker %s: heartbeat of %r failed (%s)", self.name,
                                attempt.ctx, _describe(e))
            return
        held, cancelled = bool(row[0]), bool(row[1])
        if not held:
            attempt.gone = True
            attempt.ctx._cancel(CANCELLED if cancelled else LEASE_LOST)
            return
        attempt.lease_end = sent + self.lease
        if attempt.deadline is not None:
            attempt.lease_end = min(attempt.lease_end, attempt.deadline)
        attempt.next_beat = sent + self.heartbeat


class _Conn:
    """One thread's autocommit connection, opened when first needed and again after it broke."""

    def __init__(self, worker: Worker):
        self._worker = worker
        self._conn: Optional[Any] = None

    def _cursor_run(self, statement: str, params: Sequence[Any], one: bool) -> Any:
        # A connection that broke while idle (a server restart, a cut) fails the next statement
        # without PostgreSQL's answer: it is sent again once, on a new connection. The calls
        # made here are fenced by their token, so a repeat of one that did commit is refused
        # (DS410) or answered as it stands, never recorded twice.
        for again in (True, False):
            if self._conn is None:
                self._conn = self._worker._autocommit()
            try:
                with self._conn.cursor() as cur:
                    cur.execute(statement, params)
                    return cur.fetchone() if one else None
            except psycopg2.Error as e:
                broken = getattr(e, "pgcode", None) is None
                if broken or self._conn.closed:
                    self.close()       # not PostgreSQL's answer: the connection is suspect
                if not (broken and again):
                    raise
        return None

    def execute(self, statement: str, params: Sequence[Any]) -> None:
        self._cursor_run(statement, params, False)

    def fetchone(self, statement: str, params: Sequence[Any]) -> Any:
        return self._cursor_run(statement, params, True)

    def close(self) -> None:
        if self._conn is not None:
            _close(self._conn)
            self._conn = None


def _close(conn: Any, rollback: bool = False) -> None:
    try:
        if rollback and not conn.closed:
            conn.rollback()
    except Exception:
        pass
    try:
        conn.close()
    except Exception:
        pass


def _json(value: Any) -> Optional[Json]:
    return None if value is None else Json(value)


def _describe(e: BaseException) -> str:
    if isinstance(e, psycopg2.Error) and getattr(e, "pgcode", None) is not None:
        return str(from_exception(e))
    if isinstance(e, DurableStepsError):
        return str(e)
    return (str(e).strip() or type(e).__name__).splitlines()[0]
