/**
 * C29, bulk transactions (issue 17): `npm run bench -- bulk-import`.
 *
 * Ordinary writers run at a fixed rate below saturation (BENCH_BI_RATE transactions/s in all, 8
 * clients, one business row plus `enqueue()` of one event of a key of their own each). Their
 * latency is measured in four windows of one run: with nothing else (baseline), while ONE
 * transaction in another process imports BENCH_BI_ROWS business rows without events (the
 * control: what any import of that size costs the machine), and while one imports the same rows
 * with one event per row and per distinct key through `enqueue()`; and, as a second control, while
 * one writes the same outbox rows by one INSERT … SELECT (the write volume without enqueue()). The writers touch no key of
 * the import, so they must not wait for it: issue 17 asks for their p99 during an import ≤ 2×
 * their p99 without it. The writers run in this process; the import runs in
 * bench/processes/bulk-import-writer.ts, so its event building does not delay this event loop.
 *
 * A sampler of pg_stat_activity counts, per window, how often a writer's backend was seen waiting
 * for a heavyweight lock, which tells lock waits (what the issue forbids) from a busier machine.
 *
 * Knobs (env): BENCH_BI_ROWS (100,000), BENCH_BI_RATE (200), BENCH_BI_BASELINE_S (15), BENCH_BI_ROUNDS (3),
 * BENCH_BI_NOTIFY (`off`: the writers' `enqueue()` sends no NOTIFY, `createOutbox({ notify: false })`).
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createOutbox } from '../src/index.js';
import { knob, percentile } from './e2e-support.js';
import { benchDatabase, BUSINESS_TABLE_DDL, businessTransaction, machine, openLoopWriters } from './support.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const ROWS = knob('BENCH_BI_ROWS', 100_000);
const RATE = knob('BENCH_BI_RATE', 200);
const BASELINE_S = knob('BENCH_BI_BASELINE_S', 15);
const CLIENTS = 8;

type Window = 'baseline' | 'rows-only' | 'by-hand' | 'enqueue';
/** The writers' application_name, by which the sampler finds their backends. */
const WRITERS_APP = 'outboxkit-bench-writers';
const SAMPLE_MS = 10;
const WRITERS_NOTIFY = process.env.BENCH_BI_NOTIFY !== 'off';

/**
 * Samples the writers' backends in pg_stat_activity every {@link SAMPLE_MS} until `stop()`, and
 * counts per window the samples of an active writer backend and of those waiting for a lock: what
 * tells "the writers wait for the import's locks" from "the machine is busier".
 */
function sampleWriterWaits(url: string, window: () => Window | null) {
  const counts = Object.fromEntries(
    (['baseline', 'rows-only', 'by-hand', 'enqueue'] as const).map((w) => [
      w,
      { active: 0, lock: 0, kinds: new Map<string, number>() },
    ]),
  ) as Record<Window, { active: number; lock: number; kinds: Map<string, number> }>;
  const client = new pg.Client({ connectionString: url });
  let stopped = false;
  const done = (async () => {
    await client.connect();
    while (!stopped) {
      const w = window();
      const { rows } = await client.query<{ lock: string | null }>(
        `SELECT CASE WHEN wait_event_type = 'Lock' THEN wait_event END AS lock FROM pg_stat_activity
          WHERE application_name = $1 AND state = 'active'`,
        [WRITERS_APP],
      );
      // A sample counts for the window it began and ended in (none across a window's edge).
      if (w !== null && w === window())
        for (const r of rows) {
          counts[w].active++;
          if (r.lock !== null) {
            counts[w].lock++;
            counts[w].kinds.set(r.lock, (counts[w].kinds.get(r.lock) ?? 0) + 1);
          }
        }
      await new Promise((r) => setTimeout(r, SAMPLE_MS));
    }
    await client.end();
  })();
  return {
    async stop() {
      stopped = true;
      await done;
      return counts;
    },
  };
}
const ROUNDS = knob('BENCH_BI_ROUNDS', 3);

/**
 * Runs the import of `mode` in a child process; calls `begun` once its transaction has started
 * (the child's own start-up, tsx included, is not in the window); resolves with its BEGIN → COMMIT
 * time (ms).
 */
function runImport(url: string, mode: Exclude<Window, 'baseline'>, begun: () => void): Promise<number> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(here, 'processes', 'bulk-import-writer.ts'), url, String(ROWS), mode],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  return new Promise((resolve, reject) => {
    let ms = NaN;
    createInterface({ input: child.stdout }).on('line', (line) => {
      if (line === 'begun') begun();
      const m = /^committed (\d+)$/.exec(line);
      if (m) ms = Number(m[1]);
    });
    child.on('error', reject);
    child.on('exit', (code) =>
      code === 0 && Number.isFinite(ms) ? resolve(ms) : reject(new Error(`import (${mode}) exited ${code}`)),
    );
  });
}

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: CLIENTS, application_name: WRITERS_APP });
  await pool.query(`${BUSINESS_TABLE_DDL}; CREATE TABLE imported (id text PRIMARY KEY, data text NOT NULL)`);
  const latencies: Record<Window, number[]> = { baseline: [], 'rows-only': [], 'by-hand': [], enqueue: [] };
  let window: Window | null = 'baseline';
  const writerOutbox = createOutbox({ notify: WRITERS_NOTIFY });
  const payload = { orderId: 'x', amount: 1234, currency: 'EUR' };
  const writers = openLoopWriters({
    clients: CLIENTS,
    rate: RATE,
    write: () =>
      businessTransaction(pool, (tx, id) =>
        writerOutbox.enqueue(tx, { topic: 'orders', key: id, type: 'order.created', payload }),
      ),
    window: () => window,
    latencies,
  });
  await new Promise((r) => setTimeout(r, 2_000)); // warm-up, not counted
  latencies.baseline.length = 0;
  const waits = sampleWriterWaits(db.url, () => window);
  await new Promise((r) => setTimeout(r, BASELINE_S * 1000));
  const importMs: Record<Window, number[]> = { baseline: [], 'rows-only': [], 'by-hand': [], enqueue: [] };
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of ['rows-only', 'by-hand', 'enqueue'] as const) {
      window = null;
      await new Promise((r) => setTimeout(r, 2_000)); // let the previous window's backlog clear
      importMs[mode].push(await runImport(db.url, mode, () => (window = mode)));
      await pool.query(`TRUNCATE imported; DELETE FROM outboxkit.outbox_events WHERE topic = 'imports'`);
    }
  }
  window = null;
  const waited = await waits.stop();
  await writers.stop();
  await pool.end();
  await db.drop();

  const base = percentile(latencies.baseline, 99);
  const line = (w: Window, label: string) => {
    const xs = latencies[w];
    const p99 = percentile(xs, 99);
    const ms = importMs[w].map((m) => `${(m / 1000).toFixed(1)} s`).join(', ');
    const w8 = waited[w];
    const locks =
      w8.active === 0
        ? '—'
        : `${w8.lock} of ${w8.active} (${((100 * w8.lock) / w8.active).toFixed(1)} %)${w8.lock === 0 ? '' : `: ${[...w8.kinds].map(([k, n]) => `${k} ${n}`).join(', ')}`}`;
    return `| ${label} | ${ms || '—'} | ${xs.length} | ${percentile(xs, 50).toFixed(1)} | ${p99.toFixed(1)} | ${(p99 / base).toFixed(2)} | ${locks} |`;
  };
  return [
    `Machine: ${await machine()}. Ordinary writers: ${CLIENTS} clients, ${RATE} transactions/s in all (one business row + one event of their own key, NOTIFY ${WRITERS_NOTIFY ? 'on, the default' : 'off'}); import: ${ROWS.toLocaleString('en')} rows in ONE transaction, in another process, ${ROUNDS} times each (windows pooled). Failed writer transactions: ${writers.failures()}. Last column: samples of pg_stat_activity every ${SAMPLE_MS} ms in which a writer's backend was active, and of those, how many waited for a heavyweight lock (wait_event_type \`Lock\`: a row, a transaction, NOTIFY's queue at commit), whoever held it; the rest is CPU, WAL flush (IO) and the like.`,
    '',
    '| window | import BEGIN → COMMIT | writer transactions | p50 ms | p99 ms | p99 / baseline p99 | writers seen waiting for a lock |',
    '|---|---|---|---|---|---|---|',
    line('baseline', 'no import'),
    line('rows-only', `import of ${ROWS.toLocaleString('en')} rows, no events (control)`),
    line(
      'by-hand',
      `import of ${ROWS.toLocaleString('en')} rows + the same outbox rows by one INSERT … SELECT (no enqueue())`,
    ),
    line('enqueue', `import of ${ROWS.toLocaleString('en')} rows + ${ROWS.toLocaleString('en')} events, distinct keys`),
  ].join('\n');
}
