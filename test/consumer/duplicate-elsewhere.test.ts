/**
 * A duplicate skip is visible when it is not a redelivery of the message that was applied: a
 * different message carrying an event id the group already applied (an event that reuses an old
 * id, or a relay republish) is logged at warn with where the id was first applied, emitted with
 * `elsewhere: true`, and counted in `outboxkit_consumer_duplicates_elsewhere_total`. A redelivery
 * of the applied message itself (offset reset) stays a quiet duplicate. Real Kafka and PostgreSQL,
 * with a pg.Pool and a drizzle database, per message and per batch.
 */
import { drizzle } from 'drizzle-orm/node-postgres';
import client from 'prom-client';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { consumerMetrics } from '../../consumer/index.js';
import type { DatabaseHandle } from '../../src/database.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedAtLogEnd, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('duplicates from another message', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const setups: [string, () => DatabaseHandle, 'message' | 'batch'][] = [
    ['pg.Pool, per message', () => db.pool, 'message'],
    ['pg.Pool, per batch', () => db.pool, 'batch'],
    ['drizzle, per message', () => drizzle(db.pool), 'message'],
    ['drizzle, per batch', () => drizzle(db.pool), 'batch'],
  ];

  it.each(setups)(
    '%s: a new event reusing an applied id is skipped at warn and counted; a redelivery is not',
    async (_, database, transactionScope) => {
      const [topic] = await createTopicsWithDlq([`dup-elsewhere-${transactionScope}`]);
      const warnings: { fields: Record<string, unknown>; msg: string }[] = [];
      const logger: Logger = {
        debug() {},
        info() {},
        error() {},
        warn: (fields, msg) => warnings.push({ fields, msg }),
      };
      const seenValues: unknown[] = [];
      const options = {
        topics: [topic!],
        database: database(),
        transactionScope,
        logger,
        handler: async ({ event }: { event: { json(): unknown } }) => {
          seenValues.push(event.json());
        },
      };
      const consumer = consumers.create(options);
      const registry = new client.Registry();
      consumerMetrics(consumer, registry);
      const seen = record(consumer);
      await consumer.start();

      const id = uuidv7();
      // The first event with this id, then another event that reuses it (its row long deleted
      // from the outbox, say): same partition, a later offset, other bytes.
      await producer.send(topic!, [
        { partition: 0, eventId: id, value: { order: 1 } },
        { partition: 0, eventId: id, value: { order: 2, reused: true } },
      ]);
      await waitFor(() => seen.applied.length === 1 && seen.duplicates.length === 1);
      expect(seenValues).toEqual([{ order: 1 }]);
      expect(seen.duplicates[0]).toMatchObject({
        elsewhere: true,
        firstApplied: { topic, partition: 0, offset: '0', processedAt: expect.any(Date) },
      });
      expect(seen.duplicates[0]!.event.offset).toBe('1');
      expect(warnings).toEqual([
        expect.objectContaining({
          msg: expect.stringContaining('Duplicate event id in another message than the one applied'),
          fields: expect.objectContaining({
            eventId: id,
            offset: '1',
            firstApplied: expect.objectContaining({ offset: '0' }),
          }),
        }),
      ]);
      const metrics = await registry.metrics();
      expect(metrics).toContain(
        `outboxkit_consumer_duplicates_elsewhere_total{group="${consumer.groupId}",topic="${topic}"} 1`,
      );
      expect(metrics).toContain(`outboxkit_consumer_duplicates_total{group="${consumer.groupId}",topic="${topic}"} 1`);

      // A redelivery of the applied message itself (the group's offsets reset to 0): a quiet duplicate.
      await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
      await consumer.stop();
      const admin = consumers.kafka.admin();
      await admin.connect();
      try {
        await admin.setOffsets({
          groupId: consumer.groupId,
          topic: topic!,
          partitions: [{ partition: 0, offset: '0' }],
        });
      } finally {
        await admin.disconnect();
      }
      const again = consumers.create({ ...options, groupId: consumer.groupId });
      const seenAgain = record(again);
      await again.start();
      await waitFor(() => seenAgain.duplicates.length === 2);
      expect(seenAgain.duplicates.map((d) => [d.event.offset, d.elsewhere])).toEqual([
        ['0', false],
        ['1', true],
      ]);
      expect(seenAgain.applied).toEqual([]);
      expect(warnings).toHaveLength(2);
    },
  );
});
