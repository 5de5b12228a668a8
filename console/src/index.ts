/// <reference types="node" />
// durable_steps' operator's console (docs/console.md): mounted in an Express application
// (durableConsole), registered as a Fastify plugin (fastifyConsole), or served on its own
// (main.ts, the durable-steps-console command).

import type { IncomingMessage, ServerResponse } from 'node:http';

import { Console, type ConsoleOptions } from './server.js';

export { Console } from './server.js';
export type { ActionLogEntry, ConsoleOptions, PoolClientLike, PoolLike } from './server.js';
export { escape, html, Html } from './html.js';

/**
 * The console as Express middleware (or a plain node:http handler):
 *
 *     app.use('/durable', durableConsole({ pool, actions: true, role: (req) => req.user.dbRole }));
 *
 * It answers every path under its mount path (Express's req.baseUrl).
 */
export function durableConsole<Req extends IncomingMessage = IncomingMessage>(options: ConsoleOptions<Req>) {
    const console_ = new Console<Req>(options);
    return function durableStepsConsole(req: Req & { baseUrl?: string }, res: ServerResponse,
        next?: (err?: unknown) => void): void {
        console_.handle(req, res, (req.baseUrl ?? '').replace(/\/+$/, ''), req.url ?? '/').catch((e) => {
            if (next) {
                next(e);
            } else if (!res.headersSent) {
                res.writeHead(500, { 'Content-Type': 'text/plain; charset=utf-8' });
                res.end('durable_steps console: internal error');
            }
        });
    };
}

/** What the Fastify plugin uses of Fastify. */
interface FastifyLike {
    prefix: string;
    hasContentTypeParser(type: string): boolean;
    addContentTypeParser(type: string, opts: { parseAs: 'string' },
        parser: (req: unknown, body: string, done: (err: Error | null, body?: unknown) => void) => void): void;
    route(opts: { method: string[]; url: string; handler: (request: FastifyRequestLike, reply: FastifyReplyLike) => Promise<void> }): void;
}
interface FastifyRequestLike {
    raw: IncomingMessage;
    body?: unknown;
}
interface FastifyReplyLike {
    raw: ServerResponse;
    hijack(): void;
}

/**
 * The console as a Fastify plugin, under the prefix it is registered with:
 *
 *     await app.register(fastifyConsole({ pool, actions: true }), { prefix: '/durable' });
 */
export function fastifyConsole(options: ConsoleOptions<IncomingMessage>) {
    const console_ = new Console<IncomingMessage>(options);
    async function plugin(fastify: FastifyLike): Promise<void> {
        const base = fastify.prefix.replace(/\/+$/, '');
        // the actions' forms, as text, the console reads them itself (or as an application's
        // parser of them, @fastify/formbody's, made them)
        if (!fastify.hasContentTypeParser('application/x-www-form-urlencoded')) {
            fastify.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' },
                (_req, body, done) => done(null, body));
        }
        const handler = async (request: FastifyRequestLike, reply: FastifyReplyLike) => {
            reply.hijack();
            const raw = request.raw as IncomingMessage & { body?: unknown };
            raw.body = request.body;
            const url = (raw.url ?? '/').slice(base.length) || '/';
            try {
                await console_.handle(raw, reply.raw, base, url);
            } catch {
                // hijacked: nobody else answers
                if (!reply.raw.headersSent) {
                    reply.raw.writeHead(500, { 'Content-Type': 'text/plain; charset=utf-8' });
                }
                reply.raw.end('durable_steps console: internal error');
            }
        };
        fastify.route({ method: ['GET', 'HEAD', 'POST'], url: '/', handler });
        fastify.route({ method: ['GET', 'HEAD', 'POST'], url: '/*', handler });
    }
    // one encapsulated context, so that the form parser stays the console's
    (plugin as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = false;
    return plugin;
}
