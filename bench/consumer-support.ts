/**
 * The pieces of B4 (the dedup consumer's cost), shared by bench/consumer.ts and bench/clients.ts:
 * the plain kafkajs baseline consumer and the dedup consumer, each reading the `events` events of
 * `topic` in a fresh consumer group with the handler transaction bench/consumer.ts describes,
 * timed from the first processed message to the last (group join and fetch start-up excluded).
 */
import { randomBytes } from 'node:crypto';
import type { Consumer, Kafka } from 'kafkajs';
import type pg from 'pg';
import { createDedupConsumer, DEDUP_CONSUMER_DEFAULTS, type DedupConsumer } from '../consumer/index.js';
import type { KafkaClient } from '../src/kafka/types.js';
import { HEADER_EVENT_ID } from '../src/outbox/event.js';
import { clock, clockRate, withTimeout } from './lib.js';

export type Scope = 'message' | 'batch';
/** The baseline's batch bound: the dedup consumer's default `batchMaxMessages`. */
export const BATCH_MAX_MESSAGES = 50;
export const B4_PARTITIONS = 3;
export const B4_CONCURRENCY = 3;
export const B4_POOL_SIZE = 4;
/** How long (ms) one consumer run may take before the measurement fails. */
const RUN_TIMEOUT_MS = 20 * 60_000;

/** The handler's one row: `bench_effects (event_id uuid, payload text)`, created by the caller. */
export const HANDLER_SQL = 'INSERT INTO bench_effects (event_id, payload) VALUES ($1, $2)';
export const BENCH_EFFECTS_DDL = 'CREATE TABLE bench_effects (event_id uuid NOT NULL, payload text NOT NULL)';

/** What a B4 consumer run reads: `events` events of `topic`, handler rows through `pool`. */
export interface B4Source {
  pool: pg.Pool;
  topic: string;
  events: number;
}

/**
 * The baseline: a plain kafkajs `eachBatch` consumer in a fresh group with the dedup consumer's
 * group and fetch settings; scope `message`: BEGIN; INSERT; COMMIT per message (resolveOffset
 * and heartbeat per message, auto-commit); scope `batch`: BEGIN; up to {@link BATCH_MAX_MESSAGES}
 * INSERTs; COMMIT, offsets resolved after the COMMIT. Returns messages per second.
 *
 * @throws Error when the run does not finish within 20 minutes.
 */
export async function timeBaselineConsumer(kafka: Kafka, source: B4Source, scope: Scope): Promise<number> {
  const { pool, topic, events } = source;
  const c = clock(events);
  const consumer: Consumer = kafka.consumer({
    groupId: `bench-baseline-${randomBytes(4).toString('hex')}`,
    // The dedup consumer's defaults: the same fetch and group settings on both sides.
    sessionTimeout: DEDUP_CONSUMER_DEFAULTS.sessionTimeoutMs,
    heartbeatInterval: DEDUP_CONSUMER_DEFAULTS.heartbeatIntervalMs,
    maxWaitTimeInMs: DEDUP_CONSUMER_DEFAULTS.fetchMaxWaitMs,
  });
  const step = scope === 'message' ? 1 : BATCH_MAX_MESSAGES;
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  await consumer.run({
    eachBatchAutoResolve: false,
    autoCommit: true,
    autoCommitInterval: 5_000,
    partitionsConsumedConcurrently: B4_CONCURRENCY,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      for (let i = 0; i < batch.messages.length; i += step) {
        if (!isRunning() || isStale()) return;
        const run = batch.messages.slice(i, i + step);
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          for (const message of run) {
            await client.query(HANDLER_SQL, [message.headers![HEADER_EVENT_ID]!.toString(), message.value!.toString()]);
          }
          await client.query('COMMIT');
        } finally {
          client.release();
        }
        for (const message of run) {
          resolveOffset(message.offset);
          c.tick();
        }
        await heartbeat();
      }
    },
  });
  try {
    await withTimeout(c.done, RUN_TIMEOUT_MS, `baseline (${scope})`);
  } finally {
    await consumer.disconnect();
  }
  return clockRate(c);
}

/**
 * The dedup consumer on `kafka` (a kafkajs `Kafka`, or a `KafkaClient` such as
 * `createPlatformaticClient(config)`) in group `groupId`, with the same handler, `transactionScope`
 * `scope`, {@link B4_CONCURRENCY} partitions at once; `expect` says whether every event is new
 * (`applied`) or a duplicate. Returns messages per second.
 *
 * @throws Error when an event has another outcome than `expect`, or the run does not finish within 20 minutes.
 */
export async function timeDedupConsumer(
  kafka: Kafka | KafkaClient,
  source: B4Source,
  options: { groupId: string; expect: 'applied' | 'duplicate'; scope: Scope; recordProgress?: boolean },
): Promise<number> {
  const { pool, topic, events } = source;
  const { groupId, expect, scope } = options;
  const c = clock(events);
  const consumer: DedupConsumer = createDedupConsumer({
    kafka,
    groupId,
    topics: [topic],
    database: pool,
    fromBeginning: true,
    partitionsConsumedConcurrently: B4_CONCURRENCY,
    transactionScope: scope,
    recordProgress: options.recordProgress ?? false,
    handler: async ({ tx, event }) => {
      await tx.query(HANDLER_SQL, [event.id, event.value!.toString()]);
    },
  });
  let unexpected = 0;
  consumer.on(expect === 'applied' ? 'consumer:applied' : 'consumer:duplicate', () => c.tick());
  consumer.on(expect === 'applied' ? 'consumer:duplicate' : 'consumer:applied', () => unexpected++);
  // Proven handled by the partition progress (recordProgress): a duplicate without a transaction.
  consumer.on('consumer:progress-skipped', () => (expect === 'duplicate' ? c.tick() : unexpected++));
  consumer.on('consumer:dead-lettered', () => unexpected++);
  await consumer.start();
  try {
    await withTimeout(c.done, RUN_TIMEOUT_MS, `dedup (${expect}, ${scope})`);
  } finally {
    await consumer.stop();
  }
  if (unexpected > 0) throw new Error(`dedup run (${expect}, ${scope}): ${unexpected} unexpected outcomes`);
  return clockRate(c);
}
