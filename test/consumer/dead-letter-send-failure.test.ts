import { Kafka, logLevel } from 'kafkajs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  committedAtLogEnd,
  committedOffsets,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  TestProducer,
} from './support.js';

describe('Dead-letter send failure (G5: nothing acknowledged that was not dead-lettered)', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  // Short client retries, so a failed DLQ send surfaces in about a second instead of ~10 s.
  const kafka = new Kafka({
    clientId: 'outboxkit-dlq-test',
    brokers: inject('kafkaBrokers'),
    logLevel: logLevel.NOTHING,
    retry: { initialRetryTime: 50, maxRetryTime: 400 },
  });

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  it('keeps the offset unresolved while the DLQ topic is unavailable, then dead-letters once and moves on', async () => {
    const [topic] = await createTopicsWithDlq(['dlq-down']);
    const dlq = `${topic}.dlq`;
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (_, msg) => warnings.push(msg) };
    const applied: string[] = [];
    const consumer = consumers.create({
      kafka,
      topics: [topic!],
      database: db.pool,
      logger,
      handler: async ({ event }) => {
        applied.push(event.id);
      },
    });
    const seen = record(consumer);
    await consumer.start();

    const admin = kafka.admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [dlq] });
      await waitFor(async () => !(await admin.listTopics()).includes(dlq), { message: 'DLQ topic deleted' });
      const [, good] = await producer.send(topic!, [
        { partition: 0, eventId: null, value: { note: 'no id' } },
        { partition: 0, value: { note: 'behind it' } },
      ]);
      await waitFor(() => warnings.some((w) => w.startsWith('Dead-letter send failed')), {
        message: 'a failed DLQ send',
      });

      // Nothing past the unsent dead letter was applied or acknowledged.
      expect(seen.deadLettered).toHaveLength(0);
      expect(applied).toEqual([]);
      expect((await committedOffsets(kafka, consumer.groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(0);

      await admin.createTopics({
        waitForLeaders: true,
        topics: [{ topic: dlq, numPartitions: 1, replicationFactor: 1 }],
      });
      await waitFor(() => seen.deadLettered.length === 1 && applied.length === 1, {
        timeoutMs: 30_000,
        message: 'dead-lettered, then applied',
      });
      await waitFor(() => committedAtLogEnd(kafka, consumer.groupId, topic!), { message: 'offsets at the log end' });
      expect(applied).toEqual([good]);
    } finally {
      await admin.disconnect();
    }
    const letters = await readTopic(
      dlq,
      (m) => m.headers['dlq-original-offset'],
      (all) => all.length >= 1,
    );
    expect(letters).toEqual(['0']);
  });
});
