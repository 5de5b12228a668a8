/// <reference types="node" />
// The console's requests, framework-free over node:http's request and response: Express and
// Fastify mount it (index.ts), main.ts serves it on its own. Read-only unless `actions` is set;
// an action is a POST that carries the CSRF token of this browser's cookie, confirmed on a page
// of its own, run with the operator's database role, and logged (docs/console.md).

import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';

import type { Queryable } from 'durable-steps';

import { ACTIONS, FormError, type Form } from './actions.js';
import { ASSETS } from './assets.js';
import { Html } from './html.js';
import * as pages from './pages.js';
import { Queries, qualifier } from './queries.js';

/** A connection of the pool, for the requests run as another role in a transaction. */
export interface PoolClientLike extends Queryable {
    release(err?: unknown): void;
}

/** What the console needs of node-postgres's Pool. */
export interface PoolLike extends Queryable {
    connect(): Promise<PoolClientLike>;
}

/** One action, as the log is told it. */
export interface ActionLogEntry {
    action: string;
    description: string;
    /** the database role it ran as (null: the pool's) */
    role: string | null;
    /** who the host application says the operator is (the `operator` option), if it says */
    operator: string | null;
    ok: boolean;
    message: string;
    sqlstate: string | null;
}

export interface ConsoleOptions<Req = IncomingMessage> {
    /** a pg.Pool (connect() is used when `role` is given) */
    pool: PoolLike;
    /** allow the actions (re-arm, resolve, cancel, resume, queue limits); false by default */
    actions?: boolean;
    /**
     * The database role each request's statements run as (SET LOCAL ROLE, in a transaction of
     * its own; the pool's role must be a member of it), from the request: the operator's own, so
     * that the database decides what the operator may see and do. null or undefined: the pool's
     * role.
     */
    role?(req: Req): string | null | undefined | Promise<string | null | undefined>;
    /**
     * The host application's authentication: false (or a rejection) answers 403. The console
     * mounted in an application usually sits behind that application's own; this is the hook when
     * it does not.
     */
    authorize?(req: Req): boolean | Promise<boolean>;
    /** who the operator is, for the log of actions */
    operator?(req: Req): string | null | undefined;
    /** where each action is told (a JSON line on stdout by default) */
    log?(entry: ActionLogEntry): void;
    /** the schema of the extension, when it is not on the pool's search_path */
    schema?: string;
    /** the seconds between refreshes of a live page (5; at least 2) */
    refreshSeconds?: number;
    /**
     * The key of the CSRF tokens (a random one per process by default): give every process that
     * serves one console behind a load balancer the same.
     */
    secret?: string | Buffer;
    /** the longest a page's or an action's statements may run ('15s') */
    statementTimeout?: string;
}

const COOKIE = 'ds_console_csrf';
const MAX_FORM = 1024 * 1024;
const NONCE = /^[0-9a-f]{64}$/;

/** The values of this console's cookie the request carries (a planted one may stand beside ours). */
function nonces(req: IncomingMessage): string[] {
    const out: string[] = [];
    for (const part of (req.headers.cookie ?? '').split(';')) {
        const i = part.indexOf('=');
        if (i > 0 && part.slice(0, i).trim() === COOKIE) {
            const value = part.slice(i + 1).trim();
            if (NONCE.test(value)) {
                out.push(value);
            }
        }
    }
    return out;
}

function sameHex(a: string, b: string): boolean {
    return a.length === b.length && /^[0-9a-f]*$/.test(a) && timingSafeEqual(Buffer.from(a), Buffer.from(b));
}

/** The mount path as a cookie's Path may hold it: '/' for anything else. */
function cookiePath(base: string): string {
    return base !== '' && /^\/[A-Za-z0-9\/_.~%-]*$/.test(base) ? base : '/';
}

/** A path without the slashes it ends with. */
function trimSlashes(path: string): string {
    let end = path.length;
    while (end > 1 && path.charCodeAt(end - 1) === 47) {
        end--;
    }
    return path.slice(0, end);
}

/** The body of a form POST: what a framework parsed already, or read here (1 MB at most). */
async function readForm(req: IncomingMessage & { body?: unknown }): Promise<Form> {
    const parsed = req.body;
    const urlencoded = /^application\/x-www-form-urlencoded\b/i.test(String(req.headers['content-type'] ?? ''));
    if (!urlencoded) {
        throw new FormError('an action is a form (application/x-www-form-urlencoded)');
    }
    if (parsed && typeof parsed === 'object' && !Buffer.isBuffer(parsed)) {
        return Object.fromEntries(Object.entries(parsed as Record<string, unknown>).map(([k, v]) => [k, String(v)]));
    }
    let text: string;
    if (typeof parsed === 'string') {
        text = parsed;
    } else if (req.readableEnded) {
        text = '';
    } else {
        const chunks: Buffer[] = [];
        let size = 0;
        for await (const chunk of req) {
            size += (chunk as Buffer).length;
            if (size > MAX_FORM) {
                throw new FormError('the form is larger than 1 MB');
            }
            chunks.push(chunk as Buffer);
        }
        text = Buffer.concat(chunks).toString('utf8');
    }
    return Object.fromEntries(new URLSearchParams(text));
}

class HttpError extends Error {
    constructor(readonly status: number, message: string) {
        super(message);
    }
}

/** The console: `handle` answers one request under the mount path `base`. */
export class Console<Req extends IncomingMessage = IncomingMessage> {
    private readonly queries: Queries;
    private readonly q: string;
    private readonly refresh: number;
    private readonly secret: Buffer;

    constructor(private readonly options: ConsoleOptions<Req>) {
        if (!options.pool || typeof options.pool.query !== 'function' || typeof options.pool.connect !== 'function') {
            throw new TypeError('durable_steps console: the option pool (a pg.Pool) is required');
        }
        this.q = qualifier(options.schema);
        this.queries = new Queries(this.q);
        this.refresh = Math.max(2, options.refreshSeconds ?? 5);
        this.secret = options.secret === undefined ? randomBytes(32) : Buffer.from(options.secret);
    }

    /** The form token of a cookie's nonce: only this console can make it. */
    private token(nonce: string): string {
        return createHmac('sha256', this.secret).update(nonce).digest('hex');
    }

    /**
     * Run `fn` in a transaction of its own, bounded by the statement timeout, as the request's
     * role (or the pool's): every statement of a page reads one snapshot.
     */
    private async as<T>(role: string | null, fn: (db: Queryable) => Promise<T>): Promise<T> {
        if (role !== null && role.trim().toLowerCase() === 'none') {
            // set_config('role', 'none') would be RESET ROLE: the pool's role, not the operator's
            throw new HttpError(403, 'the role none is no operator\'s role');
        }
        const client = await this.options.pool.connect();
        try {
            await client.query('BEGIN');
            await client.query("SELECT pg_catalog.set_config('statement_timeout', $1, true)",
                [this.options.statementTimeout ?? '15s']);
            if (role !== null) {
                const { rows } = await client.query(
                    "SELECT pg_catalog.set_config('role', $1, true) IS NOT NULL AND current_user = $1 AS became", [role]);
                if (!rows[0]?.became) {
                    throw new HttpError(403, 'the operator\'s role could not be taken');
                }
            }
            const out = await fn(client);
            await client.query('COMMIT');
            client.release();
            return out;
        } catch (e) {
            try {
                await client.query('ROLLBACK');
                client.release();
            } catch (gone) {
                client.release(gone);
            }
            throw e;
        }
    }

    /**
     * Answer `req` (its path `url`, relative to the mount path `base`). A database error of a page
     * is answered 500 with its message; nothing else reaches the caller but the response.
     */
    async handle(req: Req, res: ServerResponse, base: string, url: string): Promise<void> {
        const raw = url || '/';
        const q = raw.indexOf('?');
        const pathPart = q < 0 ? raw : raw.slice(0, q);
        const params = new URLSearchParams(q < 0 ? '' : raw.slice(q + 1));
        const route = trimSlashes(pathPart);
        res.setHeader('Content-Security-Policy', "default-src 'none'; script-src 'self'; style-src 'self'; "
            + "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'");
        res.setHeader('X-Content-Type-Options', 'nosniff');
        // same-origin: a browser then sends the console's own Origin with its forms (no-referrer
        // would make it 'null', which the actions refuse), and no address to another site
        res.setHeader('Referrer-Policy', 'same-origin');
        res.setHeader('Cache-Control', 'no-store');
        if (req.method === 'GET' && route.startsWith('/assets/')) {
            const name = route.slice('/assets/'.length);
            if (Object.hasOwn(ASSETS, name)) {
                res.writeHead(200, { 'Content-Type': ASSETS[name].type });
                res.end(ASSETS[name].body);
                return;
            }
        }
        // the nonce of this browser's cookie; the forms carry its token (its HMAC)
        let nonce = nonces(req)[0];
        if (nonce === undefined) {
            nonce = randomBytes(32).toString('hex');
            const secure = (req.socket as { encrypted?: boolean }).encrypted || req.headers['x-forwarded-proto'] === 'https';
            res.setHeader('Set-Cookie', `${COOKIE}=${nonce}; Path=${cookiePath(base)}; HttpOnly; SameSite=Strict${secure ? '; Secure' : ''}`);
        }
        const view: pages.View = { base, actions: !!this.options.actions, csrf: this.token(nonce), refresh: this.refresh };
        try {
            // a path the console does not make: none with empty or dot segments, which a guard
            // of the host on a sub-path would not see as the path the console acts on
            if (pathPart.split('/').slice(1).some((seg, i, all) =>
                (seg === '' && i < all.length - 1) || /^(?:\.|%2e){1,2}$/i.test(seg))) {
                throw new HttpError(400, 'a path of the console has no empty or dot segments');
            }
            if (this.options.authorize && !(await this.options.authorize(req))) {
                throw new HttpError(403, 'not allowed');
            }
            const role = (await this.options.role?.(req)) ?? null;
            const fragment = req.headers['x-console-fragment'] === '1';
            let title: string;
            let body: Html;
            let current = route;
            let live = true;
            if (req.method === 'POST' && route.startsWith('/actions/')) {
                ({ title, body } = await this.action(req, view, role, route.slice('/actions/'.length)));
                live = false;
                current = '';
            } else if (req.method !== 'GET' && req.method !== 'HEAD') {
                throw new HttpError(405, 'the console answers GET, and POST for actions');
            } else {
                ({ title, body, current, live } = await this.page(view, role, route, params));
            }
            const page = fragment ? body : pages.layout(view, title, current, body, live);
            res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
            res.end(req.method === 'HEAD' ? undefined : page.text);
        } catch (e) {
            const status = e instanceof HttpError ? e.status : 500;
            const message = e instanceof Error ? e.message : String(e);
            res.writeHead(status, { 'Content-Type': 'text/html; charset=utf-8' });
            res.end(pages.layout(view, 'Error', '', pages.outcome(view, `Error ${status}`, false, message,
                { code: (e as { code?: string }).code }), false).text);
        }
    }

    private async page(v: pages.View, role: string | null, route: string, params: URLSearchParams):
        Promise<{ title: string; body: Html; current: string; live: boolean }> {
        const given = Number(params.get('offset') ?? 0);
        const offset = Number.isSafeInteger(given) && given > 0 ? Math.min(given, 1_000_000) : 0;
        // a filter given empty is no filter
        const filter = (name: string) => params.get(name) || null;
        return this.as(role, async (db) => {
            if (route === '/') {
                return { title: 'Overview', current: '/', live: true, body: pages.overview(v, await this.queries.overview(db)) };
            }
            if (route === '/inbox') {
                const status = filter('status');
                return { title: 'Needs a person', current: '/inbox', live: true,
                    body: pages.inbox(v, await this.queries.inbox(db, status, offset), status, offset) };
            }
            if (route === '/step') {
                const runId = params.get('run') ?? '';
                const stepId = params.get('step') ?? '';
                const d = await this.queries.step(db, runId, stepId);
                return d.step
                    ? { title: `Step ${runId} / ${stepId}`, current: '', live: true, body: pages.step(v, { ...d, step: d.step }) }
                    : { title: 'Not found', current: '', live: false, body: pages.notFound(v, `Step ${runId} / ${stepId}`) };
            }
            if (route === '/runs') {
                const status = filter('status');
                return { title: 'Runs', current: '/runs', live: true,
                    body: pages.runs(v, await this.queries.runs(db, status, offset), status, offset) };
            }
            if (route === '/run') {
                const runId = params.get('id') ?? '';
                const d = await this.queries.run(db, runId);
                return d.run
                    ? { title: `Run ${runId}`, current: '/runs', live: true, body: pages.run(v, { ...d, run: d.run }) }
                    : { title: 'Not found', current: '/runs', live: false, body: pages.notFound(v, `Run ${runId}`) };
            }
            if (route === '/tasks') {
                return { title: 'Tasks', current: '/tasks', live: true, body: pages.tasks(v, await this.queries.tasks(db, offset), offset) };
            }
            if (route === '/schedules') {
                return { title: 'Schedules', current: '/schedules', live: true, body: pages.schedules(v, await this.queries.schedules(db)) };
            }
            if (route === '/keys') {
                const state = filter('state');
                return { title: 'Idempotency keys', current: '/keys', live: true,
                    body: pages.keys(v, await this.queries.keys(db, state, offset), state, offset) };
            }
            throw new HttpError(404, `no page ${route}`);
        });
    }

    private async action(req: Req, v: pages.View, role: string | null, name: string): Promise<{ title: string; body: Html }> {
        if (!this.options.actions) {
            throw new HttpError(403, 'actions are not enabled in this console');
        }
        const action = Object.prototype.hasOwnProperty.call(ACTIONS, name) ? ACTIONS[name] : undefined;
        if (!action) {
            throw new HttpError(404, `no action ${name}`);
        }
        // a form of another site, or one without the token of this browser's cookie, does nothing
        const origin = req.headers.origin;
        if (origin !== undefined) {
            const host = req.headers['x-forwarded-host'] ?? req.headers.host;
            let from: string | null = null;
            try {
                from = new URL(origin).host;
            } catch {
                // 'null' (a redirect, a sandboxed page) or no URL: not this site
            }
            if (from === null || from !== host) {
                throw new HttpError(403, 'the form came from another site');
            }
        }
        let form: Form;
        try {
            form = await readForm(req);
        } catch (e) {
            throw new HttpError(400, (e as Error).message);
        }
        const given = form.csrf ?? '';
        if (!nonces(req).some((n) => sameHex(given, this.token(n)))) {
            throw new HttpError(403, 'the form has no valid CSRF token: reload the page and try again');
        }
        let description: string;
        try {
            description = action.describe(form);
        } catch (e) {
            throw new HttpError(400, (e as Error).message);
        }
        const back = form.run_id && form.step_id ? pages.stepHref(v, form.run_id, form.step_id)
            : form.run_id ? pages.runHref(v, form.run_id) : `${v.base}/`;
        if (form.confirm !== '1') {
            return { title: 'Confirm', body: pages.confirm(v, name, description, form) };
        }
        const entry: ActionLogEntry = {
            action: name, description, role, operator: this.options.operator?.(req) ?? null,
            ok: false, message: '', sqlstate: null,
        };
        let body: Html;
        try {
            entry.message = await this.as(role, (db) => action.run(db, this.q, form));
            entry.ok = true;
            body = pages.outcome(v, description, true, entry.message, undefined, back);
        } catch (e) {
            if (!(e instanceof FormError) && typeof (e as { code?: unknown }).code !== 'string') {
                throw e;
            }
            const err = e as { message: string; code?: string; detail?: string; hint?: string };
            entry.message = err.message;
            entry.sqlstate = err.code ?? null;
            body = pages.outcome(v, description, false, err.message, err, back);
        }
        (this.options.log ?? ((x: ActionLogEntry) => console.log(JSON.stringify({ durable_steps_console: x }))))(entry);
        return { title: entry.ok ? 'Done' : 'Refused', body };
    }
}
