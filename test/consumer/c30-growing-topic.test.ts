/**
 * C30 · partitions added while running. A topic of 3 partitions, a relay and a dedup consumer group
 * (fromBeginning false) with committed offsets; the topic grows to 8 partitions while about 30
 * events/s keep coming, once while the group runs and once while it is stopped. Every event of
 * every partition must be applied exactly once, those the relay wrote to the new partitions before
 * the consumer saw them included. Kafka's "latest" reset policy started such a partition at its end,
 * and its first events were never applied (consumer/group-start.ts, docs/runbooks.md "Growing a
 * topic").
 */
import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupConsumer } from '../../consumer/index.js';
import { enqueue } from '../../src/index.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName, testKafka } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, createTopicsWithDlq, logEndOffsets, TestProducer } from './support.js';

const FIRST_PARTITIONS = 3;
const GROWN_PARTITIONS = 8;
const NEW_PARTITIONS = Array.from({ length: GROWN_PARTITIONS - FIRST_PARTITIONS }, (_, i) => FIRST_PARTITIONS + i);
/** The relay's metadata age (`producerOptions.metadataMaxAgeMs`): it writes to new partitions about this soon. */
const RELAY_METADATA_MAX_AGE_MS = 500;
/**
 * The consumer's metadata age (`metadataMaxAgeMs`): it sees the new partitions about this long after
 * its last refresh, well after the relay wrote to them, so that their first events wait for it.
 */
const CONSUMER_METADATA_MAX_AGE_MS = 15_000;

/** Writes one event with a random key every `intervalMs` through enqueue() until stopped; keeps their ids. */
class Writer {
  readonly ids: string[] = [];
  #stopped = false;
  #loop: Promise<void> | undefined;

  constructor(
    private readonly db: TestDatabase,
    private readonly topic: string,
    private readonly intervalMs = 33,
  ) {}

  start(): void {
    this.#loop = (async () => {
      while (!this.#stopped) {
        const client = await this.db.pool.connect();
        try {
          await client.query('BEGIN');
          const [event] = await enqueue(client, {
            topic: this.topic,
            key: randomUUID(),
            type: 'c30.event',
            payload: { n: this.ids.length },
          });
          await client.query('COMMIT');
          this.ids.push(event!.eventId);
        } finally {
          client.release();
        }
        // Pacing of the load (about 30 events/s), not a wait for a condition.
        await new Promise((resolve) => setTimeout(resolve, this.intervalMs));
      }
    })();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
  }
}

/** A logger that keeps the consumer's joins: when, and which partitions it was given. */
function joinRecorder(): { logger: Logger; joins: { at: number; partitions: number[] }[] } {
  const joins: { at: number; partitions: number[] }[] = [];
  const logger: Logger = {
    debug() {},
    info(obj, msg) {
      if (msg.startsWith('Dedup consumer joined')) {
        const assignment = obj.assignment as Record<string, number[]>;
        joins.push({ at: Date.now(), partitions: Object.values(assignment).flat() });
      }
    },
    warn() {},
    error() {},
  };
  return { logger, joins };
}

describe('C30 · partitions added while running', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  const writers: Writer[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    // No unique constraint: a second application of an event shows as a second row.
    await db.pool.query(
      'CREATE TABLE c30_applied (event_id uuid NOT NULL, topic text NOT NULL, partition int NOT NULL, kafka_offset bigint NOT NULL)',
    );
  });
  afterEach(async () => {
    await Promise.all(writers.splice(0).map((w) => w.stop()));
    await consumers.stopAll();
  });
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  /** A consumer of `topic` for `groupId` (fromBeginning false, the default) recording each application. */
  function consumer(topic: string, groupId: string, logger?: Logger): DedupConsumer {
    return consumers.create({
      groupId,
      topics: [topic],
      database: db.pool,
      fromBeginning: false,
      metadataMaxAgeMs: CONSUMER_METADATA_MAX_AGE_MS,
      ...(logger ? { logger } : {}),
      async handler({ tx, event }) {
        await tx.query('INSERT INTO c30_applied (event_id, topic, partition, kafka_offset) VALUES ($1, $2, $3, $4)', [
          event.id,
          event.topic,
          event.partition,
          event.offset,
        ]);
      },
    });
  }

  async function appliedPartitions(topic: string): Promise<Set<number>> {
    const { rows } = await db.pool.query<{ partition: number }>(
      'SELECT DISTINCT partition FROM c30_applied WHERE topic = $1',
      [topic],
    );
    return new Set(rows.map((r) => r.partition));
  }

  /** Every written event applied: resolves once the applied ids are the written ones (or times out). */
  async function untilAllApplied(topic: string, written: readonly string[], timeoutMs = 45_000): Promise<void> {
    let applied = 0;
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(DISTINCT event_id)::int AS n FROM c30_applied WHERE topic = $1',
          [topic],
        );
        applied = rows[0]!.n;
        return applied >= written.length;
      },
      { timeoutMs, intervalMs: 200, message: () => `${applied} of ${written.length} events applied` },
    );
  }

  /** Applied exactly once each, and nothing else applied. */
  async function expectEachAppliedOnce(topic: string, written: readonly string[]): Promise<void> {
    const { rows } = await db.pool.query<{ event_id: string; n: number }>(
      'SELECT event_id, count(*)::int AS n FROM c30_applied WHERE topic = $1 GROUP BY event_id',
      [topic],
    );
    expect(rows.filter((r) => r.n !== 1)).toEqual([]);
    expect(new Set(rows.map((r) => r.event_id))).toEqual(new Set(written));
  }

  async function grow(topic: string): Promise<void> {
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.createPartitions({ topicPartitions: [{ topic, count: GROWN_PARTITIONS }] });
    } finally {
      await admin.disconnect();
    }
  }

  /** Resolves when every new partition has a record, with the time each got its first (as seen by polling). */
  async function untilNewPartitionsWritten(topic: string): Promise<Map<number, number>> {
    const firstSeen = new Map<number, number>();
    await waitFor(
      async () => {
        const ends = await logEndOffsets(consumers.kafka, topic);
        const now = Date.now();
        for (const p of NEW_PARTITIONS) if ((ends.get(p) ?? 0) > 0 && !firstSeen.has(p)) firstSeen.set(p, now);
        return firstSeen.size === NEW_PARTITIONS.length;
      },
      {
        timeoutMs: RELAY_METADATA_MAX_AGE_MS + 20_000,
        intervalMs: 100,
        message: () => `the relay wrote to new partitions ${[...firstSeen.keys()].join(', ') || 'none'} only`,
      },
    );
    return firstSeen;
  }

  it('C30 partitions added while the group runs: every event of every partition applied exactly once', async () => {
    const [topic] = await createTopicsWithDlq(['c30-running'], FIRST_PARTITIONS);
    const { logger, joins } = joinRecorder();
    await consumer(topic!, randomName('c30'), logger).start();
    await startRelay(db.url, { producerOptions: { metadataMaxAgeMs: RELAY_METADATA_MAX_AGE_MS } });
    const writer = new Writer(db, topic!);
    writers.push(writer);
    writer.start();
    // The group runs with committed offsets: events of each first partition applied.
    await waitFor(async () => (await appliedPartitions(topic!)).size === FIRST_PARTITIONS, { timeoutMs: 30_000 });

    const grownAt = Date.now();
    await grow(topic!);
    const firstWritten = await untilNewPartitionsWritten(topic!);
    const relayMs = Math.max(...firstWritten.values()) - grownAt;
    await waitFor(async () => (await appliedPartitions(topic!)).size === GROWN_PARTITIONS, {
      timeoutMs: CONSUMER_METADATA_MAX_AGE_MS + 30_000,
      intervalMs: 200,
      message: 'the consumer applied no event of some new partition',
    });
    const consumerMs = Date.now() - grownAt;
    await writer.stop();
    await untilAllApplied(topic!, writer.ids);
    await expectEachAppliedOnce(topic!, writer.ids);

    // The case's point: the relay wrote to the new partitions before the consumer was given them.
    const joinedGrown = joins.find((j) => j.partitions.some((p) => p >= FIRST_PARTITIONS));
    expect(joinedGrown).toBeDefined();
    expect(Math.min(...firstWritten.values())).toBeLessThan(joinedGrown!.at);
    // Each new partition was read from its first record.
    const { rows } = await db.pool.query<{ partition: number; first: string }>(
      'SELECT partition, min(kafka_offset)::text AS first FROM c30_applied WHERE topic = $1 AND partition >= $2 GROUP BY partition',
      [topic, FIRST_PARTITIONS],
    );
    expect(rows.map((r) => r.first)).toEqual(NEW_PARTITIONS.map(() => '0'));
    // Bounded by the metadata ages (generous: a loaded 2-core machine).
    expect(relayMs).toBeLessThan(RELAY_METADATA_MAX_AGE_MS + 10_000);
    expect(consumerMs).toBeLessThan(CONSUMER_METADATA_MAX_AGE_MS + 20_000);
  }, 120_000);

  it('C30 partitions added while the group is stopped: every event applied exactly once after it starts', async () => {
    const [topic] = await createTopicsWithDlq(['c30-stopped'], FIRST_PARTITIONS);
    const groupId = randomName('c30');
    const first = consumer(topic!, groupId);
    await first.start();
    await startRelay(db.url, { producerOptions: { metadataMaxAgeMs: RELAY_METADATA_MAX_AGE_MS } });
    const writer = new Writer(db, topic!);
    writers.push(writer);
    writer.start();
    await waitFor(async () => (await appliedPartitions(topic!)).size === FIRST_PARTITIONS, { timeoutMs: 30_000 });

    await first.stop();
    await grow(topic!);
    await untilNewPartitionsWritten(topic!);
    await writer.stop();
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL',
          [topic],
        );
        return rows[0]!.n === 0;
      },
      { timeoutMs: 20_000, message: 'every event published' },
    );

    await consumer(topic!, groupId).start();
    await untilAllApplied(topic!, writer.ids);
    await expectEachAppliedOnce(topic!, writer.ids);
  }, 120_000);

  it('C30 a partition that had no event when the group stopped: its later events are applied, none from before the first start', async () => {
    const [topic] = await createTopicsWithDlq(['c30-idle'], FIRST_PARTITIONS);
    const groupId = randomName('c30');
    // Published before the group's first start: fromBeginning false never applies them.
    await producer.send(
      topic!,
      [0, 1, 2].map((partition) => ({ partition, value: { before: true } })),
    );
    const first = consumer(topic!, groupId);
    await first.start();
    const during = (await producer.send(topic!, [{ partition: 0, value: { during: true } }])) as string[];
    await untilAllApplied(topic!, during, 30_000);
    await first.stop();

    // Partitions 1 and 2 never had an event while the group ran.
    const after = (await producer.send(
      topic!,
      [0, 1, 2, 1, 2].map((partition) => ({ partition, value: { after: true } })),
    )) as string[];
    await consumer(topic!, groupId).start();
    await untilAllApplied(topic!, [...during, ...after], 30_000);
    await expectEachAppliedOnce(topic!, [...during, ...after]);
  });
});
