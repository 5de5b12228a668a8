// The console's pages: functions from what the queries read to HTML, every value through the
// `html` template (html.ts), so that no text of a step is ever markup.

import { Html, html, json, time } from './html.js';
import { PAGE, type Page, type Row } from './queries.js';

/** What every page is rendered with. */
export interface View {
    /** the mount path, '' at the root */
    base: string;
    /** actions enabled */
    actions: boolean;
    /** the CSRF token of this browser (the form field `csrf`) */
    csrf: string;
    /** the seconds between refreshes of a live page */
    refresh: number;
}

const NAV: [string, string][] = [
    ['/', 'Overview'], ['/inbox', 'Needs a person'], ['/runs', 'Runs'], ['/tasks', 'Tasks'],
    ['/schedules', 'Schedules'], ['/keys', 'Idempotency keys'],
];

/** A whole page: the frame around `body`. `live`: refreshed in place every v.refresh seconds. */
export function layout(v: View, title: string, current: string, body: Html, live = true): Html {
    return html`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · durable_steps</title>
<link rel="stylesheet" href="${v.base}/assets/console.css">
<script src="${v.base}/assets/console.js" defer></script>
</head><body>
<header><a class="brand" href="${v.base}/">durable_steps</a><nav>${NAV.map(([href, label]) =>
        html`<a href="${v.base}${href}"${current === href ? html` aria-current="page"` : ''}>${label}</a>`)}</nav>
<span class="mode">${v.actions ? 'actions enabled' : 'read-only'}</span></header>
<main id="live" data-refresh="${live ? v.refresh : 0}">${body}</main>
</body></html>`;
}

function badge(status: string | null | undefined): Html {
    return html`<span class="status s-${status ?? 'none'}">${status ?? '–'}</span>`;
}

/** A step's page: its ids in the query string, whatever they hold ('.', '/', '%'). */
export function stepHref(v: View, runId: string, stepId: string): string {
    return `${v.base}/step?${new URLSearchParams({ run: runId, step: stepId }).toString()}`;
}

export function runHref(v: View, runId: string): string {
    return `${v.base}/run?${new URLSearchParams({ id: runId }).toString()}`;
}

function stepLink(v: View, runId: string, stepId: string): Html {
    return html`<a class="id" href="${stepHref(v, runId, stepId)}">${runId} / ${stepId}</a>`;
}

function runLink(v: View, runId: string): Html {
    return html`<a class="id" href="${runHref(v, runId)}">${runId}</a>`;
}

function pager(v: View, route: string, params: Record<string, string | null>, offset: number, p: Page): Html {
    const link = (o: number, label: string) => {
        const q = new URLSearchParams();
        for (const [k, val] of Object.entries(params)) {
            if (val) {
                q.set(k, val);
            }
        }
        q.set('offset', String(o));
        return html`<a href="${v.base}${route}?${q.toString()}">${label}</a>`;
    };
    return html`<p class="pager">${offset > 0 ? link(Math.max(0, offset - PAGE), '← newer') : ''}
 ${p.more ? link(offset + p.rows.length, 'older →') : ''}</p>`;
}

function filters(v: View, route: string, name: string, values: string[], current: string | null): Html {
    return html`<p class="filters">${[null, ...values].map((value) => html`<a href="${v.base}${route}${value ? `?${name}=${encodeURIComponent(value)}` : ''}"${value === current ? html` aria-current="true"` : ''}>${value ?? 'all'}</a> `)}</p>`;
}

/** A form that posts an action: the confirmation page comes first. */
function actionForm(v: View, name: string, label: string, fields: Record<string, string>, extra: Html = html``,
    danger = false): Html {
    if (!v.actions) {
        return html``;
    }
    return html`<form class="action" method="post" action="${v.base}/actions/${name}">
<input type="hidden" name="csrf" value="${v.csrf}">${Object.entries(fields).map(([k, val]) =>
        html`<input type="hidden" name="${k}" value="${val}">`)}${extra}
<button type="submit"${danger ? html` class="danger"` : ''}>${label}</button></form>`;
}

// ---- overview ----------------------------------------------------------------------------------

const CLASS_COLOURS: Record<string, string> = {
    completed: '#2e7d32', retryable: '#f9a825', correctable: '#6a1b9a', permanent: '#c62828',
    cancelled: '#757575', uncertain: '#ef6c00',
};

/** Attempts by class per minute over the last hour: stacked bars, drawn with SVG attributes. */
function chart(rows: Row[]): Html {
    const now = Date.now();
    const start = Math.floor(now / 60000) * 60000 - 59 * 60000;
    const minutes = new Map<number, Map<string, number>>();
    for (const r of rows) {
        const m = minutes.get(Number(r.minute)) ?? new Map<string, number>();
        m.set(r.class, (m.get(r.class) ?? 0) + Number(r.n));
        minutes.set(Number(r.minute), m);
    }
    let max = 1;
    for (const m of minutes.values()) {
        max = Math.max(max, [...m.values()].reduce((a, b) => a + b, 0));
    }
    const bars: Html[] = [];
    for (let i = 0; i < 60; i++) {
        const m = minutes.get(start + i * 60000);
        let y = 100;
        for (const cls of Object.keys(CLASS_COLOURS)) {
            const n = m?.get(cls) ?? 0;
            if (n > 0) {
                const h = (n / max) * 100;
                y -= h;
                bars.push(html`<rect x="${i * 10}" y="${y.toFixed(2)}" width="9" height="${h.toFixed(2)}" fill="${CLASS_COLOURS[cls]}"><title>${new Date(start + i * 60000).toISOString().slice(11, 16)} UTC: ${n} ${cls}</title></rect>`);
            }
        }
    }
    const total = rows.reduce((a, r) => a + Number(r.n), 0);
    return html`<figure><svg class="chart" viewBox="0 0 600 100" preserveAspectRatio="none" role="img" aria-label="attempts by class per minute, last hour">${bars}</svg>
<figcaption>${total} attempts in the last hour, most ${max} in a minute · ${Object.entries(CLASS_COLOURS).map(([cls, colour]) =>
        html`<span class="key"><svg width="10" height="10"><rect width="10" height="10" fill="${colour}"/></svg> ${cls}</span> `)}</figcaption></figure>`;
}

export function overview(v: View, d: {
    queues: Row[]; attention: Row[]; oldest: Date | null; attempts: Row[] | null; runs: Row[]; workers: Row[]; taskWorkers: Row[];
}): Html {
    const count = (rows: Row[], status: string) => rows.find((r) => r.status === status)?.n ?? 0;
    const due = d.queues.reduce((a, q) => a + Number(q.due ?? 0), 0);
    return html`<h1>Overview</h1>
<section class="cards">
${['blocked', 'uncertain', 'failed'].map((s) => html`<a class="card attention" href="${v.base}/inbox?status=${s}"><b>${count(d.attention, s)}</b> ${s}</a>`)}
<div class="card"><b>${due}</b> due now</div>
<div class="card"><b>${d.oldest ? Math.round((Date.now() - new Date(d.oldest).getTime()) / 1000) + ' s' : '–'}</b> oldest wait</div>
${['running', 'waiting', 'blocked', 'pending'].map((s) => html`<a class="card" href="${v.base}/runs?status=${s}"><b>${count(d.runs, s)}</b> runs ${s}</a>`)}
</section>
<h2>Attempts, last hour</h2>${d.attempts === null
        ? html`<p class="none">The chart reads the server's counters (ds_attempt_minutes()): members of pg_monitor or durable_steps_admin may.</p>`
        : chart(d.attempts)}
<h2>Queues</h2>
<table><thead><tr><th>queue</th><th>limit</th><th>running</th><th>due</th><th>scheduled</th><th>configured</th>${v.actions ? html`<th></th>` : ''}</tr></thead><tbody>
${d.queues.map((q) => html`<tr><td>${q.queue}</td><td>${q.concurrency === null ? 'none' : q.concurrency === 0 ? html`<b>paused</b>` : q.concurrency}</td><td>${q.running}</td><td>${q.due}</td><td>${q.scheduled}</td><td>${time(q.updated_at)}</td>
${v.actions ? html`<td>${q.concurrency === 0
        ? actionForm(v, 'set-queue', 'resume', { queue: q.queue, concurrency: '' })
        : actionForm(v, 'set-queue', 'pause', { queue: q.queue, concurrency: '0' }, html``, true)}</td>` : ''}</tr>`)}
</tbody></table>
<h2>Workers</h2>
${d.workers.length === 0 ? html`<p class="none">No worker process is visible to this role (pg_monitor members see them all).</p>` : html`
<table><thead><tr><th>process</th><th>pid</th><th>database</th><th>state</th><th>waiting on</th><th>since</th></tr></thead><tbody>
${d.workers.map((w) => html`<tr><td>${w.backend_type}</td><td>${w.pid}</td><td>${w.datname}</td><td>${w.state}</td><td>${w.wait_event}</td><td>${time(w.backend_start)}</td></tr>`)}
</tbody></table>`}
<h3>Task workers</h3>
${d.taskWorkers.length === 0 ? html`<p class="none">No task is running.</p>` : html`<table><thead><tr><th>worker</th><th>running</th><th>first lease ends</th></tr></thead><tbody>
${d.taskWorkers.map((w) => html`<tr><td>${w.worker}</td><td>${w.running}</td><td>${time(w.lease_until)}</td></tr>`)}</tbody></table>`}`;
}

// ---- the inbox -----------------------------------------------------------------------------------

export function inbox(v: View, p: Page, status: string | null, offset: number): Html {
    return html`<h1>Needs a person</h1>
<p class="lead">Blocked steps wait for corrected input, uncertain ones for a finding, failed ones for a decision; a run waits with them.</p>
${filters(v, '/inbox', 'status', ['blocked', 'uncertain', 'failed'], status)}
${p.rows.length === 0 ? html`<p class="none">Nothing needs a person.</p>` : html`<table><thead><tr><th>status</th><th>step</th><th>kind</th><th>attempt</th><th>error</th><th>remediation</th><th>run</th><th>since</th></tr></thead><tbody>
${p.rows.map((r) => html`<tr><td>${badge(r.status)}</td><td>${stepLink(v, r.run_id, r.step_id)}</td><td>${r.kind}</td><td>${r.attempt}/${r.max_attempts}</td>
<td><code>${r.error_code}</code> ${r.error_message}</td><td>${r.remediation}</td>
<td>${r.workflow ? html`${runLink(v, r.run_id)} ${r.workflow} ${badge(r.run_status)}` : ''}</td><td>${time(r.updated_at)}</td></tr>`)}
</tbody></table>`}
${pager(v, '/inbox', { status }, offset, p)}`;
}

// ---- a step ------------------------------------------------------------------------------------

function field(label: string, value: Html | string | number | null | undefined): Html {
    return html`<dt>${label}</dt><dd>${value === null || value === undefined || value === '' ? html`<span class="none">–</span>` : value}</dd>`;
}

function textarea(name: string, label: string, value: string): Html {
    return html`<label>${label}<textarea name="${name}" rows="4">${value}</textarea></label>`;
}

export function step(v: View, d: { step: Row; attempts: Row[]; run: Row | null }): Html {
    const s = d.step;
    const ids = { run_id: s.run_id, step_id: s.step_id };
    const rearmable = ['failed', 'blocked', 'uncertain', 'cancelled'].includes(s.status);
    const response = s.kind === 'http' ? (s.result ?? (s.error_detail ? tryJson(s.error_detail) : null)) : null;
    return html`<h1>Step <span class="id">${s.run_id} / ${s.step_id}</span> ${badge(s.status)}</h1>
${d.run ? html`<p>Run ${runLink(v, s.run_id)}: ${d.run.workflow} ${badge(d.run.status)}</p>` : ''}
<section class="columns"><dl>
${field('kind', s.kind)}${field('attempt', `${s.attempt} of ${s.max_attempts}`)}${field('next attempt', time(s.next_attempt_at))}
${field('queue', s.queue)}${field('priority', s.priority)}${field('owner', s.owner)}
${field('task', s.task)}${field('worker', s.worker)}${field('lease until', s.lease_expires_at ? time(s.lease_expires_at) : null)}
${field('error class', s.error_class)}${field('SQLSTATE', s.error_code ? html`<code>${s.error_code}</code>` : null)}
${field('error', s.error_message)}${field('detail', s.error_detail)}${field('remediation', s.remediation)}
${field('created', time(s.created_at))}${field('updated', time(s.updated_at))}${field('finished', time(s.finished_at))}
</dl><div>
${s.sql !== null ? html`<h3>SQL</h3><pre class="sql">${s.sql}</pre>` : ''}
${s.input !== null ? html`<h3>Input</h3>${json(s.input)}` : ''}
${s.request !== null ? html`<h3>Request</h3>${json(s.request)}${s.idempotency_header ? html`<p>idempotency header <code>${s.idempotency_header}</code></p>` : ''}` : ''}
${response !== null ? html`<h3>Response</h3>${json(response)}` : ''}
${s.kind !== 'http' && s.result !== null ? html`<h3>Result</h3>${json(s.result)}` : ''}
<h3>Policy</h3>${json(s.policy)}
${s.on_success || s.on_failure ? html`<h3>Hooks</h3>${s.on_success ? html`<p>on_success</p><pre class="sql">${s.on_success}</pre>` : ''}${s.on_failure ? html`<p>on_failure</p><pre class="sql">${s.on_failure}</pre>` : ''}` : ''}
</div></section>
${v.actions ? html`<h2>Actions</h2><div class="actions">
${rearmable ? actionForm(v, 'rearm', 'Re-arm', ids, html`${s.kind !== 'http' && s.kind !== 'task' ? textarea('sql', 'corrected SQL (empty: as defined)', '') : ''}
${s.kind !== 'http' ? textarea('input', 'corrected input, JSON (empty: as defined)', s.input === null ? '' : JSON.stringify(s.input)) : ''}
${s.kind === 'http' && s.status !== 'uncertain' ? textarea('request', 'corrected request, JSON (empty: as defined)', '') : ''}`) : ''}
${s.status === 'uncertain' ? html`${actionForm(v, 'resolve', 'Resolve as succeeded', { ...ids, status: 'succeeded' }, textarea('result', 'its result, JSON', ''))}
${actionForm(v, 'resolve', 'Resolve as failed', { ...ids, status: 'failed' }, html``, true)}` : ''}
${['pending', 'retrying', 'running', 'blocked', 'uncertain'].includes(s.status) ? actionForm(v, 'cancel-step', 'Cancel the step', ids, html``, true) : ''}
</div>` : ''}
<h2>Attempts</h2>
${d.attempts.length === 0 ? html`<p class="none">No attempt.</p>` : html`<table><thead><tr><th>#</th><th>class</th><th>SQLSTATE</th><th>message</th><th>detail</th><th>claimed</th><th>started</th><th>finished</th><th>duration</th><th>executor</th><th>role</th><th>keys</th></tr></thead><tbody>
${d.attempts.map((a) => html`<tr><td>${a.attempt}</td><td>${badge(a.class ?? 'running')}</td><td><code>${a.error_code}</code></td><td>${a.error_message}</td><td class="detail">${a.error_detail}</td>
<td>${time(a.claimed_at)}</td><td>${time(a.started_at)}</td><td>${time(a.finished_at)}</td><td>${a.duration === null ? '' : intervalText(a.duration)}</td>
<td>${a.executor} ${a.backend_pid}</td><td>${a.role}</td><td class="detail">${a.idempotency_key ? html`<code>${a.idempotency_key}</code><br>` : ''}<code>${a.attempt_key}</code></td></tr>`)}
</tbody></table>`}`;
}

function tryJson(text: string): unknown {
    try {
        return JSON.parse(text);
    } catch {
        return text;
    }
}

/** node-postgres's interval object, or text, as text. */
function intervalText(value: unknown): string {
    if (value && typeof value === 'object') {
        const i = value as Record<string, number>;
        const ms = ((i.hours ?? 0) * 3600 + (i.minutes ?? 0) * 60 + (i.seconds ?? 0)) * 1000 + (i.milliseconds ?? 0);
        return `${ms.toFixed(1)} ms`;
    }
    return String(value);
}

// ---- runs --------------------------------------------------------------------------------------

export function runs(v: View, p: Page, status: string | null, offset: number): Html {
    return html`<h1>Runs</h1>
${filters(v, '/runs', 'status', ['pending', 'running', 'waiting', 'blocked', 'succeeded', 'failed', 'cancelled'], status)}
${p.rows.length === 0 ? html`<p class="none">No run.</p>` : html`<table><thead><tr><th>run</th><th>workflow</th><th>status</th><th>current step</th><th>waiting for</th><th>wakes</th><th>turns</th><th>error</th><th>created</th></tr></thead><tbody>
${p.rows.map((r) => html`<tr><td>${runLink(v, r.run_id)}</td><td>${r.workflow}</td><td>${badge(r.status)}</td><td>${r.current_step}</td>
<td>${r.wait_reason}${r.wait_event ? html` <code>${r.wait_event}</code>` : ''}</td><td>${time(r.next_wake_at)}</td><td>${r.turns}</td>
<td><code>${r.error_code}</code> ${r.error_message}</td><td>${time(r.created_at)}</td></tr>`)}
</tbody></table>`}
${pager(v, '/runs', { status }, offset, p)}`;
}

export function run(v: View, d: { run: Row; steps: Row[] }): Html {
    const r = d.run;
    const finished = ['succeeded', 'failed', 'cancelled'].includes(r.status);
    const t0 = d.steps.length ? new Date(d.steps[0].created_at).getTime() : 0;
    const t1 = Math.max(t0 + 1, ...d.steps.map((s) => new Date(s.finished_at ?? s.updated_at).getTime()));
    return html`<h1>Run <span class="id">${r.run_id}</span> ${badge(r.status)}</h1>
<section class="columns"><dl>
${field('workflow', r.workflow)}${field('run key', r.run_key)}${field('owner', r.owner)}${field('turns', r.turns)}
${field('current step', r.current_step)}${field('waiting for', r.wait_reason)}${field('event', r.wait_event)}${field('wakes', time(r.next_wake_at))}
${field('SQLSTATE', r.error_code ? html`<code>${r.error_code}</code>` : null)}${field('error', r.error_message)}${field('detail', r.error_detail)}
${field('created', time(r.created_at))}${field('updated', time(r.updated_at))}${field('finished', time(r.finished_at))}
</dl><div><h3>Input</h3>${json(r.input)}${r.output !== null ? html`<h3>Output</h3>${json(r.output)}` : ''}</div></section>
${v.actions ? html`<div class="actions">${!finished ? actionForm(v, 'cancel-run', 'Cancel the run', { run_id: r.run_id }, html``, true) : ''}
${['failed', 'blocked', 'waiting'].includes(r.status) ? actionForm(v, 'resume-run', 'Resume the run', { run_id: r.run_id }) : ''}</div>` : ''}
<h2>Timeline</h2>
${d.steps.length === 0 ? html`<p class="none">No step yet.</p>` : html`<ol class="timeline">
${d.steps.map((s) => {
        const a = new Date(s.created_at).getTime();
        const b = new Date(s.finished_at ?? s.updated_at).getTime();
        return html`<li>${badge(s.status)} <a class="id" href="${stepHref(v, r.run_id, s.step_id)}">${s.step_id}</a> <span class="kind">${s.kind}</span>
${s.event ? html` event <code>${s.event}</code>` : ''} ${s.attempt > 0 ? html`attempt ${s.attempt}/${s.max_attempts}` : ''}
${s.error_code ? html` <code>${s.error_code}</code> ${s.error_message}` : ''}${s.remediation ? html` — ${s.remediation}` : ''}
<svg class="span" viewBox="0 0 1000 6" preserveAspectRatio="none"><rect x="${(((a - t0) / (t1 - t0)) * 1000).toFixed(1)}" y="0" width="${Math.max(2, ((b - a) / (t1 - t0)) * 1000).toFixed(1)}" height="6" fill="#1565c0"/></svg>
<span class="times">${time(s.created_at)} → ${time(s.finished_at)}</span></li>`;
    })}</ol>`}`;
}

// ---- tasks, schedules, keys ----------------------------------------------------------------------

export function tasks(v: View, p: Page, offset: number): Html {
    return html`<h1>Tasks</h1>
<p class="lead">Tasks waiting for a worker of the application, and those a worker holds under a lease; a worker's heartbeat moves its lease on.</p>
${p.rows.length === 0 ? html`<p class="none">No task is waiting or running.</p>` : html`<table><thead><tr><th>step</th><th>task</th><th>status</th><th>worker</th><th>lease until</th><th>attempt</th><th>due</th><th>queue</th><th>on lost</th><th>updated</th></tr></thead><tbody>
${p.rows.map((r) => html`<tr><td>${stepLink(v, r.run_id, r.step_id)}</td><td>${r.task}</td><td>${badge(r.status)}</td><td>${r.worker}</td><td>${time(r.lease_expires_at)}</td>
<td>${r.attempt}/${r.max_attempts}</td><td>${time(r.next_attempt_at)}</td><td>${r.queue}</td><td>${r.on_lost}</td><td>${time(r.updated_at)}</td></tr>`)}
</tbody></table>`}
${pager(v, '/tasks', {}, offset, p)}`;
}

export function schedules(_v: View, rows: Row[] | null): Html {
    return html`<h1>Schedules</h1>
${rows === null ? html`<p class="none">pg_cron is not installed in this database: no schedules.</p>`
        : rows.length === 0 ? html`<p class="none">No schedule.</p>` : html`<table><thead><tr><th>job</th><th>schedule</th><th>starts</th><th>next slot</th><th>last slot</th><th>last fired</th><th>backfill</th><th>owner</th></tr></thead><tbody>
${rows.map((r) => html`<tr><td>${r.job_name}</td><td><code>${r.schedule}</code></td><td>${r.workflow ? html`run of ${r.workflow}` : html`<pre class="sql">${r.sql}</pre>`}${r.input !== null ? json(r.input) : ''}</td>
<td>${time(r.next_slot)}</td><td>${time(r.last_slot)}</td><td>${time(r.last_fired_at)}</td><td>${String(r.backfill)}</td><td>${r.owner}</td></tr>`)}
</tbody></table>`}`;
}

export function keys(v: View, p: Page, state: string | null, offset: number): Html {
    return html`<h1>Idempotency keys</h1>
<p class="lead">The keys of the console's role: held while a request works, done with its stored response.</p>
${filters(v, '/keys', 'state', ['held', 'done', 'expired'], state)}
${p.rows.length === 0 ? html`<p class="none">No key.</p>` : html`<table><thead><tr><th>scope</th><th>key</th><th>state</th><th>status</th><th>request</th><th>response</th><th>created</th><th>expires</th></tr></thead><tbody>
${p.rows.map((r) => html`<tr><td>${r.scope}</td><td><code>${r.key}</code></td><td>${badge(r.state)}</td><td>${r.status}</td><td>${json(r.request)}</td><td>${json(r.body)}</td><td>${time(r.created_at)}</td><td>${time(r.expires_at)}</td></tr>`)}
</tbody></table>`}
${pager(v, '/keys', { state }, offset, p)}`;
}

// ---- actions -----------------------------------------------------------------------------------

export function confirm(v: View, name: string, description: string, form: Record<string, string>): Html {
    return html`<h1>Confirm</h1>
<p class="confirm">You are about to ${description}.</p>
${Object.entries(form).filter(([k]) => k !== 'csrf' && k !== 'confirm' && form[k] !== '').map(([k, val]) =>
        html`<h3>${k}</h3><pre>${val}</pre>`)}
<form method="post" action="${v.base}/actions/${name}">
<input type="hidden" name="csrf" value="${v.csrf}"><input type="hidden" name="confirm" value="1">
${Object.entries(form).filter(([k]) => k !== 'csrf' && k !== 'confirm').map(([k, val]) => html`<input type="hidden" name="${k}" value="${val}">`)}
<button type="submit" class="danger">Confirm</button> <a href="${v.base}/">Cancel</a></form>`;
}

/** What an action came to: its answer, or the database's error as the database said it. */
export function outcome(_v: View, description: string, ok: boolean, message: string, error?: {
    code?: string; detail?: string; hint?: string;
}, back?: string): Html {
    return html`<h1>${ok ? 'Done' : 'Refused'}</h1>
<p class="${ok ? 'ok' : 'refused'}">${description}: ${message}</p>
${error?.code ? html`<p>SQLSTATE <code>${error.code}</code></p>` : ''}
${error?.detail ? html`<p class="detail">${error.detail}</p>` : ''}${error?.hint ? html`<p class="hint">${error.hint}</p>` : ''}
${back ? html`<p><a href="${back}">Back</a></p>` : ''}`;
}

export function notFound(v: View, what: string): Html {
    return html`<h1>Not found</h1><p>${what} does not exist, or this role may not see it.</p><p><a href="${v.base}/">Overview</a></p>`;
}
