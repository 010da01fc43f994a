/**
 * The dedup consumer's per-partition health (issue 16, point 5; G7), against the real broker and
 * PostgreSQL: a partition whose message keeps failing with a long backoff is reported stuck after
 * `stuckAfterMs` (health(), `consumer:partition-stuck`, the gauges) while the other partitions
 * progress and stay healthy; it recovers once the handler succeeds; and after a rebalance the
 * partitions a member lost leave its health and its gauges.
 */
import client from 'prom-client';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  consumerMetrics,
  type DedupConsumer,
  type DedupConsumerEvents,
  type DedupHandler,
  type PartitionHealth,
} from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

/** Small enough for a test, large enough that a healthy partition on a loaded 2-core machine never reaches it. */
const STUCK_AFTER_MS = 3_000;

describe('G7 · consumer partition health: which partitions are stuck', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid PRIMARY KEY, note text NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const partitionOf = (consumer: DedupConsumer, partition: number): PartitionHealth | undefined =>
    consumer.health().partitions.find((p) => p.partition === partition);

  /** The value of `name{...partition="<partition>"}` for `group`, or undefined when the series is absent. */
  function sample(text: string, name: string, group: string, partition: number): number | undefined {
    const m = new RegExp(`^${name}\\{group="${group}",topic="[^"]+",partition="${partition}"\\} (\\S+)$`, 'm').exec(
      text,
    );
    return m ? Number(m[1]) : undefined;
  }

  it('G7 a partition held by a failing message is stuck after stuckAfterMs while the others progress; it recovers when the handler succeeds', async () => {
    const [topic] = await createTopicsWithDlq(['health']);
    let healed = false;
    const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
      const { note } = event.json() as { note: string };
      if (note === 'poison' && !healed) throw new Error('downstream refuses it');
      await tx.query('INSERT INTO effects (event_id, note) VALUES ($1, $2)', [event.id, note]);
    };
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler,
      stuckAfterMs: STUCK_AFTER_MS,
      // A long backoff (full jitter below 4 s) and attempts that never run out within the test.
      retryInitialMs: 4_000,
      retryMaxMs: 4_000,
      maxAttempts: 1_000,
    });
    const registry = new client.Registry();
    consumerMetrics(consumer, registry);
    const seen = record(consumer);
    const stuck: DedupConsumerEvents['consumer:partition-stuck'][] = [];
    const stuckReportedAt: number[] = [];
    const recovered: DedupConsumerEvents['consumer:partition-recovered'][] = [];
    consumer.on('consumer:partition-stuck', (h) => {
      stuck.push(h);
      stuckReportedAt.push(Date.now());
    });
    consumer.on('consumer:partition-recovered', (h) => recovered.push(h));
    await consumer.start();
    expect(consumer.health().partitions.map((p) => p.partition)).toEqual([0, 1, 2]);
    expect(consumer.health().partitions.every((p) => !p.stuck && p.lastHandled === null)).toBe(true);

    // Steady traffic on partitions 1 and 2 for the whole test.
    let sending = true;
    let sent = 0;
    const traffic = (async () => {
      while (sending) {
        await producer.send(topic!, [
          { partition: 1, value: { note: `p1-${sent}` } },
          { partition: 2, value: { note: `p2-${sent}` } },
        ]);
        sent += 1;
        await new Promise((r) => setTimeout(r, 200));
      }
    })();

    try {
      const sentAt = Date.now();
      await producer.send(topic!, [
        { partition: 0, value: { note: 'poison' } },
        { partition: 0, value: { note: 'after-poison' } },
      ]);
      await waitFor(() => seen.retries.length >= 1, { message: 'first failure of the poison' });
      // Failing but not yet stuck: the verdict is not trivially true.
      const early = partitionOf(consumer, 0)!;
      if (Date.now() - sentAt < STUCK_AFTER_MS - 500) {
        expect(early).toMatchObject({ stuck: false, stuckSince: null, lastHandled: null });
        expect(early.waiting).toMatchObject({ reason: 'retry', offset: '0', attempts: 1 });
      }

      await waitFor(() => stuck.length >= 1, { timeoutMs: 30_000, message: 'partition 0 reported stuck' });
      const reportedAt = stuckReportedAt[0]!;
      expect(stuck[0]).toMatchObject({ topic, partition: 0, stuck: true, lastHandled: null });
      expect(stuck[0]!.stalledMs).toBeGreaterThanOrEqual(STUCK_AFTER_MS);
      expect(reportedAt - sentAt).toBeGreaterThanOrEqual(STUCK_AFTER_MS);
      expect(stuck[0]!.waiting).toMatchObject({ reason: 'retry', offset: '0' });

      // The others keep progressing after partition 0 became stuck, and stay healthy.
      await waitFor(
        () =>
          [1, 2].every((p) => {
            const h = partitionOf(consumer, p);
            return h !== undefined && h.lastHandled !== null && h.lastHandled.at > reportedAt + 1_000;
          }),
        { timeoutMs: 30_000, message: 'partitions 1 and 2 progress after partition 0 is stuck' },
      );
      const health = consumer.health();
      expect(health.stuckAfterMs).toBe(STUCK_AFTER_MS);
      expect(health.state).toBe('running');
      const [p0, p1, p2] = health.partitions;
      expect(p0).toMatchObject({ partition: 0, stuck: true, lastHandled: null, lag: 2 });
      expect(p0!.waiting).toMatchObject({ reason: 'retry', offset: '0' });
      expect((p0!.waiting as { attempts: number }).attempts).toBeGreaterThanOrEqual(1);
      expect(p0!.waiting!.since).toBeGreaterThanOrEqual(sentAt);
      expect(p0!.stuckSince).toBeGreaterThanOrEqual(sentAt + STUCK_AFTER_MS);
      for (const p of [p1!, p2!]) {
        expect(p).toMatchObject({ stuck: false, stuckSince: null, waiting: null });
        expect(p.stalledMs).toBeLessThan(STUCK_AFTER_MS);
      }

      // The gauges say the same.
      const text = await registry.metrics();
      const group = consumer.groupId;
      expect(sample(text, 'outboxkit_consumer_partition_stuck', group, 0)).toBe(1);
      expect(sample(text, 'outboxkit_consumer_partition_stuck', group, 1)).toBe(0);
      expect(sample(text, 'outboxkit_consumer_partition_stuck', group, 2)).toBe(0);
      expect(sample(text, 'outboxkit_consumer_partition_stalled_seconds', group, 0)).toBeGreaterThanOrEqual(
        STUCK_AFTER_MS / 1_000,
      );
      expect(sample(text, 'outboxkit_consumer_partition_stalled_seconds', group, 1)).toBeLessThan(
        STUCK_AFTER_MS / 1_000,
      );

      // The handler succeeds again: partition 0 recovers at its next run and catches up.
      healed = true;
      await waitFor(() => recovered.length >= 1, { timeoutMs: 30_000, message: 'partition 0 recovered' });
      expect(recovered[0]).toMatchObject({ topic, partition: 0, revoked: false, stuck: false });
      expect(recovered[0]!.lastHandled?.offset).toBe('0');
      expect(recovered[0]!.stuckForMs).toBeGreaterThan(0);
      await waitFor(() => partitionOf(consumer, 0)?.lastHandled?.offset === '1', { message: 'after-poison applied' });
      expect(partitionOf(consumer, 0)).toMatchObject({ stuck: false, waiting: null, lag: 0, stalledMs: 0 });
      const after = await registry.metrics();
      expect(sample(after, 'outboxkit_consumer_partition_stuck', group, 0)).toBe(0);
      expect(sample(after, 'outboxkit_consumer_partition_stalled_seconds', group, 0)).toBe(0);
    } finally {
      sending = false;
      await traffic;
    }
    // Only partition 0 was ever stuck, once.
    expect(stuck.map((s) => s.partition)).toEqual([0]);
    expect(recovered.map((r) => r.partition)).toEqual([0]);
    expect(seen.deadLettered).toHaveLength(0);
    expect(sent).toBeGreaterThan(10);
  });

  it('G7 partitions a rebalance took away leave health() and the gauges', async () => {
    const [topic] = await createTopicsWithDlq(['health-rebalance'], 4);
    const handler: DedupHandler<pg.Pool> = async () => {};
    const registry = new client.Registry();
    const a = consumers.create({ topics: [topic!], database: db.pool, handler, stuckAfterMs: STUCK_AFTER_MS });
    consumerMetrics(a, registry);
    await a.start();
    expect(a.health().partitions.map((p) => p.partition)).toEqual([0, 1, 2, 3]);
    /** The partitions with a series in the stuck gauge. */
    const series = async () => {
      const text = await registry.metrics();
      return [0, 1, 2, 3].filter((p) => sample(text, 'outboxkit_consumer_partition_stuck', a.groupId, p) !== undefined);
    };
    expect(await series()).toEqual([0, 1, 2, 3]);

    const b = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler,
      groupId: a.groupId,
      stuckAfterMs: STUCK_AFTER_MS,
    });
    await b.start();
    await waitFor(
      () => a.health().partitions.length + b.health().partitions.length === 4 && b.health().partitions.length > 0,
      { timeoutMs: 30_000, message: 'the partitions shared by the two members' },
    );
    const kept = a.health().partitions.map((p) => p.partition);
    const taken = b.health().partitions.map((p) => p.partition);
    expect([...kept, ...taken].sort()).toEqual([0, 1, 2, 3]);
    expect(kept.length).toBeLessThan(4);
    expect(await series()).toEqual(kept);

    await b.stop();
    await a.stop();
    expect(a.health().partitions).toEqual([]);
    expect(a.health().state).toBe('stopped');
  });
});
