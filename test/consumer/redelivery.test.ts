import type pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedAtLogEnd, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('Redelivery · effects once per event id (G4)', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  let handlerRuns = 0;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
    handlerRuns += 1;
    await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
  };

  async function effectsOf(ids: (string | null)[]): Promise<number> {
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM effects WHERE event_id = ANY($1)',
      [ids],
    );
    return rows[0]!.n;
  }

  it('applies an event produced twice at two offsets (a relay republish) once', async () => {
    const [topic] = await createTopicsWithDlq(['redelivery-twice']);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler });
    const seen = record(consumer);
    await consumer.start();
    const id = uuidv7();
    await producer.send(topic!, [{ partition: 0, eventId: id, value: { copy: 1 } }]);
    await waitFor(() => seen.applied.length === 1);
    // The republished copy lands at another offset (here another partition), in a later batch.
    await producer.send(topic!, [{ partition: 2, eventId: id, value: { copy: 2 } }]);
    await waitFor(() => seen.duplicates.length === 1);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(seen.duplicates[0]!.event).toMatchObject({ id, partition: 2, offset: '0' });
    expect(seen.applied).toHaveLength(1);
    expect(await effectsOf([id])).toBe(1);
  });

  it('skips every event again after the group offsets are reset to the earliest', async () => {
    const [topic] = await createTopicsWithDlq(['redelivery-reset']);
    const groupId = randomName('group');
    const first = consumers.create({ groupId, topics: [topic!], database: db.pool, handler });
    const seenFirst = record(first);
    await first.start();
    const ids = await producer.send(
      topic!,
      Array.from({ length: 12 }, (_, i) => ({ partition: i % 3, value: { i } })),
    );
    await waitFor(() => seenFirst.applied.length === 12);
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    await first.stop();

    const admin = consumers.kafka.admin();
    await admin.connect();
    try {
      // Deleting the group's offsets resets it: with fromBeginning it restarts at the earliest
      // offset (admin.resetOffsets does the same but waits out a full fetch, ~5 s, in kafkajs).
      await admin.deleteGroups([groupId]);
    } finally {
      await admin.disconnect();
    }
    const runsBefore = handlerRuns;
    const second = consumers.create({ groupId, topics: [topic!], database: db.pool, handler });
    const seenSecond = record(second);
    await second.start();
    await waitFor(() => seenSecond.duplicates.length === 12, { message: '12 duplicates after the reset' });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    expect(seenSecond.applied).toHaveLength(0);
    expect(handlerRuns).toBe(runsBefore);
    expect(await effectsOf(ids)).toBe(12);
  });

  it('makes a concurrent duplicate wait on the inbox row, then skip it', async () => {
    const [topic] = await createTopicsWithDlq(['redelivery-concurrent']);
    let inFlight = 0;
    let maxInFlight = 0;
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        try {
          // Hold the inbox row long enough for the other copy to reach it.
          await tx.query('SELECT pg_sleep(0.3)');
          await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
        } finally {
          inFlight -= 1;
        }
      },
    });
    const seen = record(consumer);
    await consumer.start();
    const id = uuidv7();
    await producer.send(topic!, [
      { partition: 0, eventId: id, value: { copy: 1 } },
      { partition: 1, eventId: id, value: { copy: 2 } },
    ]);
    await waitFor(() => seen.applied.length + seen.duplicates.length === 2);
    expect(seen.applied).toHaveLength(1);
    expect(seen.duplicates).toHaveLength(1);
    expect(seen.errors).toHaveLength(0);
    expect(maxInFlight).toBe(1);
    expect(await effectsOf([id])).toBe(1);
  });
});
