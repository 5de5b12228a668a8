// The worker of durable_steps' tasks: steps whose body is a handler of the application's
// (`ds_task_step`, DurableSteps.taskStep). A Worker claims due tasks of its names with
// ds_claim_tasks, for its free slots and a small buffer ahead of them (`prefetch`), runs their
// handlers, keeps their leases with ds_heartbeat, and records each attempt's outcome: the
// successes of handlers that returned without ctx.transaction together, many in one statement
// and one commit (ds_complete_tasks); a success inside ctx.transaction with ds_complete_task in
// the handler's own transaction, so that its writes and the step's outcome commit together or
// not at all; a failure with ds_fail_task.
//
// - Claimed ahead: a task waits in the buffer until a slot frees. Its lease runs meanwhile and
//   is not renewed: a buffered task not started by half its lease (or half the time to its
//   deadline) is given back uncounted (ds_release_task), long before it could be recorded lost,
//   and the worker claims no further ahead until a handler finishes.
//
// - No polling on an idle queue: when a claim finds nothing, the worker waits in
//   `CALL ds_wait_for_tasks(...)` (one statement, no LISTEN: it works through PgBouncer in
//   transaction mode), which returns as soon as a commit makes one of its tasks due.
// - Fencing: a token whose lease is gone is refused by the server (DS410, LeaseLostError) and
//   the transaction that tried rolls back; the worker logs it and moves on (the attempt is gone).
// - No global state: everything belongs to the Worker object.

import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';

import type { Queryable } from './client.js';
import { LeaseLostError, StepTimeoutError, toDurableStepsError } from './errors.js';
import type { Workflow } from './workflow.js';
import { StepBatcher, segmentHandler } from './workflow.js';

/** A connection lent by a pool: node-postgres's PoolClient has it. */
export interface TaskClient extends Queryable {
    release(err?: Error | boolean): void;
}

/** What a Worker needs of its pool: node-postgres's Pool has it. */
export interface TaskPool<C extends TaskClient = TaskClient> extends Queryable {
    connect(): Promise<C>;
}

/**
 * The connections a pool lends: node-postgres's Pool lends PoolClient (its connect() has a
 * callback overload too, which plain inference would pick).
 */
export type ClientOf<P> = P extends { connect(): Promise<infer C>; connect(callback: never): void }
    ? (unknown extends C ? LoneClientOf<P> : C extends TaskClient ? C : TaskClient)
    : LoneClientOf<P>;
type LoneClientOf<P> = P extends { connect(): Promise<infer C> } ? (C extends TaskClient ? C : TaskClient) : TaskClient;

/** The attempt a handler runs, as its second argument. */
export interface TaskContext<C extends TaskClient = TaskClient> {
    readonly runId: string;
    readonly stepId: string;
    /** the task's name (the key of its handler) */
    readonly task: string;
    /** this attempt's number, from 1 */
    readonly attempt: number;
    readonly maxAttempts: number;
    /** the same for every attempt of the step: pass it to providers */
    readonly idempotencyKey: string;
    /** another for each attempt */
    readonly attemptKey: string;
    /** when the attempt's timeout ends it (null: no timeout) */
    readonly deadline: Date | null;
    /** the name of the worker that claimed it */
    readonly worker: string;
    /** the attempt's token (ds_heartbeat, ds_complete_task, ds_claim_task take it) */
    readonly token: string;
    /**
     * Aborted at the deadline (reason: StepTimeoutError), when the step is cancelled or the lease
     * is lost (LeaseLostError), and when the worker stops and its grace period has passed
     * (WorkerStoppedError). The handler should give up then: its outcome will not be recorded.
     */
    readonly signal: AbortSignal;
    /**
     * Runs `fn` in a transaction on a connection of the pool and records its return value as the
     * step's result in that same transaction (ds_complete_task), then commits: the handler's
     * writes and the step's outcome commit together or not at all. Rejects with LeaseLostError
     * (everything rolled back) when the attempt no longer holds its lease. Once per attempt.
     */
    transaction<T>(fn: (client: C) => Promise<T> | T): Promise<T>;
}

/**
 * A task's handler: its input (the step's jsonb, parsed) and the attempt. Its return value is
 * the step's result (as JSON; undefined is null) unless it used ctx.transaction. A throw fails
 * the attempt: NonRetriableError fails the step, RetryAfterError retries after its delay,
 * BlockedError blocks it with a remediation, any other error is retried by the step's policy.
 */
export type TaskHandler<I = any, R = unknown, C extends TaskClient = TaskClient> =
    (input: I, ctx: TaskContext<C>) => R | Promise<R>;

/** Where the worker writes what it does not throw (console by default, errors and warnings). */
export interface WorkerLogger {
    error(message: string, ...meta: unknown[]): void;
    warn(message: string, ...meta: unknown[]): void;
    info?(message: string, ...meta: unknown[]): void;
    debug?(message: string, ...meta: unknown[]): void;
}

export interface WorkerOptions<P extends TaskPool = TaskPool> {
    /** a node-postgres Pool (or anything with its query() and connect()) */
    pool: P;
    /** the handlers, by task name: ctx.transaction lends them a connection of the pool */
    tasks?: Record<string, TaskHandler<any, unknown, ClientOf<P>>>;
    /**
     * Application workflows this worker runs (docs/app-workflows.md): each is declared with
     * ds_define_workflow when the worker starts, unless defineWorkflows is false
     */
    workflows?: Workflow[];
    /** declare the workflows at start (true): the role needs CREATE on the current schema */
    defineWorkflows?: boolean;
    /** how many handlers run at once (10) */
    concurrency?: number;
    /**
     * How many claimed tasks may wait for a free slot (concurrency; 0: claim only for free
     * slots). The buffer is refilled once it is half empty; its tasks are given back uncounted
     * when the worker stops or when they wait half their lease.
     */
    prefetch?: number;
    /**
     * How long the successes of handlers that returned without ctx.transaction wait to be
     * recorded together (0: those of the same turn of the event loop), in milliseconds.
     */
    completeBatchDelayMs?: number;
    /** milliseconds a claim and each heartbeat hold the lease (30 000); heartbeats every third */
    lease?: number;
    /** only tasks of these queues (all by default) */
    queues?: string[];
    /** the worker's name, recorded with its claims (hostname:pid by default) */
    worker?: string;
    /**
     * The longest a wait for due tasks lasts before the worker claims again anyway, in
     * milliseconds (10 000): a backstop only, the commit that makes a task due wakes the wait.
     */
    pollInterval?: number;
    /** how long stop() lets running handlers finish before aborting their signals (10 000 ms) */
    graceMs?: number;
    logger?: WorkerLogger;
    /** the schema of durable_steps when it is not on the connection's search_path */
    schema?: string;
}

/** How ds_fail_task classes a failure. */
export type FailureClass = 'retryable' | 'correctable' | 'permanent';

/** The events of a Worker. */
export type WorkerEvents = {
    /** the worker's own trouble (a claim, heartbeat or outcome that failed); never a handler's */
    error: [error: Error, task: TaskContext | null];
    /** an attempt recorded as succeeded */
    completed: [task: TaskContext, result: unknown];
    /** an attempt recorded as failed, with the class it was recorded with */
    failed: [task: TaskContext, error: unknown, errorClass: FailureClass];
    /** an attempt whose lease is gone (cancelled, ran out, refused with DS410): nothing recorded */
    lost: [task: TaskContext, reason: Error];
};

/** The reason of a signal aborted by stop() once its grace period passed. */
export class WorkerStoppedError extends Error {
    constructor(message = 'the worker stopped') {
        super(message);
        this.name = 'WorkerStoppedError';
    }
}

/** A row of ds_claim_tasks (and the server's clock when it answered). */
interface ClaimedRow {
    run_id: string;
    step_id: string;
    task: string;
    input: unknown;
    attempt: number;
    max_attempts: number;
    idempotency_key: string;
    attempt_key: string;
    token: string;
    /**
     * Times as milliseconds since the epoch (float8): an application's own type parser for
     * timestamptz does not change what the worker reads
     */
    lease_expires_ms: number;
    deadline_ms: number | null;
    server_now_ms: number;
}

/** ds_claim_tasks' largest max, and ds_complete_tasks' most tokens */
const MAX_CLAIM = 1000;
/** how long past its own timeout a wait's answer is waited for before its connection is cut */
const WAIT_MARGIN_MS = 10_000;
const MAX_BATCH = 1000;
const MAX_ERROR_CODE = 64;
const MAX_MESSAGE = 4000;
const MAX_DETAIL = 8000;
/** setTimeout's longest delay */
const MAX_TIMER = 2 ** 31 - 1;

function ms(value: number): string {
    return `${value} milliseconds`;
}

function bounded(text: string, max: number): string {
    return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

/** The longest start of `text` of at most `max` bytes of UTF-8 (error_code is 1 to 64 bytes). */
function clipBytes(text: string, max: number): string {
    const encoder = new TextEncoder();
    if (encoder.encode(text).length <= max) {
        return text;
    }
    let out = '';
    let bytes = 0;
    for (const ch of text) {
        const n = encoder.encode(ch).length;
        if (bytes + n > max) {
            break;
        }
        out += ch;
        bytes += n;
    }
    return out;
}

function sqlstateOf(e: unknown): string | null {
    const code = (e as { sqlstate?: unknown } | null)?.sqlstate;
    return typeof code === 'string' ? code : null;
}

/** The arguments of ds_fail_task for an error a handler threw. */
export function describeFailure(thrown: unknown): {
    errorClass: FailureClass; errorCode: string; message: string; detail: string | null;
    retryAfter: string | null; remediation: string | null;
} {
    // a server error the handler let through is its class: DS001 from ds_non_retriable() too
    const e = toDurableStepsError(thrown);
    const obj = (typeof e === 'object' && e !== null ? e : {}) as Record<string, unknown>;
    const name = typeof obj.name === 'string' && obj.name !== '' ? obj.name : 'Error';
    const code = typeof obj.code === 'string' && obj.code !== '' && clipBytes(obj.code, MAX_ERROR_CODE) === obj.code
        ? obj.code : clipBytes(name, MAX_ERROR_CODE) || 'Error';
    let message = e instanceof Error ? e.message : typeof e === 'string' ? e : String(e);
    if (message === '') {
        message = name;
    }
    const detail = e instanceof Error && typeof e.stack === 'string' ? bounded(e.stack, MAX_DETAIL) : null;
    let errorClass: FailureClass = 'retryable';
    let retryAfter: string | null = null;
    let remediation: string | null = null;
    // by SQLSTATE, not instanceof: the class of the other build (import and require) counts too
    switch (sqlstateOf(e)) {
        case 'DS001':
            errorClass = 'permanent';
            break;
        case 'DS002': {
            const after = obj.retryAfter;
            retryAfter = typeof after === 'number' ? ms(after) : typeof after === 'string' ? after : null;
            break;
        }
        case 'DS003':
            errorClass = 'correctable';
            remediation = typeof obj.remediation === 'string' ? obj.remediation
                : typeof obj.hint === 'string' ? obj.hint : message;
            break;
    }
    return { errorClass, errorCode: code, message: bounded(message, MAX_MESSAGE), detail, retryAfter, remediation };
}

type Phase = 'running' | 'completing' | 'done' | 'gone';

/** One claimed attempt, from its claim to its outcome. */
class Attempt<C extends TaskClient> {
    readonly controller = new AbortController();
    readonly ctx: TaskContext<C>;
    phase: Phase = 'running';
    inTransaction = false;
    /**
     * The handler's ctx.transaction, settled (null when it opened none): a handler that returned
     * without awaiting it is completed only once it settled, by it or by its failure
     */
    txn: Promise<void> | null = null;
    txnError: unknown = undefined;
    /** given up by stop(): its outcome is left to the lease */
    abandoned = false;
    heartbeatInFlight = false;
    /** the lease's end on this machine's clock */
    leaseUntil: number;
    private heartbeatTimer: ReturnType<typeof setInterval> | null = null;
    private leaseTimer: ReturnType<typeof setTimeout> | null = null;
    private deadlineTimer: ReturnType<typeof setTimeout> | null = null;

    constructor(readonly row: ClaimedRow, readonly offset: number, worker: string,
        transaction: (a: Attempt<C>, fn: (client: C) => unknown) => Promise<unknown>) {
        this.leaseUntil = this.local(row.lease_expires_ms);
        const attempt = this;
        this.ctx = {
            runId: row.run_id,
            stepId: row.step_id,
            task: row.task,
            attempt: row.attempt,
            maxAttempts: row.max_attempts,
            idempotencyKey: row.idempotency_key,
            attemptKey: row.attempt_key,
            deadline: row.deadline_ms === null ? null : new Date(row.deadline_ms),
            worker,
            token: row.token,
            signal: this.controller.signal,
            transaction<T>(fn: (client: C) => Promise<T> | T): Promise<T> {
                const done = transaction(attempt, fn) as Promise<T>;
                attempt.txn ??= done.then(() => undefined, (e: unknown) => {
                    attempt.txnError = e;
                });
                return done;
            },
        };
    }

    get token(): string {
        return this.row.token;
    }

    /**
     * A server time (ms since the epoch, with microseconds) on this machine's clock (offset: the
     * server's clock minus ours), rounded up to the whole millisecond of Date.now(): a timer set
     * for it never fires before it.
     */
    local(server: number): number {
        return Math.ceil(server - this.offset);
    }

    abort(reason: Error): void {
        if (!this.controller.signal.aborted) {
            this.controller.abort(reason);
        }
    }

    start(heartbeatEvery: number, heartbeat: () => void): void {
        this.heartbeatTimer = setInterval(heartbeat, heartbeatEvery);
        this.armLeaseTimer();
        if (this.row.deadline_ms !== null) {
            this.deadlineTimer = setTimeout(() => this.abort(this.timedOut()),
                Math.min(MAX_TIMER, Math.max(0, this.local(this.row.deadline_ms) - Date.now())));
        }
    }

    private timedOut(): StepTimeoutError {
        return new StepTimeoutError(`the task's timeout passed (its deadline was ${this.row.deadline_ms === null ? 'none' : new Date(this.row.deadline_ms).toISOString()})`);
    }

    /** The lease runs out on this side too: abort the handler when no heartbeat renewed it. */
    armLeaseTimer(): void {
        if (this.leaseTimer !== null) {
            clearTimeout(this.leaseTimer);
        }
        this.leaseTimer = setTimeout(() => {
            if (this.phase === 'running' && Date.now() < this.leaseUntil) {
                this.armLeaseTimer();       // a timer may fire a little early: look again then
                return;
            }
            if (this.phase === 'running' && Date.now() >= this.leaseUntil) {
                // a lease never runs past the deadline: one that ends with it is the timeout
                const deadline = this.row.deadline_ms === null ? Infinity : this.local(this.row.deadline_ms);
                this.abort(this.leaseUntil >= deadline - 1 ? this.timedOut()
                    : new LeaseLostError('the lease ran out before a heartbeat renewed it'));
            }
        }, Math.min(MAX_TIMER, Math.max(0, this.leaseUntil - Date.now())));
    }

    stopTimers(): void {
        for (const t of [this.heartbeatTimer, this.leaseTimer]) {
            if (t !== null) {
                clearInterval(t);
            }
        }
        if (this.deadlineTimer !== null) {
            clearTimeout(this.deadlineTimer);
        }
        this.heartbeatTimer = this.leaseTimer = this.deadlineTimer = null;
    }
}

/** A connection, inside the Worker. */
type C = TaskClient;

/** A claimed task waiting for a free slot. */
interface Buffered {
    row: ClaimedRow;
    /** the server's clock minus ours, when the claim answered */
    offset: number;
    /** when it is given back if it has not started (this machine's clock) */
    useBy: number;
}

/** A success waiting to be recorded with others (ds_complete_tasks). */
interface PendingCompletion {
    a: Attempt<C>;
    json: string | null;
    value: unknown;
    done: () => void;
}

const defaultLogger: WorkerLogger = {
    error: (message, ...meta) => console.error(message, ...meta),
    warn: (message, ...meta) => console.warn(message, ...meta),
};

/**
 * Runs the handlers of `tasks` for the steps stored with ds_task_step:
 *
 * ```ts
 * const worker = new Worker({ pool, tasks: { 'send-receipt': async (input, ctx) => ... } });
 * await worker.start();
 * process.on('SIGTERM', () => worker.stop());
 * ```
 *
 * The pool should have room for `concurrency` handlers' transactions, their heartbeats and the
 * worker's own wait: `concurrency + 2` connections or more.
 */
export class Worker<P extends TaskPool = TaskPool> extends EventEmitter<WorkerEvents> {
    readonly name: string;
    readonly concurrency: number;
    readonly prefetch: number;
    readonly completeBatchDelayMs: number;
    readonly lease: number;
    readonly pollInterval: number;
    readonly graceMs: number;
    readonly queues: readonly string[] | null;

    private readonly pool: TaskPool<C>;
    private readonly tasks: Map<string, TaskHandler<any, unknown, C>>;
    private readonly names: string[];
    private readonly logger: WorkerLogger;
    private readonly prefix: string;
    private readonly workflows: Workflow[];
    private readonly defineWorkflows: boolean;

    private state: 'new' | 'running' | 'stopping' | 'stopped' = 'new';
    private readonly running = new Set<Attempt<C>>();
    private readonly settled = new Map<Attempt<C>, Promise<void>>();
    /** start(): the first claim, and its launch or release */
    private starting: Promise<void> | null = null;
    private loopDone: Promise<void> | null = null;
    private stopped: Promise<void> | null = null;
    /** resolves the loop's current idle wait (a free slot, a backoff) */
    private wake: (() => void) | null = null;
    /** the connection the loop waits on in ds_wait_for_tasks, given up by stop() */
    private waiting: { client: C; released: boolean } | null = null;
    /** claimed tasks whose handlers have not started, oldest first */
    private buffer: Buffered[] = [];
    private bufferTimer: ReturnType<typeof setTimeout> | null = null;
    private bufferTimerAt = Infinity;
    /** a buffered task waited too long: claim no further ahead until a handler finishes */
    private prefetchHeld = false;
    /** successes waiting for ds_complete_tasks, and how many are waiting or being recorded */
    private pending: PendingCompletion[] = [];
    private completing = 0;
    private flushing = false;
    private flushScheduled = false;
    /** the extension has no ds_complete_tasks (an older version): one call per success */
    private noBatch = false;

    constructor(options: WorkerOptions<P>) {
        super();
        // inside, a connection is a TaskClient: the handlers see the pool's own type (ClientOf<P>)
        const pool: TaskPool = options.pool;
        const tasks = { ...(options.tasks ?? {}) } as unknown as Record<string, TaskHandler<any, unknown, C>>;
        if (pool === null || typeof pool !== 'object' || typeof pool.query !== 'function'
            || typeof pool.connect !== 'function') {
            throw new TypeError('pool must be a node-postgres Pool (query and connect)');
        }
        if (options.tasks !== undefined && (options.tasks === null || typeof options.tasks !== 'object')) {
            throw new TypeError('tasks must be an object of handlers by task name');
        }
        if (options.workflows !== undefined && !Array.isArray(options.workflows)) {
            throw new TypeError('workflows must be an array of workflow() definitions');
        }
        this.workflows = [...(options.workflows ?? [])];
        this.defineWorkflows = options.defineWorkflows ?? true;
        this.prefix = options.schema ? `"${options.schema.replace(/"/g, '""')}".` : '';
        this.name = options.worker ?? `${hostname()}:${process.pid}`;
        const batcher = new StepBatcher(pool, this.prefix, this.name, options.lease ?? 30_000);
        for (const wf of this.workflows) {
            if (typeof wf?.taskName !== 'string' || typeof wf.fn !== 'function') {
                throw new TypeError('workflows must be an array of workflow() definitions');
            }
            if (wf.taskName in tasks) {
                throw new TypeError(`workflow ${wf.name} is given twice`);
            }
            tasks[wf.taskName] = segmentHandler(wf, pool, this.prefix, options.lease ?? 30_000, batcher) as TaskHandler<any, unknown, C>;
        }
        this.names = Object.keys(tasks);
        if (this.names.length === 0) {
            throw new TypeError('tasks or workflows must name at least one task or workflow');
        }
        for (const name of this.names) {
            if (typeof tasks[name] !== 'function') {
                throw new TypeError(`the handler of task ${JSON.stringify(name)} is not a function`);
            }
        }
        this.concurrency = options.concurrency ?? 10;
        if (!Number.isInteger(this.concurrency) || this.concurrency < 1) {
            throw new RangeError(`concurrency must be an integer >= 1, not ${this.concurrency}`);
        }
        this.prefetch = options.prefetch ?? this.concurrency;
        if (!Number.isInteger(this.prefetch) || this.prefetch < 0 || this.prefetch > MAX_CLAIM) {
            throw new RangeError(`prefetch must be an integer from 0 to ${MAX_CLAIM}, not ${this.prefetch}`);
        }
        this.completeBatchDelayMs = options.completeBatchDelayMs ?? 0;
        this.lease = options.lease ?? 30_000;
        this.pollInterval = options.pollInterval ?? 10_000;
        this.graceMs = options.graceMs ?? 10_000;
        for (const [what, value, min] of [['lease', this.lease, 1], ['pollInterval', this.pollInterval, 1],
            ['graceMs', this.graceMs, 0], ['completeBatchDelayMs', this.completeBatchDelayMs, 0]] as const) {
            if (typeof value !== 'number' || !Number.isFinite(value) || value < min) {
                throw new RangeError(`${what} must be a number of milliseconds >= ${min}, not ${value}`);
            }
        }
        if (options.queues !== undefined && (!Array.isArray(options.queues)
            || options.queues.some((q) => typeof q !== 'string'))) {
            throw new TypeError('queues must be an array of queue names');
        }
        this.queues = options.queues ? [...options.queues] : null;
        this.pool = pool;
        this.tasks = new Map(Object.entries(tasks));
        this.logger = options.logger ?? defaultLogger;
        const max = (pool as { options?: { max?: unknown } }).options?.max;
        if (typeof max === 'number' && max < this.concurrency + 2) {
            this.logger.warn(`durable-steps worker ${this.name}: the pool has ${max} connections, fewer than`
                + ` concurrency + 2 (${this.concurrency + 2}): heartbeats may wait for a connection`);
        }
    }

    /** How many handlers are running now. */
    get active(): number {
        return this.running.size;
    }

    /**
     * Starts claiming. Resolves after the first claim (so that a worker that cannot claim --
     * no extension, a wrong schema, a missing privilege -- rejects here); the worker then goes on
     * by itself until stop().
     */
    start(): Promise<void> {
        if (this.state !== 'new') {
            return Promise.reject(new Error('a Worker starts once'));
        }
        this.state = 'running';
        this.starting = this.begin();
        return this.starting;
    }

    private async begin(): Promise<void> {
        let rows: ClaimedRow[];
        const want = this.wanted();
        try {
            if (this.defineWorkflows) {
                for (const wf of this.workflows) {
                    await this.pool.query(`SELECT ${this.prefix}ds_define_workflow($1, $2::jsonb)`,
                        [wf.name, wf.policy === null ? null : JSON.stringify(wf.policy)]);
                }
            }
            rows = await this.claim(want);
        } catch (e) {
            this.state = 'stopped';
            throw toDurableStepsError(e);
        }
        if (this.stopping) {
            // stop() came while the first claim was on its way: give the claims back
            await this.release(rows);
            return;
        }
        this.accept(rows);
        this.loopDone = this.loop(rows.length >= want ? null : rows.length)
            .catch((e) => this.report(e, null));
    }

    /**
     * Stops claiming; lets running handlers finish within graceMs, then aborts their signals
     * (WorkerStoppedError) and waits for them as long again (a handler still running then is left
     * to its lease: its attempt is recorded lost). Claims whose handler had not started are given
     * back uncounted (ds_release_task). Resolves once everything settled; calling it again
     * answers the same promise.
     */
    stop(): Promise<void> {
        if (this.stopped === null) {
            this.stopped = this.shutdown();
        }
        return this.stopped;
    }

    private async shutdown(): Promise<void> {
        const wasRunning = this.state === 'running';
        this.state = 'stopping';
        if (wasRunning) {
            this.nudge();
            this.abandonWait();
            await this.starting?.catch(() => undefined);
            await this.loopDone;
            // claims whose handlers never started: given back uncounted
            await this.release(this.takeBuffer(this.buffer.length));
            if (this.running.size > 0 && !(await this.settleWithin(this.graceMs))) {
                for (const a of this.running) {
                    a.abort(new WorkerStoppedError(`the worker stopped and its grace period (${this.graceMs} ms) passed`));
                }
                if (!(await this.settleWithin(this.graceMs))) {
                    for (const a of this.running) {
                        a.abandoned = true;
                        a.stopTimers();
                        this.report(new Error(`the handler of ${a.row.task} (${a.row.run_id}/${a.row.step_id}) ignored`
                            + ' its aborted signal: left to its lease'), a.ctx);
                    }
                }
            }
        }
        this.state = 'stopped';
    }

    /** true once every running handler settled, false when `ms` passed first. */
    private async settleWithin(ms: number): Promise<boolean> {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const timeout = new Promise<false>((resolve) => {
            timer = setTimeout(() => resolve(false), ms);
        });
        const all = Promise.all([...this.settled.values()]).then(() => true as const);
        try {
            return await Promise.race([all, timeout]);
        } finally {
            clearTimeout(timer);
        }
    }

    // --- claiming ---------------------------------------------------------------------------

    private get stopping(): boolean {
        return this.state !== 'running';
    }

    /**
     * How many to claim now: the free slots and the room in the buffer, once it is half empty
     * (0: nothing yet). Nothing while too many successes wait to be recorded.
     */
    private wanted(): number {
        if (this.completing >= MAX_BATCH) {
            return 0;
        }
        const free = Math.max(0, this.concurrency - this.running.size);
        const ahead = this.prefetchHeld ? 0 : this.prefetch;
        if (free === 0 && this.buffer.length > Math.floor(ahead / 2)) {
            return 0;
        }
        return Math.min(MAX_CLAIM, free + Math.max(0, ahead - this.buffer.length));
    }

    /**
     * Claims for the free slots and the buffer; when a claim answers fewer than it asked for,
     * waits in ds_wait_for_tasks until one may be due, and claims on that same connection when
     * it says so. `claimed`: how many the last claim answered, fewer than it asked for (null:
     * claim at once).
     */
    private async loop(claimed: number | null): Promise<void> {
        let failures = 0;
        let emptyWakes = 0;
        while (!this.stopping) {
            if (claimed === null) {
                const want = this.wanted();
                if (want <= 0) {
                    await this.idle(this.pollInterval);
                    continue;
                }
                let rows: ClaimedRow[];
                try {
                    rows = await this.claim(want);
                    failures = 0;
                } catch (e) {
                    await this.failed(e, ++failures);
                    continue;
                }
                if (this.stopping) {
                    await this.release(rows);
                    break;
                }
                this.accept(rows);
                if (rows.length >= want) {
                    emptyWakes = 0;
                    continue;
                }
                claimed = rows.length;
            }
            let woke: { due: boolean; rows: ClaimedRow[] | null; asked: number };
            try {
                woke = await this.waitForTasks();
                failures = 0;
            } catch (e) {
                if (this.stopping) {
                    break;
                }
                await this.failed(e, ++failures);
                claimed = null;
                continue;
            }
            if (woke.rows !== null) {
                if (this.stopping) {
                    await this.release(woke.rows);
                    break;
                }
                this.accept(woke.rows);
            }
            // a wake that finds nothing to claim, again and again (another worker is quicker,
            // or a queue limit holds what is due): back off a little instead of spinning
            if (woke.due && woke.rows !== null && woke.rows.length === 0) {
                emptyWakes++;
                if (emptyWakes > 2) {
                    await this.idle(Math.min(this.pollInterval, 10 * 2 ** Math.min(emptyWakes - 2, 7)));
                }
                claimed = 0;
                continue;
            }
            emptyWakes = 0;
            // a claim on the wake's connection that took all it asked for: claim again at once
            claimed = woke.rows !== null && woke.rows.length < woke.asked ? woke.rows.length : null;
        }
    }

    private async failed(e: unknown, failures: number): Promise<void> {
        if (this.stopping) {
            return;
        }
        this.report(toDurableStepsError(e), null);
        await this.idle(Math.min(this.pollInterval, 100 * 2 ** Math.min(failures - 1, 10)));
    }

    /** Resolves after `ms`, or sooner when nudged (a slot freed, stop()). */
    private idle(ms: number): Promise<void> {
        return new Promise<void>((resolve) => {
            const timer = setTimeout(done, ms);
            const previous = this.wake;
            this.wake = done;
            function done(): void {
                clearTimeout(timer);
                resolve();
            }
            previous?.();
        });
    }

    private nudge(): void {
        const wake = this.wake;
        this.wake = null;
        wake?.();
    }

    private async claim(max: number, on: Queryable = this.pool): Promise<ClaimedRow[]> {
        const { rows } = await on.query(
            `SELECT c.run_id, c.step_id, c.task, c.input, c.attempt, c.max_attempts, c.idempotency_key,
                    c.attempt_key, c.token,
                    (extract(epoch FROM c.lease_expires_at) * 1000)::float8 AS lease_expires_ms,
                    (extract(epoch FROM c.deadline) * 1000)::float8 AS deadline_ms,
                    (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS server_now_ms
               FROM ${this.prefix}ds_claim_tasks($1::text[], $2::integer, $3::interval, $4::text, $5::text[]) AS c`,
            [this.names, Math.min(max, MAX_CLAIM), ms(this.lease), this.name, this.queues]);
        return rows as ClaimedRow[];
    }

    /**
     * CALL ds_wait_for_tasks on a connection of its own, that stop() can give up; when a task is
     * due, the claim follows on that same connection (rows: its answer; null when it did not
     * claim).
     */
    private async waitForTasks(): Promise<{ due: boolean; rows: ClaimedRow[] | null; asked: number }> {
        const client = await this.pool.connect();
        const held = { client, released: false };
        this.waiting = held;
        const unguard = guard(client);
        let broken: Error | undefined;
        // a connection that stops answering without closing (a half-open TCP connection) is
        // not waited on for ever: past the server's own timeout and a margin, it is destroyed
        const cutOff = setTimeout(() => {
            if (!held.released) {
                held.released = true;
                client.release(new Error('ds_wait_for_tasks did not answer in time'));
            }
        }, this.pollInterval + WAIT_MARGIN_MS);
        try {
            if (this.stopping) {
                return { due: false, rows: null, asked: 0 };
            }
            const { rows } = await client.query(
                `CALL ${this.prefix}ds_wait_for_tasks($1::text[], $2::interval, $3::text[])`,
                [this.names, ms(this.pollInterval), this.queues]);
            const due = rows[0]?.due === true;
            const want = this.wanted();
            if (!due || want <= 0 || this.stopping || held.released) {
                return { due, rows: null, asked: 0 };
            }
            return { due, rows: await this.claim(want, client), asked: want };
        } catch (e) {
            broken = asError(e);
            throw e;
        } finally {
            clearTimeout(cutOff);
            this.waiting = null;
            unguard();
            if (!held.released) {
                held.released = true;
                client.release(broken);
            }
        }
    }

    /** stop(): the wait need not run to its end; its connection is closed (not reused). */
    private abandonWait(): void {
        const held = this.waiting;
        if (held !== null && !held.released) {
            held.released = true;
            held.client.release(new WorkerStoppedError('the worker stopped while waiting for tasks'));
        }
    }

    /** Gives back claims whose handlers never started: not counted, the steps wait as before. */
    private async release(rows: (ClaimedRow | Buffered)[]): Promise<void> {
        if (rows.length === 0) {
            return;
        }
        try {
            await this.pool.query(`SELECT ${this.prefix}ds_release_task(t) FROM unnest($1::text[]) AS t`,
                [rows.map((r) => ('row' in r ? r.row : r).token)]);
        } catch (e) {
            this.report(toDurableStepsError(e), null);
        }
    }

    // --- running ----------------------------------------------------------------------------

    /** Claimed rows: into the buffer, and as many as there are free slots started. */
    private accept(rows: ClaimedRow[]): void {
        const now = Date.now();
        let first = Infinity;
        for (const row of rows) {
            const offset = row.server_now_ms - now;
            // given back by half its lease (or half the time to its deadline) if it waits so long
            let left = row.lease_expires_ms - offset - now;
            if (row.deadline_ms !== null) {
                left = Math.min(left, row.deadline_ms - offset - now);
            }
            const useBy = now + Math.max(0, left) / 2;
            first = Math.min(first, useBy);
            this.buffer.push({ row, offset, useBy });
        }
        this.startNext();
        this.armBufferTimer(first);
    }

    /** Starts buffered tasks while there are free slots. */
    private startNext(): void {
        if (this.stopping) {
            return;
        }
        const n = Math.min(this.buffer.length, this.concurrency - this.running.size);
        if (n > 0) {
            this.launch(this.takeBuffer(n));
        }
    }

    /** The `n` oldest buffered tasks, out of the buffer. */
    private takeBuffer(n: number): Buffered[] {
        const taken = this.buffer.splice(0, n);
        if (this.buffer.length === 0 && this.bufferTimer !== null) {
            clearTimeout(this.bufferTimer);
            this.bufferTimer = null;
            this.bufferTimerAt = Infinity;
        }
        return taken;
    }

    /**
     * Gives back the buffered tasks that waited too long: a timer at the earliest use-by, armed
     * again only for an earlier one (it finds nothing to do when they started meanwhile).
     */
    private armBufferTimer(first: number): void {
        if (this.buffer.length === 0 || this.stopping || first === Infinity) {
            return;
        }
        if (this.bufferTimer !== null && this.bufferTimerAt <= first) {
            return;
        }
        if (this.bufferTimer !== null) {
            clearTimeout(this.bufferTimer);
        }
        this.bufferTimerAt = first;
        this.bufferTimer = setTimeout(() => {
            this.bufferTimer = null;
            const now = Date.now();
            const stale = this.buffer.filter((b) => b.useBy <= now);
            if (stale.length > 0) {
                this.buffer = this.buffer.filter((b) => b.useBy > now);
                // the handlers are slower than the claims ahead of them: claim for free slots only
                this.prefetchHeld = true;
                void this.release(stale);
            }
            this.bufferTimerAt = Infinity;
            this.armBufferTimer(Math.min(...this.buffer.map((b) => b.useBy)));
        }, Math.min(MAX_TIMER, Math.max(0, first - Date.now())));
    }

    private launch(taken: Buffered[]): void {
        for (const { row, offset } of taken) {
            const a = new Attempt<C>(row, offset, this.name, (at, fn) => this.transaction(at, fn));
            this.running.add(a);
            a.start(Math.max(1, Math.floor(this.lease / 3)), () => void this.heartbeat(a));
            const settled = this.execute(a).catch((e) => this.report(e, a.ctx)).finally(() => {
                a.stopTimers();
                this.handlerDone(a);
                this.settled.delete(a);
                this.nudge();
            });
            this.settled.set(a, settled);
        }
    }

    private async execute(a: Attempt<C>): Promise<void> {
        const handler = this.tasks.get(a.row.task);
        let value: unknown;
        let thrown: unknown;
        let threw = false;
        try {
            if (handler === undefined) {
                throw new Error(`no handler for task ${JSON.stringify(a.row.task)}`);
            }
            value = await handler(a.row.input, a.ctx);
        } catch (e) {
            threw = true;
            thrown = e;
        }
        // a transaction the handler did not await: its outcome, not the handler's return, counts
        if (a.txn !== null) {
            await a.txn;
            if (!threw && a.txnError !== undefined) {
                threw = true;
                thrown = a.txnError;
            }
        }
        a.stopTimers();
        // the slot is free once the handler returned: its outcome is recorded meanwhile
        this.handlerDone(a);
        if (a.abandoned) {
            return;
        }
        if (a.phase === 'done') {
            if (threw) {
                this.logger.warn(`durable-steps worker ${this.name}: the handler of ${a.row.task} threw after its`
                    + ' transaction recorded the outcome', thrown);
            }
            return;
        }
        if (a.phase === 'gone') {
            return;
        }
        if (threw) {
            await this.fail(a, thrown);
        } else {
            await this.complete(a, value);
        }
    }

    /** A handler returned: its slot goes to the next buffered task. */
    private handlerDone(a: Attempt<C>): void {
        if (this.running.delete(a)) {
            this.prefetchHeld = false;
            this.startNext();
            this.nudge();
        }
    }

    private async heartbeat(a: Attempt<C>): Promise<void> {
        if (a.phase !== 'running' || a.heartbeatInFlight || a.abandoned) {
            return;
        }
        a.heartbeatInFlight = true;
        try {
            const { rows } = await this.pool.query(
                `SELECT h.held, h.cancelled, (extract(epoch FROM h.lease_expires_at) * 1000)::float8 AS lease_expires_ms`
                + ` FROM ${this.prefix}ds_heartbeat($1::text, $2::interval) AS h`,
                [a.token, ms(this.lease)]);
            const h = rows[0] as { held: boolean; cancelled: boolean; lease_expires_ms: number | null } | undefined;
            if (a.phase !== 'running') {
                return;
            }
            if (h === undefined || !h.held) {
                this.lost(a, new LeaseLostError(h?.cancelled
                    ? 'the step was cancelled (ds_cancel_step)'
                    : 'the lease is no longer held: it ran out and the attempt was recorded lost, or the step ended'));
                return;
            }
            if (h.lease_expires_ms !== null) {
                a.leaseUntil = a.local(h.lease_expires_ms);
                a.armLeaseTimer();
            }
        } catch (e) {
            this.report(toDurableStepsError(e), a.ctx);
        } finally {
            a.heartbeatInFlight = false;
        }
    }

    /** The attempt is gone (held=false, DS410): abort the handler, record nothing. */
    private lost(a: Attempt<C>, reason: Error): void {
        a.phase = 'gone';
        a.stopTimers();
        a.abort(reason);
        this.logger.warn(`durable-steps worker ${this.name}: ${a.row.task} ${a.row.run_id}/${a.row.step_id}`
            + ` attempt ${a.row.attempt}: ${reason.message}`);
        this.notify('lost', a.ctx, reason);
    }

    private async transaction(a: Attempt<C>, fn: (client: C) => unknown): Promise<unknown> {
        if (a.abandoned) {
            throw new WorkerStoppedError();
        }
        if (a.inTransaction || a.phase !== 'running') {
            throw a.phase === 'gone' ? goneReason(a)
                : new Error('ctx.transaction runs once per attempt, before the handler returns');
        }
        a.inTransaction = true;
        let client: C;
        try {
            client = await this.pool.connect();
        } catch (e) {
            a.inTransaction = false;
            throw toDurableStepsError(e);
        }
        const unguard = guard(client);
        let broken: Error | undefined;
        try {
            try {
                await client.query('BEGIN');
            } catch (e) {
                broken = asError(e);
                throw toDurableStepsError(e);
            }
            let result: unknown;
            try {
                result = await fn(client);
                if ((a.phase as Phase) === 'gone') {
                    // the lease went while fn ran: the server would refuse the outcome
                    throw goneReason(a);
                }
                a.phase = 'completing';
                await client.query(`SELECT status FROM ${this.prefix}ds_complete_task($1::text, $2::jsonb)`,
                    [a.token, jsonText(result)]);
                await client.query('COMMIT');
            } catch (e) {
                try {
                    await client.query('ROLLBACK');
                } catch (rollbackError) {
                    broken = asError(rollbackError);
                }
                const err = toDurableStepsError(e);
                if (a.phase === 'completing') {
                    if (sqlstateOf(err) === 'DS410') {
                        this.lost(a, err as Error);
                    } else {
                        a.phase = 'running';
                    }
                }
                throw err;
            }
            a.phase = 'done';
            this.notify('completed', a.ctx, result);
            return result;
        } finally {
            unguard();
            a.inTransaction = false;
            client.release(broken);
        }
    }

    /**
     * Records a success with the others of the same turn of the event loop (or of
     * completeBatchDelayMs): one ds_complete_tasks, one commit. Resolves once it is recorded.
     */
    private async complete(a: Attempt<C>, value: unknown): Promise<void> {
        let json: string | null;
        try {
            json = jsonText(value);
        } catch (e) {
            await this.fail(a, e);
            return;
        }
        a.phase = 'completing';
        this.completing++;
        try {
            await new Promise<void>((done) => {
                this.pending.push({ a, json, value, done });
                this.scheduleFlush();
            });
        } finally {
            this.completing--;
        }
    }

    private scheduleFlush(): void {
        if (this.flushing || this.flushScheduled || this.pending.length === 0) {
            return;
        }
        this.flushScheduled = true;
        const run = (): void => {
            this.flushScheduled = false;
            void this.flush();
        };
        if (this.completeBatchDelayMs > 0) {
            setTimeout(run, this.completeBatchDelayMs);
        } else {
            setImmediate(run);
        }
    }

    /** One batch at a time: what comes meanwhile goes in the next, at once. */
    private async flush(): Promise<void> {
        this.flushing = true;
        try {
            while (this.pending.length > 0) {
                await this.recordBatch(this.pending.splice(0, MAX_BATCH));
            }
        } finally {
            this.flushing = false;
            this.nudge();
        }
    }

    private async recordBatch(batch: PendingCompletion[]): Promise<void> {
        if (this.noBatch || batch.length === 1) {
            await Promise.all(batch.map((p) => this.completeOne(p)));
            return;
        }
        let rows: { token: string; status: string; held: boolean }[];
        try {
            ({ rows } = await this.pool.query(
                `SELECT c.token, c.status, c.held FROM ${this.prefix}ds_complete_tasks($1::text[], $2::jsonb[]) AS c`,
                [batch.map((p) => p.a.token), batch.map((p) => p.json)]));
        } catch (e) {
            const err = toDurableStepsError(e);
            const code = sqlstateOf(err);
            if (code === '42883') {
                // an extension without ds_complete_tasks: one call per success from now on
                this.noBatch = true;
            }
            if (code !== null) {
                // the server refused the batch (a result too large, an outcome hook's error...):
                // each success on its own, with its own answer
                await Promise.all(batch.map((p) => this.completeOne(p)));
                return;
            }
            for (const p of batch) {
                p.a.phase = 'running';
                this.report(err as Error, p.a.ctx);
                p.done();
            }
            return;
        }
        const answers = new Map(rows.map((r) => [r.token, r]));
        for (const p of batch) {
            const r = answers.get(p.a.token);
            if (r?.held === true) {
                p.a.phase = 'done';
                this.notify('completed', p.a.ctx, p.value);
            } else {
                this.lost(p.a, new LeaseLostError(`the attempt no longer held its lease when its success was`
                    + ` recorded: the step is ${r?.status ?? 'unknown'}`));
            }
            p.done();
        }
    }

    /** One success, on its own (ds_complete_task). */
    private async completeOne(p: PendingCompletion): Promise<void> {
        try {
            await this.completeAlone(p.a, p.json, p.value);
        } finally {
            p.done();
        }
    }

    private async completeAlone(a: Attempt<C>, json: string | null, value: unknown): Promise<void> {
        a.phase = 'completing';
        try {
            await this.pool.query(`SELECT status FROM ${this.prefix}ds_complete_task($1::text, $2::jsonb)`,
                [a.token, json]);
            a.phase = 'done';
            this.notify('completed', a.ctx, value);
        } catch (e) {
            a.phase = 'running';
            const err = toDurableStepsError(e);
            if (sqlstateOf(err) === 'DS410') {
                this.lost(a, err as Error);
            } else if (sqlstateOf(err) !== null) {
                // the server refused the result (too large, ...): the attempt fails with it
                await this.fail(a, err);
            } else {
                this.report(err as Error, a.ctx);
            }
        }
    }

    private async fail(a: Attempt<C>, thrown: unknown): Promise<void> {
        const f = describeFailure(thrown);
        a.phase = 'completing';
        try {
            await this.pool.query(
                // a delay within what ds_fail_task takes, (0, 24 h]: ds_retry_after's 0 is the least
                `SELECT status FROM ${this.prefix}ds_fail_task($1::text, $2::text, $3::text, $4::text, $5::text,
                     CASE WHEN $6::interval IS NOT NULL
                          THEN least(greatest($6::interval, interval '1 millisecond'), interval '24 hours') END,
                     $7::text)`,
                [a.token, f.errorCode, f.message, f.detail, f.errorClass, f.retryAfter, f.remediation]);
            a.phase = 'done';
            this.notify('failed', a.ctx, thrown, f.errorClass);
        } catch (e) {
            a.phase = 'running';
            const err = toDurableStepsError(e);
            if (sqlstateOf(err) === 'DS410') {
                this.lost(a, err as Error);
            } else {
                this.report(err as Error, a.ctx);
            }
        }
    }

    /** An event whose listener's throw is logged: it must not change what the worker records. */
    private notify<K extends 'completed' | 'failed' | 'lost'>(event: K, ...args: WorkerEvents[K]): void {
        try {
            (this.emit as (event: K, ...args: WorkerEvents[K]) => boolean)(event, ...args);
        } catch (e) {
            this.logger.error(`durable-steps worker ${this.name}: a listener of '${event}' threw`, e);
        }
    }

    /** The worker's own trouble: to the 'error' listeners, or to the logger without one. */
    private report(e: unknown, task: TaskContext<C> | null): void {
        const err = asError(e);
        if (this.listenerCount('error') > 0) {
            try {
                this.emit('error', err, task as TaskContext | null);
            } catch (thrown) {
                this.logger.error(`durable-steps worker ${this.name}: a listener of 'error' threw`, thrown);
            }
        } else {
            this.logger.error(`durable-steps worker ${this.name}: ${err.message}`
                + (task ? ` (${task.task} ${task.runId}/${task.stepId} attempt ${task.attempt})` : ''), err);
        }
    }
}

function asError(e: unknown): Error {
    return e instanceof Error ? e : new Error(String(e));
}

/** Why an attempt is gone: its signal's reason, a LeaseLostError. */
function goneReason(a: { ctx: TaskContext<any> }): Error {
    const reason: unknown = a.ctx.signal.reason;
    return reason instanceof Error ? reason : new LeaseLostError('the attempt no longer holds its lease');
}

/**
 * Listens for a connection's 'error' while the worker holds it: node-postgres emits one when the
 * connection is lost (its query rejects too), and a pool's client lent without a listener would
 * end the process with it. Returns the function that stops listening.
 */
function guard(client: TaskClient): () => void {
    const emitter = client as unknown as {
        on?: (event: 'error', listener: (e: Error) => void) => unknown;
        removeListener?: (event: 'error', listener: (e: Error) => void) => unknown;
    };
    if (typeof emitter.on !== 'function' || typeof emitter.removeListener !== 'function') {
        return () => undefined;
    }
    const listener = (): void => undefined;   // the query in flight rejects with the same error
    emitter.on('error', listener);
    return () => emitter.removeListener?.('error', listener);
}

/** A result as jsonb text (undefined is SQL NULL, as JSON.stringify leaves it). */
function jsonText(value: unknown): string | null {
    if (value === undefined) {
        return null;
    }
    const text = JSON.stringify(value) as string | undefined;
    return text === undefined ? null : text;
}
