// Application workflows (docs/app-workflows.md): a workflow written in TypeScript, run by the
// Worker, on the engine's runs. `workflow(name, fn)` makes the handler of task
// `ds.workflow:<name>`: each *segment* of a run is one attempt of such a task, and its steps are
// tasks of the same run whose attempts the segment claims itself (ds_claim_task), under its own
// lease. A segment reads the run's recorded steps in one query, replays them, runs each new step
// and records it as it completes, and goes on until the workflow returns (the run's output) or
// must sleep or wait for an event: the run then waits in the engine, and the next segment
// replays from the start.

import type { Json } from './client.js';
import { EventTimeoutError, LeaseLostError, NonRetriableError, toDurableStepsError } from './errors.js';
import type { TaskClient, TaskContext, TaskHandler, TaskPool } from './worker.js';
import { describeFailure } from './worker.js';

/** The seed's retry policy names, in milliseconds. */
export interface RetryOptions {
    maxAttempts?: number;
    initialMs?: number;
    maxMs?: number;
    multiplier?: number;
}

export interface StepOptions {
    retry?: RetryOptions;
    /** each attempt's limit: its signal aborts then, and the attempt fails as timed out */
    timeoutMs?: number;
    /** run `fn` with a client in a transaction whose writes commit with the step's record */
    transaction?: boolean;
}

/** What a step's function gets, once per attempt. */
export interface StepContext<C extends TaskClient = TaskClient> {
    readonly stepId: string;
    readonly attempt: number;
    readonly maxAttempts: number;
    /** the same for every attempt of the step: pass it to providers */
    readonly idempotencyKey: string;
    readonly attemptKey: string;
    /** aborted at the step's timeout, when the run is cancelled, when a lease is lost */
    readonly signal: AbortSignal;
    /** with `transaction: true`: the transaction's client (null otherwise) */
    readonly client: C | null;
}

export interface WorkflowContext<C extends TaskClient = TaskClient> {
    readonly runId: string;
    readonly workflow: string;
    /** the segment's number, from 1 (a run's later segments replay the earlier ones' steps) */
    readonly segment: number;
    /** aborted when the run is cancelled, when the segment's lease is lost, when the worker stops */
    readonly signal: AbortSignal;
    step<T = Json>(id: string, fn: (s: StepContext<C>) => T | Promise<T>, options?: StepOptions): Promise<T>;
    /**
     * One step per item, `${id}/${n}` (n from 1), at most `concurrency` running at once, their
     * results in the order of `items`; a failed item throws its StepFailedError once the others
     * have settled. Steps of one execution may also run side by side with Promise.all: each
     * ctx.step call takes its place in the run's history when it is made.
     */
    map<T = Json, I = Json>(id: string, items: readonly I[],
        fn: (item: I, s: StepContext<C>) => T | Promise<T>, options?: StepOptions & { concurrency?: number }): Promise<T[]>;
    sql<T = Json>(id: string, sql: string, input?: Json, options?: { retry?: RetryOptions; timeoutMs?: number }): Promise<T>;
    /**
     * An HTTP step the extension's HTTP worker sends, with the step's idempotency key in
     * `idempotencyHeader` ('Idempotency-Key'); the run waits for its response without holding a
     * worker, and the call answers it ({status, headers, body}). The request's shape is
     * ds_http_step's (docs/http.md).
     */
    http<T = Json>(id: string, request: Json, options?: { retry?: RetryOptions; idempotencyHeader?: string; timeoutMs?: number }): Promise<T>;
    /** A task another worker runs (docs/tasks.md); the run waits for its result without holding a worker. */
    task<T = Json>(id: string, task: string, input?: Json, options?: { retry?: RetryOptions; queue?: string; priority?: number; timeoutMs?: number }): Promise<T>;
    sleep(id: string, ms: number): Promise<void>;
    waitForEvent<T = Json>(id: string, event: string, options?: { timeoutMs?: number }): Promise<T>;
    patched(changeId: string): Promise<boolean>;
}

export type WorkflowFunction<I = any, O = unknown, C extends TaskClient = TaskClient> =
    (ctx: WorkflowContext<C>, input: I) => O | Promise<O>;

export interface WorkflowOptions {
    /** the policy of the workflow's segments: an uncaught error retries the segment by it */
    retry?: RetryOptions;
}

/** A workflow definition, for `new Worker({ workflows: [...] })`. */
export interface Workflow<I = any, O = unknown> {
    readonly name: string;
    /** the task each segment is: `ds.workflow:<name>` */
    readonly taskName: string;
    /** its steps' tasks: `ds.step:<name>` (no worker claims them by name) */
    readonly stepTaskName: string;
    /** the segments' policy, as the engine's JSON, or null */
    readonly policy: Json | null;
    readonly fn: WorkflowFunction<I, O, any>;
}

/**
 * A step that failed for good (its attempts used up, a NonRetriableError, cancelled), thrown into
 * the workflow at the step's call. Caught, the workflow goes on; uncaught, the run fails (it is
 * non-retriable: a segment that throws it is not tried again).
 */
export class StepFailedError extends NonRetriableError {
    constructor(readonly stepId: string, readonly status: string, readonly errorCode: string | null,
        message: string) {
        super(`step ${stepId} ${status}${errorCode ? ` (${errorCode})` : ''}: ${message}`);
        this.name = 'StepFailedError';
    }
}

/** The run's recorded history no longer matches the code: never silently. */
export class WorkflowMismatchError extends NonRetriableError {
    constructor(message: string) {
        super(message);
        this.name = 'WorkflowMismatchError';
    }
}

const MAX_NAME = 63;
/** a retry or a lease held elsewhere shorter than this is waited for inside the segment */
const WAIT_IN_SEGMENT_MS = 30_000;

function checkId(what: string, id: unknown): asserts id is string {
    if (typeof id !== 'string' || id === '' || Buffer.byteLength(id) > 200 || id.startsWith('ds.')) {
        throw new RangeError(`${what} must be a string of 1 to 200 bytes that does not start with "ds.", not ${JSON.stringify(id)}`);
    }
}

function checkMs(what: string, v: unknown, min: number): asserts v is number {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > 86_400_000 * 366) {
        throw new RangeError(`${what} must be a number of milliseconds from ${min}, not ${String(v)}`);
    }
}

/** The engine's policy JSON for the seed's names; unknown names and bad values are refused. */
export function retryPolicy(retry: RetryOptions | undefined): Json | null {
    if (retry === undefined) {
        return null;
    }
    const known = ['maxAttempts', 'initialMs', 'maxMs', 'multiplier'];
    for (const k of Object.keys(retry)) {
        if (!known.includes(k)) {
            throw new RangeError(`retry has no option ${k} (it has ${known.join(', ')})`);
        }
    }
    const out: Record<string, Json> = {};
    if (retry.maxAttempts !== undefined) {
        if (!Number.isInteger(retry.maxAttempts) || retry.maxAttempts < 1 || retry.maxAttempts > 1000) {
            throw new RangeError(`retry.maxAttempts must be an integer from 1 to 1000, not ${String(retry.maxAttempts)}`);
        }
        out.max_attempts = retry.maxAttempts;
    }
    if (retry.initialMs !== undefined) {
        checkMs('retry.initialMs', retry.initialMs, 0);
        out.initial_delay = retry.initialMs;
    }
    if (retry.maxMs !== undefined) {
        checkMs('retry.maxMs', retry.maxMs, 0);
        out.max_delay = retry.maxMs;
    }
    if (retry.multiplier !== undefined) {
        if (typeof retry.multiplier !== 'number' || !(retry.multiplier >= 1 && retry.multiplier <= 100)) {
            throw new RangeError(`retry.multiplier must be a number from 1 to 100, not ${String(retry.multiplier)}`);
        }
        out.multiplier = retry.multiplier;
    }
    return out;
}

/** Defines application workflow `name`; pass it to the Worker's `workflows`. */
export function workflow<I = any, O = unknown, C extends TaskClient = TaskClient>(
    name: string, fn: WorkflowFunction<I, O, C>, options: WorkflowOptions = {}): Workflow<I, O> {
    if (typeof name !== 'string' || name === '' || Buffer.byteLength(name) > MAX_NAME) {
        throw new RangeError(`a workflow name must be a string of 1 to ${MAX_NAME} bytes`);
    }
    if (typeof fn !== 'function') {
        throw new TypeError('a workflow is a function (ctx, input) => output');
    }
    return {
        name, taskName: `ds.workflow:${name}`, stepTaskName: `ds.step:${name}`,
        policy: retryPolicy(options.retry), fn: fn as WorkflowFunction<I, O, any>,
    };
}

/** What a segment answers (the task's result), read by ds_app_workflow. */
type Answer =
    | { then: 'return'; output: Json }
    | { then: 'sleep'; step: string; ms: number }
    | { then: 'event'; step: string; event: string; timeout_ms?: number }
    | { then: 'http'; step: string; request: Json; policy: Json | null; idempotency_header: string; timeout_ms?: number }
    | { then: 'task'; step: string; task: string; input: Json; policy: Json | null; queue: string; priority: number; timeout_ms?: number };

/** Thrown through the workflow's code when the segment ends here; the segment answers it. */
class Suspended extends Error {
    constructor(readonly answer: Answer) {
        super('the workflow waits: this segment ends here');
        this.name = 'Suspended';
    }
}

interface Recorded {
    step_id: string;
    kind: string;
    status: string;
    result: Json;
    error_code: string | null;
    error_message: string | null;
    seq: number | null;
}

interface ClaimAnswer {
    status: string;
    result: Json;
    attempt: number;
    max_attempts: number;
    idempotency_key: string | null;
    attempt_key: string | null;
    token: string | null;
    lease_ms: number | null;
    deadline_ms: number | null;
    next_ms: number | null;
    now_ms: number;
    error_code: string | null;
    error_message: string | null;
}

function sqlstateOf(e: unknown): string | null {
    const code = (e as { code?: unknown } | null)?.code;
    return typeof code === 'string' ? code : null;
}

function delay(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
        if (signal.aborted) {
            reject(signal.reason);
            return;
        }
        const t = setTimeout(() => {
            signal.removeEventListener('abort', onAbort);
            resolve();
        }, Math.max(0, ms));
        const onAbort = (): void => {
            clearTimeout(t);
            reject(signal.reason);
        };
        signal.addEventListener('abort', onAbort, { once: true });
    });
}

/** What a claim of a new step stores first (ds_task_step). */
interface NewStep {
    runId: string;
    task: string;
    input: Json;
    policy: Json | null;
    timeout: string | null;
}

interface PendingClaim {
    holder: string;
    stepId: string;
    create?: NewStep;
    resolve: (c: ClaimAnswer) => void;
    reject: (e: unknown) => void;
}

interface PendingComplete {
    token: string;
    json: string;
    resolve: (held: boolean) => void;
    reject: (e: unknown) => void;
}

const CLAIM_COLUMNS = `c.status, c.result, c.attempt, c.max_attempts, c.idempotency_key, c.attempt_key, c.token,
    extract(epoch FROM c.lease_expires_at)::float8 * 1000 AS lease_ms,
    extract(epoch FROM c.deadline)::float8 * 1000 AS deadline_ms,
    extract(epoch FROM c.next_attempt_at)::float8 * 1000 AS next_ms,
    extract(epoch FROM clock_timestamp())::float8 * 1000 AS now_ms,
    c.error_code, c.error_message`;

/**
 * The claims and the successes of the steps of all the segments a worker runs, sent together:
 * those asked for in one turn of the event loop go in one statement each (a claim of new steps,
 * a claim of recorded ones, the successes), as the Worker records its tasks' successes. Each
 * caller gets its own row. A statement that fails as a whole (one holder's lease gone raises
 * DS410 for all) is sent again one call at a time, so that each caller gets its own answer.
 */
export class StepBatcher {
    private claims: PendingClaim[] = [];
    private completes: PendingComplete[] = [];
    private scheduled = false;

    constructor(private readonly pool: TaskPool, private readonly prefix: string,
        private readonly worker: string, private readonly leaseMs: number) {}

    claim(holder: string, stepId: string, create?: NewStep): Promise<ClaimAnswer> {
        return new Promise((resolve, reject) => {
            this.claims.push({ holder, stepId, create, resolve, reject });
            this.schedule();
        });
    }

    /** Records a success; false when the attempt no longer held its lease (nothing recorded). */
    complete(token: string, json: string): Promise<boolean> {
        return new Promise((resolve, reject) => {
            this.completes.push({ token, json, resolve, reject });
            this.schedule();
        });
    }

    private schedule(): void {
        if (!this.scheduled) {
            this.scheduled = true;
            setImmediate(() => {
                this.scheduled = false;
                const claims = this.claims.splice(0);
                const completes = this.completes.splice(0);
                void this.sendClaims(claims.filter((c) => c.create !== undefined));
                void this.sendClaims(claims.filter((c) => c.create === undefined));
                void this.sendCompletes(completes);
            });
        }
    }

    private async sendClaims(unordered: PendingClaim[]): Promise<void> {
        if (unordered.length === 0) {
            return;
        }
        // in the order of the steps' identities (the run is the holder's), as every call takes
        // its two locks and ds_cancel_run takes a run's: no two statements wait in a circle
        const batch = [...unordered].sort((a, b) =>
            Buffer.compare(Buffer.from(a.holder), Buffer.from(b.holder))
            || Buffer.compare(Buffer.from(a.stepId), Buffer.from(b.stepId)));
        const lease = `${this.leaseMs} milliseconds`;
        try {
            let rows: (ClaimAnswer & { i: number })[];
            if (batch[0].create !== undefined) {
                // each new step stored, then claimed by the name it was stored under
                ({ rows } = await this.pool.query(
                    `SELECT x.i::integer AS i, ${CLAIM_COLUMNS}
                       FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[], $7::interval[])
                            WITH ORDINALITY AS x(holder, run_id, step_id, task, input, policy, timeout, i),
                            LATERAL ${this.prefix}ds_task_step(x.run_id, x.step_id, x.task, x.input, x.policy,
                                                               timeout => x.timeout) AS s,
                            LATERAL ${this.prefix}ds_claim_task(x.holder, s.step_id, $8::interval, $9) AS c`,
                    [batch.map((b) => b.holder), batch.map((b) => b.create?.runId), batch.map((b) => b.stepId),
                        batch.map((b) => b.create?.task), batch.map((b) => JSON.stringify(b.create?.input ?? null)),
                        batch.map((b) => (b.create?.policy == null ? null : JSON.stringify(b.create.policy))),
                        batch.map((b) => b.create?.timeout ?? null), lease, this.worker]));
            } else {
                ({ rows } = await this.pool.query(
                    `SELECT x.i::integer AS i, ${CLAIM_COLUMNS}
                       FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(holder, step_id, i),
                            LATERAL ${this.prefix}ds_claim_task(x.holder, x.step_id, $3::interval, $4) AS c`,
                    [batch.map((b) => b.holder), batch.map((b) => b.stepId), lease, this.worker]));
            }
            for (const r of rows) {
                batch[r.i - 1].resolve(r);
            }
        } catch (e) {
            if (batch.length === 1) {
                batch[0].reject(e);
                return;
            }
            // one call's error is not the others': each on its own
            await Promise.all(batch.map((b) => this.sendClaims([b])));
        }
    }

    private async sendCompletes(batch: PendingComplete[]): Promise<void> {
        if (batch.length === 0) {
            return;
        }
        try {
            const { rows }: { rows: { held: boolean }[] } = await this.pool.query(
                `SELECT c.held FROM ${this.prefix}ds_complete_tasks($1::text[], $2::jsonb[]) AS c`,
                [batch.map((b) => b.token), batch.map((b) => b.json)]);
            rows.forEach((r, i) => batch[i].resolve(r.held));
        } catch (e) {
            if (batch.length === 1) {
                batch[0].reject(e);
                return;
            }
            await Promise.all(batch.map((b) => this.sendCompletes([b])));
        }
    }
}

/** The handler of one workflow's segments: made by the Worker for its pool. */
export function segmentHandler<C extends TaskClient>(wf: Workflow, pool: TaskPool<C>, prefix: string,
    leaseMs: number, batcher: StepBatcher): TaskHandler<Json, Answer, C> {
    return async (input, task) => {
        const segment = Number(task.stepId.slice('ds.segment:'.length)) || 1;
        // Only segments record a run's steps, and the turns its sleeps and event waits after a
        // segment: the first attempt of the first segment has nothing to read
        const history = segment === 1 && task.attempt === 1
            ? new Map<string, Recorded>() : await readHistory(pool, prefix, task.runId);
        const run = new Segment<C>(wf, pool, prefix, leaseMs, batcher, task, history, segment);
        let output: unknown;
        try {
            output = await wf.fn(run.ctx, input);
        } catch (e) {
            if (run.suspension !== null) {
                return run.suspension;
            }
            throw e;
        }
        // a workflow that caught the suspension still ends its segment there
        if (run.suspension !== null) {
            return run.suspension;
        }
        return { then: 'return', output: (output === undefined ? null : output) as Json };
    };
}

async function readHistory(pool: TaskPool, prefix: string, runId: string): Promise<Map<string, Recorded>> {
    const { rows }: { rows: Recorded[] } = await pool.query(
        `SELECT s.step_id, s.kind, s.status, s.result, s.error_code, s.error_message,
                CASE WHEN s.kind = 'task' AND s.task LIKE 'ds.step:%' AND jsonb_typeof(s.input -> 'seq') = 'number'
                     THEN (s.input ->> 'seq')::integer END AS seq
           FROM ${prefix}ds_steps s WHERE s.run_id = $1`, [runId]);
    return new Map(rows.map((r) => [r.step_id, r]));
}

class Segment<C extends TaskClient> {
    readonly ctx: WorkflowContext<C>;
    suspension: Answer | null = null;
    private seq = 0;
    private readonly used = new Set<string>();

    constructor(private readonly wf: Workflow, private readonly pool: TaskPool<C>,
        private readonly prefix: string, private readonly leaseMs: number,
        private readonly batcher: StepBatcher, private readonly task: TaskContext<C>, private readonly history: Map<string, Recorded>,
        segment: number) {
        const self = this;
        this.ctx = {
            runId: task.runId, workflow: wf.name, segment, signal: task.signal,
            step: (id, fn, options) => self.step(id, fn, options),
            map: (id, items, fn, options) => self.map(id, items, fn, options),
            sql: (id, sql, input, options) => self.sql(id, sql, input, options),
            http: (id, request, options) => self.http(id, request, options),
            task: (id, task, input, options) => self.taskStep(id, task, input, options),
            sleep: (id, ms) => self.sleep(id, ms),
            waitForEvent: (id, event, options) => self.waitForEvent(id, event, options),
            patched: (changeId) => self.patched(changeId),
        } as WorkflowContext<C>;
    }

    /** every call after the suspension throws it again: the segment ends there */
    private enter(id: string, what: string): void {
        if (this.suspension !== null) {
            throw new Suspended(this.suspension);
        }
        this.task.signal.throwIfAborted();
        checkId(`${what}'s id`, id);
        if (this.used.has(id)) {
            throw new WorkflowMismatchError(`step id ${id} is used twice in workflow ${this.wf.name}: each step, sleep and event wait needs an id of its own`);
        }
        this.used.add(id);
        // a call the run never made, while it recorded calls this execution has not reached:
        // the history went past this point under other code
        const ahead = this.history.has(id) ? [] : this.unreplayed();
        if (ahead.length > 0) {
            throw new WorkflowMismatchError(`workflow ${this.wf.name} reaches a new call ${id} where run ${this.task.runId} recorded ${ahead.join(', ')} after it: its code changed under a run in flight; put the change behind ctx.patched()`);
        }
    }

    /** The calls the run recorded that this execution has not reached yet. */
    private unreplayed(): string[] {
        return [...this.history.keys()].filter((k) => !k.startsWith('ds.') && !this.used.has(k));
    }

    /** The step recorded under `id`, which must be of `kind` (WorkflowMismatchError otherwise). */
    private recordedAs(id: string, kind: string, call: string): Recorded | undefined {
        const recorded = this.history.get(id);
        if (recorded !== undefined && recorded.kind !== kind) {
            throw new WorkflowMismatchError(`workflow ${this.wf.name} calls ${call} where run ${this.task.runId} recorded a ${recorded.kind} step of that id: its code changed under a run in flight; put the change behind ctx.patched()`);
        }
        return recorded;
    }

    private suspend(answer: Answer): never {
        this.suspension = answer;
        throw new Suspended(answer);
    }

    private failed(r: { step_id?: string; status: string; error_code: string | null; error_message: string | null }, id: string): StepFailedError {
        return new StepFailedError(id, r.status, r.error_code, r.error_message ?? '');
    }

    async step<T>(id: string, fn: (s: StepContext<C>) => T | Promise<T>, options: StepOptions = {}): Promise<T> {
        this.enter(id, 'a step');
        if (typeof fn !== 'function') {
            throw new TypeError(`step ${id}: fn must be a function`);
        }
        if (options.timeoutMs !== undefined) {
            checkMs('timeoutMs', options.timeoutMs, 1);
        }
        return this.stepAt(id, fn, options, ++this.seq);
    }

    async map<T, I>(id: string, items: readonly I[], fn: (item: I, s: StepContext<C>) => T | Promise<T>,
        options: StepOptions & { concurrency?: number } = {}): Promise<T[]> {
        if (!Array.isArray(items)) {
            throw new TypeError(`map ${id}: items must be an array`);
        }
        if (typeof fn !== 'function') {
            throw new TypeError(`map ${id}: fn must be a function`);
        }
        const { concurrency = items.length, ...stepOptions } = options;
        if (!Number.isInteger(concurrency) || concurrency < 1) {
            if (items.length > 0) {
                throw new RangeError(`map ${id}: concurrency must be a whole number of at least 1`);
            }
        }
        if (stepOptions.timeoutMs !== undefined) {
            checkMs('timeoutMs', stepOptions.timeoutMs, 1);
        }
        // every item takes its place in the history now, in order: whenever a slot lets it
        // run, its place is the same in every execution of the run
        const ids = items.map((_, i) => `${id}/${i + 1}`);
        for (const itemId of ids) {
            this.enter(itemId, 'a map\'s item');
        }
        const first = this.seq + 1;
        this.seq += items.length;
        const results: T[] = new Array(items.length);
        const failures: { index: number; error: unknown }[] = [];
        let next = 0;
        const lane = async (): Promise<void> => {
            while (next < items.length) {
                const i = next++;
                try {
                    results[i] = await this.stepAt(ids[i], (s) => fn(items[i], s), stepOptions, first + i);
                } catch (e) {
                    if (e instanceof Suspended) {
                        throw e;
                    }
                    failures.push({ index: i, error: e });
                }
            }
        };
        await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, lane));
        if (failures.length > 0) {
            failures.sort((a, b) => a.index - b.index);
            throw failures[0].error;
        }
        return results;
    }

    /** Step `id`, the run's `seq`-th step of this execution (checked against its history). */
    private async stepAt<T>(id: string, fn: (s: StepContext<C>) => T | Promise<T>, options: StepOptions,
        seq: number): Promise<T> {
        const policy = retryPolicy(options.retry);
        const recorded = this.history.get(id);
        if (recorded !== undefined) {
            if (recorded.kind !== 'task' || recorded.seq === null) {
                throw new WorkflowMismatchError(`workflow ${this.wf.name} calls ctx.step('${id}') where run ${this.task.runId} recorded a ${recorded.kind} step of that id: its code changed under a run in flight; put the change behind ctx.patched()`);
            }
            if (recorded.seq !== seq) {
                throw new WorkflowMismatchError(`workflow ${this.wf.name} reaches step ${id} as its step ${seq}, but run ${this.task.runId} recorded it as step ${recorded.seq}: its code changed under a run in flight; put the change behind ctx.patched()`);
            }
            if (recorded.status === 'succeeded') {
                return recorded.result as T;
            }
            if (['failed', 'cancelled'].includes(recorded.status)) {
                throw this.failed(recorded, id);
            }
        }
        let c: ClaimAnswer | null = null;
        if (recorded === undefined) {
            // stored and claimed in one statement: one commit
            c = await this.claim(id, {
                input: { seq }, policy,
                timeout: options.timeoutMs === undefined ? null : `${options.timeoutMs} milliseconds`,
            });
        }
        for (;;) {
            c ??= await this.claim(id);
            if (c.token !== null) {
                const outcome = await this.attempt(c, fn, options);
                if (outcome.done) {
                    return outcome.value as T;
                }
            } else {
                const result = await this.settle(id, c);
                if (result.done) {
                    return result.value as T;
                }
            }
            c = null;
        }
    }

    /** A claim's answer without a token: return, throw, wait here, or end the segment. */
    private async settle(id: string, c: ClaimAnswer): Promise<{ done: boolean; value?: unknown }> {
        switch (c.status) {
            case 'succeeded':
                return { done: true, value: c.result };
            case 'failed':
            case 'cancelled':
            case 'blocked':
            case 'uncertain':
                throw this.failed(c, id);
        }
        const until = c.status === 'running' ? c.lease_ms : c.next_ms;
        const wait = until === null ? 1000 : until - c.now_ms;
        if (wait <= WAIT_IN_SEGMENT_MS) {
            await delay(wait + 5, this.task.signal);
            return { done: false };
        }
        return this.suspend({ then: 'sleep', step: `ds.wait:${id}:${c.attempt}:${this.ctx.segment}`, ms: Math.ceil(wait) });
    }

    /**
     * ds_claim_task on step `id` (with other segments' claims); with `create`, the step is
     * stored first (ds_task_step, which answers a step that exists as it stands), in the same
     * statement.
     */
    private claim(id: string, create?: { input: Json; policy: Json | null; timeout: string | null }): Promise<ClaimAnswer> {
        return this.batcher.claim(this.task.token, id, create === undefined ? undefined
            : { runId: this.task.runId, task: this.wf.stepTaskName, ...create });
    }

    /** One attempt: fn under the step's lease (heartbeats), its outcome recorded. */
    private async attempt<T>(c: ClaimAnswer, fn: (s: StepContext<C>) => T | Promise<T>,
        options: StepOptions): Promise<{ done: boolean; value?: unknown }> {
        const token = c.token as string;
        const controller = new AbortController();
        const onParent = (): void => controller.abort(this.task.signal.reason);
        this.task.signal.addEventListener('abort', onParent, { once: true });
        const offset = c.now_ms - Date.now();
        const timers: ReturnType<typeof setTimeout>[] = [];
        if (c.deadline_ms !== null) {
            timers.push(setTimeout(() => controller.abort(new Error(`step ${c.idempotency_key}: its timeout passed`)),
                Math.max(0, c.deadline_ms - offset - Date.now())));
        }
        const beat = setInterval(() => {
            this.pool.query(`SELECT h.held FROM ${this.prefix}ds_heartbeat($1::text, $2::interval) AS h`,
                [token, `${this.leaseMs} milliseconds`])
                .then(({ rows }) => {
                    if (!rows[0]?.held) {
                        controller.abort(new Error('the step no longer holds its lease'));
                    }
                }, () => undefined);
        }, this.leaseMs / 3);
        let client: C | null = null;
        let unserializable = false;
        const serialized = (v: unknown): string => {
            try {
                return JSON.stringify(v === undefined ? null : v);
            } catch (e) {
                unserializable = true;
                throw e;
            }
        };
        try {
            const s = (c2: C | null): StepContext<C> => ({
                stepId: c.idempotency_key ?? '', attempt: c.attempt, maxAttempts: c.max_attempts,
                idempotencyKey: c.idempotency_key ?? '', attemptKey: c.attempt_key ?? '',
                signal: controller.signal, client: c2,
            });
            let value: unknown;
            try {
                let json: string;
                if (options.transaction) {
                    client = await this.pool.connect();
                    await client.query('BEGIN');
                    value = await fn(s(client));
                    controller.signal.throwIfAborted();
                    json = serialized(value);
                    await client.query(`SELECT 1 FROM ${this.prefix}ds_complete_task($1::text, $2::jsonb)`,
                        [token, json]);
                    await client.query('COMMIT');
                } else {
                    value = await fn(s(null));
                    controller.signal.throwIfAborted();
                    json = serialized(value);
                    if (!await this.batcher.complete(token, json)) {
                        return { done: false };     // the lease was gone: the step's state decides
                    }
                }
                return { done: true, value: JSON.parse(json) };
            } catch (e) {
                if (client !== null) {
                    await client.query('ROLLBACK').catch(() => undefined);
                }
                // the segment itself ends (cancelled, lease lost, stopping): the step's lease decides
                if (this.task.signal.aborted) {
                    throw e;
                }
                // the step's lease was gone as its outcome came: nothing recorded, its state decides
                if (sqlstateOf(e) === 'DS410') {
                    return { done: false };
                }
                const d = describeFailure(toDurableStepsError(e));
                // a result that is not JSON fails the same way every time: not worth a retry
                const cls = d.errorClass === 'correctable' || unserializable ? 'permanent' : d.errorClass;
                try {
                    await this.pool.query(
                        `SELECT 1 FROM ${this.prefix}ds_fail_task($1::text, $2, $3, $4, $5, $6::interval, $7)`,
                        [token, d.errorCode, d.message, d.detail, cls, d.retryAfter, d.remediation]);
                } catch (refused) {
                    // the lease was gone (its deadline, a cancellation, a lost lease): the step's
                    // state, recorded by whoever ended the attempt, decides
                    if (sqlstateOf(refused) !== 'DS410') {
                        throw refused;
                    }
                }
                return { done: false };
            }
        } finally {
            client?.release();
            clearInterval(beat);
            timers.forEach(clearTimeout);
            this.task.signal.removeEventListener('abort', onParent);
        }
    }

    /**
     * ds_run_step on the run, in a transaction that first holds the segment's lease (a
     * heartbeat, whose lock on the segment lasts to the commit): a segment whose lease is gone,
     * or whose run was cancelled, runs no SQL step, and a cancellation waits for the step.
     */
    private async fencedSql(id: string, sql: string, input: Json | undefined, policy: Json | null,
        timeoutMs: number | undefined): Promise<ClaimAnswer> {
        const client = await this.pool.connect();
        let open = false;
        try {
            await client.query('BEGIN');
            open = true;
            const { rows: [beat] }: { rows: { held: boolean }[] } = await client.query(
                `SELECT h.held FROM ${this.prefix}ds_heartbeat($1::text, $2::interval) AS h`,
                [this.task.token, `${this.leaseMs} milliseconds`]);
            if (!beat?.held) {
                throw new LeaseLostError(`segment ${this.task.stepId} of run ${this.task.runId} no longer holds its lease: SQL step ${id} does not start`);
            }
            const { rows }: { rows: ClaimAnswer[] } = await client.query(
                `SELECT r.status, r.result, r.attempt, r.max_attempts, NULL AS token,
                        NULL::float8 AS lease_ms, NULL::float8 AS deadline_ms,
                        extract(epoch FROM r.next_attempt_at)::float8 * 1000 AS next_ms,
                        extract(epoch FROM clock_timestamp())::float8 * 1000 AS now_ms,
                        r.error_code, r.error_message
                   FROM ${this.prefix}ds_run_step($1, $2, $3, $4::jsonb, $5::jsonb, $6::interval) AS r`,
                [this.task.runId, id, sql, input === undefined ? null : JSON.stringify(input),
                    policy === null ? null : JSON.stringify(policy),
                    timeoutMs === undefined ? null : `${timeoutMs} milliseconds`]);
            await client.query('COMMIT');
            open = false;
            return rows[0];
        } finally {
            if (open) {
                await client.query('ROLLBACK').catch(() => undefined);
            }
            client.release();
        }
    }

    async sql<T>(id: string, sql: string, input?: Json, options: { retry?: RetryOptions; timeoutMs?: number } = {}): Promise<T> {
        this.enter(id, 'a SQL step');
        const recorded = this.recordedAs(id, 'sql', `ctx.sql('${id}')`);
        if (recorded?.status === 'succeeded') {
            return recorded.result as T;
        }
        if (recorded !== undefined && ['failed', 'cancelled'].includes(recorded.status)) {
            throw this.failed(recorded, id);
        }
        const policy = retryPolicy(options.retry);
        for (;;) {
            const r = await this.fencedSql(id, sql, input, policy, options.timeoutMs);
            if (r.status === 'running') {
                r.status = 'retrying';      // run by another session now: look again shortly
                r.next_ms = r.now_ms + 50;
            }
            const settled = await this.settle(id, r);
            if (settled.done) {
                return settled.value as T;
            }
        }
    }

    /** An HTTP step or a task that the run waits for in the engine: its result, or its failure. */
    private waitedFor<T>(id: string, recorded: Recorded | undefined, answer: Answer): T {
        if (recorded?.status === 'succeeded') {
            return recorded.result as T;
        }
        if (recorded !== undefined && ['failed', 'cancelled', 'blocked', 'uncertain'].includes(recorded.status)) {
            throw this.failed(recorded, id);
        }
        return this.suspend(answer);
    }

    async http<T>(id: string, request: Json, options: { retry?: RetryOptions; idempotencyHeader?: string; timeoutMs?: number } = {}): Promise<T> {
        this.enter(id, 'an HTTP step');
        if (request === null || typeof request !== 'object' || Array.isArray(request)) {
            throw new TypeError(`HTTP step ${id}: the request is an object ({method, url, ...})`);
        }
        if (options.timeoutMs !== undefined) {
            checkMs(`HTTP step ${id}: timeoutMs`, options.timeoutMs, 1);
        }
        const answer: Answer = {
            then: 'http', step: id, request, policy: retryPolicy(options.retry),
            idempotency_header: options.idempotencyHeader ?? 'Idempotency-Key',
        };
        if (options.timeoutMs !== undefined) {
            answer.timeout_ms = Math.ceil(options.timeoutMs);
        }
        return this.waitedFor<T>(id, this.recordedAs(id, 'http', `ctx.http('${id}')`), answer);
    }

    async taskStep<T>(id: string, task: string, input?: Json, options: { retry?: RetryOptions; queue?: string; priority?: number; timeoutMs?: number } = {}): Promise<T> {
        this.enter(id, 'a task');
        if (typeof task !== 'string' || task === '') {
            throw new RangeError(`task ${id}: the task's name must be a non-empty string`);
        }
        if (options.timeoutMs !== undefined) {
            checkMs(`task ${id}: timeoutMs`, options.timeoutMs, 1);
        }
        if (options.priority !== undefined && !Number.isInteger(options.priority)) {
            throw new RangeError(`task ${id}: priority must be an integer`);
        }
        const recorded = this.recordedAs(id, 'task', `ctx.task('${id}')`);
        if (recorded !== undefined && recorded.seq !== null) {
            throw new WorkflowMismatchError(`workflow ${this.wf.name} calls ctx.task('${id}') where run ${this.task.runId} recorded a ctx.step of that id: its code changed under a run in flight; put the change behind ctx.patched()`);
        }
        const answer: Answer = {
            then: 'task', step: id, task, input: input === undefined ? null : input,
            policy: retryPolicy(options.retry), queue: options.queue ?? 'default', priority: options.priority ?? 0,
        };
        if (options.timeoutMs !== undefined) {
            answer.timeout_ms = Math.ceil(options.timeoutMs);
        }
        return this.waitedFor<T>(id, recorded, answer);
    }

    async sleep(id: string, ms: number): Promise<void> {
        this.enter(id, 'a sleep');
        checkMs(`sleep ${id}`, ms, 0);
        const recorded = this.recordedAs(id, 'sleep', `ctx.sleep('${id}')`);
        if (recorded?.status === 'succeeded') {
            return;
        }
        this.suspend({ then: 'sleep', step: id, ms: Math.ceil(ms) });
    }

    async waitForEvent<T>(id: string, event: string, options: { timeoutMs?: number } = {}): Promise<T> {
        this.enter(id, 'an event wait');
        if (typeof event !== 'string' || event === '') {
            throw new RangeError(`event wait ${id}: the event's name must be a non-empty string`);
        }
        if (options.timeoutMs !== undefined) {
            checkMs(`event wait ${id}: timeoutMs`, options.timeoutMs, 1);
        }
        const recorded = this.recordedAs(id, 'event', `ctx.waitForEvent('${id}')`);
        if (recorded?.status === 'succeeded') {
            return recorded.result as T;
        }
        if (recorded?.status === 'failed') {
            throw new EventTimeoutError(`event ${event} was not emitted within its timeout (wait ${id})`);
        }
        const answer: Answer = { then: 'event', step: id, event };
        if (options.timeoutMs !== undefined) {
            answer.timeout_ms = Math.ceil(options.timeoutMs);
        }
        this.suspend(answer);
    }

    /**
     * Whether this run takes the code of change `changeId`: true for a run that reaches this
     * point with no call recorded past it, false for one whose history already went past it;
     * recorded, so that every later segment answers the same.
     */
    async patched(changeId: string): Promise<boolean> {
        if (this.suspension !== null) {
            throw new Suspended(this.suspension);
        }
        checkId('a change id', changeId);
        const id = `ds.patch:${changeId}`;
        const recorded = this.history.get(id);
        if (recorded?.status === 'succeeded') {
            return recorded.result === true;
        }
        const value = this.unreplayed().length === 0;
        let c: ClaimAnswer | null = recorded === undefined
            ? await this.claim(id, { input: null, policy: null, timeout: null }) : null;
        for (;;) {
            c ??= await this.claim(id);
            if (c.token !== null) {
                if (await this.batcher.complete(c.token, JSON.stringify(value))) {
                    return value;
                }
                c = null;
                continue;
            }
            const settled = await this.settle(id, c);
            if (settled.done) {
                return settled.value === true;
            }
            c = null;
        }
    }
}
