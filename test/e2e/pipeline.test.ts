/**
 * The walking skeleton, end to end on the real PostgreSQL and Kafka:
 * commit → relay → Kafka → dedup consumer → effect, and a rolled-back transaction whose event
 * never arrives.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDedupConsumer } from '../../consumer/index.js';
import { enqueue } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, randomName, testKafka } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('CREATE TABLE effects (order_id text PRIMARY KEY, event_id uuid NOT NULL)');
});
afterAll(async () => {
  await db.drop();
});

describe('pipeline', () => {
  it('applies each committed event once and never a rolled-back one', async () => {
    const [topic] = await createTopics(['e2e']);
    const kafka = testKafka();
    const admin = kafka.admin();
    await admin.connect();
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic: `${topic}.dlq`, numPartitions: 1 }] });
    await admin.disconnect();

    const consumer = createDedupConsumer({
      kafka,
      groupId: randomName('e2e'),
      topics: [topic!],
      database: db.pool,
      fromBeginning: true,
      async handler({ tx, event }) {
        const { orderId } = event.json() as { orderId: string };
        await tx.query('INSERT INTO effects (order_id, event_id) VALUES ($1, $2)', [orderId, event.id]);
      },
    });
    await consumer.start();
    try {
      await startRelay(db.url);
      const client = await db.pool.connect();
      try {
        for (let i = 0; i < 30; i++) {
          await client.query('BEGIN');
          await enqueue(client, {
            topic: topic!,
            key: `order-${i}`,
            type: 'order.created',
            payload: { orderId: `order-${i}` },
          });
          await client.query('COMMIT');
        }
        await client.query('BEGIN');
        await enqueue(client, { topic: topic!, key: 'ghost', type: 'order.created', payload: { orderId: 'ghost' } });
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
      await waitFor(async () => {
        const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM effects');
        return rows[0]!.n === 30;
      });
      // Republish everything (as a relay crash before marking would): no second effect.
      await db.pool.query('UPDATE outboxkit.outbox_events SET published_at = NULL');
      await waitFor(async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
        );
        return rows[0]!.n === 0;
      });
      await waitFor(async () => {
        const { rows } = await db.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM outboxkit.inbox`);
        return rows[0]!.n === 30;
      });
      const { rows } = await db.pool.query<{ order_id: string }>('SELECT order_id FROM effects ORDER BY order_id');
      expect(rows).toHaveLength(30);
      expect(rows.some((r) => r.order_id === 'ghost')).toBe(false);
    } finally {
      await consumer.stop();
    }
  });
});
