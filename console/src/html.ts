// HTML made only by the `html` template: every interpolated value is text, escaped, unless it is
// already Html (made by this module). Step text -- SQL, input, errors, HTTP bodies and headers,
// run ids -- is written by any role and so is untrusted: it reaches a page only through here.

/** A piece of HTML that is safe to put in a page as it is. */
export class Html {
    constructor(readonly text: string) {}
    toString(): string {
        return this.text;
    }
}

const ESCAPES: Record<string, string> = {
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;', '`': '&#96;',
};

/** Text as HTML text: safe in element content and in a quoted attribute. */
export function escape(value: unknown): string {
    return String(value).replace(/[&<>"'`]/g, (c) => ESCAPES[c]);
}

type Part = Html | string | number | boolean | null | undefined | Part[];

function render(part: Part): string {
    if (part === null || part === undefined || part === false) {
        return '';
    }
    if (part instanceof Html) {
        return part.text;
    }
    if (Array.isArray(part)) {
        return part.map(render).join('');
    }
    return escape(part);
}

/** The template of every page: html`<p>${untrusted}</p>` escapes `untrusted`. */
export function html(strings: TemplateStringsArray, ...values: Part[]): Html {
    let out = strings[0];
    for (let i = 0; i < values.length; i++) {
        out += render(values[i]) + strings[i + 1];
    }
    return new Html(out);
}

/** A JSON value shown as indented text (escaped). */
export function json(value: unknown): Html {
    if (value === null || value === undefined) {
        return html`<span class="none">null</span>`;
    }
    return html`<pre class="json">${JSON.stringify(value, null, 2)}</pre>`;
}

/** A timestamp as text, in UTC, to the millisecond; a dash for none. */
export function time(value: Date | string | null | undefined): Html {
    if (value === null || value === undefined) {
        return html`<span class="none">–</span>`;
    }
    const d = value instanceof Date ? value : new Date(value);
    if (Number.isNaN(d.getTime())) {
        return html`${String(value)}`;
    }
    return html`<time datetime="${d.toISOString()}">${d.toISOString().replace('T', ' ').replace('Z', '')}</time>`;
}

