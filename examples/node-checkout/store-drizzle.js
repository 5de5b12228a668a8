// The checkout's database layer in Drizzle ORM over a node-postgres Pool: the charge URL with
// Drizzle's query builder, the two durable_steps calls with its sql`` template.
//
// sql`` binds every ${interpolation} as a parameter ($1, $2, ...); only sql.raw() would splice
// text into the statement. The handler is SQL of its own (its `$1` is the stored request), so
// it is interpolated -- a bound value that reaches the server untouched -- never sql.raw()'d.

import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { pgTable, text } from 'drizzle-orm/pg-core';
import pg from 'pg';

import { fromDatabaseError } from './durable-steps.js';

const shopConfig = pgTable('shop_config', {
    name: text('name').primaryKey(),
    value: text('value').notNull(),
});

/**
 * @param {string} databaseUrl a postgresql:// URL (a socket directory as ?host=/dir)
 * @returns {import('./durable-steps.js').CheckoutStore}
 */
export function openDrizzleStore(databaseUrl) {
    // Outside db.transaction() each statement runs alone in autocommit. node-postgres prepares
    // a statement by name only when given a `name`, which Drizzle passes only for .prepare(name),
    // never used here: PgBouncer's transaction mode sees nothing that outlives a statement.
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 30 });
    // an idle connection that the server or PgBouncer closes must not take the service down
    pool.on('error', (e) => console.error('idle database connection lost:', e.message));
    const db = drizzle({ client: pool });

    /** @param {import('drizzle-orm').SQL} query */
    async function rows(query) {
        try {
            return (await db.execute(query)).rows;
        } catch (e) {
            // Drizzle wraps the server's error (DrizzleQueryError, its `cause`)
            throw fromDatabaseError(e);
        }
    }

    return {
        async setup(chargeUrl) {
            // IF NOT EXISTS: replicas of the service may start at once
            await db.execute(sql`CREATE TABLE IF NOT EXISTS shop_config (
                name text PRIMARY KEY, value text NOT NULL)`);
            await db.insert(shopConfig).values({ name: 'charge_url', value: chargeUrl })
                .onConflictDoUpdate({ target: shopConfig.name, set: { value: chargeUrl } });
        },

        async idempotent(key, request, handler) {
            const [row] = await rows(sql`SELECT status, body, replayed
                FROM ds_idempotent('checkout', ${key}, ${JSON.stringify(request)}::jsonb, ${handler},
                                   wait => '10 s')`);
            return /** @type {any} */ (row);
        },

        async waitCharge(runId) {
            const [row] = await rows(sql`SELECT status, result, error_code, error_message
                FROM ds_wait_step(${runId}, 'charge', '10 s')`);
            return /** @type {any} */ (row);
        },

        async close() {
            await pool.end();
        },
    };
}
