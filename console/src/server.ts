/// <reference types="node" />
// The console's requests, framework-free over node:http's request and response: Express and
// Fastify mount it (index.ts), main.ts serves it on its own. Read-only unless `actions` is set;
// an action is a POST that carries the CSRF token of this browser's cookie, confirmed on a page
// of its own, run with the operator's database role, and logged (docs/console.md).

import { randomBytes, timingSafeEqual } from 'node:crypto';
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
}

const COOKIE = 'ds_console_csrf';
const MAX_FORM = 1024 * 1024;

function cookies(req: IncomingMessage): Map<string, string> {
    const out = new Map<string, string>();
    for (const part of (req.headers.cookie ?? '').split(';')) {
        const i = part.indexOf('=');
        if (i > 0) {
            out.set(part.slice(0, i).trim(), decodeURIComponent(part.slice(i + 1).trim()));
        }
    }
    return out;
}

function sameToken(a: string | undefined, b: string | undefined): boolean {
    if (!a || !b || a.length !== b.length) {
        return false;
    }
    return timingSafeEqual(Buffer.from(a), Buffer.from(b));
}

/** The body of a form POST: what a framework parsed already, or read here (1 MB at most). */
async function readForm(req: IncomingMessage & { body?: unknown }): Promise<Form> {
    const parsed = req.body;
    if (parsed && typeof parsed === 'object' && !Buffer.isBuffer(parsed)) {
        return Object.fromEntries(Object.entries(parsed as Record<string, unknown>).map(([k, v]) => [k, String(v)]));
    }
    let text: string;
    if (typeof parsed === 'string') {
        text = parsed;
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

    constructor(private readonly options: ConsoleOptions<Req>) {
        if (!options.pool || typeof options.pool.query !== 'function') {
            throw new TypeError('durable_steps console: the option pool (a pg.Pool) is required');
        }
        this.q = qualifier(options.schema);
        this.queries = new Queries(this.q);
        this.refresh = Math.max(2, options.refreshSeconds ?? 5);
    }

    /** Run `fn` on a connection as the request's role (in a transaction), or on the pool. */
    private async as<T>(role: string | null, fn: (db: Queryable) => Promise<T>): Promise<T> {
        if (role === null) {
            return fn(this.options.pool);
        }
        const client = await this.options.pool.connect();
        try {
            await client.query('BEGIN');
            await client.query("SELECT pg_catalog.set_config('role', $1, true)", [role]);
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
        const u = new URL(url || '/', 'http://console.invalid');
        const route = u.pathname.replace(/\/+$/, '') || '/';
        res.setHeader('Content-Security-Policy', "default-src 'none'; script-src 'self'; style-src 'self'; "
            + "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'");
        res.setHeader('X-Content-Type-Options', 'nosniff');
        res.setHeader('Referrer-Policy', 'no-referrer');
        res.setHeader('Cache-Control', 'no-store');
        if (req.method === 'GET' && route.startsWith('/assets/')) {
            const asset = ASSETS[route.slice('/assets/'.length)];
            if (asset) {
                res.writeHead(200, { 'Content-Type': asset.type });
                res.end(asset.body);
                return;
            }
        }
        let csrf = cookies(req).get(COOKIE);
        if (!csrf || !/^[0-9a-f]{64}$/.test(csrf)) {
            csrf = randomBytes(32).toString('hex');
            const secure = (req.socket as { encrypted?: boolean }).encrypted || req.headers['x-forwarded-proto'] === 'https';
            res.setHeader('Set-Cookie', `${COOKIE}=${csrf}; Path=${base || '/'}; HttpOnly; SameSite=Strict${secure ? '; Secure' : ''}`);
        }
        const view: pages.View = { base, actions: !!this.options.actions, csrf, refresh: this.refresh };
        try {
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
                ({ title, body } = await this.action(req, view, role, decodeURIComponent(route.slice('/actions/'.length))));
                live = false;
                current = '';
            } else if (req.method !== 'GET' && req.method !== 'HEAD') {
                throw new HttpError(405, 'the console answers GET, and POST for actions');
            } else {
                ({ title, body, current, live } = await this.page(view, role, route, u.searchParams));
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
        const offset = Number(params.get('offset') ?? 0) || 0;
        const segments = route.split('/').slice(1).map((s) => decodeURIComponent(s));
        return this.as(role, async (db) => {
            if (route === '/') {
                return { title: 'Overview', current: '/', live: true, body: pages.overview(v, await this.queries.overview(db)) };
            }
            if (route === '/inbox') {
                const status = params.get('status');
                return { title: 'Needs a person', current: '/inbox', live: true,
                    body: pages.inbox(v, await this.queries.inbox(db, status, offset), status, offset) };
            }
            if (segments[0] === 'steps' && segments.length === 3) {
                const d = await this.queries.step(db, segments[1], segments[2]);
                return d.step
                    ? { title: `Step ${segments[1]} / ${segments[2]}`, current: '', live: true, body: pages.step(v, { ...d, step: d.step }) }
                    : { title: 'Not found', current: '', live: false, body: pages.notFound(v, `Step ${segments[1]} / ${segments[2]}`) };
            }
            if (route === '/runs') {
                const status = params.get('status');
                return { title: 'Runs', current: '/runs', live: true,
                    body: pages.runs(v, await this.queries.runs(db, status, offset), status, offset) };
            }
            if (segments[0] === 'runs' && segments.length === 2) {
                const d = await this.queries.run(db, segments[1]);
                return d.run
                    ? { title: `Run ${segments[1]}`, current: '/runs', live: true, body: pages.run(v, { ...d, run: d.run }) }
                    : { title: 'Not found', current: '/runs', live: false, body: pages.notFound(v, `Run ${segments[1]}`) };
            }
            if (route === '/tasks') {
                return { title: 'Tasks', current: '/tasks', live: true, body: pages.tasks(v, await this.queries.tasks(db, offset), offset) };
            }
            if (route === '/schedules') {
                return { title: 'Schedules', current: '/schedules', live: true, body: pages.schedules(v, await this.queries.schedules(db)) };
            }
            if (route === '/keys') {
                const state = params.get('state');
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
        // a form of another site, or one without this browser's token, does nothing
        const origin = req.headers.origin;
        if (origin !== undefined && origin !== 'null') {
            const host = req.headers['x-forwarded-host'] ?? req.headers.host;
            if (new URL(origin).host !== host) {
                throw new HttpError(403, 'the form came from another site');
            }
        }
        let form: Form;
        try {
            form = await readForm(req);
        } catch (e) {
            throw new HttpError(400, (e as Error).message);
        }
        if (!sameToken(form.csrf, cookies(req).get(COOKIE))) {
            throw new HttpError(403, 'the form has no valid CSRF token: reload the page and try again');
        }
        let description: string;
        try {
            description = action.describe(form);
        } catch (e) {
            throw new HttpError(400, (e as Error).message);
        }
        const back = form.run_id && form.step_id
            ? `${v.base}/steps/${encodeURIComponent(form.run_id)}/${encodeURIComponent(form.step_id)}`
            : form.run_id ? `${v.base}/runs/${encodeURIComponent(form.run_id)}` : `${v.base}/`;
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
