import { Kafka, logLevel } from 'kafkajs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { replayDeadLetters } from '../../consumer/dead-letter-replay.js';
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
    const logger: Logger = {
      debug() {},
      info() {},
      error: (_, msg) => warnings.push(msg),
      warn: (_, msg) => warnings.push(msg),
    };
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

      // Nothing past the unsent dead letter was applied or acknowledged; the consumer runs on.
      expect(seen.deadLettered).toHaveLength(0);
      expect(seen.crashes).toEqual([]);
      expect(consumer.state).toBe('running');
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
      // Through every failed send and back: the consumer never crashed (kafkajs restarts a consumer
      // whose batch threw a retriable error, after a crash event; that is not how it waited).
      expect(seen.crashes).toEqual([]);
      expect(consumer.state).toBe('running');
      expect(seen.errors.length).toBeGreaterThan(0);
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

  it('sends a dead letter too large for its topic without its value (dlq-omitted), moves on, and never crashes', async () => {
    // The dead-letter topic takes records of up to 100 kB; the poison is 200 kB (as when the
    // source topic allows more than its dead-letter topic, or the dlq-* headers tip it over).
    const [topic] = await createTopicsWithDlq(['dlq-too-large'], 1);
    const dlq = `${topic}.dlq`;
    const admin = kafka.admin();
    await admin.connect();
    try {
      await admin.alterConfigs({
        validateOnly: false,
        resources: [{ type: 2, name: dlq, configEntries: [{ name: 'max.message.bytes', value: '100000' }] }],
      });
    } finally {
      await admin.disconnect();
    }
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (_, msg) => warnings.push(msg) };
    const applied: string[] = [];
    const consumer = consumers.create({
      kafka,
      topics: [topic!],
      database: db.pool,
      logger,
      maxAttempts: 2,
      handler: async ({ event }) => {
        if ((event.json() as { note: string }).note === 'big') throw new Error('cannot handle this one');
        applied.push(event.id);
      },
    });
    const seen = record(consumer);
    await consumer.start();
    // Told at start: the dead-letter topic is smaller than its source topic.
    expect(warnings.some((w) => w.includes('dead-lettered without its value'))).toBe(true);
    const [big, after] = await producer.send(topic!, [
      { partition: 0, key: 'k-big', value: { note: 'big', pad: 'x'.repeat(200_000) } },
      { partition: 0, value: { note: 'after' } },
    ]);
    await waitFor(() => seen.deadLettered.length === 1 && applied.length === 1, {
      timeoutMs: 30_000,
      message: () => `dead-lettered without its value, then the next one applied (warnings: ${warnings.join(' | ')})`,
    });
    await waitFor(() => committedAtLogEnd(kafka, consumer.groupId, topic!), { message: 'offsets at the log end' });
    expect(applied).toEqual([after]);
    expect(seen.crashes).toEqual([]);
    expect(consumer.state).toBe('running');
    const [letter] = await readTopic(
      dlq,
      (m) => m,
      (all) => all.length >= 1,
    );
    expect(letter!.value).toBeNull();
    expect(letter!.key).toBe('k-big');
    expect(letter!.headers['event-id']).toBe(big);
    expect(letter!.headers['dlq-original-offset']).toBe('0');
    expect(letter!.headers['dlq-reason']).toBe('Error: cannot handle this one');
    expect(letter!.headers['dlq-omitted']).toMatch(/^value \(2000\d\d bytes\)/);
    // Not replayable from the dead-letter topic: replay says where the original is instead.
    const result = await replayDeadLetters(kafka, dlq, { all: true });
    expect(result.replayed).toEqual([]);
    expect(result.skipped).toEqual([
      expect.objectContaining({ eventId: big, why: expect.stringContaining(`${topic}/0@0`) }),
    ]);
  });
});
