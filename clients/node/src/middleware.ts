// Idempotent HTTP endpoints over ds_idempotent (docs/idempotent-requests.md), as Express
// middleware and a Fastify preHandler hook. Both do the same:
//
// 1. read the client's key from the Idempotency-Key header (400 without one, unless the key is
//    optional; 400 for one that is not 1 to 255 characters);
// 2. call ds_idempotent(scope, key, request, handler, wait => ...), where the request is what
//    `request(...)` makes of the HTTP request ({method, path, idempotency_key, body} by default)
//    and the handler is one SQL statement, $1 that request, returning (status, body): it runs
//    once per key, and its response commits with its writes. The handler is a bind parameter,
//    as every SQL text of this package;
// 3. set `Idempotent-Replayed: true` when the response was stored by an earlier request, then
//    either answer the stored response (the default) or hand it to the route (`respond: false`:
//    Express's res.locals.idempotent, Fastify's request.idempotent) to build its own answer;
// 4. answer a documented SQLSTATE whose HTTP status is below 500 (DS422: another request under
//    the key, 422; DS409: still in flight after `wait`, 409 with Retry-After) with that status and
//    {error, sqlstate}; any other error goes to the framework's error handling.

import { DurableSteps, type IdempotentResponse, type Interval, type Json, type Queryable } from './client.js';
import { DurableStepsError, toDurableStepsError } from './errors.js';

/** The parts of an HTTP request the stored request is made of. */
export interface IdempotentHttpRequest {
    method: string;
    /** the path, without the query string */
    path: string;
    key: string;
    body: unknown;
}

export interface IdempotencyOptions {
    /** a DurableSteps, or the Pool it is made over */
    client: DurableSteps | Queryable;
    /** the scope of the keys: the endpoint, or the kind of request */
    scope: string;
    /**
     * The handler: one SQL statement, $1 the stored request, returning one row
     * (status integer, body jsonb). A function picks it by request.
     */
    handler: string | ((request: IdempotentHttpRequest) => string);
    /**
     * The stored request, which a repeat must match (jsonb equality; another one under the key
     * is answered 422). By default {method, path, idempotency_key, body}.
     */
    request?: (request: IdempotentHttpRequest) => Json;
    /** the header of the key ('Idempotency-Key') */
    header?: string;
    /** false: a request without the header goes on to the route without any of this (true) */
    required?: boolean;
    /** how long the response is kept (ds_idempotent's default: 24 hours) */
    ttl?: Interval;
    /** how long a repeat waits for a first request in flight ('10 s'); then 409 */
    wait?: Interval;
    /** false: the route answers, with the stored response at hand; true: answer it (default) */
    respond?: boolean;
}

/** What the middleware hands to the route with `respond: false`. */
export type IdempotentResult = IdempotentResponse & { key: string };

export const REPLAYED_HEADER = 'Idempotent-Replayed';

/** A request's answer, before it is written in a framework's terms. */
type Outcome =
    | { kind: 'skip' }
    | { kind: 'error'; status: number; body: { error: string; sqlstate?: string | null }; retryAfter?: string }
    | { kind: 'answer'; result: IdempotentResult };

function defaultRequest(r: IdempotentHttpRequest): Json {
    return { method: r.method, path: r.path, idempotency_key: r.key, body: (r.body ?? null) as Json };
}

/** The shared part of both middlewares: from the HTTP request's parts to its outcome. */
function makeCore(options: IdempotencyOptions) {
    // by its method rather than instanceof: a DurableSteps of the package's other build (an
    // application that both imports and requires it) is one too
    const given = options.client as DurableSteps | Queryable;
    const client = typeof (given as DurableSteps).idempotent === 'function'
        ? given as DurableSteps : new DurableSteps(given as Queryable);
    const header = options.header ?? 'Idempotency-Key';
    const required = options.required ?? true;
    const wait = options.wait ?? '10 s';
    const toRequest = options.request ?? defaultRequest;

    return {
        header,
        respond: options.respond ?? true,
        async run(method: string, path: string, key: string | undefined, body: unknown): Promise<Outcome> {
            if (key === undefined || key === '') {
                if (!required) {
                    return { kind: 'skip' };
                }
                return { kind: 'error', status: 400, body: { error: `an ${header} header is required` } };
            }
            // ds_idempotent's bounds, answered as the client's mistake rather than a 22023
            if ([...key].length > 255) {
                return { kind: 'error', status: 400, body: { error: `the ${header} header is longer than 255 characters` } };
            }
            const parts: IdempotentHttpRequest = { method, path, key, body };
            const handler = typeof options.handler === 'function' ? options.handler(parts) : options.handler;
            try {
                const answer = await client.idempotent(options.scope, key, toRequest(parts), handler,
                    { ttl: options.ttl, wait });
                return { kind: 'answer', result: { ...answer, key } };
            } catch (e) {
                const err = toDurableStepsError(e);
                if (err instanceof DurableStepsError && err.httpStatus < 500) {
                    return {
                        kind: 'error',
                        status: err.httpStatus,
                        body: { error: err.message, sqlstate: err.sqlstate },
                        retryAfter: err.sqlstate === 'DS409' ? '1' : undefined,
                    };
                }
                throw err;
            }
        },
    };
}

function pathOf(url: string): string {
    const q = url.indexOf('?');
    return q < 0 ? url : url.slice(0, q);
}

// ---- Express (4 and 5) ------------------------------------------------------------------------

/** What the Express middleware uses of Express's request. */
export interface ExpressLikeRequest {
    method: string;
    originalUrl: string;
    body?: unknown;
    get(name: string): string | undefined;
}

/** What the Express middleware uses of Express's response. */
export interface ExpressLikeResponse {
    locals: Record<string, any>;
    status(code: number): unknown;
    set(field: string, value: string): unknown;
    json(body: unknown): unknown;
}

/**
 * Express middleware for an idempotent endpoint: put it after a body parser (express.json()).
 *
 *     app.post('/orders', expressIdempotency({ client: pool, scope: 'orders', handler: SQL }));
 *
 * With `respond: false` it calls next() with the answer in res.locals.idempotent, and the route
 * answers (the header Idempotent-Replayed is already set on a replay).
 */
export function expressIdempotency(options: IdempotencyOptions) {
    const core = makeCore(options);
    return async function idempotency(req: ExpressLikeRequest, res: ExpressLikeResponse,
        next: (err?: unknown) => void): Promise<void> {
        let outcome: Outcome;
        try {
            outcome = await core.run(req.method, pathOf(req.originalUrl), req.get(core.header), req.body);
        } catch (e) {
            next(e);
            return;
        }
        if (outcome.kind === 'skip') {
            next();
        } else if (outcome.kind === 'error') {
            if (outcome.retryAfter) {
                res.set('Retry-After', outcome.retryAfter);
            }
            res.status(outcome.status);
            res.json(outcome.body);
        } else {
            if (outcome.result.replayed) {
                res.set(REPLAYED_HEADER, 'true');
            }
            if (core.respond) {
                res.status(outcome.result.status);
                res.json(outcome.result.body);
            } else {
                res.locals.idempotent = outcome.result;
                next();
            }
        }
    };
}

// ---- Fastify (4 and 5) ------------------------------------------------------------------------

/** What the Fastify hook uses of Fastify's request. */
export interface FastifyLikeRequest {
    method: string;
    url: string;
    body?: unknown;
    headers: Record<string, string | string[] | undefined>;
}

/** What the Fastify hook uses of Fastify's reply. */
export interface FastifyLikeReply {
    code(statusCode: number): unknown;
    header(key: string, value: string): unknown;
    send(payload?: unknown): unknown;
}

/**
 * A Fastify preHandler hook for an idempotent endpoint:
 *
 *     app.post('/orders', { preHandler: fastifyIdempotency({ client: pool, scope: 'orders', handler: SQL }) },
 *              async () => {});   // not reached: the hook answers
 *
 * With `respond: false` the route runs with the answer in request.idempotent (the header
 * Idempotent-Replayed is already set on a replay).
 */
export function fastifyIdempotency(options: IdempotencyOptions) {
    const core = makeCore(options);
    const headerName = core.header.toLowerCase();
    return async function idempotency(request: FastifyLikeRequest, reply: FastifyLikeReply): Promise<unknown> {
        const raw = request.headers[headerName];
        const key = Array.isArray(raw) ? raw[0] : raw;
        const outcome = await core.run(request.method, pathOf(request.url), key, request.body);
        if (outcome.kind === 'skip') {
            return undefined;
        }
        if (outcome.kind === 'error') {
            if (outcome.retryAfter) {
                reply.header('Retry-After', outcome.retryAfter);
            }
            reply.code(outcome.status);
            return reply.send(outcome.body);
        }
        if (outcome.result.replayed) {
            reply.header(REPLAYED_HEADER, 'true');
        }
        if (core.respond) {
            reply.code(outcome.result.status);
            return reply.send(outcome.result.body);
        }
        (request as FastifyLikeRequest & { idempotent?: IdempotentResult }).idempotent = outcome.result;
        return undefined;
    };
}
