// The durable_steps functions as typed calls over node-postgres (or anything with its
// `query(text, values)`): each call is one statement whose SQL text is fixed by this package --
// the function's name and the names of the arguments given -- and whose every value, a step's
// body and an idempotent handler included, is a bind parameter. So:
//
// - a step's SQL reaches the server as written: no query builder rewrites its `?` or `:name`,
//   and no client data is ever spliced into a statement;
// - it works behind PgBouncer in transaction mode: no LISTEN (the waits are one statement each),
//   no session SET, no named prepared statement (node-postgres prepares by name only when a
//   query has a `name`; these have none);
// - the rows come back as objects with camelCase fields and parsed values (jsonb, integers,
//   timestamps), never the text of a composite value.
//
// A failed call rejects with the error class of its SQLSTATE (./errors.ts).

import { toDurableStepsError } from './errors.js';

/** What a call needs of node-postgres: a Pool, a Client or a PoolClient all have it. */
export interface Queryable {
    query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** A JSON value, as jsonb holds it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/**
 * An interval: PostgreSQL's text ('10 s', '5 minutes', '00:00:10') or a number of milliseconds.
 */
export type Interval = string | number;

/** A step's status (docs/steps.md, "Step statuses"). */
export type StepStatus =
    | 'pending' | 'running' | 'retrying' | 'succeeded' | 'failed' | 'blocked' | 'uncertain' | 'cancelled';

/** A run's status (docs/runs.md, "Run states"). */
export type RunStatus = 'pending' | 'running' | 'waiting' | 'blocked' | 'succeeded' | 'failed' | 'cancelled';

/** A row of the type ds_step_result (docs/reference.md). */
export interface StepResult<R = Json> {
    runId: string;
    stepId: string;
    status: StepStatus;
    /** the result of a succeeded step (null otherwise) */
    result: R | null;
    /** the number of the last attempt */
    attempt: number;
    /** the last attempt number the current arming allows */
    maxAttempts: number;
    nextAttemptAt: Date | null;
    /** the last failure: its class, SQLSTATE, message and detail */
    errorClass: string | null;
    errorCode: string | null;
    errorMessage: string | null;
    errorDetail: string | null;
    /** what to do for a blocked step */
    remediation: string | null;
    /** true when the answer comes from the stored state without running the body */
    replayed: boolean;
}

/** An HTTP step's request (docs/http.md, "Request"); no other field is allowed (22023). */
export interface HttpRequest {
    /** GET by default */
    method?: 'GET' | 'HEAD' | 'POST' | 'PUT' | 'PATCH' | 'DELETE' | 'OPTIONS';
    /** an http or https URL */
    url: string;
    headers?: Record<string, string>;
    /** any JSON value, sent as the body with Content-Type: application/json */
    json?: Json;
    /** a string sent as the body (text/plain unless headers set a type); not with json */
    body?: string;
    /** 'json': the response body is parsed as JSON; 'text' (the default): kept as a string */
    expect?: 'json' | 'text';
    /** milliseconds or interval text, at most 5 minutes */
    connect_timeout?: number | string;
    retry_on_status?: (number | string)[];
    fail_on_status?: (number | string)[];
}

/**
 * An HTTP step's result: the response (docs/http.md, "Response"): header names in lower case;
 * the body parsed JSON with expect 'json', else a string (null when empty).
 */
export interface HttpResponse<B = Json> {
    status: number;
    headers: Record<string, string>;
    body: B;
}

/** The retry policy keys (docs/steps.md, "Retry policy"); delays as intervals. */
export interface RetryPolicy {
    max_attempts?: number;
    initial_delay?: string;
    max_delay?: string;
    backoff?: 'exponential' | 'fixed' | string;
    multiplier?: number;
    jitter?: number;
}

export interface RunStepOptions {
    /** the body's $1 */
    input?: Json;
    policy?: RetryPolicy;
    timeout?: Interval;
    nowait?: boolean;
    retryOn?: string[];
    failOn?: string[];
    onTimeout?: 'retry' | 'fail';
    defer?: boolean;
    runAt?: Date | string;
    notify?: string;
    onSuccess?: string;
    onFailure?: string;
    queue?: string;
    priority?: number;
    /** 'row': a body that returns no row fails (DS008, the step is blocked) instead of succeeding with null */
    expect?: 'row';
}

export interface HttpStepOptions {
    policy?: RetryPolicy;
    /** the header that carries the step's key; null or '' sends none */
    idempotencyHeader?: string | null;
    onSuccess?: string;
    onFailure?: string;
    timeout?: Interval;
    nowait?: boolean;
    runAt?: Date | string;
    notify?: string;
    retryOnStatus?: string[];
    failOnStatus?: string[];
}

export interface TaskStepOptions {
    policy?: RetryPolicy;
    /** the queue its claims are counted in ('default' by default) */
    queue?: string;
    priority?: number;
    /** not claimed before this time */
    runAt?: Date | string;
    /** the handler's deadline per attempt (none by default): ctx.signal is aborted at it */
    timeout?: Interval;
    notify?: string;
    onSuccess?: string;
    onFailure?: string;
    /**
     * What a lease that ran out makes of the attempt: 'retry' (the default: a lost attempt,
     * DS007, retried by the policy) or 'uncertain' (the step waits for an operator).
     */
    onLost?: 'retry' | 'uncertain';
    nowait?: boolean;
    /** 'row': a handler that completes it with no result (undefined, null) blocks it (DS008) */
    expect?: 'row';
}

export interface RetryStepOptions {
    input?: Json;
    sql?: string;
    request?: HttpRequest;
}

export interface StartRunOptions {
    /** makes the start idempotent: the run id is the key */
    runKey?: string;
    /** the default retry policy of the run's steps */
    policy?: RetryPolicy;
}

/** What ds_start_run answers. */
export interface StartedRun {
    runId: string;
    status: RunStatus;
    /** false when the run key named a run that existed */
    created: boolean;
}

/** What ds_wait_run answers. */
export interface RunOutcome<O = Json> {
    status: RunStatus;
    /** the workflow's return value once the run succeeded */
    output: O | null;
    errorCode: string | null;
    errorMessage: string | null;
}

/** What ds_idempotent answers: the stored response, or the one just stored. */
export interface IdempotentResponse<B = Json> {
    status: number;
    body: B;
    /** true when the response was stored by an earlier request */
    replayed: boolean;
}

export interface IdempotentOptions {
    /** how long the response is kept ('24 hours' by default) */
    ttl?: Interval;
    /** how long a repeat waits for a first request in flight (none: DS409 at once) */
    wait?: Interval;
}

/** What ds_idempotent_begin answers. */
export type IdempotentBegin<B = Json> =
    | { state: 'new'; token: string; status: null; body: null }
    | { state: 'replay'; token: null; status: number; body: B };

export interface IdempotentBeginOptions {
    ttl?: Interval;
    /** how long the key stays held without a finish ('5 minutes' by default) */
    lease?: Interval;
    /**
     * how long a repeat waits for the request that holds the key to finish, abandon it or lose
     * its lease (woken by that commit, not polling); none: InProgressError (DS409) at once
     */
    wait?: Interval;
}

export interface ClientOptions {
    /**
     * The schema durable_steps is installed in, when it is not on the connection's search_path:
     * the calls are qualified with it.
     */
    schema?: string;
}

type SqlType = 'text' | 'jsonb' | 'interval' | 'boolean' | 'text[]' | 'timestamptz' | 'integer' | 'uuid';

/** One call in named notation: `fn(name => $1::type, ...)`, only the arguments given. */
class Call {
    private readonly args: string[] = [];
    readonly values: unknown[] = [];

    /** Adds an argument; undefined leaves it to its default, null passes SQL NULL. */
    arg(name: string, value: unknown, type: SqlType): this {
        if (value === undefined) {
            return this;
        }
        this.values.push(encode(value, type));
        this.args.push(`${name} => $${this.values.length}::${type}`);
        return this;
    }

    text(fn: string, columns: string): string {
        return `SELECT ${columns} FROM ${fn}(${this.args.join(', ')})`;
    }
}

function encode(value: unknown, type: SqlType): unknown {
    if (value === null) {
        return null;
    }
    switch (type) {
        case 'jsonb':
            // node-postgres would send a JS array as a PostgreSQL array: always send JSON text
            return JSON.stringify(value);
        case 'interval':
            if (typeof value === 'number') {
                if (!Number.isFinite(value)) {
                    throw new TypeError(`an interval must be a finite number of milliseconds, not ${value}`);
                }
                return `${value} milliseconds`;
            }
            return value;
        default:
            return value;
    }
}

const STEP_COLUMNS = `run_id, step_id, status, result, attempt, max_attempts, next_attempt_at, error_class,
       error_code, error_message, error_detail, remediation, replayed`;

function stepResult<R>(row: any): StepResult<R> {
    return {
        runId: row.run_id,
        stepId: row.step_id,
        status: row.status,
        result: row.result,
        attempt: row.attempt,
        maxAttempts: row.max_attempts,
        nextAttemptAt: row.next_attempt_at,
        errorClass: row.error_class,
        errorCode: row.error_code,
        errorMessage: row.error_message,
        errorDetail: row.error_detail,
        remediation: row.remediation,
        replayed: row.replayed,
    };
}

function quoteIdent(name: string): string {
    return `"${name.replace(/"/g, '""')}"`;
}

/**
 * durable_steps over a node-postgres Pool, Client or PoolClient. Calls made through a Pool are
 * each a transaction of their own; to make several in one transaction (a step and the writes
 * that go with it), give a PoolClient on which BEGIN was run.
 */
export class DurableSteps {
    readonly db: Queryable;
    private readonly prefix: string;

    constructor(db: Queryable, options: ClientOptions = {}) {
        this.db = db;
        this.prefix = options.schema ? `${quoteIdent(options.schema)}.` : '';
    }

    /** The same calls on another connection (a PoolClient inside a transaction). */
    on(db: Queryable): DurableSteps {
        const other = Object.create(DurableSteps.prototype) as DurableSteps;
        Object.assign(other, this, { db });
        return other;
    }

    private async rows(fn: string, call: Call, columns: string): Promise<any[]> {
        try {
            return (await this.db.query(call.text(this.prefix + fn, columns), call.values)).rows;
        } catch (e) {
            throw toDurableStepsError(e);
        }
    }

    private async one(fn: string, call: Call, columns: string): Promise<any> {
        const rows = await this.rows(fn, call, columns);
        if (rows.length !== 1) {
            throw new Error(`${fn} answered ${rows.length} rows, not one`);
        }
        return rows[0];
    }

    private async step<R>(fn: string, call: Call): Promise<StepResult<R>> {
        return stepResult<R>(await this.one(fn, call, STEP_COLUMNS));
    }

    /**
     * ds_run_step: the durable step `(runId, stepId)` whose body is `sql` (one statement, $1 the
     * input). The SQL is a bind parameter: it reaches the server as written.
     */
    runStep<R = Json>(runId: string, stepId: string, sql: string, options: RunStepOptions = {}): Promise<StepResult<R>> {
        const call = new Call()
            .arg('run_id', runId, 'text')
            .arg('step_id', stepId, 'text')
            .arg('sql', sql, 'text')
            .arg('input', options.input, 'jsonb')
            .arg('policy', options.policy, 'jsonb')
            .arg('timeout', options.timeout, 'interval')
            .arg('nowait', options.nowait, 'boolean')
            .arg('retry_on', options.retryOn, 'text[]')
            .arg('fail_on', options.failOn, 'text[]')
            .arg('on_timeout', options.onTimeout, 'text')
            .arg('defer', options.defer, 'boolean')
            .arg('run_at', options.runAt, 'timestamptz')
            .arg('notify', options.notify, 'text')
            .arg('on_success', options.onSuccess, 'text')
            .arg('on_failure', options.onFailure, 'text')
            .arg('queue', options.queue, 'text')
            .arg('priority', options.priority, 'integer')
            .arg('expect', options.expect, 'text');
        return this.step<R>('ds_run_step', call);
    }

    /**
     * ds_http_step: an HTTP step, stored with the caller's transaction and sent by the HTTP
     * worker once it commits. Its result, once it succeeded, is the response.
     */
    httpStep<B = Json>(runId: string, stepId: string, request: HttpRequest,
        options: HttpStepOptions = {}): Promise<StepResult<HttpResponse<B>>> {
        const call = new Call()
            .arg('run_id', runId, 'text')
            .arg('step_id', stepId, 'text')
            .arg('request', request, 'jsonb')
            .arg('policy', options.policy, 'jsonb')
            .arg('idempotency_header', options.idempotencyHeader, 'text')
            .arg('on_success', options.onSuccess, 'text')
            .arg('timeout', options.timeout, 'interval')
            .arg('nowait', options.nowait, 'boolean')
            .arg('run_at', options.runAt, 'timestamptz')
            .arg('notify', options.notify, 'text')
            .arg('on_failure', options.onFailure, 'text')
            .arg('retry_on_status', options.retryOnStatus, 'text[]')
            .arg('fail_on_status', options.failOnStatus, 'text[]');
        return this.step<HttpResponse<B>>('ds_http_step', call);
    }

    /**
     * ds_task_step: a task, the step `(runId, stepId)` whose body is the handler `task` of a
     * Worker (./worker.ts), given `input`. Stored with the caller's transaction and claimed by a
     * worker once that commits; the same definition replays, another is StepConflictError
     * (DS422). Its result is the step as it is ('pending' until a worker ran it).
     */
    taskStep<R = Json>(runId: string, stepId: string, task: string, input?: Json,
        options: TaskStepOptions = {}): Promise<StepResult<R>> {
        const call = new Call()
            .arg('run_id', runId, 'text')
            .arg('step_id', stepId, 'text')
            .arg('task', task, 'text')
            .arg('input', input, 'jsonb')
            .arg('policy', options.policy, 'jsonb')
            .arg('queue', options.queue, 'text')
            .arg('priority', options.priority, 'integer')
            .arg('run_at', options.runAt, 'timestamptz')
            .arg('timeout', options.timeout, 'interval')
            .arg('notify', options.notify, 'text')
            .arg('on_success', options.onSuccess, 'text')
            .arg('on_failure', options.onFailure, 'text')
            .arg('on_lost', options.onLost, 'text')
            .arg('nowait', options.nowait, 'boolean')
            .arg('expect', options.expect, 'text');
        return this.step<R>('ds_task_step', call);
    }

    /**
     * ds_wait_step: the step as soon as it has stopped, or as it is when `timeout` passes
     * (30 s by default). One statement: no LISTEN, no polling.
     */
    waitStep<R = Json>(runId: string, stepId: string, timeout?: Interval): Promise<StepResult<R>> {
        const call = new Call()
            .arg('run_id', runId, 'text')
            .arg('step_id', stepId, 'text')
            .arg('timeout', timeout, 'interval');
        return this.step<R>('ds_wait_step', call);
    }

    /** ds_cancel_step: the step becomes cancelled and never runs again. */
    cancelStep<R = Json>(runId: string, stepId: string): Promise<StepResult<R>> {
        return this.step<R>('ds_cancel_step', new Call().arg('run_id', runId, 'text').arg('step_id', stepId, 'text'));
    }

    /** ds_retry_step: re-arms a failed, blocked, uncertain or cancelled step, optionally corrected. */
    retryStep<R = Json>(runId: string, stepId: string, options: RetryStepOptions = {}): Promise<StepResult<R>> {
        const call = new Call()
            .arg('run_id', runId, 'text')
            .arg('step_id', stepId, 'text')
            .arg('input', options.input, 'jsonb')
            .arg('sql', options.sql, 'text')
            .arg('request', options.request, 'jsonb');
        return this.step<R>('ds_retry_step', call);
    }

    /**
     * ds_start_run: stores a run of `workflow` (a function or procedure `(run_id text, input
     * jsonb)`) with the caller's transaction; the worker starts it once that commits.
     */
    async startRun(workflow: string, input?: Json, options: StartRunOptions = {}): Promise<StartedRun> {
        const call = new Call()
            .arg('workflow', workflow, 'text')
            .arg('input', input, 'jsonb')
            .arg('run_key', options.runKey, 'text')
            .arg('policy', options.policy, 'jsonb');
        const row = await this.one('ds_start_run', call, 'run_id, status, created');
        return { runId: row.run_id, status: row.status, created: row.created };
    }

    /**
     * ds_wait_run: the run as soon as it is succeeded, failed, cancelled or blocked, or as it is
     * when `timeout` passes (30 s by default).
     */
    async waitRun<O = Json>(runId: string, timeout?: Interval): Promise<RunOutcome<O>> {
        const call = new Call().arg('run_id', runId, 'text').arg('timeout', timeout, 'interval');
        const row = await this.one('ds_wait_run', call, 'status, output, error_code, error_message');
        return { status: row.status, output: row.output, errorCode: row.error_code, errorMessage: row.error_message };
    }

    /** ds_cancel_run: the run and its unfinished steps become cancelled; its status. */
    async cancelRun(runId: string): Promise<RunStatus> {
        const row = await this.one('ds_cancel_run', new Call().arg('run_id', runId, 'text'), 'ds_cancel_run AS status');
        return row.status;
    }

    /** ds_resume_run: a failed, blocked or waiting run takes its next turn now; its status. */
    async resumeRun(runId: string): Promise<RunStatus> {
        const row = await this.one('ds_resume_run', new Call().arg('run_id', runId, 'text'), 'ds_resume_run AS status');
        return row.status;
    }

    /**
     * ds_emit_event: records event `name` of the current role, waking its runs that wait for it
     * once the transaction commits. true for the first emit, false for a later one.
     */
    async emitEvent(name: string, payload?: Json): Promise<boolean> {
        const call = new Call().arg('name', name, 'text').arg('payload', payload, 'jsonb');
        const row = await this.one('ds_emit_event', call, 'ds_emit_event AS emitted');
        return row.emitted;
    }

    /**
     * ds_idempotent: runs `handler` (one SQL statement, $1 the request, returning one row
     * `(status integer, body jsonb)`) once per `(scope, key)` and stores its response with its
     * writes; a repeat with the same request replays it, another request is StepConflictError
     * (DS422), a repeat while the first is in flight InProgressError (DS409) unless `wait` is
     * given.
     */
    async idempotent<B = Json>(scope: string, key: string, request: Json, handler: string,
        options: IdempotentOptions = {}): Promise<IdempotentResponse<B>> {
        const call = new Call()
            .arg('scope', scope, 'text')
            .arg('key', key, 'text')
            .arg('request', request, 'jsonb')
            .arg('handler', handler, 'text')
            .arg('ttl', options.ttl, 'interval')
            .arg('wait', options.wait, 'interval');
        const row = await this.one('ds_idempotent', call, 'status, body, replayed');
        return { status: row.status, body: row.body, replayed: row.replayed };
    }

    /**
     * ds_idempotent_begin: holds the key for application code (state 'new', with the token to
     * finish or abandon it) or answers its stored response (state 'replay'). A repeat while the
     * key is held is InProgressError (DS409), at once or once `wait` has passed.
     */
    async idempotentBegin<B = Json>(scope: string, key: string, request: Json,
        options: IdempotentBeginOptions = {}): Promise<IdempotentBegin<B>> {
        const call = new Call()
            .arg('scope', scope, 'text')
            .arg('key', key, 'text')
            .arg('request', request, 'jsonb')
            .arg('ttl', options.ttl, 'interval')
            .arg('lease', options.lease, 'interval')
            .arg('wait', options.wait, 'interval');
        const row = await this.one('ds_idempotent_begin', call, 'state, status, body, token');
        return { state: row.state, token: row.token, status: row.status, body: row.body };
    }

    /** ds_idempotent_finish: stores the response of a key held with `token`. */
    async idempotentFinish(scope: string, key: string, token: string, status: number, body: Json): Promise<void> {
        const call = new Call()
            .arg('scope', scope, 'text')
            .arg('key', key, 'text')
            .arg('token', token, 'uuid')
            .arg('status', status, 'integer')
            .arg('body', body, 'jsonb');
        await this.rows('ds_idempotent_finish', call, '1');
    }

    /**
     * ds_idempotent_renew: the lease of a key held with `token` runs `lease` ('5 minutes' by
     * default) from now, while the work goes on; when it runs out. InProgressError (DS409) once
     * the token no longer holds the key, StepNotFoundError (DS404) when the key does not exist.
     */
    async idempotentRenew(scope: string, key: string, token: string, lease?: Interval): Promise<Date> {
        const call = new Call()
            .arg('scope', scope, 'text')
            .arg('key', key, 'text')
            .arg('token', token, 'uuid')
            .arg('lease', lease, 'interval');
        const row = await this.one('ds_idempotent_renew', call, 'ds_idempotent_renew AS until');
        return row.until;
    }

    /** ds_idempotent_abandon: frees a key held with `token`, so that a retry starts afresh. */
    async idempotentAbandon(scope: string, key: string, token: string): Promise<void> {
        const call = new Call().arg('scope', scope, 'text').arg('key', key, 'text').arg('token', token, 'uuid');
        await this.rows('ds_idempotent_abandon', call, '1');
    }
}
