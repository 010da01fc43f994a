/**
 * The broker killed (SIGKILL) and restarted mid-stream, on a private broker so the shared one is
 * untouched: nothing committed is lost, keys keep the order of their first occurrences.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Kafka, logLevel } from 'kafkajs';
import { freePortBlock, startScratchBroker, type ScratchBroker } from '../../scripts/services.js';
import { enqueue, HEADER_EVENT_ID, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopicsOn, randomName } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
let broker: ScratchBroker;
let kafka: Kafka;
// A port per Kafka line, so the two CI passes never meet a leftover of the other.
// Its broker's port and controller port: a free pair, from a base of this file's own.
const PORT = await freePortBlock(2, 19_092 + Number(process.pid % 50) * 2);

beforeAll(async () => {
  db = await createTestDatabase();
  broker = await startScratchBroker(PORT);
  kafka = new Kafka({
    clientId: 'broker-restart',
    brokers: broker.brokers,
    logLevel: logLevel.NOTHING,
    retry: { retries: 3 },
  });
}, 120_000);
afterAll(async () => {
  await broker?.destroy();
  await db?.drop();
});

describe('broker killed and restarted mid-stream', () => {
  it('publishes every committed event after the broker comes back, keys in order', async () => {
    const topic = randomName('restart');
    // Right after the broker starts, CreateTopics may meet "This server does not host this
    // topic-partition": the helper retries it and waits for the leaders.
    await createTopicsOn(kafka, [{ topic, numPartitions: 3 }]);
    const relay = await startRelay(db.url, { kafka, retryInitialMs: 100, retryMaxMs: 1_000 });
    let errors = 0;
    relay.on('relay:error', () => errors++);
    const expected = new Map<string, string[]>();
    const write = async (from: number, to: number) => {
      for (let i = from; i < to; i++) {
        const key = `k${i % 5}`;
        const [e] = await withPgTransaction(db.pool, (c) => enqueue(c, { topic, key, type: 't', payload: i }));
        expected.set(key, [...(expected.get(key) ?? []), e!.eventId]);
      }
    };
    await write(0, 50);
    await broker.kill('SIGKILL');
    await write(50, 100); // committed while the broker is down
    await waitFor(() => errors > 0, { message: 'the relay noticed the outage' });
    await broker.restart();
    await write(100, 150);
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
        );
        return rows[0]!.n === 0;
      },
      { timeoutMs: 60_000 },
    );
    const consumer = kafka.consumer({ groupId: randomName('reader') });
    const seen: { key: string; id: string }[] = [];
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ message }) => {
        seen.push({ key: message.key!.toString(), id: message.headers![HEADER_EVENT_ID]!.toString() });
      },
    });
    await waitFor(() => new Set(seen.map((s) => s.id)).size >= 150, { timeoutMs: 60_000 });
    await consumer.disconnect();
    for (const [key, ids] of expected) {
      const firsts: string[] = [];
      for (const s of seen) if (s.key === key && !firsts.includes(s.id)) firsts.push(s.id);
      expect(firsts, key).toEqual(ids);
    }
  }, 180_000);

  it('topics are created with leaders when asked while the broker is down and coming back', async () => {
    const topic = randomName('restart-create');
    await broker.kill('SIGKILL');
    // Asked while the broker is down: connection refused, then whatever a starting broker answers
    // (NOT_CONTROLLER, "does not host this topic-partition") until it is ready; all retriable.
    const created = createTopicsOn(kafka, [{ topic, numPartitions: 3 }], { retries: 60 });
    let settled = false;
    void created.then(
      () => (settled = true),
      () => (settled = true),
    );
    await new Promise((r) => setTimeout(r, 500));
    expect(settled).toBe(false); // still retrying: the broker is down
    await broker.restart();
    await created;
    const admin = kafka.admin();
    await admin.connect();
    try {
      const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
      expect(topics[0]!.partitions.map((p) => p.leader >= 0)).toEqual([true, true, true]);
    } finally {
      await admin.disconnect();
    }
  }, 180_000);
});
