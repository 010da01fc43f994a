/**
 * `npm run bench -- <name> [...]`: runs benchmarks from bench/<name>.ts (each exports
 * `run(): Promise<string>` returning Markdown) against the services of `npm run services:up`, and
 * prints their results. Without a name, lists them. Record results in bench/RESULTS.md.
 */
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const available = readdirSync(here)
  // lib, run and support files are shared code, not benchmarks.
  .filter((f) => f.endsWith('.ts') && !['run.ts', 'lib.ts', 'support.ts'].includes(f) && !f.endsWith('-support.ts'))
  .map((f) => f.slice(0, -3));
const names = process.argv.slice(2);
if (names.length === 0) {
  console.log(`usage: npm run bench -- <${available.join('|')}> ...`);
  process.exit(0);
}
for (const name of names) {
  if (!available.includes(name)) {
    console.error(`unknown benchmark ${name}; available: ${available.join(', ')}`);
    process.exit(2);
  }
  const mod = (await import(pathToFileURL(path.join(here, `${name}.ts`)).href)) as { run(): Promise<string> };
  console.log(`## ${name}\n\n${await mod.run()}\n`);
}
