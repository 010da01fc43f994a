/**
 * Side by side (`npm run bench -- side-by-side`): the built code of the commit before a change and
 * of the code after it, measured in one run in absolute rates, so that a redesign can show that
 * the writer, the relay's drain and the consumer's throughput did not regress (after / before ≥ 0.95).
 *
 *   BENCH_BEFORE=45708ce npm run bench -- side-by-side              (the defaults)
 *   BENCH_EVENTS=5000 BENCH_ROUNDS=1 BENCH_B1_MS=1000 BENCH_ONLY=b2 npm run bench -- side-by-side
 *
 * - BENCH_BEFORE (default `45708ce`, the last commit before the redesign of issue 15, by its hash:
 *   a tag does not travel with every clone): the ref before, checked out as a git worktree in
 *   .services/bench-trees/ (removed at the end);
 * - BENCH_AFTER (default: this checkout as it is, uncommitted changes included): a ref after,
 *   checked out the same way;
 * - BENCH_EVENTS (default 100,000): events of B2 and B4; BENCH_B1_MS (default 5,000): time of a B1
 *   measurement, after 1 s of warm-up; BENCH_ROUNDS (default 4; 3 at least for a verdict);
 *   BENCH_ONLY (e.g. `b2,b4`; default all): some of `b1`, `b2`, `b4`; BENCH_SYNC_COMMIT=off: B1's
 *   sessions commit without waiting for the WAL flush (the code's cost without the disk's noise).
 * Both trees get this checkout's node_modules (a symlink: the run stops if their package.json
 * declare different dependencies) and are built with `npx tsc -p tsconfig.build.json`. Each
 * measurement is a child process (bench/processes/side-by-side-measure.ts, which says what it
 * measures) running one tree's dist/ on a fresh database, migrated by that tree, and fresh topics,
 * all dropped afterwards:
 * - B1 enqueue, 1 and 32 clients: a business INSERT and `enqueue()` of one 256-byte event per
 *   transaction (transactions/s);
 * - B2 relay drain: pending 256-byte events over 1,000 keys drained by the tree's `outboxkit relay`
 *   into a 6-partition topic, from its first published event to its last (events/s);
 * - B4 dedup consumer: events pre-produced to a 3-partition topic (256-byte JSON values) read by
 *   the tree's dedup consumer, one INSERT per event in its transaction (events/s).
 * A round measures each benchmark for both trees one right after the other, before first in odd
 * rounds and after first in even ones, so that drift and warm-up hit both alike. Prints per
 * benchmark each tree's median rate, the ratios after / before of the rounds, their median and
 * PASS (≥ 0.95) or FAIL. Progress goes to stderr.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { Kafka, logLevel } from 'kafkajs';
import { f0, f2, f3, knob, loadAverage, log, root, startChild, stopChild, table, type Child } from './e2e-support.js';
import { median, withTimeout } from './lib.js';
import { benchDatabase, machine, paddedJson, produceEvents } from './support.js';

const TARGET = 0.95;
const MIN_ROUNDS = 3;
const BEFORE = process.env.BENCH_BEFORE || '45708ce';
const AFTER = process.env.BENCH_AFTER || undefined;
const EVENTS = knob('BENCH_EVENTS', 100_000);
const ROUNDS = knob('BENCH_ROUNDS', 4);
const B1_MS = knob('BENCH_B1_MS', 5_000);
const ONLY = process.env.BENCH_ONLY?.split(',').filter(Boolean);
/** A measurement that has not ended by then failed (its child's own limit is 20 minutes). */
const MEASUREMENT_TIMEOUT_MS = 25 * 60_000;
const CHILD = path.join(root, 'bench', 'processes', 'side-by-side-measure.ts');
/** The package.json fields that decide what node_modules holds. */
const DEPENDENCY_FIELDS = ['dependencies', 'devDependencies', 'optionalDependencies', 'overrides'];

export interface Tree {
  label: 'before' | 'after';
  /** The ref as given, or null for this checkout. */
  ref: string | null;
  commit: string;
  dir: string;
}

interface Benchmark {
  name: string;
  unit: string;
  /** The child's arguments after the tree: the measurement and its clients. */
  args: string[];
  /** A fresh topic (and its .dlq) of this many partitions; with `produce`, BENCH_EVENTS events on it. */
  partitions?: number;
  produce?: boolean;
}

const BENCHMARKS: Benchmark[] = [
  { name: 'B1 enqueue, 1 client', unit: 'transactions/s', args: ['b1', '1'] },
  { name: 'B1 enqueue, 32 clients', unit: 'transactions/s', args: ['b1', '32'] },
  { name: 'B2 relay drain', unit: 'events/s', args: ['b2'], partitions: 6 },
  { name: 'B4 dedup consumer', unit: 'events/s', args: ['b4'], partitions: 3, produce: true },
];

const SELECTED = BENCHMARKS.filter((b) => ONLY === undefined || ONLY.includes(b.args[0]!));

export const git = (args: string[]) => execFileSync('git', args, { cwd: root, encoding: 'utf8' }).trim();

export function removeWorktree(dir: string): void {
  try {
    git(['worktree', 'remove', '--force', dir]);
  } catch {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A detached worktree of `ref` in .services/bench-trees/ (replacing one a stopped run left). */
export function worktree(label: Tree['label'], ref: string): Tree {
  const commit = git(['rev-parse', '--verify', `${ref}^{commit}`]);
  const dir = path.join(root, '.services', 'bench-trees', `${label}-${ref.replace(/[^\w.-]/g, '_')}`);
  if (existsSync(dir)) removeWorktree(dir);
  // --force: the folder of a worktree a stopped run left may be gone while git still lists it.
  git(['worktree', 'add', '--force', '--detach', dir, commit]);
  symlinkSync(realpathSync(path.join(root, 'node_modules')), path.join(dir, 'node_modules'));
  return { label, ref, commit, dir };
}

export function describe(tree: Tree): string {
  if (tree.ref !== null) return `\`${tree.ref}\` (${tree.commit.slice(0, 7)})`;
  const dirty = git(['status', '--porcelain', '--untracked-files=no']) !== '';
  return `this checkout at ${tree.commit.slice(0, 7)}${dirty ? ' with uncommitted changes' : ''}`;
}

/**
 * Stops the run when the trees declare different dependencies (they share one node_modules, so
 * one of them would not run on its own); returns the other fields in which their package.json
 * differ (scripts, exports), for the record.
 */
export function packageDifferences(before: Tree, after: Tree): string[] {
  const read = (t: Tree) =>
    JSON.parse(readFileSync(path.join(t.dir, 'package.json'), 'utf8')) as Record<string, unknown>;
  const [a, b] = [read(before), read(after)];
  const differ = [...new Set([...Object.keys(a), ...Object.keys(b)])].filter((f) => !isDeepStrictEqual(a[f], b[f]));
  // Packages the later tree adds (a test tool, a library of a new feature) are in this checkout's
  // node_modules and the earlier tree never imports them: only a removed or changed one stops the run.
  const addedOnly = (f: string) =>
    (f === 'devDependencies' || f === 'dependencies') &&
    Object.entries((a[f] ?? {}) as Record<string, string>).every(
      ([name, version]) => (b[f] as Record<string, string> | undefined)?.[name] === version,
    );
  const dependencies = differ.filter((f) => DEPENDENCY_FIELDS.includes(f) && !addedOnly(f));
  if (dependencies.length > 0)
    throw new Error(
      `The package.json of ${describe(before)} and of ${describe(after)} declare different ${dependencies.join(', ')}. ` +
        "Both trees would run on this checkout's node_modules, so one of them would not run on its own " +
        'dependencies: measure such a pair by hand, with an `npm ci` in each tree.',
    );
  return differ;
}

/**
 * The trees of `beforeRef` and `afterRef` (undefined: this checkout as it is), each added to `made`
 * when it is a worktree of its own (the caller removes them), checked by {@link packageDifferences}
 * and built with `npx tsc -p tsconfig.build.json`.
 */
export function builtTrees(
  beforeRef: string,
  afterRef: string | undefined,
  made: Tree[],
): { before: Tree; after: Tree; differences: string[] } {
  const before = worktree('before', beforeRef);
  made.push(before);
  const after: Tree =
    afterRef === undefined
      ? { label: 'after', ref: null, commit: git(['rev-parse', 'HEAD']), dir: root }
      : worktree('after', afterRef);
  if (after.ref !== null) made.push(after);
  const differences = packageDifferences(before, after);
  for (const tree of [before, after]) {
    log('side-by-side', `building ${tree.label}: ${describe(tree)}`);
    execFileSync('npx', ['tsc', '-p', 'tsconfig.build.json'], { cwd: tree.dir, stdio: 'inherit' });
  }
  return { before, after, differences };
}

/** One measurement of `bench` with `tree`'s built code, on a fresh database and fresh topics. */
async function measure(bench: Benchmark, tree: Tree): Promise<number> {
  const db = await benchDatabase({ migrated: false });
  const kafka = new Kafka({ clientId: 'outboxkit-bench', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  const topic = `bench-side-by-side-${randomBytes(4).toString('hex')}`;
  let child: Child | undefined;
  try {
    if (bench.partitions !== undefined) {
      await admin.connect();
      await admin.createTopics({
        waitForLeaders: true,
        topics: [
          { topic, numPartitions: bench.partitions },
          { topic: `${topic}.dlq`, numPartitions: 1 },
        ],
      });
      if (bench.produce)
        await produceEvents(kafka, topic, EVENTS, (i) =>
          JSON.stringify(paddedJson({ orderId: `order-${i % 10_000}`, amount: i }, 256)),
        );
    }
    child = startChild(`${bench.name} (${tree.label})`, CHILD, [tree.dir, ...bench.args], {
      DATABASE_URL: db.url,
      KAFKA_BROKERS: db.brokers.join(','),
      BENCH_TOPIC: topic,
      BENCH_EVENTS: String(EVENTS),
      BENCH_B1_MS: String(B1_MS),
    });
    // 'close', not 'exit': the child's last output lines have been read by then.
    const proc = child.proc;
    const code = await withTimeout(
      new Promise<number | null>((r) => proc.once('close', (c) => r(c))),
      MEASUREMENT_TIMEOUT_MS,
      child.name,
    );
    const line = child.lines.findLast((l) => l.startsWith('rate '));
    if (code !== 0 || line === undefined)
      throw new Error(`${child.name} failed (exit ${code}):\n${child.lines.slice(-20).join('\n')}`);
    return Number(line.slice('rate '.length));
  } finally {
    if (child !== undefined) await stopChild(child);
    if (bench.partitions !== undefined) {
      await admin.deleteTopics({ topics: [topic, `${topic}.dlq`] }).catch(() => {});
      await admin.disconnect();
    }
    await db.drop();
  }
}

export async function run(): Promise<string> {
  if (!Number.isInteger(ROUNDS) || ROUNDS < 1)
    throw new Error(`BENCH_ROUNDS must be a whole number ≥ 1, got ${ROUNDS}.`);
  const made: Tree[] = [];
  try {
    const { before, after, differences } = builtTrees(BEFORE, AFTER, made);

    const loadBefore = loadAverage();
    const rates = new Map(BENCHMARKS.map((b) => [b, { before: [] as number[], after: [] as number[] }]));
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? [before, after] : [after, before];
      for (const bench of SELECTED) {
        for (const tree of order) {
          const rate = await measure(bench, tree);
          rates.get(bench)![tree.label].push(rate);
          log('side-by-side', `round ${round + 1}/${ROUNDS}, ${bench.name}, ${tree.label}: ${f0(rate)} ${bench.unit}`);
        }
      }
    }

    const rows = SELECTED.map((bench) => {
      const r = rates.get(bench)!;
      const ratios = r.after.map((x, i) => x / r.before[i]!);
      const ratio = median(ratios);
      const verdict =
        ROUNDS < MIN_ROUNDS ? `— (fewer than ${MIN_ROUNDS} rounds)` : ratio >= TARGET ? 'PASS' : '**FAIL**';
      return [
        bench.name,
        bench.unit,
        f0(median(r.before)),
        f0(median(r.after)),
        ratios.map(f2).join(' '),
        `**${f3(ratio)}**`,
        verdict,
      ];
    });
    return [
      `Before: ${describe(before)}. After: ${describe(after)}.` +
        (differences.length > 0 ? ` Their package.json differ in ${differences.join(', ')} (not dependencies).` : ''),
      `Machine: ${await machine()}; load average ${loadBefore} before the rounds, ${loadAverage()} after.`,
      `${ROUNDS} round(s), before first in rounds 1, 3, ...; B1 ${B1_MS} ms per measurement after 1 s of warm-up` +
        `${process.env.BENCH_SYNC_COMMIT === 'off' ? ' (synchronous_commit off)' : ''}; ` +
        `B2 and B4 ${EVENTS.toLocaleString('en-US')} events of 256 bytes.`,
      '',
      table(
        [
          'benchmark',
          'unit',
          'before (median)',
          'after (median)',
          'after / before per round',
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
