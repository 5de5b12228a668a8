// durable-steps: the durable_steps extension's functions as typed calls over node-postgres, its
// SQLSTATEs as error classes, idempotent endpoints for Express and Fastify, and the Worker of
// tasks, steps whose body is a handler of the application (README.md).

import {
    DurableSteps,
    type HttpRequest,
    type HttpResponse,
    type HttpStepOptions,
    type IdempotentBegin,
    type IdempotentBeginOptions,
    type IdempotentOptions,
    type IdempotentResponse,
    type Interval,
    type Json,
    type Queryable,
    type RunOutcome,
    type RunStepOptions,
    type StartRunOptions,
    type StartedRun,
    type StepResult,
    type TaskStepOptions,
} from './client.js';

export * from './client.js';
export * from './errors.js';
export * from './middleware.js';
export * from './worker.js';
export * from './workflow.js';

// The calls as functions of a connection, for code that keeps no DurableSteps object: each is
// `new DurableSteps(db).<method>(...)`.

export function runStep<R = Json>(db: Queryable, runId: string, stepId: string, sql: string,
    options?: RunStepOptions): Promise<StepResult<R>> {
    return new DurableSteps(db).runStep<R>(runId, stepId, sql, options);
}

export function httpStep<B = Json>(db: Queryable, runId: string, stepId: string, request: HttpRequest,
    options?: HttpStepOptions): Promise<StepResult<HttpResponse<B>>> {
    return new DurableSteps(db).httpStep<B>(runId, stepId, request, options);
}

export function taskStep<R = Json>(db: Queryable, runId: string, stepId: string, task: string, input?: Json,
    options?: TaskStepOptions): Promise<StepResult<R>> {
    return new DurableSteps(db).taskStep<R>(runId, stepId, task, input, options);
}

export function waitStep<R = Json>(db: Queryable, runId: string, stepId: string,
    timeout?: Interval): Promise<StepResult<R>> {
    return new DurableSteps(db).waitStep<R>(runId, stepId, timeout);
}

export function startRun(db: Queryable, workflow: string, input?: Json,
    options?: StartRunOptions): Promise<StartedRun> {
    return new DurableSteps(db).startRun(workflow, input, options);
}

export function waitRun<O = Json>(db: Queryable, runId: string, timeout?: Interval): Promise<RunOutcome<O>> {
    return new DurableSteps(db).waitRun<O>(runId, timeout);
}

export function emitEvent(db: Queryable, name: string, payload?: Json): Promise<boolean> {
    return new DurableSteps(db).emitEvent(name, payload);
}

export function idempotent<B = Json>(db: Queryable, scope: string, key: string, request: Json, handler: string,
    options?: IdempotentOptions): Promise<IdempotentResponse<B>> {
    return new DurableSteps(db).idempotent<B>(scope, key, request, handler, options);
}

export function idempotentBegin<B = Json>(db: Queryable, scope: string, key: string, request: Json,
    options?: IdempotentBeginOptions): Promise<IdempotentBegin<B>> {
    return new DurableSteps(db).idempotentBegin<B>(scope, key, request, options);
}

export function idempotentFinish(db: Queryable, scope: string, key: string, token: string, status: number,
    body: Json): Promise<void> {
    return new DurableSteps(db).idempotentFinish(scope, key, token, status, body);
}

export function idempotentRenew(db: Queryable, scope: string, key: string, token: string,
    lease?: Interval): Promise<Date> {
    return new DurableSteps(db).idempotentRenew(scope, key, token, lease);
}

export function idempotentAbandon(db: Queryable, scope: string, key: string, token: string): Promise<void> {
    return new DurableSteps(db).idempotentAbandon(scope, key, token);
}
