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
//
// Without a `handler`, the route itself is the handler, written in application code, as the
// Python client's idempotent_view runs a view (docs/idempotent-requests.md, "Application code"):
// ds_idempotent_begin holds the key (a repeat waits up to `wait` for its response, woken by its
// finish), the route runs with the key's lease renewed every third of it, and its JSON answer is
// stored with ds_idempotent_finish before it is sent. A route that fails (an answer of 500 or
// more, or none by res.json) abandons the key, so that the client's retry runs it again; one
// whose lease was lost meanwhile is answered 409, its answer not being the key's.

import { createHash } from 'node:crypto';
import { Transform, pipeline } from 'node:stream';

import { DurableSteps, type IdempotentResponse, type Interval, type Json, type Queryable } from './client.js';
import { DurableStepsError, InProgressError, StepNotFoundError, toDurableStepsError } from './errors.js';

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
     * (status integer, body jsonb). A function picks it by request. Without one, the route is
     * the handler: it runs once per key, in application code, and its JSON answer is stored.
     */
    handler?: string | ((request: IdempotentHttpRequest) => string);
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
    /**
     * Without a handler: how long the key stays held without a renewal ('5 minutes'); it is
     * renewed every third of it while the route runs.
     */
    lease?: Interval;
    /**
     * With a handler: false, the route answers, with the stored response at hand; true, the
     * middleware answers it (default). Without a handler a replay is always answered.
     */
    respond?: boolean;
    /** where a failed renewal or abandon of a key is told (console.error by default) */
    log?: (message: string, error: unknown) => void;
}

/**
 * What a route that is its own handler (no `handler` option) is given: Express's
 * res.locals.idempotency, Fastify's request.idempotency.
 */
export interface IdempotencyHold {
    key: string;
    /** the scope passed to SQL (the option's, with the user) */
    scope: string;
    /** the end user; null: anonymous */
    user: string | null;
    /**
     * Aborted once the key's lease is lost (its renewal refused): the route's answer will not be
     * stored, and it is answered 409; work under way may stop.
     */
    signal: AbortSignal;
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
    | { kind: 'answer'; result: IdempotentResult }
    | { kind: 'held'; held: HeldKey };

type ErrorOutcome = Extract<Outcome, { kind: 'error' }>;

/** A documented SQLSTATE below 500 as the client's answer; null for an error of the service. */
function errorOutcome(e: unknown): ErrorOutcome | null {
    const err = toDurableStepsError(e);
    if (err instanceof DurableStepsError && err.httpStatus < 500) {
        return {
            kind: 'error',
            status: err.httpStatus,
            body: { error: err.message, sqlstate: err.sqlstate },
            retryAfter: err.sqlstate === 'DS409' ? '1' : undefined,
        };
    }
    return null;
}

/**
 * A key held by ds_idempotent_begin for a route that is its own handler: its lease renewed every
 * third of it until the response is settled, stored (finish) or given up (abandon).
 */
class HeldKey {
    readonly hold: IdempotencyHold;
    private readonly lost = new AbortController();
    private readonly timer: ReturnType<typeof setInterval>;
    private settled = false;

    constructor(private readonly client: DurableSteps, scope: string, key: string, user: string | null,
        private readonly token: string, leaseMs: number, private readonly lease: Interval | undefined,
        private readonly onError: (message: string, e: unknown) => void) {
        this.hold = { key, scope, user, signal: this.lost.signal };
        this.timer = setInterval(() => void this.renew(), Math.max(leaseMs / 3, 10));
        this.timer.unref?.();
    }

    private async renew(): Promise<void> {
        try {
            await this.client.idempotentRenew(this.hold.scope, this.hold.key, this.token, this.lease);
        } catch (e) {
            const err = toDurableStepsError(e);
            if (this.settled) {
                return;
            }
            if (err instanceof InProgressError || err instanceof StepNotFoundError) {
                clearInterval(this.timer);
                this.lost.abort(err);
            } else {
                // a lost connection: the next renewal may do, the lease is long enough for two more
                this.onError(`could not renew the lease of idempotency key ${this.hold.key}`, err);
            }
        }
    }

    private stop(): boolean {
        if (this.settled) {
            return false;
        }
        this.settled = true;
        clearInterval(this.timer);
        return true;
    }

    /**
     * The route answered `status` with `body`: store it (finish), or, for 500 and more, give the
     * key up. The outcome to answer instead (409 when the key is no longer this request's), or
     * null to send the route's answer.
     */
    async settle(status: number, body: unknown): Promise<ErrorOutcome | null> {
        if (!this.stop()) {
            return null;
        }
        if (status >= 500) {
            await this.giveUp();
            return null;
        }
        if (this.lost.signal.aborted) {
            return lostOutcome(this.lost.signal.reason);
        }
        try {
            await this.client.idempotentFinish(this.hold.scope, this.hold.key, this.token, status,
                (body === undefined ? null : body) as Json);
            return null;
        } catch (e) {
            const err = toDurableStepsError(e);
            if (err instanceof InProgressError || err instanceof StepNotFoundError) {
                return lostOutcome(err);
            }
            throw err;
        }
    }

    /** The route failed, or answered otherwise than JSON: the client's retry runs it again. */
    async abandon(): Promise<void> {
        if (this.stop()) {
            await this.giveUp();
        }
    }

    private async giveUp(): Promise<void> {
        try {
            await this.client.idempotentAbandon(this.hold.scope, this.hold.key, this.token);
        } catch (e) {
            // the key stays held until its lease runs out; the route's own outcome matters more
            this.onError(`could not abandon idempotency key ${this.hold.key}`, e);
        }
    }
}

function lostOutcome(reason: unknown): ErrorOutcome {
    const why = reason instanceof Error ? reason.message : 'lost';
    return {
        kind: 'error', status: 409, retryAfter: '1',
        body: { error: `the key's lease ran out while the request ran (${why}): its response is not stored`, sqlstate: 'DS409' },
    };
}

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
    // the lease in milliseconds, as PostgreSQL reads its text (read once)
    let leaseMs: Promise<number> | null = typeof options.lease === 'number' ? Promise.resolve(options.lease) : null;
    function readLeaseMs(): Promise<number> {
        if (leaseMs === null) {
            const text = options.lease ?? '5 minutes';
            leaseMs = client.db.query('SELECT (extract(epoch FROM $1::interval) * 1000)::float8 AS ms', [text])
                .then((r) => Number(r.rows[0].ms));
            leaseMs.catch(() => { leaseMs = null; });
        }
        return leaseMs;
    }

    function error(status: number, message: string): Outcome {
        return { kind: 'error', status, body: { error: message } };
    }

    return {
        header,
        respond: options.respond ?? true,
        log: options.log ?? ((message: string, error: unknown) => console.error(`durable-steps: ${message}:`, error)),
        /** true: the route is the handler (no `handler` option) */
        routeIsHandler: options.handler === undefined,
        async run(incoming: Incoming, onError: (message: string, e: unknown) => void): Promise<Outcome> {
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
            try {
                if (options.handler === undefined) {
                    const ms = await readLeaseMs();
                    const began = await client.idempotentBegin(scope, key, stored, { ttl: options.ttl, lease: options.lease, wait });
                    if (began.state === 'replay') {
                        return { kind: 'answer', result: { status: began.status, body: began.body, replayed: true, key, scope, user } };
                    }
                    return { kind: 'held', held: new HeldKey(client, scope, key, user, began.token, ms, options.lease, onError) };
                }
                const handler = typeof options.handler === 'function' ? options.handler(parts) : options.handler;
                const answer = await client.idempotent(scope, key, stored, handler, { ttl: options.ttl, wait });
                return { kind: 'answer', result: { ...answer, key, scope, user } };
            } catch (e) {
                const outcome = errorOutcome(e);
                if (outcome === null) {
                    throw toDurableStepsError(e);
                }
                return outcome;
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
    statusCode: number;
    status(code: number): unknown;
    set(field: string, value: string): unknown;
    json(body: unknown): unknown;
    once(event: 'close', listener: () => void): unknown;
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
 * answers (the header Idempotent-Replayed is already set on a replay). Without a handler the
 * route is the handler, run once per key, its res.json answer stored (holdForRoute):
 *
 *     app.post('/orders', expressIdempotency({ client: pool, scope: 'orders' }), async (req, res) => {
 *         const order = await placeOrder(req.body);   // res.locals.idempotency: key, scope, signal
 *         res.status(201).json(order);
 *     });
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
            }, core.log);
        } catch (e) {
            next(e);
            return;
        }
        if (outcome.kind === 'skip') {
            next();
        } else if (outcome.kind === 'held') {
            holdForRoute(outcome.held, res, next);
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

/**
 * The route is the handler: its res.json answer is stored before it is sent (res.send of an
 * object is res.json too); an answer of 500 or more, or one not made by res.json (an error
 * handler's, a plain res.send or res.end), abandons the key once the response is over.
 */
function holdForRoute(held: HeldKey, res: ExpressLikeResponse, next: (err?: unknown) => void): void {
    const json = res.json.bind(res);
    let answered = false;
    res.json = (body: unknown) => {
        if (answered) {
            return json(body);
        }
        answered = true;
        held.settle(res.statusCode, body).then((refused) => {
            if (refused === null) {
                json(body);
            } else {
                res.set('Retry-After', refused.retryAfter ?? '1');
                res.status(refused.status);
                json(refused.body);
            }
        }, next);
        return res;
    };
    res.once('close', () => {
        if (!answered) {
            answered = true;
            void held.abandon();
        }
    });
    res.locals.idempotency = held.hold;
    next();
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
    statusCode: number;
    code(statusCode: number): unknown;
    header(key: string, value: string): unknown;
    getHeader(key: string): unknown;
    send(payload?: unknown): unknown;
}

type FastifyPreHandler = (request: FastifyLikeRequest, reply: FastifyLikeReply) => Promise<unknown>;
type FastifyPreParsing = (request: object, reply: unknown, payload: unknown) => Promise<unknown>;
type FastifyOnSend = (request: FastifyLikeRequest, reply: FastifyLikeReply, payload: unknown) => Promise<unknown>;

/**
 * The hooks of an idempotent Fastify route: the function is its preHandler, `preParsing` the
 * hook that fingerprints the body's bytes as they are read, `onSend` the one that stores the
 * answer of a route that is its own handler (no `handler` option). Spread into the route's
 * options, it gives the route all three: `app.post('/orders', { ...orders }, route)`.
 */
export interface FastifyIdempotencyHooks extends FastifyPreHandler {
    preHandler: FastifyPreHandler;
    preParsing: FastifyPreParsing;
    onSend: FastifyOnSend;
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
 * Idempotent-Replayed is already set on a replay). Without a handler the route is the handler,
 * run once per key, its JSON answer stored by the onSend hook (request.idempotency: key, scope,
 * signal):
 *
 *     const orders = fastifyIdempotency({ client: pool, scope: 'orders' });
 *     app.post('/orders', { ...orders }, async (request, reply) => reply.code(201).send(await placeOrder(request.body)));
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

    // the keys held for routes that are their own handler, by request, until onSend settles them
    const holds = new WeakMap<object, HeldKey>();

    const preHandler: FastifyPreHandler = async (request, reply) => {
        const raw = request.headers[headerName];
        const key = Array.isArray(raw) ? raw[0] : raw;
        const outcome = await core.run({
            method: request.method, url: request.url, key, body: request.body,
            bodySha256: () => bodySha256(request), user: () => user(request),
        }, core.log);
        if (outcome.kind === 'skip') {
            return undefined;
        }
        if (outcome.kind === 'held') {
            holds.set(request, outcome.held);
            (request as FastifyLikeRequest & { idempotency?: IdempotencyHold }).idempotency = outcome.held.hold;
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

    // the route's answer, serialized: stored before it is sent (see holdForRoute for Express)
    const onSend: FastifyOnSend = async (request, reply, payload) => {
        const held = holds.get(request);
        if (held === undefined) {
            return payload;
        }
        holds.delete(request);
        if (reply.statusCode >= 500) {
            await held.abandon();
            return payload;
        }
        const type = String(reply.getHeader('content-type') ?? '');
        if (typeof payload !== 'string' || !/^application\/(?:[\w.+-]*\+)?json\b/i.test(type)) {
            await held.abandon();
            throw new TypeError(`an idempotent route answers JSON, not ${type || typeof payload}`);
        }
        const refused = await held.settle(reply.statusCode, JSON.parse(payload));
        if (refused === null) {
            return payload;
        }
        reply.code(refused.status);
        reply.header('Retry-After', refused.retryAfter ?? '1');
        return JSON.stringify(refused.body);
    };

    const hooks = ((request: FastifyLikeRequest, reply: FastifyLikeReply) => preHandler(request, reply)) as FastifyIdempotencyHooks;
    hooks.preHandler = preHandler;
    hooks.preParsing = preParsing;
    hooks.onSend = onSend;
    return hooks;
}
