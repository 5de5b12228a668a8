// What the console reads, each a statement over the extension's views and functions, with bound
// values only, as the operator's role: a role sees the rows of the roles whose privileges it
// has, a member of durable_steps_admin sees all (docs/reference.md, "Views"). Lists are pages of
// PAGE rows, newest first, by a condition an index of the extension holds.

import type { Queryable } from 'durable-steps';

export const PAGE = 50;

export type Row = Record<string, any>;

/**
 * The steps waiting or running, as the two indexes that hold exactly them (steps_due_idx and
 * steps_task_due_idx) read them: never the history.
 */
const LIVE = 'next_attempt_at IS NOT NULL AND (task IS NULL OR task IS NOT NULL)';

/** The classes a step that needs a person has: steps_attention_idx holds exactly these. */
const ATTENTION = "error_class = ANY ('{correctable,uncertain,exhausted,permanent,timeout}'::text[])";

/** A page of rows: `more` when a next page exists. */
export interface Page {
    rows: Row[];
    more: boolean;
}

async function page(db: Queryable, sql: string, values: unknown[], offset: number): Promise<Page> {
    const { rows } = await db.query(`${sql} LIMIT ${PAGE + 1} OFFSET ${Math.max(0, Math.floor(offset))}`, values);
    return { rows: rows.slice(0, PAGE), more: rows.length > PAGE };
}

/** Qualify with the extension's schema when it is not on the search_path. */
export function qualifier(schema: string | undefined): string {
    return schema ? `"${schema.replace(/"/g, '""')}".` : '';
}

export class Queries {
    constructor(private readonly q: string) {}

    async overview(db: Queryable) {
        const queues = (await db.query(
            `SELECT queue, concurrency, running, due, scheduled, updated_at FROM ${this.q}ds_queues ORDER BY queue`)).rows;
        const attention = (await db.query(
            `SELECT status, count(*)::int AS n FROM ${this.q}ds_steps
              WHERE ${ATTENTION} AND status IN ('blocked', 'uncertain', 'failed') GROUP BY status`)).rows;
        const oldest = (await db.query(
            `SELECT min(next_attempt_at) AS oldest FROM ${this.q}ds_steps
              WHERE ${LIVE} AND status IN ('pending', 'retrying') AND next_attempt_at <= now()`)).rows[0]?.oldest ?? null;
        // the whole server's, from the counters of the shared memory: pg_monitor and
        // durable_steps_admin may read them; another role's console draws no chart
        const fn = `${this.q}ds_attempt_minutes()`;
        const may = (await db.query(
            `SELECT coalesce(pg_catalog.has_function_privilege(pg_catalog.to_regprocedure($1), 'EXECUTE'), false) AS may`,
            [fn])).rows[0].may;
        const attempts: Row[] | null = may ? (await db.query(
            `SELECT (extract(epoch FROM minute) * 1000)::float8 AS minute, class, attempts::int AS n FROM ${fn}`)).rows : null;
        const runs = (await db.query(
            `SELECT status, count(*)::int AS n FROM ${this.q}ds_runs
              WHERE status IN ('pending', 'running', 'waiting', 'blocked') GROUP BY status`)).rows;
        const workers = (await db.query(
            `SELECT pid, backend_type, datname, state, wait_event, backend_start
               FROM pg_catalog.pg_stat_activity
              WHERE backend_type LIKE 'durable_steps%' ORDER BY backend_type, pid`)).rows;
        const taskWorkers = (await db.query(
            `SELECT worker, count(*)::int AS running, min(lease_expires_at) AS lease_until
               FROM ${this.q}ds_steps WHERE ${LIVE} AND task IS NOT NULL AND status = 'running' AND worker IS NOT NULL
              GROUP BY worker ORDER BY worker`)).rows;
        return { queues, attention, oldest, attempts, runs, workers, taskWorkers };
    }

    inbox(db: Queryable, status: string | null, offset: number): Promise<Page> {
        const statuses = status && ['blocked', 'uncertain', 'failed'].includes(status) ? [status] : ['blocked', 'uncertain', 'failed'];
        return page(db,
            `SELECT s.run_id, s.step_id, s.kind, s.status, s.attempt, s.max_attempts, s.error_code,
                    s.error_message, s.remediation, s.updated_at, s.owner::text AS owner,
                    r.workflow, r.status AS run_status
               FROM ${this.q}ds_steps s LEFT JOIN ${this.q}ds_runs r ON r.run_id = s.run_id AND r.current_step = s.step_id
              WHERE s.${ATTENTION} AND s.status = ANY ($1::text[])
              ORDER BY s.updated_at DESC, s.run_id, s.step_id`, [statuses], offset);
    }

    async step(db: Queryable, runId: string, stepId: string) {
        const step = (await db.query(
            `SELECT *, owner::text AS owner FROM ${this.q}ds_steps WHERE run_id = $1 AND step_id = $2`, [runId, stepId])).rows[0] ?? null;
        const attempts = step ? (await db.query(
            `SELECT *, role::text AS role FROM ${this.q}ds_attempts WHERE run_id = $1 AND step_id = $2 ORDER BY attempt`,
            [runId, stepId])).rows : [];
        const run = step ? (await db.query(
            `SELECT run_id, workflow, status FROM ${this.q}ds_runs WHERE run_id = $1`, [runId])).rows[0] ?? null : null;
        return { step, attempts, run };
    }

    runs(db: Queryable, status: string | null, offset: number): Promise<Page> {
        return page(db,
            `SELECT run_id, workflow, status, current_step, wait_reason, wait_event, next_wake_at, turns,
                    error_code, error_message, created_at, updated_at
               FROM ${this.q}ds_runs WHERE ($1::text IS NULL OR status = $1)
              ORDER BY created_at DESC, run_id`, [status], offset);
    }

    async run(db: Queryable, runId: string) {
        const run = (await db.query(
            `SELECT *, owner::text AS owner FROM ${this.q}ds_runs WHERE run_id = $1`, [runId])).rows[0] ?? null;
        const steps = (await db.query(
            `SELECT step_id, kind, status, attempt, max_attempts, next_attempt_at, error_code, error_message,
                    remediation, request->>'name' AS event, created_at, updated_at, finished_at
               FROM ${this.q}ds_steps WHERE run_id = $1 ORDER BY created_at, step_id LIMIT 500`, [runId])).rows;
        return { run, steps };
    }

    tasks(db: Queryable, offset: number): Promise<Page> {
        return page(db,
            `SELECT run_id, step_id, task, status, worker, attempt, max_attempts, next_attempt_at,
                    lease_expires_at, on_lost, queue, priority, updated_at
               FROM ${this.q}ds_steps
              WHERE ${LIVE} AND task IS NOT NULL AND status IN ('pending', 'retrying', 'running')
              ORDER BY status = 'running' DESC, next_attempt_at, run_id, step_id`, [], offset);
    }

    async schedules(db: Queryable) {
        try {
            return (await db.query(`SELECT * FROM ${this.q}ds_schedules ORDER BY job_name`)).rows;
        } catch (e) {
            // pg_cron is not installed (55000) or the view reads it and cannot: no schedules
            if ((e as { code?: string }).code === '55000' || (e as { code?: string }).code === '3F000'
                || (e as { code?: string }).code === '42P01') {
                return null;
            }
            throw e;
        }
    }

    keys(db: Queryable, state: string | null, offset: number): Promise<Page> {
        return page(db,
            `SELECT scope, key, state, status, request, body, owner::text AS owner, created_at, expires_at
               FROM ${this.q}ds_idempotency_keys WHERE ($1::text IS NULL OR state = $1)
              ORDER BY created_at DESC, scope, key`, [state], offset);
    }
}
