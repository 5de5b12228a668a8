// The console's stylesheet and its one script, served by the console itself (the pages' Content
// Security Policy allows scripts and styles of the console's own origin only, none inline).

const CSS = `
:root { color-scheme: light; --fg: #1b1f24; --muted: #5f6b76; --line: #d8dee4; --bg: #f6f8fa; --accent: #1565c0; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #fff; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1.2em; background: #0d2538; color: #fff; }
header a { color: #cfe3f7; text-decoration: none; }
header a[aria-current] { color: #fff; font-weight: 600; border-bottom: 2px solid #fff; }
header .brand { color: #fff; font-weight: 700; }
header nav { display: flex; gap: 1em; flex: 1; }
header .mode { font-size: 12px; color: #9fb6cc; }
main { padding: 1em 1.2em 3em; max-width: 1400px; }
h1 { font-size: 20px; margin: .3em 0 .6em; }
h2 { font-size: 16px; margin: 1.4em 0 .5em; }
h3 { font-size: 14px; margin: 1em 0 .3em; color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .35em .6em; border-bottom: 1px solid var(--line); }
th { font-weight: 600; color: var(--muted); background: var(--bg); }
td.detail { max-width: 28em; overflow-wrap: anywhere; font-size: 12px; }
code, pre, .id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
pre { background: var(--bg); border: 1px solid var(--line); padding: .5em; white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
.none { color: var(--muted); }
.status { display: inline-block; padding: 0 .5em; border-radius: 1em; font-size: 12px; background: #e3e8ee; }
.s-succeeded, .s-completed, .s-done { background: #d7f0dc; } .s-running, .s-pending, .s-held, .s-waiting { background: #dbe9fb; }
.s-retrying, .s-retryable { background: #fdf0c4; } .s-blocked, .s-correctable { background: #ead9f5; }
.s-uncertain { background: #fde1c8; } .s-failed, .s-permanent, .s-exhausted { background: #f9d6d5; }
.cards { display: flex; flex-wrap: wrap; gap: .8em; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: .6em 1em; min-width: 9em; color: var(--fg); text-decoration: none; }
.card b { display: block; font-size: 22px; }
.card.attention b { color: #8e24aa; }
.chart { width: 100%; height: 120px; background: var(--bg); border: 1px solid var(--line); }
figure { margin: 0; } figcaption { color: var(--muted); font-size: 12px; } .key { margin-right: .8em; }
.columns { display: grid; grid-template-columns: minmax(18em, 1fr) 2fr; gap: 1.5em; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; margin: 0; } dt { color: var(--muted); } dd { margin: 0; overflow-wrap: anywhere; }
.actions { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
form.action { border: 1px solid var(--line); border-radius: 6px; padding: .6em; display: flex; flex-direction: column; gap: .4em; }
form.action textarea, label textarea { display: block; width: 32em; max-width: 100%; font-family: ui-monospace, monospace; }
button { font: inherit; padding: .3em 1em; border-radius: 4px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
button.danger { background: #b3261e; border-color: #b3261e; }
.filters a, .pager a { margin-right: .8em; } .filters a[aria-current] { font-weight: 700; }
.timeline { list-style: none; padding: 0; } .timeline li { padding: .4em 0; border-bottom: 1px solid var(--line); }
.timeline .span { display: block; width: 100%; height: 6px; margin: .3em 0; background: var(--bg); }
.timeline .times, .timeline .kind { color: var(--muted); font-size: 12px; }
.ok { color: #2e7d32; font-weight: 600; } .refused { color: #b3261e; font-weight: 600; } .confirm { font-size: 16px; }
.lead { color: var(--muted); }
`;

// Live pages: every data-refresh seconds, while the tab is visible and no form on the page is
// being filled in, the page's <main> is fetched again (the server answers the fragment alone to
// X-Console-Fragment: 1) and put in place: HTML the server escaped, as on the first load.
const JS = `
(function () {
  var main = document.getElementById('live');
  if (!main) return;
  var every = Number(main.getAttribute('data-refresh')) || 0;
  if (every < 2) return;
  function editing() {
    var a = document.activeElement;
    if (a && a.form) return true;
    var fields = main.querySelectorAll('textarea, input[type=text]');
    for (var i = 0; i < fields.length; i++) if (fields[i].value !== fields[i].defaultValue) return true;
    return false;
  }
  function tick() {
    if (document.hidden || editing()) return schedule();
    fetch(location.href, { headers: { 'X-Console-Fragment': '1' }, credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text !== null && !editing()) { main.innerHTML = text; main.setAttribute('data-refreshed', String(Date.now())); }
      })
      .catch(function () {})
      .then(schedule);
  }
  function schedule() { setTimeout(tick, every * 1000); }
  schedule();
})();
`;

export const ASSETS: Record<string, { type: string; body: string }> = {
    'console.css': { type: 'text/css; charset=utf-8', body: CSS },
    'console.js': { type: 'text/javascript; charset=utf-8', body: JS },
};
