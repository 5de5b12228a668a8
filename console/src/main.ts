#!/usr/bin/env node
/// <reference types="node" />
// durable-steps-console: the console served on its own (docs/console.md, "On its own").
//
//   DS_CONSOLE_USER=ops DS_CONSOLE_PASSWORD=... durable-steps-console \
//       --database-url postgres://ops@db/shop [--port 8080] [--host 127.0.0.1] [--actions]
//
// Every request must carry HTTP Basic credentials equal to DS_CONSOLE_USER and
// DS_CONSOLE_PASSWORD (it does not start without them); the database decides the rest: the
// console runs as the role of the database URL. SIGTERM and SIGINT stop it gracefully.

import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage } from 'node:http';
import { parseArgs } from 'node:util';

import pg from 'pg';

import { Console } from './server.js';

/** Equal, in a time that tells nothing of either: their digests compared in constant time. */
function same(a: string, b: string): boolean {
    const digest = (s: string) => createHash('sha256').update(s).digest();
    return timingSafeEqual(digest(a), digest(b));
}

function main(): void {
    const { values } = parseArgs({
        options: {
            'database-url': { type: 'string' },
            port: { type: 'string', default: '8080' },
            host: { type: 'string', default: '127.0.0.1' },
            actions: { type: 'boolean', default: false },
            schema: { type: 'string' },
        },
    });
    const url = values['database-url'] ?? process.env.DATABASE_URL;
    const user = process.env.DS_CONSOLE_USER;
    const password = process.env.DS_CONSOLE_PASSWORD;
    if (!url) {
        console.error('durable-steps-console: give --database-url (or DATABASE_URL)');
        process.exit(2);
    }
    if (!user || !password) {
        console.error('durable-steps-console: set DS_CONSOLE_USER and DS_CONSOLE_PASSWORD: the console answers only requests with them (HTTP Basic)');
        process.exit(2);
    }
    const pool = new pg.Pool({ connectionString: url, max: 5, application_name: 'durable_steps console' });
    pool.on('error', (e) => console.error('durable-steps-console: idle connection lost:', e.message));
    const console_ = new Console<IncomingMessage>({
        pool, actions: values.actions, schema: values.schema, operator: () => user,
    });
    const server = createServer((req, res) => {
        const header = req.headers.authorization ?? '';
        const given = header.startsWith('Basic ') ? Buffer.from(header.slice(6), 'base64').toString('utf8') : '';
        const colon = given.indexOf(':');
        // both compared, whatever the first answers: the time tells nothing of which was wrong
        const userOk = same(colon < 0 ? '' : given.slice(0, colon), user);
        const passwordOk = same(colon < 0 ? '' : given.slice(colon + 1), password);
        if (colon < 0 || !(userOk && passwordOk)) {
            res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="durable_steps console", charset="UTF-8"', 'Content-Type': 'text/plain' });
            res.end('authentication required');
            return;
        }
        console_.handle(req, res, '', req.url ?? '/').catch((e) => {
            console.error('durable-steps-console:', e);
            if (!res.headersSent) {
                res.writeHead(500, { 'Content-Type': 'text/plain' });
            }
            res.end('internal error');
        });
    });
    server.listen(Number(values.port), values.host, () => {
        const address = server.address();
        const port = typeof address === 'object' && address ? address.port : values.port;
        console.log(`durable-steps-console: http://${values.host}:${port}/ (${values.actions ? 'actions enabled' : 'read-only'})`);
    });
    const stop = () => {
        server.close(() => void pool.end().then(() => process.exit(0)));
        server.closeIdleConnections?.();
        setTimeout(() => process.exit(0), 5000).unref();
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
}

main();
