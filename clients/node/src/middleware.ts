/// <reference types="node" />
// Idempotent HTTP endpoints over ds_idempotent (docs/idempotent-requests.md), as Express
// middleware and a Fastify preHandler hook. Both do the same:
//
// 1. read the client's key from the Idempotency-Key header (400 without one, unless the key is
//    optional; 400 for one that is not 1 to 255 characters);
// 2. tell the end user (the `user` option; by default the framework's authenticated user,
//    req.user / request.user) and put that identity into the scope passed to SQL, so that two
//    users of one service never share a key: `<scope>:user:<encodeURIComponent(user)>`
//    (userScope below), none for an anonymous request;
// 3. fingerprint the body by its bytes: the stored request carries the SHA-256 of the raw body
//    (Express: `req.rawBody`, which keepRawBody puts there as express.json()'s `verify`, or the
//    body the middleware reads itself when no parser did; Fastify: the hook's preParsing part,
//    or `request.rawBody`), so that two bodies a parser reads alike are still two requests;
// 4. refuse a stored request that jsonb cannot hold (the character U+0000) with 400, before SQL;
// 5. call ds_idempotent(scope, key, request, handler, wait => ...), where the request is what
//    `request(...)` makes of the HTTP request ({method, path, query, idempotency_key, user,
//    body_sha256, body} by default) and the handler is one SQL statement, $1 that request,
//    returning (status, body): it runs once per key, and its response commits with its writes.
//    The handler is a bind parameter, as every SQL text of this package. ds_idempotent holds the
//    key with the handler's own transaction: there is no lease to renew;
// 6. set `Idempotent-Replayed: true` when the response was stored by an earlier request, then
//    either answer the stored response (the default) or hand it to the route (`respond: false`:
//    Express's res.locals.idempotent, Fastify's request.idempotent) to build its own answer;
// 7. answer a documented SQLSTATE whose HTTP status is below 500 (DS422: another request under
//    the key, 422; DS409: still in flight after `wait`, 409 with Retry-After) with that status and
//    {error, sqlstate}; any other error goes to the framework's error handling.

import { createHash } from 'node:crypto';
import { Transform, pipeline } from 'node:stream';

import { DurableSteps, type IdempotentResponse, type Interval, type Json, type Queryable } from './client.js';
import { DurableStepsError, toDurableStepsError } from './errors.js';

/** The parts of an HTTP request the stored request is made of. */
export interface IdempotentHttpRequest {
    method: string;
    /** the path, without the query string */
    path: string;
    /** the query string, without its '?' ('' without one) */
    query: string;
    key: string;
    /** the body as the framework's parser made it (null: none, or bytes no parser read) */
    body: unknown;
    /** the SHA-256 of the body's bytes, in lowercase hex (of no bytes without a body) */
    bodySha256: string;
    /** the end user the request is of (the `user` option); null: anonymous */
    user: string | null;
    /** the scope passed to SQL: the option's scope, with the user (userScope) */
    scope: string;
}

/** What a `user` function answers: the end user's identity, or null (undefined, '') for none. */
export type UserIdentity = string | number | bigint | null | undefined;

export interface IdempotencyOptions<Req = unknown> {
    /** a DurableSteps, or the Pool it is made over */
    client: DurableSteps | Queryable;
    /**
     * The scope of the keys: the endpoint, or the kind of request. 1 to 178 characters (the
     * rest of PostgreSQL's 255 is the user's room), without ':user:'.
     */
    scope: string;
    /**
     * The handler: one SQL statement, $1 the stored request, returning one row
     * (status integer, body jsonb). A function picks it by request.
     */
    handler: string | ((request: IdempotentHttpRequest) => string);
    /**
     * The stored request, which a repeat must match (jsonb equality; another one under the key
     * is answered 422). By default {method, path, query, idempotency_key, user, body_sha256, body}.
     * To an object it makes without `body_sha256`, the middleware adds it: two requests are the
     * same only with the same body bytes.
     */
    request?: (request: IdempotentHttpRequest) => Json;
    /**
     * The end user of the request, whose keys are his alone: a key is scoped by (database role,
     * scope, user). By default the framework's authenticated user (Express: `req.user`, as
     * Passport sets it; Fastify: `request.user`, as @fastify/jwt or @fastify/passport set it):
     * a string or number as it is, an object by its `id`, `sub` or `username`. null, undefined
     * or '': anonymous, the keys of the scope alone. `user: () => null` shares one key space
     * among every user of the service.
     */
    user?(request: Req): UserIdentity;
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
export type IdempotentResult = IdempotentResponse & {
    key: string;
    /** the scope passed to SQL (the option's, with the user) */
    scope: string;
    /** the end user; null: anonymous */
    user: string | null;
};

export const REPLAYED_HEADER = 'Idempotent-Replayed';

const USER_MARK = ':user:';
const HASHED_MARK = 'sha256=';
const MAX_SCOPE = 255;
/** the longest scope an option may name: room for ':user:sha256=<64 hex digits>' */
export const MAX_USER_SCOPE = MAX_SCOPE - USER_MARK.length - HASHED_MARK.length - 64;

function sha256(bytes: Uint8Array | string): string {
    return createHash('sha256').update(bytes).digest('hex');
}

const EMPTY_SHA256 = sha256(new Uint8Array(0));

/** Characters as PostgreSQL counts them (code points), not UTF-16 units. */
function characters(s: string): number {
    return [...s].length;
}

/**
 * The scope of `user`'s keys under `scope`: `scope` itself for no user, else
 * `<scope>:user:<encodeURIComponent(user)>`, or `<scope>:user:sha256=<hex of the user's UTF-8>`
 * when that would be longer than 255 characters (a user that is not well-formed UTF-16: of
 * its UTF-16LE code units). The encoded part has no ':' and never starts with a raw '=', so
 * no two (scope, user) meet, given scopes without ':user:'. The Python client's user_scope
 * answers the same.
 */
export function userScope(scope: string, user: string | null): string {
    if (user === null) {
        return scope;
    }
    let part: string;
    try {
        part = encodeURIComponent(user);
    } catch {
        // a lone surrogate: no UTF-8 of it; its UTF-16 units tell it apart
        part = HASHED_MARK + createHash('sha256').update(Buffer.from(user, 'utf16le')).digest('hex');
    }
    if (characters(scope) + USER_MARK.length + part.length > MAX_SCOPE) {
        part = HASHED_MARK + sha256(user);
    }
    return scope + USER_MARK + part;
}

/** A user's identity as userScope takes it: the defaults' reading of an authenticated user. */
export function identityOf(user: unknown): string | null {
    if (user === null || user === undefined || user === false || user === '') {
        return null;
    }
    if (typeof user === 'string') {
        return user;
    }
    if (typeof user === 'number' || typeof user === 'bigint') {
        return String(user);
    }
    if (typeof user === 'object') {
        const fields = user as Record<string, unknown>;
        for (const name of ['id', 'sub', 'username']) {
            const value = fields[name];
            if ((typeof value === 'string' && value !== '') || typeof value === 'number' || typeof value === 'bigint') {
                return String(value);
            }
        }
    }
    throw new TypeError('idempotency: cannot tell who the authenticated user is (no id, sub or username): '
        + 'give the middleware the option user(request)');
}

function checkScope(scope: unknown): asserts scope is string {
    if (typeof scope !== 'string' || scope === '') {
        throw new TypeError('idempotency: the option scope must be a non-empty string');
    }
    if (scope.includes(USER_MARK)) {
        throw new TypeError(`idempotency: a scope must not contain '${USER_MARK}' (the users' part of scopes)`);
    }
    if (characters(scope) > MAX_USER_SCOPE) {
        throw new TypeError(`idempotency: a scope of at most ${MAX_USER_SCOPE} characters, for the room of its users`);
    }
}

// the escape of U+0000 in JSON text, not preceded by a backslash of its own
const NUL_ESCAPE = /(?<!\\)(?:\\\\)*\\u0000/;

/** jsonb refuses U+0000 (SQLSTATE 22P05): a request with it is the client's mistake. */
function hasNul(value: Json): boolean {
    return NUL_ESCAPE.test(JSON.stringify(value) ?? '');
}

/** A request's answer, before it is written in a framework's terms. */
type Outcome =
    | { kind: 'skip' }
    | { kind: 'error'; status: number; body: { error: string; sqlstate?: string | null }; retryAfter?: string }
    | { kind: 'answer'; result: IdempotentResult };

function defaultRequest(r: IdempotentHttpRequest): Json {
    return {
        method: r.method, path: r.path, query: r.query, idempotency_key: r.key, user: r.user,
        body_sha256: r.bodySha256, body: r.body as Json,
    };
}

/** What the middleware stores of a parsed body: a JSON value, not a Buffer. */
function storedBody(body: unknown): unknown {
    if (body === undefined || body instanceof Uint8Array) {
        return null;
    }
    return body;
}

/** What a request is, in the terms both middlewares share. */
interface Incoming {
    method: string;
    url: string;
    key: string | undefined;
    body: unknown;
    /** the body's digest, or a function that reads it (called only for a request with a key) */
    bodySha256: () => Promise<string | { tooLarge: true }>;
    user: () => UserIdentity;
}

function splitUrl(url: string): { path: string; query: string } {
    const q = url.indexOf('?');
    return q < 0 ? { path: url, query: '' } : { path: url.slice(0, q), query: url.slice(q + 1) };
}

/** The shared part of both middlewares: from the HTTP request's parts to its outcome. */
function makeCore<Req>(options: IdempotencyOptions<Req>) {
    checkScope(options.scope);
    // by its method rather than instanceof: a DurableSteps of the package's other build (an
    // application that both imports and requires it) is one too
    const given = options.client as DurableSteps | Queryable;
    const client = typeof (given as DurableSteps).idempotent === 'function'
        ? given as DurableSteps : new DurableSteps(given as Queryable);
    const header = options.header ?? 'Idempotency-Key';
    const required = options.required ?? true;
    const wait = options.wait ?? '10 s';
    const toRequest = options.request ?? defaultRequest;

    function error(status: number, message: string): Outcome {
        return { kind: 'error', status, body: { error: message } };
    }

    return {
        header,
        respond: options.respond ?? true,
        async run(incoming: Incoming): Promise<Outcome> {
            const { key } = incoming;
            if (key === undefined || key === '') {
                if (!required) {
                    return { kind: 'skip' };
                }
                return error(400, `an ${header} header is required`);
            }
            // ds_idempotent's bounds, answered as the client's mistake rather than a 22023
            if (characters(key) > 255) {
                return error(400, `the ${header} header is longer than 255 characters`);
            }
            if (key.includes('\u0000')) {
                return error(400, `the ${header} header has the character U+0000`);
            }
            const user = identityOf(incoming.user());
            const digest = await incoming.bodySha256();
            if (typeof digest !== 'string') {
                return error(413, 'the request body is too large');
            }
            const scope = userScope(options.scope, user);
            const parts: IdempotentHttpRequest = {
                method: incoming.method, ...splitUrl(incoming.url), key, body: storedBody(incoming.body),
                bodySha256: digest, user, scope,
            };
            let stored = toRequest(parts);
            if (stored !== null && typeof stored === 'object' && !Array.isArray(stored) && !('body_sha256' in stored)) {
                stored = { ...stored, body_sha256: digest };
            }
            if (hasNul(stored)) {
                // jsonb cannot hold it (22P05): the client's request, not the service, is wrong
                return error(400, 'the request has the character U+0000 (\\u0000), which cannot be stored');
            }
            const handler = typeof options.handler === 'function' ? options.handler(parts) : options.handler;
            try {
                const answer = await client.idempotent(scope, key, stored, handler, { ttl: options.ttl, wait });
                return { kind: 'answer', result: { ...answer, key, scope, user } };
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

// ---- Express (4 and 5) ------------------------------------------------------------------------

/** What the Express middleware uses of Express's request. */
export interface ExpressLikeRequest {
    method: string;
    originalUrl: string;
    body?: unknown;
    /** the body's bytes, as keepRawBody (express.json()'s `verify`) keeps them */
    rawBody?: unknown;
    /** the authenticated user (Passport's) */
    user?: unknown;
    headers?: Record<string, string | string[] | undefined>;
    /** true once a body parser has read the body */
    readableEnded?: boolean;
    get(name: string): string | undefined;
    [Symbol.asyncIterator]?(): AsyncIterator<unknown>;
}

/** What the Express middleware uses of Express's response. */
export interface ExpressLikeResponse {
    locals: Record<string, any>;
    status(code: number): unknown;
    set(field: string, value: string): unknown;
    json(body: unknown): unknown;
}

export interface ExpressIdempotencyOptions extends IdempotencyOptions<ExpressLikeRequest> {
    /**
     * The most bytes of a body the middleware reads itself, when no body parser read it
     * (102400, express.json()'s default); a larger body is answered 413.
     */
    limit?: number;
}

/**
 * The `verify` of Express's body parsers that keeps the body's bytes as `req.rawBody`, where
 * expressIdempotency reads them: `express.json({ verify: keepRawBody })`.
 */
export function keepRawBody(req: object, _res: unknown, buf: Uint8Array): void {
    (req as { rawBody?: Uint8Array }).rawBody = buf;
}

const EXPRESS_NEEDS_BYTES = 'expressIdempotency needs the bytes of the body, which a body parser read without '
    + 'keeping them: give it express.json({ verify: keepRawBody }) (or put req.rawBody yourself)';

/** The digest of an Express request's body, by its bytes. */
async function expressBodySha256(req: ExpressLikeRequest, limit: number): Promise<string | { tooLarge: true }> {
    const raw = req.rawBody;
    if (typeof raw === 'string' || raw instanceof Uint8Array) {
        return sha256(raw);
    }
    const length = req.headers?.['content-length'];
    if (req.readableEnded || typeof req[Symbol.asyncIterator] !== 'function') {
        if (length === '0' || (length === undefined && req.headers?.['transfer-encoding'] === undefined)) {
            return EMPTY_SHA256;
        }
        throw new Error(EXPRESS_NEEDS_BYTES);
    }
    if (typeof length === 'string' && Number(length) > limit) {
        return { tooLarge: true };
    }
    // no parser read it (a content type none of them takes, or none at all): read it here, and
    // keep it for the route as req.rawBody
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of req as AsyncIterable<unknown>) {
        const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk as Uint8Array;
        size += bytes.length;
        if (size <= limit) {
            chunks.push(bytes);     // past the limit: read on (the client's answer needs it read), keep nothing
        }
    }
    if (size > limit) {
        return { tooLarge: true };
    }
    const body = Buffer.concat(chunks);
    req.rawBody = body;
    return sha256(body);
}

/**
 * Express middleware for an idempotent endpoint. The body is compared by its bytes: give the
 * JSON parser keepRawBody (a body no parser read, the middleware reads itself):
 *
 *     app.use(express.json({ verify: keepRawBody }));
 *     app.post('/orders', expressIdempotency({ client: pool, scope: 'orders', handler: SQL }));
 *
 * With `respond: false` it calls next() with the answer in res.locals.idempotent, and the route
 * answers (the header Idempotent-Replayed is already set on a replay).
 */
export function expressIdempotency(options: ExpressIdempotencyOptions) {
    const core = makeCore(options);
    const limit = options.limit ?? 102400;
    const user = options.user ?? ((req: ExpressLikeRequest) => identityOf(req.user));
    return async function idempotency(req: ExpressLikeRequest, res: ExpressLikeResponse,
        next: (err?: unknown) => void): Promise<void> {
        let outcome: Outcome;
        try {
            outcome = await core.run({
                method: req.method, url: req.originalUrl, key: req.get(core.header), body: req.body,
                bodySha256: () => expressBodySha256(req, limit), user: () => user(req),
            });
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
    /** the authenticated user (@fastify/jwt's, @fastify/passport's) */
    user?: unknown;
    /** the body's bytes, when a plugin (fastify-raw-body) keeps them */
    rawBody?: unknown;
}

/** What the Fastify hook uses of Fastify's reply. */
export interface FastifyLikeReply {
    code(statusCode: number): unknown;
    header(key: string, value: string): unknown;
    send(payload?: unknown): unknown;
}

type FastifyPreHandler = (request: FastifyLikeRequest, reply: FastifyLikeReply) => Promise<unknown>;
type FastifyPreParsing = (request: object, reply: unknown, payload: unknown) => Promise<unknown>;

/**
 * The hooks of an idempotent Fastify route: the function is its preHandler, `preParsing` the
 * hook that fingerprints the body's bytes as they are read.
 */
export interface FastifyIdempotencyHooks extends FastifyPreHandler {
    preHandler: FastifyPreHandler;
    preParsing: FastifyPreParsing;
}

const FASTIFY_NEEDS_BYTES = 'fastifyIdempotency needs the bytes of the body: give the route its preParsing hook '
    + 'as well ({ preParsing: hooks.preParsing, preHandler: hooks.preHandler }), or keep request.rawBody';

/**
 * The hooks of an idempotent Fastify route. The body is compared by its bytes, which its
 * preParsing hook fingerprints as Fastify reads them:
 *
 *     const orders = fastifyIdempotency({ client: pool, scope: 'orders', handler: SQL });
 *     app.post('/orders', { preParsing: orders.preParsing, preHandler: orders.preHandler },
 *              async () => {});   // not reached: the hook answers
 *
 * (A request.rawBody that a plugin keeps, fastify-raw-body's, does as well.) With
 * `respond: false` the route runs with the answer in request.idempotent (the header
 * Idempotent-Replayed is already set on a replay).
 */
export function fastifyIdempotency(options: IdempotencyOptions<FastifyLikeRequest>): FastifyIdempotencyHooks {
    const core = makeCore(options);
    const headerName = core.header.toLowerCase();
    const user = options.user ?? ((request: FastifyLikeRequest) => identityOf(request.user));
    // the digests of the bodies read through preParsing, by request
    const digests = new WeakMap<object, string>();

    async function bodySha256(request: FastifyLikeRequest): Promise<string> {
        const digest = digests.get(request);
        if (digest !== undefined) {
            return digest;
        }
        const raw = request.rawBody;
        if (typeof raw === 'string' || raw instanceof Uint8Array) {
            return sha256(raw);
        }
        if (request.body === undefined || request.body === null) {
            return EMPTY_SHA256;    // no body was parsed: there was none
        }
        throw new Error(FASTIFY_NEEDS_BYTES);
    }

    const preParsing: FastifyPreParsing = async (request, _reply, payload) => {
        const source = payload as NodeJS.ReadableStream & { receivedEncodedLength?: number };
        const hash = createHash('sha256');
        let received = 0;
        const counted = new Transform({
            transform(chunk: Buffer, _encoding, done) {
                hash.update(chunk);
                received += chunk.length;
                // Fastify compares it with Content-Length: the bytes of the wire, an earlier
                // hook's count when it decoded them
                (counted as Transform & { receivedEncodedLength?: number }).receivedEncodedLength =
                    source.receivedEncodedLength ?? received;
                done(null, chunk);
            },
            flush(done) {
                digests.set(request, hash.digest('hex'));
                done();
            },
        });
        pipeline(source, counted, () => { /* an error reaches the parser through `counted` */ });
        return counted;
    };

    const preHandler: FastifyPreHandler = async (request, reply) => {
        const raw = request.headers[headerName];
        const key = Array.isArray(raw) ? raw[0] : raw;
        const outcome = await core.run({
            method: request.method, url: request.url, key, body: request.body,
            bodySha256: () => bodySha256(request), user: () => user(request),
        });
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

    const hooks = ((request: FastifyLikeRequest, reply: FastifyLikeReply) => preHandler(request, reply)) as FastifyIdempotencyHooks;
    hooks.preHandler = preHandler;
    hooks.preParsing = preParsing;
    return hooks;
}
