"""durable_steps' documented SQLSTATEs as exception classes (docs/reference.md, "SQLSTATEs").

from_dbapi(e) turns a SQLAlchemy DBAPIError raised by a durable_steps function into the class of
its SQLSTATE, which carries the HTTP status a service answers with; other errors stay
DurableStepsError with status 500.
"""


class DurableStepsError(Exception):
    sqlstate = None
    http_status = 500

    def __init__(self, message, sqlstate=None):
        super().__init__(message)
        self.message = message
        if sqlstate is not None:
            self.sqlstate = sqlstate


class NonRetriable(DurableStepsError):      # DS001: the body chose to fail for good
    sqlstate, http_status = "DS001", 422


class RetryAfter(DurableStepsError):        # DS002: the body asked for a retry later
    sqlstate, http_status = "DS002", 503


class Blocked(DurableStepsError):           # DS003: blocked until a person re-arms it
    sqlstate, http_status = "DS003", 409


class StepFailed(DurableStepsError):        # DS102: ds_unwrap or a workflow's step did not succeed
    sqlstate, http_status = "DS102", 502


class AlreadyFinished(DurableStepsError):   # DS103: nothing left to cancel or re-arm
    sqlstate, http_status = "DS103", 409


class NotFound(DurableStepsError):          # DS404: no such step, run or key
    sqlstate, http_status = "DS404", 404


class InFlight(DurableStepsError):          # DS409: held by another transaction or request
    sqlstate, http_status = "DS409", 409


class Conflict(DurableStepsError):          # DS422: another definition or request under the key
    sqlstate, http_status = "DS422", 422


class NotPermitted(DurableStepsError):      # 42501: the role may not do it
    sqlstate, http_status = "42501", 403


BY_SQLSTATE = {cls.sqlstate: cls for cls in (NonRetriable, RetryAfter, Blocked, StepFailed,
                                             AlreadyFinished, NotFound, InFlight, Conflict,
                                             NotPermitted)}


def from_dbapi(e):
    """The exception of the SQLSTATE of a DBAPIError (psycopg2's pgcode)."""
    code = getattr(getattr(e, "orig", None), "pgcode", None)
    diag = getattr(getattr(e, "orig", None), "diag", None)
    message = (diag.message_primary if diag is not None and diag.message_primary else str(e.orig))
    cls = BY_SQLSTATE.get(code, DurableStepsError)
    return cls(message, code) if cls is DurableStepsError else cls(message)
