import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { DEAD_LETTER_REASON_INVALID_EVENT_ID, type DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedAtLogEnd, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('C16 · a message without a usable event id', () => {
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

  it('dead-letters messages with no, malformed or nil event ids; the partition moves on and the consumer keeps running', async () => {
    const [topic] = await createTopicsWithDlq(['c16']);
    const handled: string[] = [];
    const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
      const { note } = event.json() as { note: string };
      handled.push(note);
      await tx.query('INSERT INTO effects (event_id, note) VALUES ($1, $2)', [event.id, note]);
    };
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler });
    const seen = record(consumer);
    await consumer.start();

    await producer.send(topic!, [
      { partition: 0, eventId: null, value: { note: 'no header' } },
      { partition: 0, eventId: 'not-a-uuid', value: { note: 'malformed' } },
      { partition: 0, eventId: '00000000-0000-0000-0000-000000000000', value: { note: 'nil uuid' } },
      { partition: 0, eventId: '0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B', value: { note: 'good, upper case' } },
    ]);
    await waitFor(() => seen.deadLettered.length === 3 && seen.applied.length === 1, {
      message: '3 dead-lettered, 1 applied',
    });
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!), {
      message: 'partition 0 moved on',
    });

    expect(handled).toEqual(['good, upper case']);
    expect(seen.applied[0]!.event.id).toBe('0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b');
    expect(seen.deadLettered.map((d) => [d.offset, d.eventId, d.reason, d.attempts])).toEqual([
      ['0', null, DEAD_LETTER_REASON_INVALID_EVENT_ID, 0],
      ['1', null, DEAD_LETTER_REASON_INVALID_EVENT_ID, 0],
      ['2', null, DEAD_LETTER_REASON_INVALID_EVENT_ID, 0],
    ]);
    expect(seen.retries).toHaveLength(0);
    expect(seen.crashes).toHaveLength(0);

    const letters = await readTopic(
      `${topic}.dlq`,
      (m) => m,
      (all) => all.length >= 3,
    );
    expect(letters).toHaveLength(3);
    expect(
      letters.map((l) => [
        JSON.parse(l.value!.toString()).note,
        l.headers['event-id'],
        l.headers['dlq-reason'],
        l.headers['dlq-original-offset'],
        l.headers['dlq-attempts'],
      ]),
    ).toEqual([
      ['no header', undefined, 'missing or invalid event id', '0', '0'],
      ['malformed', 'not-a-uuid', 'missing or invalid event id', '1', '0'],
      ['nil uuid', '00000000-0000-0000-0000-000000000000', 'missing or invalid event id', '2', '0'],
    ]);

    // Still running: a later good message on the same partition is applied.
    await producer.send(topic!, [{ partition: 0, value: { note: 'later' } }]);
    await waitFor(() => seen.applied.length === 2);
    expect(handled).toEqual(['good, upper case', 'later']);
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
      [consumer.groupId],
    );
    expect(rows[0]!.n).toBe(2);
  });

  it('reads the event id from a configured header', async () => {
    const [topic] = await createTopicsWithDlq(['c16-header']);
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      eventIdHeader: 'x-message-id',
      handler: async () => {},
    });
    const seen = record(consumer);
    await consumer.start();
    await producer.send(topic!, [
      { partition: 1, eventId: null, value: {}, headers: { 'x-message-id': '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c' } },
      // The default header alone is not enough once another one is configured.
      { partition: 1, value: {} },
    ]);
    await waitFor(() => seen.applied.length === 1 && seen.deadLettered.length === 1);
    expect(seen.applied[0]!.event.id).toBe('0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c');
    expect(seen.deadLettered[0]!.offset).toBe('1');
  });
});
