// The checkout's database layer in Knex (over node-postgres): the schema, the charge URL and the
// receipts with Knex's schema and query builders; the durable_steps calls with the client
// library (clients/node). One node-postgres Pool serves them all: Knex borrows its connections
// (`connectionPool`, Knex 3.3), and the library and the task worker use it directly.
//
// knex.raw() rewrites every `?` of its SQL into a positional parameter ($1, $2, ...) and `??`
// into an identifier: the handler (SQL of its own, whose `$1` is the stored request) must never
// be part of a raw text. The library sends its statements to node-postgres directly, every SQL
// text -- the handler included -- a bound value, so Knex never sees them.

import { DurableSteps } from 'durable-steps';
import knexFactory from 'knex';
import pg from 'pg';

/**
 * @typedef {object} Receipt
 * @property {string} order the order (the checkout's run_id)
 * @property {string} to the address it was sent to
 * @property {string} messageId the mail service's id of the message
 * @property {string} idempotencyKey the key it was sent with (the task step's)
 */

/**
 * @typedef {object} Shipment
 * @property {string} order the order (the checkout's run_id)
 * @property {string} carrier who ships it
 * @property {string} idempotencyKey the key of the workflow step that recorded it
 */

/**
 * @typedef {object} CheckoutStore
 * @property {(chargeUrl: string) => Promise<void>} setup
 * @property {DurableSteps} durableSteps the durable_steps calls, on the store's pool
 * @property {pg.Pool} pool the pool the task worker claims with and lends to ctx.transaction
 * @property {(client: pg.PoolClient, receipt: Receipt) => Promise<void>} recordReceipt
 *           records a receipt as sent, on the client of the handler's transaction
 * @property {(client: pg.PoolClient, shipment: Shipment) => Promise<void>} recordShipment
 *           records an order as shipped, on the client of the workflow step's transaction
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
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 30 });
    // an idle connection that the server or PgBouncer closes must not take the service down
    pool.on('error', (e) => console.error('idle database connection lost:', e.message));
    const knex = knexFactory({ client: 'pg', connectionPool: pool, compileSqlOnError: false });

    return {
        async setup(chargeUrl) {
            // IF NOT EXISTS: replicas of the service may start at once
            await knex.raw(
                'CREATE TABLE IF NOT EXISTS shop_config (name text PRIMARY KEY, value text NOT NULL)');
            await knex.raw(`CREATE TABLE IF NOT EXISTS receipts (
                order_id text PRIMARY KEY, sent_to text NOT NULL, message_id text NOT NULL,
                idempotency_key text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())`);
            await knex.raw(`CREATE TABLE IF NOT EXISTS shipments (
                order_id text PRIMARY KEY, carrier text NOT NULL, idempotency_key text NOT NULL,
                shipped_at timestamptz NOT NULL DEFAULT now())`);
            await knex('shop_config').insert({ name: 'charge_url', value: chargeUrl })
                .onConflict('name').merge();
        },

        durableSteps: new DurableSteps(pool),
        pool,

        async recordReceipt(client, receipt) {
            // Knex builds the statement, the handler's client runs it in its transaction (a Knex
            // transaction would take another connection, outside the step's outcome)
            const { sql, bindings } = knex('receipts').insert({
                order_id: receipt.order,
                sent_to: receipt.to,
                message_id: receipt.messageId,
                idempotency_key: receipt.idempotencyKey,
            }).toSQL().toNative();
            await client.query(sql, /** @type {unknown[]} */ (bindings));
        },

        async recordShipment(client, shipment) {
            // as recordReceipt: built by Knex, run in the step's transaction
            const { sql, bindings } = knex('shipments').insert({
                order_id: shipment.order,
                carrier: shipment.carrier,
                idempotency_key: shipment.idempotencyKey,
            }).toSQL().toNative();
            await client.query(sql, /** @type {unknown[]} */ (bindings));
        },

        async close() {
            await knex.destroy();       // leaves the pool it was given alone
            await pool.end();
        },
    };
}
