import type pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedOffsets, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('C15 · the same event twice in one batch', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL, note text NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
    await tx.query('INSERT INTO effects (event_id, note) VALUES ($1, $2)', [
      event.id,
      (event.json() as { note: string }).note,
    ]);
  };

  async function effectsById(): Promise<Map<string, number>> {
    const { rows } = await db.pool.query<{ event_id: string; n: string }>(
      'SELECT event_id, count(*) AS n FROM effects GROUP BY event_id',
    );
    return new Map(rows.map((r) => [r.event_id, Number(r.n)]));
  }

  it('applies a, b and c once each from a batch [a, b, a, c], without an error', async () => {
    const [topic] = await createTopicsWithDlq(['c15']);
    const [a, b, c] = [uuidv7(), uuidv7(), uuidv7()];
    // One send to one partition: one record batch, delivered to the consumer as one batch.
    await producer.send(topic!, [
      { partition: 0, eventId: a, value: { note: 'a' } },
      { partition: 0, eventId: b, value: { note: 'b' } },
      { partition: 0, eventId: a, value: { note: 'a again' } },
      { partition: 0, eventId: c, value: { note: 'c' } },
    ]);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler });
    const seen = record(consumer);
    await consumer.start();

    await waitFor(async () => (await committedOffsets(consumers.kafka, consumer.groupId, topic!)).get(0) === 4, {
      message: 'offset of partition 0 committed past [a, b, a, c]',
    });
    expect(await effectsById()).toEqual(
      new Map([
        [a, 1],
        [b, 1],
        [c, 1],
      ]),
    );
    expect(seen.applied.map((e) => e.event.id)).toEqual([a, b, c]);
    expect(seen.duplicates.map((e) => [e.event.id, e.event.offset])).toEqual([[a, '2']]);
    expect(seen.retries).toHaveLength(0);
    expect(seen.errors).toHaveLength(0);
    expect(seen.deadLettered).toHaveLength(0);
    expect(seen.crashes).toHaveLength(0);
    const { rows } = await db.pool.query(
      'SELECT event_id, "offset" FROM outboxkit.inbox WHERE consumer_group = $1 ORDER BY "offset"',
      [consumer.groupId],
    );
    expect(rows).toEqual([
      { event_id: a, offset: '0' },
      { event_id: b, offset: '1' },
      { event_id: c, offset: '3' },
    ]);

    // The consumer keeps running: a later event is applied too.
    const [d] = await producer.send(topic!, [{ partition: 0, value: { note: 'd' } }]);
    await waitFor(() => seen.applied.length === 4);
    expect((await effectsById()).get(d!)).toBe(1);
  });
});
