// What an operator may do from the console, each one call of the extension's own functions, run
// with the database rights of the operator's role: the database decides, and its error is what
// the operator reads (docs/console.md, "Actions").

import type { Queryable } from 'durable-steps';

export type Form = Record<string, string>;

export interface Action {
    /** what the confirmation page and the log say */
    describe(form: Form): string;
    /** the call; its answer, as text */
    run(db: Queryable, q: string, form: Form): Promise<string>;
}

/** A field that must be there. */
function required(form: Form, name: string): string {
    const value = form[name];
    if (value === undefined || value === '') {
        throw new FormError(`${name} is required`);
    }
    return value;
}

/** A JSON field: absent or empty is null; anything else must parse. */
function jsonField(form: Form, name: string): unknown {
    const text = form[name];
    if (text === undefined || text.trim() === '') {
        return null;
    }
    try {
        return JSON.parse(text);
    } catch (e) {
        throw new FormError(`${name} is not JSON: ${(e as Error).message}`);
    }
}

/** A mistake in the form itself, found before the database is asked. */
export class FormError extends Error {}

function step(form: Form): string {
    return `step ${required(form, 'run_id')} / ${required(form, 'step_id')}`;
}

export const ACTIONS: Record<string, Action> = {
    rearm: {
        describe(form) {
            const what = [form.input?.trim() ? 'a corrected input' : '', form.sql?.trim() ? 'corrected SQL' : '',
                form.request?.trim() ? 'a corrected request' : ''].filter(Boolean);
            return `re-arm ${step(form)}${what.length ? ' with ' + what.join(', ') : ' as it was defined'}`;
        },
        async run(db, q, form) {
            const { rows } = await db.query(
                `SELECT status FROM ${q}ds_retry_step(run_id => $1, step_id => $2, input => $3::jsonb,
                                                     sql => $4, request => $5::jsonb)`,
                [required(form, 'run_id'), required(form, 'step_id'),
                    form.input?.trim() ? JSON.stringify(jsonField(form, 'input')) : null,
                    form.sql?.trim() ? form.sql : null,
                    form.request?.trim() ? JSON.stringify(jsonField(form, 'request')) : null]);
            return `the step is ${rows[0].status}`;
        },
    },
    resolve: {
        describe(form) {
            return `resolve ${step(form)} as ${required(form, 'status')}`;
        },
        async run(db, q, form) {
            const result = jsonField(form, 'result');
            const { rows } = await db.query(
                `SELECT status FROM ${q}ds_resolve_step($1, $2, $3, $4::jsonb)`,
                [required(form, 'run_id'), required(form, 'step_id'), required(form, 'status'),
                    result === null ? null : JSON.stringify(result)]);
            return `the step is ${rows[0].status}`;
        },
    },
    'cancel-step': {
        describe(form) {
            return `cancel ${step(form)}`;
        },
        async run(db, q, form) {
            const { rows } = await db.query(`SELECT status FROM ${q}ds_cancel_step($1, $2)`,
                [required(form, 'run_id'), required(form, 'step_id')]);
            return `the step is ${rows[0].status}`;
        },
    },
    'cancel-run': {
        describe(form) {
            return `cancel run ${required(form, 'run_id')} and its unfinished steps`;
        },
        async run(db, q, form) {
            const { rows } = await db.query(`SELECT ${q}ds_cancel_run($1) AS status`, [required(form, 'run_id')]);
            return `the run is ${rows[0].status}`;
        },
    },
    'resume-run': {
        describe(form) {
            return `resume run ${required(form, 'run_id')}: its next turn now`;
        },
        async run(db, q, form) {
            const { rows } = await db.query(`SELECT ${q}ds_resume_run($1) AS status`, [required(form, 'run_id')]);
            return `the run is ${rows[0].status}`;
        },
    },
    'set-queue': {
        describe(form) {
            const c = form.concurrency?.trim();
            return `${c === '0' ? 'pause' : c ? `limit to ${c} at once` : 'remove the limit of'} queue ${required(form, 'queue')}`;
        },
        async run(db, q, form) {
            const c = form.concurrency?.trim();
            if (c && !/^\d+$/.test(c)) {
                throw new FormError('concurrency is a whole number, 0 to pause, or empty for no limit');
            }
            await db.query(`SELECT ${q}ds_set_queue($1, $2::int)`, [required(form, 'queue'), c ? Number(c) : null]);
            return c === '0' ? 'the queue is paused' : c ? `the queue runs at most ${c} at once` : 'the queue has no limit';
        },
    },
};
