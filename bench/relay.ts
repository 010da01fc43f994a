/**
 * B2 relay drain and relay memory: N pending 256-byte events (default 200,000; BENCH_EVENTS).
 * - relay: the built `outboxkit relay` daemon (a child process, so its RSS is its own) drains them,
 *   timed from its first published event;
 * - raw: kafkajs producing the same messages with the same producer settings and batch size;
 * - null publisher: the relay's database work alone (a producer that acknowledges at once).
 * Ratio = relay / min(raw, null publisher): how close the relay comes to its slower half.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { laneOf } from '../src/outbox/event.js';
import { Relay, SAFE_PRODUCER_CONFIG } from '../relay/index.js';
import { benchDatabase, machine, pendingCount, seedPending, startRelayDaemon, timeDrain } from './support.js';

const N = Number(process.env.BENCH_EVENTS ?? 200_000);
const KEYS = 1_000;
const BATCH = 500;

async function seed(pool: pg.Pool, topic: string): Promise<void> {
  await seedPending(pool, { topic, count: N, keys: KEYS, laneOf });
}

async function waitDrained(pool: pg.Pool): Promise<void> {
  while ((await pendingCount(pool)) > 0) await new Promise((r) => setTimeout(r, 100));
}

function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return kb / 1024;
}

export async function run(): Promise<string> {
  if (!existsSync(path.resolve('dist/cli/main.js')))
    throw new Error('Run `npm run build` first: the relay is measured from the build.');
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: 4 });
  const kafka = new Kafka({ clientId: 'bench', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const topic = `bench-relay-${randomUUID().slice(0, 8)}`;
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 6 }] });

  // 1. The relay daemon, as a child process.
  await seed(pool, topic);
  // The built CLI, as users run it (`outboxkit relay`).
  const child = startRelayDaemon(path.resolve('dist/cli/main.js'), db.url, db.brokers);
  let maxRss = 0;
  const relayMs = await timeDrain(pool, N, () => (maxRss = Math.max(maxRss, rssMb(child.pid!))));
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));

  // 2. Raw kafkajs with the relay's producer settings, same messages, batches of the same size.
  const producer = kafka.producer({ ...SAFE_PRODUCER_CONFIG, retry: { retries: 5 } });
  await producer.connect();
  const value = Buffer.from('x'.repeat(256));
  let t0 = performance.now();
  for (let i = 0; i < N; i += BATCH) {
    const messages = Array.from({ length: Math.min(BATCH, N - i) }, (_, j) => ({
      key: `key-${(i + j) % KEYS}`,
      value,
      headers: { 'event-id': randomUUID(), 'event-type': 'bench' },
    }));
    await producer.sendBatch({ acks: -1, topicMessages: [{ topic, messages }] });
  }
  const rawMs = performance.now() - t0;
  await producer.disconnect();

  // 3. The relay's database work alone.
  await pool.query('TRUNCATE outboxkit.outbox_events');
  await seed(pool, topic);
  const nullRelay = new Relay({
    pool,
    producer: { connect: async () => {}, disconnect: async () => {}, send: async () => {} },
    listen: false,
    pollIntervalMs: 50,
  });
  await nullRelay.start();
  t0 = performance.now();
  await waitDrained(pool);
  const nullMs = performance.now() - t0;
  await nullRelay.stop();

  await admin.deleteTopics({ topics: [topic] });
  await admin.disconnect();
  await pool.end();
  await db.drop();

  const rate = (ms: number) => (N / (ms / 1000)).toFixed(0);
  const floorMs = Math.max(rawMs, nullMs);
  return [
    `Machine: ${await machine()}; ${N} events of 256 bytes, ${KEYS} keys, topic of 6 partitions, batch ${BATCH}.`,
    '',
    '| run | events/s |',
    '| --- | --- |',
    `| relay daemon (child process) | ${rate(relayMs)} |`,
    `| raw kafkajs, same settings | ${rate(rawMs)} |`,
    `| relay with a null publisher | ${rate(nullMs)} |`,
    '',
    `B2 ratio relay / min(raw, null publisher) = **${(floorMs / relayMs).toFixed(3)}** (target ≥ 0.80)`,
    `Relay RSS while draining: max **${maxRss.toFixed(0)} MB** (target ≤ 120 MB)`,
  ].join('\n');
}
