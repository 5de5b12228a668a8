// Every call of the package against the real cluster, through the ES module build (imported by
// the package's own name, so through its "exports" map): typed results and the error class of
// each SQLSTATE the calls raise for real.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';

import * as ds from 'durable-steps';

import env from './env.cjs';

const { DurableSteps } = ds;
const pool = env.makePool();
const client = new DurableSteps(pool);
const WORKFLOW = 'node_client_test_wf';

/** Asserts that `promise` rejects with an instance of `cls` of SQLSTATE `code`; returns it. */
async function rejectsWith(promise, cls, code) {
    let caught;
    await assert.rejects(promise, (e) => {
        caught = e;
        return true;
    });
    assert.ok(caught instanceof cls, `${caught?.name} (${caught?.code}: ${caught?.message}) is not a ${cls.name}`);
    assert.ok(caught instanceof ds.DurableStepsError);
    assert.equal(caught.sqlstate, code);
    assert.equal(caught.code, code);
    assert.equal(caught.httpStatus, cls.httpStatus);
    // node-postgres's own error stays as the cause
    assert.equal(caught.cause?.code, code);
    return caught;
}

before(async () => {
    // a workflow of the runs' tests (app has CREATE on public): a step, then an event
    await pool.query(`CREATE OR REPLACE FUNCTION ${WORKFLOW}(run_id text, input jsonb) RETURNS jsonb
        LANGUAGE plpgsql AS $wf$
        DECLARE
            doubled jsonb;
            event jsonb;
        BEGIN
            doubled := ds_step('double', 'SELECT to_jsonb(($1->>''n'')::int * 2)', input);
            event := ds_await_event('event', 'node-client:' || run_id);
            RETURN jsonb_build_object('doubled', doubled, 'event', event);
        END $wf$`);
});

after(() => pool.end());

test('the ES module build is the one imported', () => {
    assert.match(import.meta.resolve('durable-steps'), /\/dist\/esm\/index\.js$/);
});

describe('runStep', () => {
    test('runs the body once and answers typed results; a repeat replays', async () => {
        const run = env.unique('run');
        // `?`, `:name` and `$1` in the body reach the server as written: the SQL is bound
        const sql = `SELECT jsonb_build_object('sum', ($1->>'a')::int + 1, 'has_a', $1 ? 'a',
                                               'text', 'what? :name $2', 'list', jsonb_build_array(1, 'two', null))`;
        const first = await client.runStep(run, 'add', sql, { input: { a: 41 }, policy: { max_attempts: 3 } });
        assert.deepEqual(first.result, { sum: 42, has_a: true, text: 'what? :name $2', list: [1, 'two', null] });
        assert.equal(first.runId, run);
        assert.equal(first.stepId, 'add');
        assert.equal(first.status, 'succeeded');
        assert.equal(first.attempt, 1);
        assert.equal(first.maxAttempts, 3);
        assert.equal(first.replayed, false);
        assert.equal(first.errorCode, null);
        const again = await ds.runStep(pool, run, 'add', sql, { input: { a: 41 } });
        assert.equal(again.replayed, true);
        assert.deepEqual(again.result, first.result);
    });

    test('a JSON array input is jsonb, not a PostgreSQL array', async () => {
        const step = await client.runStep(env.unique('arr'), 's', 'SELECT to_jsonb(jsonb_array_length($1))',
            { input: [1, 2, 3] });
        assert.equal(step.result, 3);
    });

    test('a deferred step is pending with a Date due, and waitStep answers its outcome', async () => {
        const run = env.unique('defer');
        const stored = await client.runStep(run, 'later', `SELECT '"done"'::jsonb`, { defer: true });
        assert.equal(stored.status, 'pending');
        assert.ok(stored.nextAttemptAt instanceof Date);
        assert.equal(stored.result, null);
        const done = await client.waitStep(run, 'later', '60 s');
        assert.equal(done.status, 'succeeded');
        assert.equal(done.result, 'done');
        assert.equal(done.replayed, true);
    });

    test('a body that fails for good answers its error, typed', async () => {
        const step = await client.runStep(env.unique('fail'), 's', `SELECT ds_non_retriable('card declined')`);
        assert.equal(step.status, 'failed');
        assert.equal(step.errorCode, 'DS001');
        assert.equal(step.errorMessage, 'card declined');
        assert.equal(typeof step.errorClass, 'string');
    });

    test("expect: 'row' blocks a step whose body finds no row (DS008, NoRowError)", async () => {
        const sql = `SELECT n FROM (VALUES (1), (2)) v(n) WHERE n = ($1->>'n')::int`;
        const none = await client.runStep(env.unique('expect'), 's', sql, { input: { n: 3 }, expect: 'row' });
        assert.equal(none.status, 'blocked');
        assert.equal(none.errorCode, 'DS008');
        assert.equal(ds.ERRORS_BY_SQLSTATE.get(none.errorCode), ds.NoRowError);
        const one = await client.runStep(env.unique('expect'), 's', sql, { input: { n: 2 }, expect: 'row' });
        assert.equal(one.status, 'succeeded');
        assert.equal(one.result, 2);
    });

    test('calls on a PoolClient share its transaction', async () => {
        const run = env.unique('tx');
        const conn = await pool.connect();
        try {
            await conn.query('BEGIN');
            const step = await client.on(conn).runStep(run, 's', 'SELECT to_jsonb(1)');
            assert.equal(step.status, 'succeeded');
            await conn.query('ROLLBACK');
        } finally {
            conn.release();
        }
        await rejectsWith(client.waitStep(run, 's', 0), ds.StepNotFoundError, 'DS404');
    });
});

describe('httpStep and waitStep', () => {
    test('the HTTP worker sends the request once; waitStep answers the response', async () => {
        const tag = env.unique('http');
        const stored = await client.httpStep(tag, 'charge', {
            method: 'POST', url: `${env.PROVIDER}/charge/${tag}`, json: { amount: 1999 }, expect: 'json',
        }, { timeout: '10 s', policy: { max_attempts: 3, initial_delay: '100 ms' } });
        assert.equal(stored.runId, tag);
        assert.ok(['pending', 'running'].includes(stored.status), stored.status);
        const done = await ds.waitStep(pool, tag, 'charge', 60_000);
        assert.equal(done.status, 'succeeded');
        assert.equal(done.result.status, 200);
        assert.equal(typeof done.result.headers, 'object');
        // expect: 'json' -- the provider's answer parsed: {charged: tag, charge: n, received: body}
        assert.equal(done.result.body.charged, tag);
        assert.equal(done.result.body.charge, 1);
        assert.deepEqual(JSON.parse(done.result.body.received), { amount: 1999 });
        assert.equal((await env.providerCounts()).charges[tag], 1);
        // a repeat of the call answers the stored step, typed
        const repeat = await client.httpStep(tag, 'charge', {
            method: 'POST', url: `${env.PROVIDER}/charge/${tag}`, json: { amount: 1999 }, expect: 'json',
        }, { timeout: '10 s', policy: { max_attempts: 3, initial_delay: '100 ms' } });
        assert.equal(repeat.replayed, true);
        assert.equal(repeat.result.status, 200);
    });

    test('waitStep answers a step as it is when the timeout passes', async () => {
        const run = env.unique('wait');
        await client.runStep(run, 's', 'SELECT to_jsonb(1)', { runAt: new Date(Date.now() + 3_600_000) });
        const step = await client.waitStep(run, 's', '50 ms');
        assert.equal(step.status, 'pending');
        assert.ok(step.nextAttemptAt.getTime() > Date.now() + 3_000_000);
    });
});

describe('cancelStep and retryStep', () => {
    test('a cancelled step is re-armed and runs', async () => {
        const run = env.unique('cancel');
        await client.runStep(run, 's', 'SELECT to_jsonb(7)', { runAt: new Date(Date.now() + 3_600_000) });
        const cancelled = await client.cancelStep(run, 's');
        assert.equal(cancelled.status, 'cancelled');
        const rearmed = await client.retryStep(run, 's');
        assert.equal(rearmed.status, 'pending');
        const done = await client.waitStep(run, 's', '60 s');
        assert.equal(done.status, 'succeeded');
        assert.equal(done.result, 7);
        // nothing left to cancel: DS103
        await rejectsWith(client.cancelStep(run, 's'), ds.InvalidStepStateError, 'DS103');
    });
});

describe('runs and events', () => {
    test('startRun, emitEvent, waitRun', async () => {
        const key = env.unique('runkey');
        const started = await ds.startRun(pool, WORKFLOW, { n: 21 }, { runKey: key });
        assert.deepEqual(started, { runId: key, status: 'pending', created: true });
        const again = await client.startRun(WORKFLOW, { n: 21 }, { runKey: key });
        assert.equal(again.created, false);
        assert.equal(again.runId, key);
        await rejectsWith(client.startRun(WORKFLOW, { n: 22 }, { runKey: key }), ds.StepConflictError, 'DS422');

        // the run waits for its event once its step is done
        const waiting = await client.waitRun(key, '50 ms');
        assert.ok(['pending', 'running', 'waiting'].includes(waiting.status), waiting.status);
        assert.equal(waiting.output, null);
        assert.equal(await ds.emitEvent(pool, `node-client:${key}`, { color: 'blue' }), true);
        assert.equal(await client.emitEvent(`node-client:${key}`, { color: 'red' }), false);
        const done = await ds.waitRun(pool, key, '60 s');
        assert.deepEqual(done, { status: 'succeeded', output: { doubled: 42, event: { color: 'blue' } },
                                 errorCode: null, errorMessage: null });
    });

    test('a run without a key has a UUID; cancelRun and resumeRun answer statuses', async () => {
        const started = await client.startRun(WORKFLOW, { n: 1 });
        assert.match(started.runId, /^[0-9a-f-]{36}$/);
        assert.equal(started.created, true);
        assert.equal(await client.cancelRun(started.runId), 'cancelled');
        const outcome = await client.waitRun(started.runId, 0);
        assert.equal(outcome.status, 'cancelled');
        await rejectsWith(client.resumeRun(started.runId), ds.InvalidStepStateError, 'DS103');
    });

    test('resumeRun of a waiting run answers its status', async () => {
        const { runId } = await client.startRun(WORKFLOW, { n: 2 });
        await env.until('the run to wait for its event', async () =>
            (await pool.query('SELECT status FROM ds_runs WHERE run_id = $1', [runId])).rows[0]?.status === 'waiting');
        assert.ok(['pending', 'running', 'waiting'].includes(await client.resumeRun(runId)));
        await client.cancelRun(runId);
    });
});

describe('idempotent requests', () => {
    const HANDLER = `SELECT 201, jsonb_build_object('echo', $1, 'question', 'why? :x')`;

    test('idempotent runs the handler once and replays its response', async () => {
        const key = env.unique('idem');
        const first = await client.idempotent('orders', key, { amount: 70 }, HANDLER, { ttl: '1 hour', wait: '5 s' });
        assert.deepEqual(first, { status: 201, body: { echo: { amount: 70 }, question: 'why? :x' }, replayed: false });
        const again = await ds.idempotent(pool, 'orders', key, { amount: 70 }, HANDLER);
        assert.deepEqual(again, { ...first, replayed: true });
        await rejectsWith(client.idempotent('orders', key, { amount: 71 }, HANDLER), ds.StepConflictError, 'DS422');
    });

    test('a handler that does not parse is SqlSyntaxError, nothing stored', async () => {
        const key = env.unique('idem-syntax');
        await rejectsWith(client.idempotent('orders', key, {}, 'SELEC 201'), ds.SqlSyntaxError, '42601');
        assert.equal((await client.idempotent('orders', key, {}, HANDLER)).replayed, false);
    });

    test('a handler of the wrong columns is DatatypeMismatchError', async () => {
        await rejectsWith(client.idempotent('orders', env.unique('idem-cols'), {}, `SELECT 'x'::text, 1`),
            ds.DatatypeMismatchError, '42804');
    });

    test('begin, finish, abandon', async () => {
        const key = env.unique('begin');
        const begun = await client.idempotentBegin('orders', key, { amount: 5 }, { lease: '1 minute' });
        assert.equal(begun.state, 'new');
        assert.match(begun.token, /^[0-9a-f-]{36}$/);
        assert.equal(begun.status, null);
        // held: a repeat is in progress, DS409; with a wait, until the holder finishes
        await rejectsWith(ds.idempotentBegin(pool, 'orders', key, { amount: 5 }), ds.InProgressError, 'DS409');
        await rejectsWith(ds.idempotentBegin(pool, 'orders', key, { amount: 5 }, { wait: 100 }), ds.InProgressError, 'DS409');
        const waiting = client.idempotentBegin('orders', key, { amount: 5 }, { wait: '1 minute' });
        await env.until('the repeat waiting', async () => (await pool.query(
            "SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE '%ds_idempotent_begin%' AND wait_event IS NOT NULL AND state = 'active' AND pid <> pg_backend_pid()")).rows[0].n > 0);
        await ds.idempotentFinish(pool, 'orders', key, begun.token, 201, { order: 9 });
        assert.deepEqual(await waiting, { state: 'replay', token: null, status: 201, body: { order: 9 } });
        const replay = await client.idempotentBegin('orders', key, { amount: 5 });
        assert.deepEqual(replay, { state: 'replay', token: null, status: 201, body: { order: 9 } });

        const other = env.unique('abandon');
        const held = await client.idempotentBegin('orders', other, { amount: 6 });
        await client.idempotentAbandon('orders', other, held.token);
        assert.equal((await client.idempotentBegin('orders', other, { amount: 6 })).state, 'new');
        await rejectsWith(ds.idempotentAbandon(pool, 'orders', env.unique('nokey'), held.token),
            ds.StepNotFoundError, 'DS404');
    });

    test('renew', async () => {
        const key = env.unique('renew');
        const begun = await client.idempotentBegin('orders', key, { amount: 7 }, { lease: 1000 });
        const until = await client.idempotentRenew('orders', key, begun.token, '1 hour');
        assert.ok(until instanceof Date);
        assert.ok(until.getTime() > Date.now() + 59 * 60_000);
        await env.sleep(1200);  // past the first lease: still held, by the renewal
        await rejectsWith(client.idempotentBegin('orders', key, { amount: 7 }), ds.InProgressError, 'DS409');
        assert.ok((await ds.idempotentRenew(pool, 'orders', key, begun.token)) instanceof Date);
        await rejectsWith(client.idempotentRenew('orders', key, '00000000-0000-4000-8000-000000000000'),
            ds.InProgressError, 'DS409');
        await rejectsWith(client.idempotentRenew('orders', env.unique('nokey'), begun.token),
            ds.StepNotFoundError, 'DS404');
        await client.idempotentAbandon('orders', key, begun.token);
    });
});

describe('errors of SQLSTATEs raised for real', () => {
    test('DS422: another definition under a step key', async () => {
        const run = env.unique('conflict');
        await client.runStep(run, 's', 'SELECT to_jsonb(1)');
        const e = await rejectsWith(client.runStep(run, 's', 'SELECT to_jsonb(2)'), ds.StepConflictError, 'DS422');
        assert.equal(e.httpStatus, 422);
    });

    test('DS409: nowait on a step another transaction holds', async () => {
        const run = env.unique('held');
        const conn = await pool.connect();
        try {
            await conn.query('BEGIN');
            await client.on(conn).runStep(run, 's', 'SELECT to_jsonb(1)');
            await rejectsWith(client.runStep(run, 's', 'SELECT to_jsonb(1)', { nowait: true }),
                ds.InProgressError, 'DS409');
            await conn.query('COMMIT');
        } finally {
            conn.release();
        }
    });

    test('DS404: waiting for a step that does not exist', async () => {
        await rejectsWith(client.waitStep(env.unique('none'), 's', 0), ds.StepNotFoundError, 'DS404');
    });

    test('42601: a body that does not parse', async () => {
        const e = await rejectsWith(client.runStep(env.unique('syntax'), 's', 'SELEC 1'), ds.SqlSyntaxError, '42601');
        assert.match(e.message, /syntax error/);
    });

    test('22023: an empty run id', async () => {
        await rejectsWith(client.runStep('', 's', 'SELECT 1'), ds.InvalidParameterValueError, '22023');
    });

    test('42501: an HTTP step by a role without durable_steps_http', async () => {
        // a role of the connection's user that lacks it, taken for one transaction (SET LOCAL
        // ROLE: nothing stays on the server connection behind PgBouncer)
        execFileSync('sh', ['-c', env.ADMIN_PSQL], {
            input: `DO $$ BEGIN
                        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'node_client_no_http') THEN
                            CREATE ROLE node_client_no_http NOLOGIN;
                        END IF;
                    END $$;
                    GRANT node_client_no_http TO ${env.connection().user};`,
        });
        const conn = await pool.connect();
        try {
            await conn.query('BEGIN');
            await conn.query('SET LOCAL ROLE node_client_no_http');
            await rejectsWith(client.on(conn).httpStep(env.unique('noperm'), 'charge', { url: `${env.PROVIDER}/charge/x` }),
                ds.InsufficientPrivilegeError, '42501');
        } finally {
            await conn.query('ROLLBACK');
            conn.release();
        }
    });

    test('54000: an input over durable_steps.max_input_size', async () => {
        const e = await rejectsWith(client.runStep(env.unique('big'), 's', 'SELECT $1', { input: { pad: 'x'.repeat(1_100_000) } }),
            ds.ProgramLimitExceededError, '54000');
        assert.equal(e.httpStatus, 413);
    });

    test('42883: a workflow that does not exist', async () => {
        await rejectsWith(client.startRun('no_such_workflow_here'), ds.UndefinedFunctionError, '42883');
    });

    test('DS102: a step that has not succeeded, unwrapped', async () => {
        // ds_unwrap has no call of its own: it is SQL over a step; its error still maps
        const run = env.unique('unwrap');
        await client.runStep(run, 's', 'SELECT to_jsonb(1)', { defer: true, runAt: new Date(Date.now() + 3_600_000) });
        const e = await pool.query(`SELECT ds_unwrap(ds_wait_step($1, 's', '0 s'))`, [run]).then(
            () => null, ds.toDurableStepsError);
        assert.ok(e instanceof ds.StepNotSucceededError, String(e));
    });

    test('every class answers the HTTP status docs/reference.md lists for its SQLSTATE', async () => {
        const { readFile } = await import('node:fs/promises');
        const text = await readFile(new URL('../../../docs/reference.md', import.meta.url), 'utf8');
        const section = text.slice(text.indexOf('### HTTP statuses\n'));
        const statuses = new Map();
        for (const line of section.slice(0, section.indexOf('\n#', 1) >>> 0).split('\n')) {
            const m = /^\| (\d{3}) \| (.*) \|$/.exec(line);
            for (const code of m ? m[2].matchAll(/`([0-9A-Z]{5})`/g) : []) {
                statuses.set(code[1], Number(m[1]));
            }
        }
        assert.ok(statuses.size >= 40, String(statuses.size));
        const wrong = [];
        for (const [code, cls] of ds.ERRORS_BY_SQLSTATE) {
            if (cls.httpStatus !== statuses.get(code)) {
                wrong.push(`${code}: ${cls.httpStatus}, documented ${statuses.get(code)}`);
            }
        }
        assert.deepEqual(wrong, []);
    });

    test('every documented SQLSTATE has its class', () => {
        for (const code of ['DS001', 'DS002', 'DS003', 'DS004', 'DS005', 'DS006', 'DS007', 'DS010', 'DS011',
            'DS012', 'DS013', 'DS014', 'DS101', 'DS102', 'DS103', 'DS104', 'DS105', 'DS106', 'DS201', 'DS404', 'DS408', 'DS410', 'DS426',
            'DS409', 'DS422', '21000', '22004', '22023', '25001', '25006', '2D000', '42501', '42601', '42710', '42723', '42804',
            '42809', '42883', '54000', '55000', '57014']) {
            const cls = ds.ERRORS_BY_SQLSTATE.get(code);
            assert.ok(cls, code);
            assert.equal(cls.sqlstate, code);
        }
        // an error not from the server is left as it is
        const lost = new Error('Connection terminated unexpectedly');
        assert.equal(ds.toDurableStepsError(lost), lost);
    });
});
