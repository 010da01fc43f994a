/**
 * The pieces of B2 (relay drain and relay memory), shared by bench/relay.ts and bench/clients.ts:
 * N pending events of 256 bytes over {@link B2_KEYS} keys on a topic of {@link B2_PARTITIONS}
 * partitions, drained by
 * - the built `outboxkit relay` daemon (a child process, so that its RSS is its own), timed from
 *   its first published event to its last;
 * - raw kafkajs producing the same messages with the relay's producer settings, batches of
 *   {@link B2_BATCH};
 * - the relay with a null publisher (a producer that acknowledges at once): its database work alone.
 * B2 ratio = relay / min(raw, null publisher) in events/s: how close the relay comes to its slower half.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { Kafka } from 'kafkajs';
import pg from 'pg';
import { laneOf } from '../src/outbox/event.js';
import { createWalRelay, Relay, SAFE_PRODUCER_CONFIG, walPublicationName } from '../relay/index.js';
import { createKafkajsClient } from '../src/kafka/kafkajs/client.js';
import type { KafkaClientName } from '../relay/options.js';
import { processCpuSeconds } from './e2e-support.js';
import { pendingCount, seedPending, startRelayDaemon, timeDrain } from './support.js';

export const B2_KEYS = 1_000;
export const B2_BATCH = 500;
export const B2_PARTITIONS = 6;

/** The built CLI (`dist/cli/main.js`), as users run it. @throws Error when it is not built. */
export function builtCli(): string {
  const cli = path.resolve('dist/cli/main.js');
  if (!existsSync(cli)) throw new Error('Run `npm run build` first: the relay is measured from the build.');
  return cli;
}

/** Seeds `count` pending B2 events on `topic` (empty outbox expected). */
export async function seedB2(pool: pg.Pool, topic: string, count: number): Promise<void> {
  await seedPending(pool, { topic, count, keys: B2_KEYS, laneOf });
}

/**
 * Seeds `count` pending B2 events on `topic` in transactions of `perTransaction` events (one
 * statement each, committed on its own), `concurrency` at a time on connections of their own with
 * `synchronous_commit = off` (the seeding is not measured): the shape a WAL relay reads from its
 * slot, one transaction at a time. The events are {@link seedB2}'s: 256 bytes, key
 * `key-<i mod B2_KEYS>` with its lane.
 */
export async function seedB2Transactions(
  databaseUrl: string,
  options: { topic: string; count: number; perTransaction: number; concurrency?: number },
): Promise<void> {
  const concurrency = options.concurrency ?? 8;
  const seeder = new pg.Pool({
    connectionString: databaseUrl,
    max: concurrency,
    options: '-c synchronous_commit=off',
  });
  try {
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < options.count) {
          const first = next;
          next = Math.min(options.count, first + options.perTransaction);
          const keys = Array.from({ length: next - first }, (_, j) => `key-${(first + j) % B2_KEYS}`);
          await seeder.query(
            `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload)
             SELECT gen_random_uuid(), $1, u.key, u.lane, 'bench', convert_to(rpad('x', 256, 'x'), 'UTF8')
               FROM unnest($2::text[], $3::smallint[]) AS u(key, lane)`,
            [options.topic, keys, keys.map(laneOf)],
          );
        }
      }),
    );
  } finally {
    await seeder.end();
  }
}

/** Resident set size of process `pid`, in MB (MiB), from /proc/<pid>/status. */
export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return kb / 1024;
}

/**
 * Drains the `count` events pending in `databaseUrl` with the built relay daemon (`args`: more
 * `outboxkit relay` flags, such as `['--source', 'wal', '--wal-slot', slot]`; `kafkaClient` adds
 * `--kafka-client`), then stops it with SIGTERM. Returns the drain's duration (ms, from its first
 * published event), the daemon's largest RSS (MB) sampled every 50 ms while draining, and its
 * CPU-seconds (utime + stime of /proc/<pid>/stat) from the first published event seen to the last.
 *
 * @throws Error when the daemon exits before the events are drained.
 */
export async function drainWithDaemon(
  pool: pg.Pool,
  options: {
    databaseUrl: string;
    brokers: string[];
    count: number;
    kafkaClient?: KafkaClientName;
    args?: readonly string[];
  },
): Promise<{ ms: number; maxRssMb: number; cpuSeconds: number }> {
  const args = [...(options.kafkaClient ? ['--kafka-client', options.kafkaClient] : []), ...(options.args ?? [])];
  const child = startRelayDaemon(builtCli(), options.databaseUrl, options.brokers, args);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  let maxRssMb = 0;
  let cpuAtFirst = NaN;
  try {
    const ms = await timeDrain(
      pool,
      options.count,
      () => {
        if (child.exitCode !== null || child.signalCode !== null)
          throw new Error(`the relay daemon exited (${child.exitCode ?? child.signalCode}) before draining`);
        maxRssMb = Math.max(maxRssMb, rssMb(child.pid!));
      },
      () => (cpuAtFirst = processCpuSeconds(child.pid!) ?? NaN),
    );
    const cpuSeconds = (processCpuSeconds(child.pid!) ?? NaN) - cpuAtFirst;
    return { ms, maxRssMb, cpuSeconds };
  } finally {
    child.kill('SIGTERM');
    await exited;
  }
}

/**
 * Produces `count` B2 messages (256 bytes, keys of {@link B2_KEYS}, `event-id` and `event-type`
 * headers) to `topic` with raw kafkajs, the relay's producer settings, acks=all, batches of
 * {@link B2_BATCH}, one at a time. Returns the duration in ms (connect excluded).
 */
export async function rawKafkajsProduce(kafka: Kafka, topic: string, count: number): Promise<number> {
  const producer = kafka.producer({ ...SAFE_PRODUCER_CONFIG, retry: { retries: 5 } });
  await producer.connect();
  try {
    const value = Buffer.from('x'.repeat(256));
    const t0 = performance.now();
    for (let i = 0; i < count; i += B2_BATCH) {
      const messages = Array.from({ length: Math.min(B2_BATCH, count - i) }, (_, j) => ({
        key: `key-${(i + j) % B2_KEYS}`,
        value,
        headers: { 'event-id': randomUUID(), 'event-type': 'bench' },
      }));
      await producer.sendBatch({ acks: -1, topicMessages: [{ topic, messages }] });
    }
    return performance.now() - t0;
  } finally {
    await producer.disconnect();
  }
}

/**
 * Drains the events pending in `pool`'s outbox with an in-process relay whose producer
 * acknowledges at once (the relay's database work alone), polling the pending count every 100 ms.
 * Returns the duration in ms (from the relay's start).
 */
export async function drainWithNullPublisher(pool: pg.Pool): Promise<number> {
  const relay = new Relay({
    pool,
    producer: { connect: async () => {}, disconnect: async () => {}, send: async () => {} },
    listen: false,
    pollIntervalMs: 50,
  });
  await relay.start();
  try {
    const t0 = performance.now();
    while ((await pendingCount(pool)) > 0) await new Promise((r) => setTimeout(r, 100));
    return performance.now() - t0;
  } finally {
    await relay.stop();
  }
}

/**
 * Drains the `count` events pending in `databaseUrl`'s outbox with an in-process WAL relay
 * (`createWalRelay()`, slot `slot`, which exists) whose producer acknowledges at once: the WAL
 * relay's database work alone (decoding by the walsender, the stream, the bulk deletes and the
 * confirmations), its topic limits read from the real `brokers`. Timed as {@link drainWithDaemon}
 * times (from the first published event).
 */
export async function drainWalWithNullPublisher(
  pool: pg.Pool,
  options: { databaseUrl: string; brokers: string[]; slot: string; count: number },
): Promise<number> {
  const real = createKafkajsClient(
    { clientId: 'bench-null-publisher', brokers: options.brokers },
    { logLevel: 'nothing' },
  );
  const relay = createWalRelay({
    connection: options.databaseUrl,
    slot: options.slot,
    publication: walPublicationName('outboxkit'),
    kafka: {
      ...real,
      producer: () => ({
        connect: async () => {},
        disconnect: async () => {},
        send: async (records: readonly unknown[]) => ({ outcomes: records.map(() => ({ ok: true as const })) }),
      }),
    },
  });
  await relay.start();
  try {
    return await timeDrain(pool, options.count);
  } finally {
    await relay.stop();
  }
}

/** The B2 ratio: relay events/s over the slower of raw and null publisher (durations in ms). */
export function b2Ratio(ms: { relay: number; raw: number; nullPublisher: number }): number {
  return Math.max(ms.raw, ms.nullPublisher) / ms.relay;
}
