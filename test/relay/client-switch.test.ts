/**
 * Switching the relay's Kafka client library (kafkajs ↔ @platformatic/kafka) keeps each key on
 * one partition and in order: the events of every key are published partly by a relay on one
 * library, then, after it stopped, by a relay on the other (docs/kafka.md, "Choosing a client").
 * With @platformatic/kafka's default partitioner about half of the keys would be split over two
 * partitions.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { enqueue, withPgTransaction } from '../../src/index.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic, testKafka } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

const KEYS = 60;
const PER_KEY_EACH_SIDE = 10;

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

function clientOf(library: 'kafkajs' | 'platformatic') {
  return library === 'kafkajs'
    ? testKafka('outboxkit-test-switch')
    : createPlatformaticClient({ clientId: 'outboxkit-test-switch', brokers: inject('kafkaBrokers') });
}

/** Enqueues events `from`..`from + count - 1` of every key, in that order per key. */
async function enqueueRound(topic: string, from: number, count: number): Promise<void> {
  for (let i = from; i < from + count; i++) {
    await withPgTransaction(db.pool, (c) =>
      enqueue(
        c,
        Array.from({ length: KEYS }, (_, k) => ({ topic, key: `switch-${k}`, type: 't', payload: { k, i } })),
      ),
    );
  }
}

async function publishedCount(topic: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: string }>(
    'SELECT count(*) AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NOT NULL',
    [topic],
  );
  return Number(rows[0]!.n);
}

describe('switching the Kafka client library of the relay', () => {
  it.each([
    ['kafkajs', 'platformatic'],
    ['platformatic', 'kafkajs'],
  ] as const)('from %s to %s keeps every key on one partition, in order', async (from, to) => {
    const [topic] = await createTopics(['switch'], { partitions: 6 });
    await enqueueRound(topic!, 0, PER_KEY_EACH_SIDE);
    const first = await startRelay(db.url, { kafka: clientOf(from) });
    await waitFor(async () => (await publishedCount(topic!)) === KEYS * PER_KEY_EACH_SIDE, { timeoutMs: 30_000 });
    await first.stopAndForget();

    await enqueueRound(topic!, PER_KEY_EACH_SIDE, PER_KEY_EACH_SIDE);
    await startRelay(db.url, { kafka: clientOf(to) });
    const total = KEYS * PER_KEY_EACH_SIDE * 2;
    await waitFor(async () => (await publishedCount(topic!)) === total, { timeoutMs: 30_000 });

    const read = await readTopic(
      topic!,
      (m) => ({ key: m.key!, partition: m.partition, i: (JSON.parse(m.value!.toString()) as { i: number }).i }),
      (all) => new Set(all.map((r) => `${r.key}/${r.i}`)).size >= total,
      60_000,
    );
    const byKey = new Map<string, { partitions: Set<number>; firsts: number[]; seen: Set<number> }>();
    for (const r of read) {
      let k = byKey.get(r.key);
      if (!k) byKey.set(r.key, (k = { partitions: new Set(), firsts: [], seen: new Set() }));
      k.partitions.add(r.partition);
      if (!k.seen.has(r.i)) k.firsts.push(r.i);
      k.seen.add(r.i);
    }
    expect(byKey.size).toBe(KEYS);
    const split = [...byKey].filter(([, k]) => k.partitions.size !== 1).map(([key]) => key);
    expect(split).toEqual([]);
    const expected = Array.from({ length: PER_KEY_EACH_SIDE * 2 }, (_, i) => i);
    for (const [, k] of byKey) expect(k.firsts).toEqual(expected);
    // Keys spread over the partitions (one partition for all would also "agree").
    expect(new Set([...byKey.values()].map((k) => [...k.partitions][0])).size).toBe(6);
  });
});
