import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE } from '../../src/outbox/event.js';
import type { DedupHandler } from '../../consumer/index.js';
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

describe('C13 · one poison message', () => {
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

  async function notesApplied(): Promise<string[]> {
    const { rows } = await db.pool.query<{ note: string }>('SELECT note FROM effects ORDER BY note');
    return rows.map((r) => r.note);
  }

  it('dead-letters the poison after maxAttempts with its headers; later messages run; partition 1 is never held up', async () => {
    const [topic] = await createTopicsWithDlq(['c13']);
    const maxAttempts = 6;
    let poisonRuns = 0;
    // The order in which effects and dead letters happened, across partitions.
    const timeline: string[] = [];
    const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
      const { note } = event.json() as { note: string };
      if (note === 'poison') {
        poisonRuns += 1;
        throw new Error('poison pill');
      }
      await tx.query('INSERT INTO effects (event_id, note) VALUES ($1, $2)', [event.id, note]);
    };
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler,
      maxAttempts,
      // Slow retries (full jitter below 1 s each; 5 retries ≈ 2.5 s on average), so that the
      // partition-1 traffic below happens while the poison is still being retried.
      retryInitialMs: 1_000,
      retryMaxMs: 1_000,
    });
    const seen = record(consumer);
    consumer.on('consumer:applied', ({ event }) => timeline.push(`applied ${(event.json() as { note: string }).note}`));
    consumer.on('consumer:dead-lettered', ({ partition, offset }) =>
      timeline.push(`dead-lettered ${partition}@${offset}`),
    );
    await consumer.start();

    const [, poisonId] = await producer.send(topic!, [
      { partition: 0, key: 'k0', value: { note: 'p0-ok-1' } },
      { partition: 0, key: 'k-poison', value: { note: 'poison' }, headers: { traceparent: '00-abc-def-01' } },
      { partition: 0, key: 'k0', value: { note: 'p0-ok-2' } },
      { partition: 0, key: 'k0', value: { note: 'p0-ok-3' } },
    ]);
    await waitFor(() => seen.retries.length >= 1, { message: 'first failure of the poison' });

    // Steady traffic on partition 1 while the poison is retried: one message at a time.
    for (let i = 1; i <= 5; i++) await producer.send(topic!, [{ partition: 1, value: { note: `p1-${i}` } }]);

    await waitFor(() => seen.deadLettered.length === 1 && seen.applied.length === 8, {
      message: 'poison dead-lettered, 8 applied',
    });
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!), {
      message: 'offsets committed to the log end',
    });

    // Partition 1 was never held up: all its messages were applied before the poison gave up.
    const dead = timeline.indexOf('dead-lettered 0@1');
    for (let i = 1; i <= 5; i++) expect(timeline.indexOf(`applied p1-${i}`)).toBeLessThan(dead);
    // Partition 0 kept its order: ok-1, then the poison's dead letter, then ok-2 and ok-3.
    expect(timeline.filter((t) => t.includes('p0') || t.startsWith('dead'))).toEqual([
      'applied p0-ok-1',
      'dead-lettered 0@1',
      'applied p0-ok-2',
      'applied p0-ok-3',
    ]);
    expect(poisonRuns).toBe(maxAttempts);
    expect(seen.retries.map((r) => r.attempt)).toEqual([1, 2, 3, 4, 5]);
    expect(await notesApplied()).toEqual(['p0-ok-1', 'p0-ok-2', 'p0-ok-3', 'p1-1', 'p1-2', 'p1-3', 'p1-4', 'p1-5']);
    const inbox = await db.pool.query('SELECT 1 FROM outboxkit.inbox WHERE event_id = $1', [poisonId]);
    expect(inbox.rowCount).toBe(0);
    expect((await committedOffsets(consumers.kafka, consumer.groupId, topic!)).get(0)).toBe(4);
    expect(seen.errors).toHaveLength(0);
    expect(seen.crashes).toHaveLength(0);

    const [letter] = await readTopic(
      `${topic}.dlq`,
      (m) => m,
      (all) => all.length >= 1,
    );
    expect(letter!.key).toBe('k-poison');
    expect(letter!.value?.toString()).toBe(JSON.stringify({ note: 'poison' }));
    const { 'dlq-failed-at': failedAt, ...headers } = letter!.headers;
    expect(headers).toEqual({
      [HEADER_EVENT_ID]: poisonId,
      [HEADER_EVENT_TYPE]: 'test.event',
      traceparent: '00-abc-def-01',
      // The handler threw 'poison pill'; 'poison' is the payload's note, and a reason never
      // carries words of the value (reasonOf, docs/runbooks.md "Dead letters").
      'dlq-reason': 'Error: … pill',
      'dlq-original-topic': topic,
      'dlq-original-partition': '0',
      'dlq-original-offset': '1',
      'dlq-attempts': String(maxAttempts),
      'dlq-consumer-group': consumer.groupId,
    });
    expect(Number.isNaN(Date.parse(failedAt!))).toBe(false);
  });

  it('dead-letters at once, without retries, when the handler rejects the message as invalid', async () => {
    const [topic] = await createTopicsWithDlq(['c13-invalid']);
    let runs = 0;
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        runs += 1;
        const { note } = event.json() as { note: string }; // throws InvalidMessageError on non-JSON
        await tx.query('INSERT INTO effects (event_id, note) VALUES ($1, $2)', [event.id, note]);
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await producer.send(topic!, [{ partition: 2, value: { note: 'fine' } }]);
    // A value that is not JSON (TestProducer JSON-encodes, so send raw bytes), then a good one.
    const invalidId = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';
    const raw = consumers.kafka.producer();
    await raw.connect();
    try {
      await raw.send({
        topic: topic!,
        messages: [{ partition: 2, value: '{not json', headers: { [HEADER_EVENT_ID]: invalidId } }],
      });
    } finally {
      await raw.disconnect();
    }
    await producer.send(topic!, [{ partition: 2, value: { note: 'after-invalid' } }]);

    await waitFor(() => seen.deadLettered.length === 1 && seen.applied.length === 2, {
      message: 'invalid dead-lettered, 2 applied',
    });
    expect(seen.retries).toHaveLength(0);
    expect(seen.deadLettered[0]).toMatchObject({ partition: 2, offset: '1', attempts: 1, eventId: invalidId });
    expect(seen.deadLettered[0]!.reason).toMatch(/^InvalidMessageError: .* is not valid JSON/);
    expect(seen.applied.map((a) => a.event.offset)).toEqual(['0', '2']);
    expect(runs).toBe(3);
  });
});
