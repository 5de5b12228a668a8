// The checkout's database layer in Knex (over node-postgres): the schema and the charge URL with
// Knex's schema and query builders, the two durable_steps calls with knex.raw().
//
// knex.raw() rewrites every `?` of its SQL into a positional parameter ($1, $2, ...) and `??`
// into an identifier. The handler is SQL of its own (its `$1` is the stored request, and an
// operator like jsonb's `?` would be rewritten too), so it is never part of the raw text: it is
// one of the bindings, and reaches the server as a bound value, untouched.

import knexFactory from 'knex';

import { fromDatabaseError } from './durable-steps.js';

const IDEMPOTENT = `SELECT status, body, replayed
  FROM ds_idempotent('checkout', ?, ?::jsonb, ?, wait => '10 s')`;
const WAIT = `SELECT status, result, error_code, error_message
  FROM ds_wait_step(?, 'charge', '10 s')`;

/**
 * @param {string} databaseUrl a postgresql:// URL (a socket directory as ?host=/dir)
 * @returns {import('./durable-steps.js').CheckoutStore}
 */
export function openKnexStore(databaseUrl) {
    // Each knex.raw() outside a transaction is a statement of its own in autocommit, and Knex
    // prepares nothing by name and sets nothing on the session (no searchPath here): nothing is
    // left on a server connection that PgBouncer's transaction mode would hand to another client.
    // compileSqlOnError: false keeps the bindings -- the client's body -- out of error messages.
    const knex = knexFactory({
        client: 'pg',
        // node-postgres parses the URL: Knex's own parser takes one without a host (a socket
        // directory in ?host=) for a SQLite file name
        connection: { connectionString: databaseUrl },
        pool: { min: 0, max: 30 },
        compileSqlOnError: false,
    });

    /**
     * Runs one raw statement; a failure becomes the error of its SQLSTATE, with the server's own
     * message (Knex prefixes the statement's text to it).
     * @param {string} text
     * @param {unknown[]} bindings
     */
    async function raw(text, bindings) {
        const query = knex.raw(text, /** @type {any} */ (bindings));
        try {
            return (await query).rows;
        } catch (e) {
            const prefix = query.toSQL().toNative().sql + ' - ';
            const err = /** @type {any} */ (e);
            if (typeof err?.message === 'string' && err.message.startsWith(prefix)) {
                err.message = err.message.slice(prefix.length);
            }
            throw fromDatabaseError(e);
        }
    }

    return {
        async setup(chargeUrl) {
            // IF NOT EXISTS: replicas of the service may start at once
            await knex.raw(
                'CREATE TABLE IF NOT EXISTS shop_config (name text PRIMARY KEY, value text NOT NULL)');
            await knex('shop_config').insert({ name: 'charge_url', value: chargeUrl })
                .onConflict('name').merge();
        },

        async idempotent(key, request, handler) {
            const [row] = await raw(IDEMPOTENT, [key, JSON.stringify(request), handler]);
            return row;
        },

        async waitCharge(runId) {
            const [row] = await raw(WAIT, [runId]);
            return row;
        },

        async close() {
            await knex.destroy();
        },
    };
}
