/**
 * Paced retention cleanup (issue 17, point 6): `npm run bench -- cleanup`.
 *
 * 8 writers enqueue at a fixed rate (BENCH_CL_RATE, 250 transactions/s in all; one business row
 * plus one event each; an open loop, so a slow transaction shows as latency), and a relay in this
 * process publishes their events. The outbox also holds BENCH_CL_ROWS (1,000,000) published rows
 * past retention. The relay's first cleanup starts after a window without cleanup
 * (BENCH_CL_BEFORE_S, 60 s); the writers' latency is measured before it, while it deletes the
 * backlog (paced by `cleanupRowsPerSecond`, BENCH_CL_PACE, default the relay's), and for
 * BENCH_CL_AFTER_S (60 s) after it. Reports the time the cleanup took and the writers' p99 during
 * it over their p99 without it (the before and after windows pooled). Issue 17 asks for ≤ 10 min
 * and ≤ 1.2×.
 */
import pg from 'pg';
import { enqueue } from '../src/index.js';
import { knob, percentile } from './e2e-support.js';
import { ensureTopics } from '../src/kafka/topics.js';
import { Relay, RELAY_DEFAULTS } from '../relay/index.js';
import { Kafka, logLevel } from 'kafkajs';
import { benchDatabase, BUSINESS_TABLE_DDL, businessTransaction, machine, openLoopWriters } from './support.js';

const ROWS = knob('BENCH_CL_ROWS', 1_000_000);
const RATE = knob('BENCH_CL_RATE', 250);
const BEFORE_S = knob('BENCH_CL_BEFORE_S', 60);
const AFTER_S = knob('BENCH_CL_AFTER_S', 60);
const PACE = knob('BENCH_CL_PACE', RELAY_DEFAULTS.cleanupRowsPerSecond);
const BATCH = knob('BENCH_CL_BATCH', RELAY_DEFAULTS.cleanupBatchSize);
const CLIENTS = 8;

type Window = 'before' | 'during' | 'after';

const log = (m: string) => process.stderr.write(`[cleanup ${new Date().toISOString().slice(11, 19)}] ${m}\n`);

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: CLIENTS + 2 });
  await pool.query(BUSINESS_TABLE_DDL);
  log(`seeding ${ROWS.toLocaleString('en')} published rows past retention`);
  // Rows like the writers' (one key each, a 256-byte payload), published two days ago, with their
  // key-lock rows: what a day of traffic leaves behind.
  await pool.query(
    `WITH keys AS (SELECT 'old-' || g AS key, g FROM generate_series(1, $1::int) AS g),
          locks AS (INSERT INTO outboxkit.outbox_key_locks SELECT hashtextextended(key, 7) FROM keys)
     INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload, headers, published_at)
     SELECT gen_random_uuid(), 'bench-cleanup-old', key, g % 64, 'order.created', convert_to(repeat('x', 256), 'UTF8'),
            '{}', now() - interval '2 days' + g * interval '1 ms'
       FROM keys`,
    [ROWS],
  );
  await pool.query('VACUUM ANALYZE outboxkit.outbox_events');
  await pool.query('CHECKPOINT');
  const topic = `bench-cleanup-${Date.now()}`;
  const kafka = new Kafka({ clientId: 'bench-cleanup', brokers: db.brokers, logLevel: logLevel.NOTHING });
  await ensureTopics(kafka, [{ topic, numPartitions: 3 }]);

  const latencies: Record<Window, number[]> = { before: [], during: [], after: [] };
  let window: Window | null = null;
  const payload = { orderId: 'x', amount: 1234, currency: 'EUR', note: 'y'.repeat(180) };

  const relay = new Relay({
    connectionString: db.url,
    kafka,
    cleanupIntervalMs: (BEFORE_S + 5) * 1000,
    cleanupBatchSize: BATCH,
    cleanupRowsPerSecond: PACE,
  });
  let cleanupStarted = 0;
  let cleanupEnded = 0;
  let deleted = 0;
  relay.on('relay:cleaned', (e) => {
    if (deleted === 0) {
      cleanupStarted = performance.now();
      window = 'during';
      log('cleanup started');
    }
    deleted += e.deleted;
    if (deleted >= ROWS && cleanupEnded === 0) {
      cleanupEnded = performance.now();
      window = null;
      log(`cleanup ended: ${deleted.toLocaleString('en')} rows`);
    }
  });
  const relayStarted = performance.now();
  await relay.start();
  const writers = openLoopWriters({
    clients: CLIENTS,
    rate: RATE,
    write: () =>
      businessTransaction(pool, (tx, id) => enqueue(tx, { topic: topic, key: id, type: 'order.created', payload })),
    window: () => window,
    latencies,
  });
  await new Promise((r) => setTimeout(r, 5_000)); // warm-up
  window = 'before';
  log('window before');
  await new Promise((r) => setTimeout(r, relayStarted + (BEFORE_S + 5) * 1000 - performance.now() - 500));
  window = null;
  while (cleanupEnded === 0) await new Promise((r) => setTimeout(r, 500));
  await new Promise((r) => setTimeout(r, 2_000));
  window = 'after';
  log('window after');
  await new Promise((r) => setTimeout(r, AFTER_S * 1000));
  window = null;
  await writers.stop();
  await relay.stop();
  await pool.end();
  await db.drop();

  const without = [...latencies.before, ...latencies.after];
  const baseP99 = percentile(without, 99);
  const row = (label: string, xs: number[]) =>
    `| ${label} | ${xs.length} | ${percentile(xs, 50).toFixed(1)} | ${percentile(xs, 99).toFixed(1)} | ${(percentile(xs, 99) / baseP99).toFixed(2)} |`;
  return [
    `Machine: ${await machine()}. ${CLIENTS} writers at ${RATE} transactions/s in all; ${ROWS.toLocaleString('en')} published rows past retention; cleanup batches of ${BATCH} at ${PACE === 0 ? 'no pace (back to back)' : `${PACE} rows/s`}. Failed writer transactions: ${writers.failures()}.`,
    '',
    `Cleanup: ${deleted.toLocaleString('en')} rows in ${((cleanupEnded - cleanupStarted) / 1000).toFixed(1)} s (${Math.round(deleted / ((cleanupEnded - cleanupStarted) / 1000))} rows/s).`,
    '',
    '| writers | transactions | p50 ms | p99 ms | p99 / p99 without cleanup |',
    '|---|---|---|---|---|',
    row('before the cleanup', latencies.before),
    row('during the cleanup', latencies.during),
    row('after the cleanup', latencies.after),
    row('without cleanup (before + after)', without),
  ].join('\n');
}
