/**
 * G5 · dead letters stay visible and can be replayed: a handler that fails until a flag flips
 * dead-letters its events; after the fix, `dlq replay` re-drives them and the dedup consumer
 * applies each once; replaying again only produces duplicates. Also `outboxkit dlq list|replay`.
 */
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { readDeadLetters, replayDeadLetters } from '../../consumer/dead-letter-replay.js';
import { deadLetterMessage, reducedDeadLetter } from '../../consumer/dead-letter.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnCli } from '../helpers/processes.js';
import { createTopics } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedAtLogEnd, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

const SECRET = 'card-number-4111111111111111';

describe('G5 · dlq list and replay', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  let failing = true;

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
    await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
    if (failing) throw new Error('downstream refused the order');
  };

  async function effectsOf(id: string | null): Promise<number> {
    const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM effects WHERE event_id = $1', [
      id,
    ]);
    return rows[0]!.n;
  }

  it('replays dead letters after the fix: each event applied once, a second replay only duplicates', async () => {
    failing = true;
    const [topic] = await createTopicsWithDlq(['dlq-replay']);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, maxAttempts: 2 });
    const seen = record(consumer);
    await consumer.start();
    const [a, b] = await producer.send(topic!, [
      { partition: 0, key: 'order-a', value: { secret: SECRET } },
      { partition: 1, key: 'order-b', value: { n: 2 } },
    ]);
    await waitFor(() => seen.deadLettered.length === 2, { message: 'two dead letters' });

    const { records, complete } = await readDeadLetters(consumers.client, `${topic}.dlq`);
    expect(complete).toBe(true);
    expect(records.map((r) => r.summary.eventId).sort()).toEqual([a, b].sort());
    const summaryA = records.find((r) => r.summary.eventId === a)!.summary;
    expect(summaryA).toMatchObject({
      originalTopic: topic,
      originalPartition: 0,
      originalOffset: '0',
      attempts: 2,
      consumerGroup: consumer.groupId,
      eventType: 'test.event',
      key: 'order-a',
    });
    expect(summaryA.reason).toContain('downstream refused the order');
    expect(Date.parse(summaryA.failedAt!)).not.toBeNaN();
    expect(JSON.stringify(summaryA)).not.toContain(SECRET);

    failing = false;
    const first = await replayDeadLetters(consumers.client, `${topic}.dlq`, { eventIds: [a!] });
    expect(first.replayed).toEqual([expect.objectContaining({ eventId: a, topic })]);
    await waitFor(() => seen.applied.length === 1);
    expect(seen.applied[0]!.event.id).toBe(a);
    // The replayed message is the original one: same key, value and headers, no dlq-* header.
    expect(seen.applied[0]!.event.key).toBe('order-a');
    expect(seen.applied[0]!.event.json()).toEqual({ secret: SECRET });
    expect(Object.keys(seen.applied[0]!.event.headers).filter((h) => h.startsWith('dlq-'))).toEqual([]);
    expect(seen.applied[0]!.event.headers['event-type']).toBe('test.event');
    expect(await effectsOf(b!)).toBe(0);

    const all = await replayDeadLetters(consumers.client, `${topic}.dlq`, { all: true });
    expect(all.replayed.map((r) => r.eventId).sort()).toEqual([a, b].sort());
    await waitFor(() => seen.applied.length === 2 && seen.duplicates.length === 1);

    // Replaying everything again: both come back as duplicates, no effect runs twice.
    await replayDeadLetters(consumers.client, `${topic}.dlq`, { all: true });
    await waitFor(() => seen.duplicates.length === 3);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(seen.applied).toHaveLength(2);
    expect(await effectsOf(a!)).toBe(1);
    expect(await effectsOf(b!)).toBe(1);
    expect(seen.deadLettered).toHaveLength(2);
  });

  it('replays the latest dead letter with a value when a later copy went without it (dlq-omitted)', async () => {
    const [topic] = await createTopics(['dlq-omitted-copy'], { partitions: 1 });
    const [dlq] = await createTopics(['dlq-omitted-copy-dlq'], { partitions: 1 });
    const full = deadLetterMessage(
      { key: Buffer.from('k'), value: Buffer.from('{"n":1}'), timestamp: '0', offset: '5', headers: {} },
      { reason: 'Error: x', topic: topic!, partition: 0, attempts: 5, groupId: 'g', failedAt: new Date() },
    );
    const id = '0190a6e2-8f4b-7cc3-9d2e-0123456789ab';
    full.headers!['event-id'] = id;
    const kafka = consumers.kafka;
    const p = kafka.producer();
    await p.connect();
    try {
      await p.send({ topic: dlq!, messages: [full, reducedDeadLetter(full, ['event-id'])] });
    } finally {
      await p.disconnect();
    }
    const result = await replayDeadLetters(consumers.client, dlq!, { all: true, to: topic! });
    expect(result.replayed).toEqual([{ eventId: id, topic: topic!, dlqPartition: 0, dlqOffset: '0' }]);
    expect(result.skipped).toEqual([
      expect.objectContaining({ dlqOffset: '1', why: expect.stringContaining('without its value') }),
    ]);
  });

  it('reports requested event ids that are not dead-lettered, and reads an empty topic at once', async () => {
    const [topic] = await createTopicsWithDlq(['dlq-empty']);
    expect(await readDeadLetters(consumers.client, `${topic}.dlq`)).toEqual({ records: [], complete: true });
    const result = await replayDeadLetters(consumers.client, `${topic}.dlq`, {
      eventIds: ['0190a6e2-8f4b-7cc3-9d2e-0123456789ab'],
    });
    expect(result).toEqual({ replayed: [], skipped: [], notFound: ['0190a6e2-8f4b-7cc3-9d2e-0123456789ab'] });
    await expect(readDeadLetters(consumers.client, `${topic}.nope`)).rejects.toMatchObject({
      code: 'OUTBOXKIT_TOPIC_MISSING',
    });
  });

  it('outboxkit dlq list shows where and why without the payload; dlq replay --all --to re-drives', async () => {
    failing = true;
    const [topic] = await createTopicsWithDlq(['dlq-cli']);
    const [other] = await createTopics(['dlq-cli-to']);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, maxAttempts: 1 });
    const seen = record(consumer);
    await consumer.start();
    const [id] = await producer.send(topic!, [{ partition: 2, key: 'k', value: { secret: SECRET } }]);
    await waitFor(() => seen.deadLettered.length === 1);

    const list = spawnCli(['dlq', 'list', `${topic}.dlq`]);
    expect((await list.exited).code).toBe(0);
    const text = list.output.join('');
    expect(text).toContain(`event=${id}`);
    expect(text).toContain(`from=${topic}/2@0`);
    expect(text).toContain('attempts=1');
    expect(text).toContain('downstream refused the order');
    expect(text).not.toContain(SECRET);

    const json = spawnCli(['dlq', 'list', `${topic}.dlq`, '--json', '--limit', '5']);
    expect((await json.exited).code).toBe(0);
    const parsed = JSON.parse(json.stdout.join('')) as { eventId: string; originalTopic: string }[];
    expect(parsed).toEqual([expect.objectContaining({ eventId: id, originalTopic: topic })]);

    // --to: a topic this consumer does not read; the record lands there with its original bytes.
    failing = false;
    const replay = spawnCli(['dlq', 'replay', `${topic}.dlq`, '--all', '--to', other!]);
    expect((await replay.exited).code).toBe(0);
    expect(replay.output.join('')).toContain(`replayed ${id} -> ${other}`);
    const { records } = await readDeadLetters(consumers.client, other!);
    expect(records.map((r) => [r.summary.eventId, r.message.value?.toString()])).toEqual([
      [id, JSON.stringify({ secret: SECRET })],
    ]);

    const missing = spawnCli(['dlq', 'replay', `${topic}.dlq`]);
    expect((await missing.exited).code).not.toBe(0);
  });
});
