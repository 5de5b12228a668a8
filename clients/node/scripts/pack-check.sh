#!/usr/bin/env bash
# The package an application installs: `npm pack` makes the tarball (the built ES module and
# CommonJS code and their declarations, the sources, the README), a scratch application outside
# this tree installs it with npm -- offline, from the npm cache ./build filled -- and both its
# builds run a step against the cluster of examples/run-tests (DS_PGHOST, DS_PGPORT, ...).
# Run by ./test after the build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache=${DS_EXAMPLES_CACHE:?DS_EXAMPLES_CACHE is not set (examples/run-tests sets it)}/clients-node
work=$(mktemp -d "${TMPDIR:-/tmp}/durable_steps_pack.XXXXXX")
trap 'rm -rf "$work"' EXIT

tarball=$(npm pack --silent --pack-destination "$work" | tail -n 1)
listing=$(tar -tzf "$work/$tarball")
for f in package/dist/esm/index.js package/dist/esm/index.d.ts package/dist/cjs/index.js \
         package/dist/cjs/index.d.ts package/dist/esm/workflow.js package/README.md package/package.json; do
    grep -qx "$f" <<<"$listing" || { echo "not ok - npm pack: $tarball lacks $f"; exit 1; }
done
echo "ok - npm pack: $tarball holds the ES module and CommonJS builds and their declarations"

# the tarball installed offline (it has no dependencies of its own); pg, an optional peer
# dependency, is the application's: here the one ./build installed from the lock file
modules=$(readlink -f node_modules)
mkdir "$work/app"
cd "$work/app"
npm init -y >/dev/null
npm install --offline --no-audit --no-fund --no-update-notifier --cache "$cache/npm" \
    "$work/$tarball" >/dev/null
ln -s "$modules/pg" node_modules/pg
cat >esm.mjs <<'JS'
import { DurableSteps, workflow } from 'durable-steps';
import pg from 'pg';
const pool = new pg.Pool({ host: process.env.DS_PGHOST, port: Number(process.env.DS_PGPORT),
                           database: process.env.DS_PGDATABASE, user: process.env.DS_PGUSER });
const run = `pack-esm-${process.pid}-${Date.now()}`;
const step = await new DurableSteps(pool).runStep(run, 's', 'SELECT 41 + 1');
await pool.end();
if (step.status !== 'succeeded' || step.result !== 42 || typeof workflow !== 'function') {
    throw new Error(`unexpected: ${JSON.stringify(step)}`);
}
JS
cat >cjs.cjs <<'JS'
const { DurableSteps } = require('durable-steps');
const pg = require('pg');
const pool = new pg.Pool({ host: process.env.DS_PGHOST, port: Number(process.env.DS_PGPORT),
                           database: process.env.DS_PGDATABASE, user: process.env.DS_PGUSER });
new DurableSteps(pool).runStep(`pack-cjs-${process.pid}-${Date.now()}`, 's', 'SELECT 41 + 1')
    .then((step) => {
        if (step.status !== 'succeeded' || step.result !== 42) {
            throw new Error(`unexpected: ${JSON.stringify(step)}`);
        }
        return pool.end();
    })
    .catch((e) => { console.error(e); process.exit(1); });
JS
node esm.mjs
node cjs.cjs
echo "ok - npm pack: a scratch application installs the tarball and runs a step with its ES module and CommonJS builds"
