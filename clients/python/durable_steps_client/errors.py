"""durable_steps' documented SQLSTATEs as exception classes, all under DurableStepsError.

Every class names the SQLSTATE it stands for (docs/reference.md "SQLSTATEs", the tables of
docs/idempotent-requests.md and docs/schedules.md) and the HTTP status a service answers with
(docs/reference.md "HTTP statuses"; the Node.js client's classes carry the same). The calls of this package raise them in place of psycopg2's errors (the original is the
exception's __cause__ and its ``pgerror``); ``from_exception`` does the same for an error raised
elsewhere (psycopg2's, or SQLAlchemy's DBAPIError around one).
"""
import datetime
from typing import Dict, Optional, Type, Union


class DurableStepsError(Exception):
    """An error PostgreSQL raised for a durable_steps call; ``sqlstate`` says which."""

    sqlstate: Optional[str] = None
    http_status: int = 500

    def __init__(self, message: str, sqlstate: Optional[str] = None, detail: Optional[str] = None,
                 hint: Optional[str] = None, pgerror: Optional[BaseException] = None):
        super().__init__(message)
        self.message = message
        if sqlstate is not None:
            self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        self.pgerror = pgerror

    def __str__(self) -> str:
        return "%s (SQLSTATE %s)" % (self.message, self.sqlstate) if self.sqlstate else self.message


# The extension's own codes (class DS), src/base/ds_errcodes.h

class NonRetriable(DurableStepsError):
    """DS001: ds_non_retriable(): the body failed the step for good."""
    sqlstate, http_status = "DS001", 422


class RetryAfter(DurableStepsError):
    """DS002: ds_retry_after(): the body asked for a retry after a delay."""
    sqlstate, http_status = "DS002", 503


class Blocked(DurableStepsError):
    """DS003: ds_blocked(): the step waits for a person to re-arm it."""
    sqlstate, http_status = "DS003", 409


class StepTimeout(DurableStepsError):
    """DS004: a step's timeout cancelled its body."""
    sqlstate, http_status = "DS004", 504


class ResultTooLarge(DurableStepsError):
    """DS005: a result exceeded durable_steps.max_result_size."""
    sqlstate = "DS005"


class TooManyRows(DurableStepsError):
    """DS006: a body returned more than one row."""
    sqlstate = "DS006"


class InvocationLost(DurableStepsError):
    """DS007: an attempt's executor ended before recording its outcome."""
    sqlstate, http_status = "DS007", 503


class NoRow(DurableStepsError):
    """DS008: a step called with expect='row' returned no row (it is blocked)."""
    sqlstate, http_status = "DS008", 409


class HttpStatus(DurableStepsError):
    """DS010: an HTTP step's response was not 2xx."""
    sqlstate, http_status = "DS010", 502


class HttpNotSent(DurableStepsError):
    """DS011: an HTTP step's request was never sent."""
    sqlstate, http_status = "DS011", 502


class HttpUncertain(DurableStepsError):
    """DS012: an HTTP step's request may have been received, no whole response came back."""
    sqlstate, http_status = "DS012", 502


class HttpBadResponse(DurableStepsError):
    """DS013: a response too large, or not the JSON or text expected."""
    sqlstate, http_status = "DS013", 502


class ResolvedFailed(DurableStepsError):
    """DS014: an operator resolved an uncertain step as failed."""
    sqlstate, http_status = "DS014", 502


class NoStepContext(DurableStepsError):
    """DS101: an attempt-context function called outside a step."""
    sqlstate = "DS101"


class StepNotSucceeded(DurableStepsError):
    """DS102: ds_unwrap of a step that has not succeeded; a workflow's step that failed for good."""
    sqlstate, http_status = "DS102", 502


class InvalidStepState(DurableStepsError):
    """DS103: nothing left to cancel, re-arm or resolve in the step's or run's state."""
    sqlstate, http_status = "DS103", 409


class StepRecursion(DurableStepsError):
    """DS104: a step's body runs the same step, or steps nest too deep."""
    sqlstate = "DS104"


class NoRunContext(DurableStepsError):
    """DS105: ds_step, ds_http, ds_sleep or ds_await_event outside a run's workflow."""
    sqlstate = "DS105"


class RunSuspended(DurableStepsError):
    """DS106: internal, ends a workflow's turn that must wait."""
    sqlstate, http_status = "DS106", 503


class WrongPartition(DurableStepsError):
    """DS201: the run (or idempotency key) belongs to a partition this server does not own: call
    the server that owns it (docs/partitions.md)."""
    sqlstate, http_status = "DS201", 503


class VersionMismatch(DurableStepsError):
    """DS426: the extension installed in the database is of another version than the library
    the server loaded: ``ALTER EXTENSION durable_steps UPDATE`` has not run yet
    (docs/operations.md, "Upgrades")."""
    sqlstate, http_status = "DS426", 503


class EventTimeout(DurableStepsError):
    """DS408: ds_await_event's timeout passed before the event was emitted."""
    sqlstate, http_status = "DS408", 504


class StepNotFound(DurableStepsError):
    """DS404: no such step, run, key or schedule (or the caller may not see it)."""
    sqlstate, http_status = "DS404", 404


class InProgress(DurableStepsError):
    """DS409: held by another transaction or request: retry later."""
    sqlstate, http_status = "DS409", 409


class StepConflict(DurableStepsError):
    """DS422: another definition, run or request under an existing key."""
    sqlstate, http_status = "DS422", 422


class LeaseLost(DurableStepsError):
    """DS410: a task's token no longer holds its lease (the lease ran out and the attempt was
    recorded lost, the step was cancelled, or the attempt already finished): ds_complete_task
    and ds_fail_task refuse it, and the transaction that tried is aborted, so the handler's own
    writes in it roll back with it (docs/tasks.md)."""
    sqlstate, http_status = "DS410", 410


# Short names for the three a service meets most
NotFound = StepNotFound
InFlight = InProgress
Conflict = StepConflict


# PostgreSQL's standard codes the documentation lists for the extension's calls

class ReadOnlyTransaction(DurableStepsError):
    """25006: a step created, run or re-armed in a read-only transaction."""
    sqlstate, http_status = "25006", 503


class InvalidTransactionState(DurableStepsError):
    """25000: ds_claim_tasks at the REPEATABLE READ or SERIALIZABLE isolation level: a claim runs
    at READ COMMITTED."""
    sqlstate = "25000"


class ActiveSqlTransaction(DurableStepsError):
    """25001: ds_claim_tasks inside a transaction block: a claim must commit before its handlers
    run (call it in autocommit mode)."""
    sqlstate = "25001"


class NullValueNotAllowed(DurableStepsError):
    """22004: a required argument is NULL."""
    sqlstate, http_status = "22004", 400


class InvalidParameterValue(DurableStepsError):
    """22023: a malformed argument (the message names it)."""
    sqlstate, http_status = "22023", 400


class SqlSyntaxError(DurableStepsError):
    """42601: a step's body, hook or handler that does not parse or is not one statement."""
    sqlstate = "42601"


class DatatypeMismatch(DurableStepsError):
    """42804: a ds_key part of an unsupported type; a handler whose columns are not (integer, jsonb)."""
    sqlstate = "42804"


class OutOfMemory(DurableStepsError):
    """53200: more steps in one transaction than the server's lock table is sized for; nothing stored."""
    sqlstate, http_status = "53200", 413


class ProgramLimitExceeded(DurableStepsError):
    """54000: a SQL text, input, request or payload larger than its setting allows."""
    sqlstate, http_status = "54000", 413


class InsufficientPrivilege(DurableStepsError):
    """42501: the role may not do it."""
    sqlstate, http_status = "42501", 403


class UndefinedObject(DurableStepsError):
    """42704: a step's policy names a limit that does not exist (docs/limits.md)."""
    sqlstate = "42704"


class FeatureNotSupported(DurableStepsError):
    """0A000: a step of a limit that would run in its caller's transaction (docs/limits.md)."""
    sqlstate = "0A000"


class UndefinedFunction(DurableStepsError):
    """42883: ds_start_run of a workflow that does not exist."""
    sqlstate = "42883"


class WrongObjectType(DurableStepsError):
    """42809: ds_start_run of a routine that is not a workflow."""
    sqlstate = "42809"


class InvalidTransactionTermination(DurableStepsError):
    """2D000: a procedure workflow that runs COMMIT or ROLLBACK."""
    sqlstate = "2D000"


class CardinalityViolation(DurableStepsError):
    """21000: an idempotent request's handler returned no row, or more than one."""
    sqlstate = "21000"


class ObjectNotInPrerequisiteState(DurableStepsError):
    """55000: pg_cron is not installed in this database (schedules)."""
    sqlstate, http_status = "55000", 503


class QueryCanceled(DurableStepsError):
    """57014: a wait or a statement cancelled (statement_timeout, pg_cancel_backend)."""
    sqlstate, http_status = "57014", 503


class DuplicateObject(DurableStepsError):
    """42710: a schedule's job name that is another role's schedule or pg_cron job."""
    sqlstate, http_status = "42710", 409


class DuplicateFunction(DurableStepsError):
    """42723: ds_define_workflow of a name that a SQL workflow already has."""
    sqlstate, http_status = "42723", 409


# What a task's handler raises to say how its attempt failed (durable_steps_client.worker): not errors
# PostgreSQL raised, so not DurableStepsErrors and without a SQLSTATE. Any other exception a
# handler raises is a retryable failure named by its class.

class TaskError(Exception):
    """The base of the errors a task's handler raises to choose its attempt's failure class.

    ``code`` is the failure's error_code (1 to 64 characters): the class's name unless given,
    so ``class CardDeclined(NonRetriableError)`` fails the step with error_code CardDeclined.
    """

    failure_class = "retryable"

    def __init__(self, message: str, *, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.code = code or type(self).__name__


class NonRetriableError(TaskError):
    """The step fails for good (ds_fail_task class 'permanent'), whatever attempts are left."""
    failure_class = "permanent"


class RetryAfterError(TaskError):
    """A retryable failure (class 'retryable') retried ``delay_seconds`` later (retry_after),
    in place of the policy's backoff (the attempt is counted)."""

    def __init__(self, message: str, delay_seconds: Union[float, datetime.timedelta], *,
                 code: Optional[str] = None):
        super().__init__(message, code=code)
        if isinstance(delay_seconds, datetime.timedelta):
            delay_seconds = delay_seconds.total_seconds()
        if delay_seconds < 0:
            raise ValueError("delay_seconds must not be negative")
        self.delay_seconds = float(delay_seconds)


class BlockedError(TaskError):
    """The step is blocked (class 'correctable') with ``remediation`` for a person: ds_retry_step
    re-arms it, optionally with corrected input."""
    failure_class = "correctable"

    def __init__(self, message: str, remediation: str, *, code: Optional[str] = None):
        super().__init__(message, code=code)
        self.remediation = remediation


def _classes(base: type):
    for cls in base.__subclasses__():
        yield cls
        yield from _classes(cls)


BY_SQLSTATE: Dict[str, Type[DurableStepsError]] = {c.sqlstate: c for c in _classes(DurableStepsError)
                                                   if c.sqlstate}


def from_exception(e: BaseException) -> DurableStepsError:
    """The DurableStepsError for an error of psycopg2 (or SQLAlchemy's DBAPIError around one).

    A code no class stands for gives DurableStepsError itself, with ``sqlstate`` set; an error
    without a SQLSTATE (a lost connection) gives DurableStepsError with ``sqlstate`` None.
    """
    if isinstance(e, DurableStepsError):
        return e
    orig = getattr(e, "orig", None) or e       # SQLAlchemy wraps the driver's error
    code = getattr(orig, "pgcode", None)
    diag = getattr(orig, "diag", None)
    message = getattr(diag, "message_primary", None) or str(orig).strip()
    detail = getattr(diag, "message_detail", None)
    hint = getattr(diag, "message_hint", None)
    cls = BY_SQLSTATE.get(code or "", DurableStepsError)
    return cls(message, code, detail, hint, orig)


__all__ = sorted({c.__name__ for c in _classes(DurableStepsError)}
                 | {"DurableStepsError", "NotFound", "InFlight", "Conflict", "BY_SQLSTATE",
                    "from_exception", "TaskError", "NonRetriableError", "RetryAfterError",
                    "BlockedError"})
