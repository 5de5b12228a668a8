// durable_steps' documented SQLSTATEs as error classes (docs/reference.md, "SQLSTATEs"), and the
// shapes of the rows the checkout reads, as JSDoc types (checked by an editor, no build step).
//
// fromDatabaseError(e) turns an error raised by a durable_steps function -- node-postgres's own,
// or one a query builder wrapped around it (Drizzle's DrizzleQueryError keeps it as `cause`) --
// into the class of its SQLSTATE, which carries the HTTP status a service answers with; other
// errors become DurableStepsError with status 500.

/**
 * A row of ds_idempotent(scope, key, request, handler, ...).
 * @typedef {object} IdempotentResponse
 * @property {number} status    the stored response's HTTP status
 * @property {any} body         the stored response's body (jsonb, parsed)
 * @property {boolean} replayed true when the response was stored by an earlier request
 */

/**
 * The columns the checkout reads of ds_wait_step(run_id, step_id, timeout).
 * @typedef {object} StepOutcome
 * @property {'pending'|'running'|'succeeded'|'failed'|'blocked'|'uncertain'|'cancelled'|string} status
 * @property {any} result               the step's result once it succeeded (for an HTTP step:
 *                                      {status, headers, body})
 * @property {string|null} error_code
 * @property {string|null} error_message
 */

/**
 * What the checkout needs of a database layer; store-knex.js and store-drizzle.js implement it.
 * @typedef {object} CheckoutStore
 * @property {(chargeUrl: string) => Promise<void>} setup
 * @property {(key: string, request: object, handler: string) => Promise<IdempotentResponse>} idempotent
 * @property {(runId: string) => Promise<StepOutcome>} waitCharge
 * @property {() => Promise<void>} close
 */

export class DurableStepsError extends Error {
    /** @type {string|null} */
    static sqlstate = null;
    static httpStatus = 500;

    /**
     * @param {string} message the server's primary message
     * @param {string|null} [sqlstate] for the base class: the SQLSTATE no subclass names
     */
    constructor(message, sqlstate = null) {
        super(message);
        this.name = new.target.name;
        const cls = /** @type {typeof DurableStepsError} */ (new.target);
        /** @type {string|null} */
        this.sqlstate = cls.sqlstate ?? sqlstate;
        /** @type {number} */
        this.httpStatus = cls.httpStatus;
    }
}

/** DS001: the body chose to fail for good. */
export class NonRetriable extends DurableStepsError {
    static sqlstate = 'DS001';
    static httpStatus = 422;
}

/** DS002: the body asked for a retry later. */
export class RetryAfter extends DurableStepsError {
    static sqlstate = 'DS002';
    static httpStatus = 503;
}

/** DS003: blocked until a person re-arms it. */
export class Blocked extends DurableStepsError {
    static sqlstate = 'DS003';
    static httpStatus = 409;
}

/** DS102: ds_unwrap or a workflow's step did not succeed. */
export class StepFailed extends DurableStepsError {
    static sqlstate = 'DS102';
    static httpStatus = 502;
}

/** DS103: nothing left to cancel or re-arm. */
export class AlreadyFinished extends DurableStepsError {
    static sqlstate = 'DS103';
    static httpStatus = 409;
}

/** DS404: no such step, run or key. */
export class NotFound extends DurableStepsError {
    static sqlstate = 'DS404';
    static httpStatus = 404;
}

/** DS409: held by another transaction or request. */
export class InFlight extends DurableStepsError {
    static sqlstate = 'DS409';
    static httpStatus = 409;
}

/** DS422: another definition or request under the key. */
export class Conflict extends DurableStepsError {
    static sqlstate = 'DS422';
    static httpStatus = 422;
}

/** 42501: the role may not do it. */
export class NotPermitted extends DurableStepsError {
    static sqlstate = '42501';
    static httpStatus = 403;
}

/** @type {Map<string, typeof DurableStepsError>} */
export const BY_SQLSTATE = new Map(
    [NonRetriable, RetryAfter, Blocked, StepFailed, AlreadyFinished, NotFound, InFlight, Conflict,
     NotPermitted].map((cls) => [/** @type {string} */ (cls.sqlstate), cls]));

/**
 * The server's error inside e: e itself or one of its causes, the first that carries a SQLSTATE
 * and a severity (node-postgres's DatabaseError).
 * @param {unknown} e
 * @returns {{code: string, message: string} | null}
 */
function serverError(e) {
    for (let cur = e, depth = 0; cur && typeof cur === 'object' && depth < 8; depth++) {
        const c = /** @type {any} */ (cur);
        if (typeof c.code === 'string' && /^[0-9A-Z]{5}$/.test(c.code) && typeof c.severity === 'string') {
            return c;
        }
        cur = c.cause;
    }
    return null;
}

/**
 * The error of the SQLSTATE of e, with the server's message.
 * @param {unknown} e
 * @returns {DurableStepsError}
 */
export function fromDatabaseError(e) {
    if (e instanceof DurableStepsError) {
        return e;
    }
    const found = serverError(e);
    if (found === null) {
        return new DurableStepsError(e instanceof Error ? e.message : String(e));
    }
    const cls = BY_SQLSTATE.get(found.code);
    return cls ? new cls(found.message) : new DurableStepsError(found.message, found.code);
}
