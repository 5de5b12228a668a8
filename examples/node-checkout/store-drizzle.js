// The checkout's database layer in Drizzle ORM over a node-postgres Pool: the charge URL and the
// receipts with Drizzle's query builder; the durable_steps calls with the client library
// (clients/node) and the task worker on the same Pool.
//
// Drizzle's sql`` binds every ${interpolation}, and only sql.raw() splices text; the library
// binds every SQL text it sends (the handler included), so nothing of the handler is ever
// spliced into a statement.

import { DurableSteps } from 'durable-steps';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { pgTable, text, timestamp } from 'drizzle-orm/pg-core';
import pg from 'pg';

const shopConfig = pgTable('shop_config', {
    name: text('name').primaryKey(),
    value: text('value').notNull(),
});

const receipts = pgTable('receipts', {
    orderId: text('order_id').primaryKey(),
    sentTo: text('sent_to').notNull(),
    messageId: text('message_id').notNull(),
    idempotencyKey: text('idempotency_key').notNull(),
    sentAt: timestamp('sent_at', { withTimezone: true }).notNull().defaultNow(),
});

const shipments = pgTable('shipments', {
    orderId: text('order_id').primaryKey(),
    carrier: text('carrier').notNull(),
    idempotencyKey: text('idempotency_key').notNull(),
    shippedAt: timestamp('shipped_at', { withTimezone: true }).notNull().defaultNow(),
});

/**
 * @param {string} databaseUrl a postgresql:// URL (a socket directory as ?host=/dir)
 * @returns {import('./store-knex.js').CheckoutStore}
 */
export function openDrizzleStore(databaseUrl) {
    // Outside db.transaction() each statement runs alone in autocommit. node-postgres prepares
    // a statement by name only when given a `name`, which Drizzle passes only for .prepare(name),
    // never used here, and the library never: PgBouncer's transaction mode sees nothing that
    // outlives a statement.
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 30 });
    // an idle connection that the server or PgBouncer closes must not take the service down
    pool.on('error', (e) => console.error('idle database connection lost:', e.message));
    const db = drizzle({ client: pool });

    return {
        async setup(chargeUrl) {
            // IF NOT EXISTS: replicas of the service may start at once
            await db.execute(sql`CREATE TABLE IF NOT EXISTS shop_config (
                name text PRIMARY KEY, value text NOT NULL)`);
            await db.execute(sql`CREATE TABLE IF NOT EXISTS receipts (
                order_id text PRIMARY KEY, sent_to text NOT NULL, message_id text NOT NULL,
                idempotency_key text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())`);
            await db.execute(sql`CREATE TABLE IF NOT EXISTS shipments (
                order_id text PRIMARY KEY, carrier text NOT NULL, idempotency_key text NOT NULL,
                shipped_at timestamptz NOT NULL DEFAULT now())`);
            await db.insert(shopConfig).values({ name: 'charge_url', value: chargeUrl })
                .onConflictDoUpdate({ target: shopConfig.name, set: { value: chargeUrl } });
        },

        durableSteps: new DurableSteps(pool),
        pool,

        async recordReceipt(client, receipt) {
            // Drizzle over the handler's own client: the insert runs in its transaction (a
            // db.transaction() would take another connection, outside the step's outcome)
            await drizzle({ client }).insert(receipts).values({
                orderId: receipt.order,
                sentTo: receipt.to,
                messageId: receipt.messageId,
                idempotencyKey: receipt.idempotencyKey,
            });
        },

        async recordShipment(client, shipment) {
            // as recordReceipt: Drizzle over the step's own client, in its transaction
            await drizzle({ client }).insert(shipments).values({
                orderId: shipment.order,
                carrier: shipment.carrier,
                idempotencyKey: shipment.idempotencyKey,
            });
        },

        async close() {
            await pool.end();
        },
    };
}
