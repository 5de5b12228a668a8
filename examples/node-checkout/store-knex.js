// The checkout's database layer in Knex (over node-postgres): the schema and the charge URL with
// Knex's schema and query builders; the durable_steps calls with the client library
// (clients/node), on a connection of Knex's own pool.
//
// knex.raw() rewrites every `?` of its SQL into a positional parameter ($1, $2, ...) and `??`
// into an identifier: the handler (SQL of its own, whose `$1` is the stored request) must never
// be part of a raw text. The library sends its statements to node-postgres directly, every SQL
// text -- the handler included -- a bound value, so Knex never sees them.

import { DurableSteps } from 'durable-steps';
import knexFactory from 'knex';

/**
 * @typedef {object} CheckoutStore
 * @property {(chargeUrl: string) => Promise<void>} setup
 * @property {DurableSteps} durableSteps the durable_steps calls, on the store's pool
 * @property {() => Promise<void>} close
 */

/**
 * @param {string} databaseUrl a postgresql:// URL (a socket directory as ?host=/dir)
 * @returns {CheckoutStore}
 */
export function openKnexStore(databaseUrl) {
    // Each statement outside a transaction is one of its own in autocommit, and neither Knex nor
    // the library prepares anything by name or sets anything on the session (no searchPath
    // here): nothing is left on a server connection that PgBouncer's transaction mode would hand
    // to another client.
    const knex = knexFactory({
        client: 'pg',
        // node-postgres parses the URL: Knex's own parser takes one without a host (a socket
        // directory in ?host=) for a SQLite file name
        connection: { connectionString: databaseUrl },
        pool: { min: 0, max: 30 },
        compileSqlOnError: false,
    });

    // What the library needs of a connection (node-postgres's query(text, values)), on one that
    // Knex's pool lends for the statement: the same pool serves the ORM and durable_steps.
    const db = {
        /**
         * @param {string} text
         * @param {unknown[]} values
         */
        async query(text, values) {
            const connection = await knex.client.acquireConnection();
            try {
                return await connection.query(text, values);
            } finally {
                await knex.client.releaseConnection(connection);
            }
        },
    };

    return {
        async setup(chargeUrl) {
            // IF NOT EXISTS: replicas of the service may start at once
            await knex.raw(
                'CREATE TABLE IF NOT EXISTS shop_config (name text PRIMARY KEY, value text NOT NULL)');
            await knex('shop_config').insert({ name: 'charge_url', value: chargeUrl })
                .onConflict('name').merge();
        },

        durableSteps: new DurableSteps(db),

        async close() {
            await knex.destroy();
        },
    };
}
