/**
 * B1 in interleaved slices (`npm run bench -- b1-slices`): B1's transaction (one business row plus
 * `enqueue()` of one 256-byte event, NOTIFY on, a fresh key each) by the built code of the commit
 * before a change and of the code after it, both loaded in ONE process
 * (bench/processes/b1-slices-measure.ts) on two fresh databases of one server, in alternating
 * slices of BENCH_SLICE_MS. It resolves differences of a few per cent that
 * `npm run bench -- side-by-side` (a process per measurement, seconds apart) cannot on a noisy
 * machine: both trees meet the same disk flushes, JIT and load within a second of each other.
 *
 *   npm run bench -- b1-slices                                   (5d29141 before: advisory key locks)
 *   BENCH_BEFORE=ae61eb5 BENCH_CLIENTS=32 BENCH_SYNC_COMMIT=off npm run bench -- b1-slices
 *
 * - BENCH_BEFORE (default `5d29141`, the last commit whose `enqueue()` took a transaction-level
 *   advisory lock per key, before issue 17's row locks), BENCH_AFTER (default this checkout as it
 *   is): the trees, made and built as bench/side-by-side.ts does;
 * - BENCH_CLIENTS (default `1,32`): the client counts, one measurement process each;
 * - BENCH_SLICES (default 40) pairs of slices of BENCH_SLICE_MS (default 1,000) ms each, the first
 *   of a pair alternating between the trees;
 * - BENCH_SYNC_COMMIT=off: the sessions commit without waiting for the WAL flush (the code's own
 *   cost without the disk's).
 * Prints per client count each tree's median rate, the median of the per-pair ratios after /
 * before with its interquartile range, and PASS (≥ 0.95) or FAIL.
 */
import { median } from './lib.js';
import { f0, f2, f3, knob, loadAverage, log, root, startChild, stopChild, table, type Child } from './e2e-support.js';
import { builtTrees, describe, removeWorktree, type Tree } from './side-by-side.js';
import { benchDatabase, machine } from './support.js';
import path from 'node:path';

const TARGET = 0.95;
const BEFORE = process.env.BENCH_BEFORE || '5d29141';
const AFTER = process.env.BENCH_AFTER || undefined;
const SLICE_MS = knob('BENCH_SLICE_MS', 1_000);
const SLICES = knob('BENCH_SLICES', 40);
const CLIENTS = (process.env.BENCH_CLIENTS || '1,32').split(',').map(Number);
const CHILD = path.join(root, 'bench', 'processes', 'b1-slices-measure.ts');

/** The quantile `q` (0–1) of `xs`, by linear interpolation. */
function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  const at = (s.length - 1) * q;
  const lo = Math.floor(at);
  return s[lo]! + (s[Math.min(lo + 1, s.length - 1)]! - s[lo]!) * (at - lo);
}

/** One measurement process for `clients`: the per-pair rates of both trees. */
async function measure(before: Tree, after: Tree, clients: number): Promise<{ before: number[]; after: number[] }> {
  const dbs = [await benchDatabase({ migrated: false }), await benchDatabase({ migrated: false })];
  let child: Child | undefined;
  try {
    child = startChild(`B1 slices, ${clients} client(s)`, CHILD, [before.dir, after.dir, String(clients)], {
      DATABASE_URL_BEFORE: dbs[0]!.url,
      DATABASE_URL_AFTER: dbs[1]!.url,
      BENCH_SLICE_MS: String(SLICE_MS),
      BENCH_SLICES: String(SLICES),
    });
    const proc = child.proc;
    const code = await new Promise<number | null>((r) => proc.once('close', (c) => r(c)));
    const pairs = child.lines.filter((l) => l.startsWith('slice ')).map((l) => l.split(' ').slice(1).map(Number));
    if (code !== 0 || !child.lines.includes('done'))
      throw new Error(`${child.name} failed (exit ${code}):\n${child.lines.slice(-20).join('\n')}`);
    return { before: pairs.map((p) => p[0]!), after: pairs.map((p) => p[1]!) };
  } finally {
    if (child !== undefined) await stopChild(child);
    for (const db of dbs) await db.drop();
  }
}

export async function run(): Promise<string> {
  if (CLIENTS.some((c) => !Number.isInteger(c) || c < 1))
    throw new Error(`BENCH_CLIENTS must list whole numbers ≥ 1, got ${process.env.BENCH_CLIENTS}.`);
  const made: Tree[] = [];
  try {
    const { before, after } = builtTrees(BEFORE, AFTER, made);
    const loadBefore = loadAverage();
    const rows: string[][] = [];
    for (const clients of CLIENTS) {
      log('b1-slices', `${clients} client(s): ${SLICES} pairs of ${SLICE_MS} ms slices`);
      const r = await measure(before, after, clients);
      const ratios = r.after.map((x, i) => x / r.before[i]!);
      const ratio = median(ratios);
      rows.push([
        `B1 enqueue, ${clients} client${clients === 1 ? '' : 's'}`,
        f0(median(r.before)),
        f0(median(r.after)),
        `${f2(quantile(ratios, 0.25))}–${f2(quantile(ratios, 0.75))}`,
        `**${f3(ratio)}**`,
        ratio >= TARGET ? 'PASS' : '**FAIL**',
      ]);
    }
    return [
      `Before: ${describe(before)}. After: ${describe(after)}.`,
      `Machine: ${await machine()}; load average ${loadBefore} before, ${loadAverage()} after.`,
      `${SLICES} pairs of ${SLICE_MS} ms slices per client count, both trees in one process, first of a pair alternating` +
        `${process.env.BENCH_SYNC_COMMIT === 'off' ? '; synchronous_commit off' : '; synchronous_commit on (B1 as defined)'}.`,
      '',
      table(
        [
          'benchmark',
          'before tx/s (median)',
          'after tx/s (median)',
          'after / before, interquartile',
          'median ratio',
          `≥ ${TARGET}`,
        ],
        rows,
      ),
    ].join('\n');
  } finally {
    for (const tree of made) removeWorktree(tree.dir);
  }
}
