// durable_steps' documented SQLSTATEs as error classes: the extension's own (class DS,
// docs/reference.md "SQLSTATEs", src/base/ds_errcodes.h) and the standard ones its functions
// raise for documented reasons (the same table, docs/idempotent-requests.md and
// docs/schedules.md "Errors"). Every function of this package turns a failed query into one of
// them with toDurableStepsError(), so that an application catches `StepConflictError`, not a
// string compare on `e.code`.
//
// Each class carries the HTTP status a service answers with when the error reaches its client
// (the middleware of ./express and ./fastify use it), as docs/reference.md "HTTP statuses" lists
// them; the Python client's classes carry the same.

import type { Interval } from './client.js';

/** The fields of node-postgres's DatabaseError this package reads. */
export interface ServerErrorFields {
    code: string;
    message: string;
    severity?: string;
    detail?: string;
    hint?: string;
}

/** The base class: every error of a durable_steps call. */
export class DurableStepsError extends Error {
    /** The SQLSTATE a subclass stands for (null on the base class). */
    static readonly sqlstate: string | null = null;
    /** The HTTP status a service answers with when this error reaches its client. */
    static readonly httpStatus: number = 500;

    /** The server's SQLSTATE (null for an error that did not come from the server). */
    readonly sqlstate: string | null;
    /** The same as sqlstate, under the name node-postgres uses. */
    readonly code: string | null;
    readonly httpStatus: number;
    /** The server's DETAIL and HINT, when it sent them. */
    readonly detail: string | null;
    readonly hint: string | null;

    constructor(message: string, fields: Partial<ServerErrorFields> = {}, options?: { cause?: unknown }) {
        super(message, options);
        const cls = new.target as typeof DurableStepsError;
        this.name = cls.name;
        this.sqlstate = cls.sqlstate ?? fields.code ?? null;
        this.code = this.sqlstate;
        this.httpStatus = cls.httpStatus;
        this.detail = fields.detail ?? null;
        this.hint = fields.hint ?? null;
    }
}

// --- raised by step bodies through the helpers (recorded on the step's attempts) -------------

// A task's handler (./worker.ts) throws them too, to say what its failure is: `new
// NonRetriableError(message)` fails the step at once, `new RetryAfterError(message, delayMs)`
// retries it after the delay, `new BlockedError(message, remediation)` blocks it.

/**
 * DS001 non_retriable: `ds_non_retriable()`, fail the step at once. Thrown by a task's handler:
 * the step fails (class 'permanent').
 */
export class NonRetriableError extends DurableStepsError {
    static override readonly sqlstate = 'DS001';
    static override readonly httpStatus = 422;
}

/**
 * DS002 retry_after: `ds_retry_after()`, retry after the given delay. Thrown by a task's handler
 * as `new RetryAfterError(message, delayMs)`: the attempt fails and the next one runs after
 * `delayMs` milliseconds.
 */
export class RetryAfterError extends DurableStepsError {
    static override readonly sqlstate = 'DS002';
    static override readonly httpStatus = 503;

    /**
     * The delay: the milliseconds given, or the interval the server named (`ds_retry_after`'s,
     * from its DETAIL "Retry after <interval>."); null when neither says one. A task's worker
     * records at least 1 ms and at most 24 hours.
     */
    readonly retryAfter: Interval | null;

    constructor(message: string, delayMs?: number | Partial<ServerErrorFields>, options?: { cause?: unknown }) {
        const fields = typeof delayMs === 'object' && delayMs !== null ? delayMs : {};
        super(message, fields, options);
        if (typeof delayMs === 'number') {
            if (!Number.isFinite(delayMs) || delayMs < 0) {
                throw new RangeError(`a retry delay must be a finite number of milliseconds >= 0, not ${delayMs}`);
            }
            this.retryAfter = delayMs;
        } else {
            this.retryAfter = /^Retry after (.+)\.$/.exec(this.detail ?? '')?.[1] ?? null;
        }
    }

    /** The delay in milliseconds when it was given as a number (null otherwise). */
    get delayMs(): number | null {
        return typeof this.retryAfter === 'number' ? this.retryAfter : null;
    }
}

/**
 * DS003 blocked: `ds_blocked()`, blocked until a person re-arms the step. Thrown by a task's
 * handler as `new BlockedError(message, remediation)`: the step is blocked with the remediation
 * (class 'correctable') until `ds_retry_step` re-arms it.
 */
export class BlockedError extends DurableStepsError {
    static override readonly sqlstate = 'DS003';
    static override readonly httpStatus = 409;

    /** What must change before the step is re-armed (the server's HINT for `ds_blocked`). */
    readonly remediation: string | null;

    constructor(message: string, remediation?: string | Partial<ServerErrorFields>, options?: { cause?: unknown }) {
        const fields = typeof remediation === 'object' && remediation !== null ? remediation : {};
        super(message, fields, options);
        this.remediation = typeof remediation === 'string' ? remediation : this.hint;
    }
}

// --- recorded on attempts by the extension (a step's errorCode; raised only by a workflow) ----

/** DS004 step_timeout: the step's timeout cancelled its body. */
export class StepTimeoutError extends DurableStepsError {
    static override readonly sqlstate = 'DS004';
    static override readonly httpStatus = 504;
}

/** DS005 result_too_large: a result over durable_steps.max_result_size. */
export class ResultTooLargeError extends DurableStepsError {
    static override readonly sqlstate = 'DS005';
}

/** DS006 too_many_rows: a body returned more than one row. */
export class TooManyRowsError extends DurableStepsError {
    static override readonly sqlstate = 'DS006';
}

/** DS007 invocation_lost: an attempt's executor ended before recording its outcome. */
export class InvocationLostError extends DurableStepsError {
    static override readonly sqlstate = 'DS007';
    static override readonly httpStatus = 503;
}

/** DS008 no_row: a step called with `expect: 'row'` returned no row (it is blocked). */
export class NoRowError extends DurableStepsError {
    static override readonly sqlstate = 'DS008';
    static override readonly httpStatus = 409;
}

/** DS010 http_status: an HTTP step's response was not 2xx. */
export class HttpStatusError extends DurableStepsError {
    static override readonly sqlstate = 'DS010';
    static override readonly httpStatus = 502;
}

/** DS011 http_not_sent: an HTTP request was never sent (no connection). */
export class HttpNotSentError extends DurableStepsError {
    static override readonly sqlstate = 'DS011';
    static override readonly httpStatus = 502;
}

/** DS012 http_uncertain: an HTTP request may have been received, no whole response came back. */
export class HttpUncertainError extends DurableStepsError {
    static override readonly sqlstate = 'DS012';
    static override readonly httpStatus = 502;
}

/** DS013 http_bad_response: a response too large, or not the JSON or text expected. */
export class HttpBadResponseError extends DurableStepsError {
    static override readonly sqlstate = 'DS013';
    static override readonly httpStatus = 502;
}

/** DS014 resolved_failed: `ds_resolve_step(..., 'failed')`. */
export class ResolvedFailedError extends DurableStepsError {
    static override readonly sqlstate = 'DS014';
    static override readonly httpStatus = 502;
}

// --- raised to callers ------------------------------------------------------------------------

/** DS101 no_step_context: an attempt-context function called outside a step. */
export class NoStepContextError extends DurableStepsError {
    static override readonly sqlstate = 'DS101';
}

/** DS102 step_not_succeeded: `ds_unwrap` of a step that has not succeeded; a workflow's failed step. */
export class StepNotSucceededError extends DurableStepsError {
    static override readonly sqlstate = 'DS102';
    static override readonly httpStatus = 502;
}

/** DS103 invalid_step_state: nothing left to cancel, re-arm, resume or resolve. */
export class InvalidStepStateError extends DurableStepsError {
    static override readonly sqlstate = 'DS103';
    static override readonly httpStatus = 409;
}

/** DS104 step_recursion: a step's body runs the same step, or steps nest too deep. */
export class StepRecursionError extends DurableStepsError {
    static override readonly sqlstate = 'DS104';
}

/** DS105 no_run_context: `ds_step`, `ds_http`, `ds_sleep` or `ds_await_event` outside a workflow. */
export class NoRunContextError extends DurableStepsError {
    static override readonly sqlstate = 'DS105';
}

/** DS106 run_suspended: internal, ends a workflow's turn that must wait. */
export class RunSuspendedError extends DurableStepsError {
    static override readonly sqlstate = 'DS106';
    static override readonly httpStatus = 503;
}

/** DS201 wrong_partition: the run (or idempotency key) belongs to a partition this server does not own (docs/partitions.md). */
export class WrongPartitionError extends DurableStepsError {
    static override readonly sqlstate = 'DS201';
    static override readonly httpStatus = 503;
}

/**
 * DS426 version_mismatch: the extension installed in the database is of another version than
 * the library the server loaded: `ALTER EXTENSION durable_steps UPDATE` has not run yet
 * (docs/operations.md, "Upgrades").
 */
export class VersionMismatchError extends DurableStepsError {
    static override readonly sqlstate = 'DS426';
    static override readonly httpStatus = 503;
}

/** DS404 step_not_found: no such step, run or idempotency key (or the caller may not see it). */
export class StepNotFoundError extends DurableStepsError {
    static override readonly sqlstate = 'DS404';
    static override readonly httpStatus = 404;
}

/** DS408 event_timeout: `ds_await_event` whose timeout passed before the event was emitted. */
export class EventTimeoutError extends DurableStepsError {
    static override readonly sqlstate = 'DS408';
    static override readonly httpStatus = 504;
}

/**
 * DS410 lease_lost: a task's token no longer holds its lease (the lease ran out and the attempt
 * was recorded lost, the step was cancelled, or the attempt already has its outcome):
 * `ds_complete_task` and `ds_fail_task` refuse it, and the transaction that tried is aborted,
 * so the handler's own writes in it roll back with it.
 */
export class LeaseLostError extends DurableStepsError {
    static override readonly sqlstate = 'DS410';
    static override readonly httpStatus = 410;
}

/** DS409 in_progress: held by another transaction or request; retry later. */
export class InProgressError extends DurableStepsError {
    static override readonly sqlstate = 'DS409';
    static override readonly httpStatus = 409;
}

/** DS422 step_conflict: another definition, run or request under the key. */
export class StepConflictError extends DurableStepsError {
    static override readonly sqlstate = 'DS422';
    static override readonly httpStatus = 422;
}

// --- standard SQLSTATEs the documentation lists -------------------------------------------------

/** 21000 cardinality_violation: an idempotent handler returned no row, or more than one. */
export class CardinalityViolationError extends DurableStepsError {
    static override readonly sqlstate = '21000';
}

/** 22004 null_value_not_allowed: a required argument is NULL. */
export class NullValueNotAllowedError extends DurableStepsError {
    static override readonly sqlstate = '22004';
    static override readonly httpStatus = 400;
}

/** 22023 invalid_parameter_value: a malformed argument (the message names it). */
export class InvalidParameterValueError extends DurableStepsError {
    static override readonly sqlstate = '22023';
    static override readonly httpStatus = 400;
}

/** 25000 invalid_transaction_state: `ds_claim_tasks` at the REPEATABLE READ or SERIALIZABLE isolation level. */
export class InvalidTransactionStateError extends DurableStepsError {
    static override readonly sqlstate = '25000';
}

/** 25001 active_sql_transaction: `ds_claim_tasks` inside a transaction block (a claim commits by itself). */
export class ActiveSqlTransactionError extends DurableStepsError {
    static override readonly sqlstate = '25001';
}

/** 25006 read_only_sql_transaction: a step created, run or re-armed in a read-only transaction. */
export class ReadOnlySqlTransactionError extends DurableStepsError {
    static override readonly sqlstate = '25006';
    static override readonly httpStatus = 503;
}

/** 2D000 invalid_transaction_termination: a procedure workflow ran COMMIT or ROLLBACK. */
export class InvalidTransactionTerminationError extends DurableStepsError {
    static override readonly sqlstate = '2D000';
}

/** 42501 insufficient_privilege: the role may not do it. */
export class InsufficientPrivilegeError extends DurableStepsError {
    static override readonly sqlstate = '42501';
    static override readonly httpStatus = 403;
}

/** 42704 undefined_object: a step's policy names a limit that does not exist (docs/limits.md). */
export class UndefinedObjectError extends DurableStepsError {
    static override readonly sqlstate = '42704';
}

/** 0A000 feature_not_supported: a step of a limit that would run in its caller's transaction (docs/limits.md). */
export class FeatureNotSupportedError extends DurableStepsError {
    static override readonly sqlstate = '0A000';
}

/** 42601 syntax_error: a step's body or hook, or a handler, that does not parse or is not one statement. */
export class SqlSyntaxError extends DurableStepsError {
    static override readonly sqlstate = '42601';
}

/** 42710 duplicate_object: a schedule's name taken by another role or job. */
export class DuplicateObjectError extends DurableStepsError {
    static override readonly sqlstate = '42710';
    static override readonly httpStatus = 409;
}

/** 42723 duplicate_function: `ds_define_workflow` of a SQL workflow's name. */
export class DuplicateFunctionError extends DurableStepsError {
    static override readonly sqlstate = '42723';
    static override readonly httpStatus = 409;
}

/** 42804 datatype_mismatch: a `ds_key` part of an unsupported type; a handler's columns not (integer, jsonb). */
export class DatatypeMismatchError extends DurableStepsError {
    static override readonly sqlstate = '42804';
}

/** 42809 wrong_object_type: `ds_start_run` of a routine that is not a workflow. */
export class WrongObjectTypeError extends DurableStepsError {
    static override readonly sqlstate = '42809';
}

/** 42883 undefined_function: `ds_start_run` of a workflow that does not exist. */
export class UndefinedFunctionError extends DurableStepsError {
    static override readonly sqlstate = '42883';
}

/** 53200 out_of_memory: more steps in one transaction than the server's lock table is sized for. */
export class OutOfMemoryError extends DurableStepsError {
    static override readonly sqlstate = '53200';
    static override readonly httpStatus = 413;
}

/** 54000 program_limit_exceeded: SQL, input, request, body or payload over its size setting. */
export class ProgramLimitExceededError extends DurableStepsError {
    static override readonly sqlstate = '54000';
    static override readonly httpStatus = 413;
}

/** 55000 object_not_in_prerequisite_state: pg_cron is not installed (schedules). */
export class ObjectNotInPrerequisiteStateError extends DurableStepsError {
    static override readonly sqlstate = '55000';
    static override readonly httpStatus = 503;
}

/** 57014 query_canceled: a wait or a step's statement cancelled (statement_timeout). */
export class QueryCanceledError extends DurableStepsError {
    static override readonly sqlstate = '57014';
    static override readonly httpStatus = 503;
}

/** Every class of a SQLSTATE, by its SQLSTATE. */
export const ERRORS_BY_SQLSTATE: ReadonlyMap<string, typeof DurableStepsError> = new Map(
    [
        NonRetriableError, RetryAfterError, BlockedError, StepTimeoutError, ResultTooLargeError,
        TooManyRowsError, InvocationLostError, NoRowError, HttpStatusError, HttpNotSentError, HttpUncertainError,
        HttpBadResponseError, ResolvedFailedError, NoStepContextError, StepNotSucceededError,
        InvalidStepStateError, StepRecursionError, NoRunContextError, RunSuspendedError,
        WrongPartitionError, VersionMismatchError, StepNotFoundError, EventTimeoutError, InProgressError, LeaseLostError,
        StepConflictError,
        CardinalityViolationError, NullValueNotAllowedError, InvalidParameterValueError,
        InvalidTransactionStateError, ActiveSqlTransactionError, ReadOnlySqlTransactionError, InvalidTransactionTerminationError, InsufficientPrivilegeError,
        SqlSyntaxError, DuplicateObjectError, DuplicateFunctionError, DatatypeMismatchError, WrongObjectTypeError,
        UndefinedFunctionError, UndefinedObjectError, FeatureNotSupportedError, OutOfMemoryError, ProgramLimitExceededError,
        ObjectNotInPrerequisiteStateError, QueryCanceledError,
    ].map((cls) => [cls.sqlstate as string, cls]),
);

/**
 * The server's error inside e: e itself or one of its causes, the first that carries a SQLSTATE
 * and a severity (node-postgres's DatabaseError; a query builder's error wraps it as `cause`).
 */
function serverError(e: unknown): ServerErrorFields | null {
    let cur: unknown = e;
    for (let depth = 0; cur !== null && typeof cur === 'object' && depth < 8; depth++) {
        const c = cur as Record<string, unknown>;
        if (typeof c.code === 'string' && /^[0-9A-Z]{5}$/.test(c.code) && typeof c.severity === 'string') {
            return c as unknown as ServerErrorFields;
        }
        cur = c.cause;
    }
    return null;
}

/**
 * The error of e's SQLSTATE, with the server's message, detail and hint, and e as its cause.
 * An error of another SQLSTATE is a DurableStepsError with that SQLSTATE; one that did not come
 * from the server (a lost connection) is returned as it is.
 */
export function toDurableStepsError(e: unknown): unknown {
    if (e instanceof DurableStepsError) {
        return e;
    }
    const found = serverError(e);
    if (found === null) {
        return e;
    }
    const cls = ERRORS_BY_SQLSTATE.get(found.code) ?? DurableStepsError;
    return new cls(found.message, found, { cause: e });
}
