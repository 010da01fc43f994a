/**
 * The measurement of bench/b1-slices.ts, in a process of its own: B1's transaction (one row into a
 * business table plus `enqueue()` of one 256-byte JSON event with NOTIFY, a fresh UUID key each)
 * run by the built code of two trees in ONE process, on two databases of one server, in
 * alternating slices: each tree's pool of `<clients>` connections runs for BENCH_SLICE_MS, then the
 * other's, the first of each pair alternating, BENCH_SLICES pairs after 1 s of warm-up each. Both
 * trees share this process's JIT, event loop, pg module and the server's state of the moment, so
 * a slice pair's ratio after / before leaves mostly the code's own difference.
 *
 * Prints `slice <before tx/s> <after tx/s>` per pair, then `done`.
 *
 * Usage: node --import tsx bench/processes/b1-slices-measure.ts <before tree> <after tree> <clients>
 * Environment: DATABASE_URL_BEFORE, DATABASE_URL_AFTER (empty databases: each tree migrates its
 * own), BENCH_SLICE_MS, BENCH_SLICES, BENCH_SYNC_COMMIT (`off`: the sessions commit without waiting
 * for the WAL flush).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import type * as Core from '../../src/index.js';
import { throughput } from '../lib.js';
import { b1Operation } from '../support.js';

const [beforeDir, afterDir, clientsArg] = process.argv.slice(2);
const clients = Number(clientsArg);
if (!beforeDir || !afterDir || !Number.isInteger(clients) || clients < 1)
  throw new Error('usage: b1-slices-measure.ts <before tree> <after tree> <clients>');
const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const sliceMs = Number(env('BENCH_SLICE_MS'));
const slices = Number(env('BENCH_SLICES'));

/** One tree's B1 transaction on its own migrated database, and its pool. */
async function side(tree: string, databaseUrl: string) {
  const pkg = JSON.parse(readFileSync(path.join(tree, 'package.json'), 'utf8')) as {
    exports: Record<string, { import: string }>;
  };
  const core = (await import(pathToFileURL(path.join(tree, pkg.exports['.']!.import)).href)) as typeof Core;
  await core.migrate({ connectionString: databaseUrl });
  const pool = new pg.Pool({
    connectionString: databaseUrl,
    max: clients,
    ...(process.env.BENCH_SYNC_COMMIT === 'off' ? { options: '-c synchronous_commit=off' } : {}),
  });
  return { op: await b1Operation(pool, core.createOutbox), pool };
}

const before = await side(beforeDir, env('DATABASE_URL_BEFORE'));
const after = await side(afterDir, env('DATABASE_URL_AFTER'));
try {
  // The JIT's first second, for each tree's code.
  await throughput(before.op, 1_000, clients);
  await throughput(after.op, 1_000, clients);
  for (let i = 0; i < slices; i++) {
    const rates = { before: 0, after: 0 };
    for (const label of i % 2 === 0 ? (['before', 'after'] as const) : (['after', 'before'] as const)) {
      rates[label] = await throughput((label === 'before' ? before : after).op, sliceMs, clients);
    }
    process.stdout.write(`slice ${rates.before} ${rates.after}\n`);
  }
  process.stdout.write('done\n');
} finally {
  await before.pool.end();
  await after.pool.end();
}
