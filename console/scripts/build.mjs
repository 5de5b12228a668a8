// Builds dist/esm (ES modules) and dist/cjs (CommonJS) from src/ with tsc, each with its .d.ts
// files, and marks each directory's module kind with a package.json of its own, as the client
// library's build does (clients/node/scripts/build.mjs).
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
rmSync(join(root, 'dist'), { recursive: true, force: true });
for (const [config, dir, type] of [['tsconfig.json', 'esm', 'module'], ['tsconfig.cjs.json', 'cjs', 'commonjs']]) {
    execFileSync(process.execPath, [tsc, '-p', join(root, config)], { stdio: 'inherit', cwd: root });
    mkdirSync(join(root, 'dist', dir), { recursive: true });
    writeFileSync(join(root, 'dist', dir, 'package.json'), JSON.stringify({ type }) + '\n');
}
chmodSync(join(root, 'dist', 'esm', 'main.js'), 0o755);
