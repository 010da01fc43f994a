/**
 * Issue #6 · partition progress in PostgreSQL (`recordProgress: true`), against the real
 * PostgreSQL and Kafka: records redelivered after a crash are skipped without an inbox claim,
 * Kafka's committed offsets stay authoritative, and neither an offset reset nor a recreated
 * topic (with new records, or a later copy of an applied event, at the recorded offsets) ever
 * makes the consumer skip a record it did not handle.
 */
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { CRASH_POINT_AFTER_COMMIT } from '../../consumer/dedup-consumer.js';
import {
  resetConsumerProgress,
  type DedupConsumer,
  type DedupConsumerEvents,
  type DedupConsumerOptions,
} from '../../consumer/index.js';
import type { DatabaseHandle } from '../../src/database.js';
import { isOutboxkitError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  type ChildConsumer,
  committedAtLogEnd,
  committedOffsets,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  startChildConsumer,
  TestProducer,
} from './support.js';

describe('Issue 6 · partition progress in PostgreSQL (recordProgress)', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  const children = new Set<ChildConsumer>();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL, "offset" bigint)');
  });
  afterEach(async () => {
    for (const child of children) {
      if (child.alive()) {
        child.proc.kill('SIGKILL');
        await child.exited;
      }
    }
    children.clear();
    await consumers.stopAll();
  });
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const handler: DedupConsumerOptions<DatabaseHandle>['handler'] = async ({ tx, event }) => {
    await (tx as { query: (t: string, v: unknown[]) => Promise<unknown> }).query(
      'INSERT INTO effects (event_id, "offset") VALUES ($1, $2)',
      [event.id, event.offset],
    );
  };

  /** Effects per event id (the crash child writes no offset). */
  async function effectsPerEvent(): Promise<Map<string, number>> {
    const { rows } = await db.pool.query<{ event_id: string; n: number }>(
      'SELECT event_id, count(*)::int AS n FROM effects GROUP BY event_id',
    );
    return new Map(rows.map((r) => [r.event_id, r.n]));
  }

  /** Every id applied exactly once. */
  async function expectEachOnce(ids: readonly (string | null)[]): Promise<void> {
    const effects = await effectsPerEvent();
    expect(ids.map((id) => effects.get(id!) ?? 0)).toEqual(ids.map(() => 1));
  }

  interface Seen {
    skipped: DedupConsumerEvents['consumer:progress-skipped'][];
    recorded: ReturnType<typeof record>;
  }
  function watch(consumer: DedupConsumer): Seen {
    const skipped: Seen['skipped'] = [];
    consumer.on('consumer:progress-skipped', (e) => skipped.push(e));
    return { skipped, recorded: record(consumer) };
  }

  async function progressRow(groupId: string, topic: string, partition: number) {
    const { rows } = await db.pool.query<{ range_start: string; last_offset: string; last_event_id: string }>(
      `SELECT range_start::text, last_offset::text, last_event_id::text FROM outboxkit.consumer_progress
        WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
      [groupId, topic, partition],
    );
    return rows[0];
  }

  async function resetToEarliest(groupId: string, topic: string): Promise<void> {
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.resetOffsets({ groupId, topic, earliest: true });
    } finally {
      await admin.disconnect();
    }
  }

  /** Deletes `topic` and creates it again under the same name (3 partitions). */
  async function recreateTopic(topic: string): Promise<void> {
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [topic] });
      await waitFor(async () => !(await admin.listTopics()).includes(topic), { timeoutMs: 30_000 });
      // The broker may refuse the name for a moment while the deletion completes.
      await waitFor(
        () =>
          admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 3 }] }).then(
            () => true,
            () => false,
          ),
        { timeoutMs: 30_000 },
      );
    } finally {
      await admin.disconnect();
    }
  }

  for (const scope of ['message', 'batch'] as const) {
    it(`SIGKILL after commit, before the offset commit (${scope} scope): the next member skips the redelivered records by progress, without an inbox claim`, async () => {
      const [topic] = await createTopicsWithDlq([`progress-crash-${scope}`]);
      const groupId = randomName('group');
      const child = await startChildConsumer({
        TEST_DATABASE_URL: db.url,
        KAFKA_BROKERS: inject('kafkaBrokers').join(','),
        TEST_TOPIC: topic!,
        TEST_GROUP_ID: groupId,
        TEST_RECORD_PROGRESS: '1',
        TEST_TRANSACTION_SCOPE: scope,
        OUTBOXKIT_CRASH_POINT: CRASH_POINT_AFTER_COMMIT,
        // Batch scope: one transaction holds the run, so the crash comes after the whole run.
        OUTBOXKIT_CRASH_AFTER: scope === 'message' ? '3' : '1',
      });
      children.add(child);
      const ids = await producer.send(
        topic!,
        Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { i } })),
      );
      expect((await child.exited).signal).toBe('SIGKILL');
      const lastCommitted = child.committed().at(-1)!;
      // The killed member's progress row states what it committed (batch scope: the whole run,
      // whose after-commit hooks came after its COMMIT), and no offset reached Kafka.
      const row = (await progressRow(groupId, topic!, 0))!;
      expect(row.range_start).toBe('0');
      expect(Number(row.last_offset)).toBeGreaterThanOrEqual(lastCommitted.offset);
      if (scope === 'message')
        expect(row).toEqual({
          range_start: '0',
          last_offset: String(lastCommitted.offset),
          last_event_id: lastCommitted.id,
        });
      expect(row.last_event_id).toBe(ids[Number(row.last_offset)]);
      expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(0);

      const next = consumers.create({
        groupId,
        topics: [topic!],
        database: db.pool,
        handler,
        recordProgress: true,
        transactionScope: scope,
      });
      const seen = watch(next);
      await next.start();
      await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), { timeoutMs: 30_000 });
      const handledBefore = Number(row.last_offset) + 1;
      // Every record the killed member handled: skipped by progress (no inbox claim, so no 'duplicate').
      expect(seen.skipped.map((s) => Number(s.offset))).toEqual(Array.from({ length: handledBefore }, (_, i) => i));
      expect(seen.skipped.map((s) => s.eventId)).toEqual(ids.slice(0, handledBefore));
      expect(seen.recorded.duplicates).toEqual([]);
      expect(seen.recorded.applied.map((a) => a.event.id)).toEqual(ids.slice(handledBefore));
      await expectEachOnce(ids);
      expect(await progressRow(groupId, topic!, 0)).toEqual({
        range_start: '0',
        last_offset: '5',
        last_event_id: ids[5],
      });
    });
  }

  it('an offset reset to the earliest offset applies the records before the recorded range and skips the range', async () => {
    const [topic] = await createTopicsWithDlq(['progress-reset']);
    const groupId = randomName('group');
    // Five records before the group exists: a group starting at the log end never handles them.
    const early = await producer.send(
      topic!,
      Array.from({ length: 5 }, (_, i) => ({ partition: 1, value: { early: i } })),
    );
    // The group starts at the log end (offset 5): set before its first member joins, so that no
    // fetch of 'latest' can race with the sends below.
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.setOffsets({
        groupId,
        topic: topic!,
        partitions: [0, 1, 2].map((p) => ({ partition: p, offset: p === 1 ? '5' : '0' })),
      });
    } finally {
      await admin.disconnect();
    }
    const first = consumers.create({ groupId, topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seenFirst = watch(first);
    await first.start();
    const late = await producer.send(
      topic!,
      Array.from({ length: 5 }, (_, i) => ({ partition: 1, value: { late: i } })),
    );
    await waitFor(() => seenFirst.recorded.applied.length === 5);
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    await first.stop();
    expect(await progressRow(groupId, topic!, 1)).toEqual({
      range_start: '5',
      last_offset: '9',
      last_event_id: late[4],
    });
    await expectEachOnce(late);
    expect((await effectsPerEvent()).get(early[0]!)).toBeUndefined();

    await resetToEarliest(groupId, topic!);
    const second = consumers.create({ groupId, topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seen = watch(second);
    await second.start();
    await waitFor(() => seen.recorded.applied.length + seen.skipped.length === 10);
    // Never seen by the group: applied now. The recorded range: skipped, and nothing twice.
    expect(seen.recorded.applied.map((a) => a.event.id)).toEqual(early);
    expect(seen.skipped.map((s) => s.eventId)).toEqual(late);
    await expectEachOnce([...early, ...late]);
    // The stream began at 0 and met the anchor: the row now covers the whole log.
    expect(await progressRow(groupId, topic!, 1)).toEqual({
      range_start: '0',
      last_offset: '9',
      last_event_id: late[4],
    });
  });

  it('a recreated topic: new records and a later copy of an applied event at the recorded offsets are never skipped', async () => {
    const name = randomName('progress-recreated');
    const [topic] = await createTopicsWithDlq([name]);
    const groupId = randomName('group');
    const old = await producer.send(
      topic!,
      Array.from({ length: 6 }, (_, i) => ({ partition: 2, value: { old: i } })),
    );
    const first = consumers.create({ groupId, topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seenFirst = watch(first);
    await first.start();
    await waitFor(() => seenFirst.recorded.applied.length === 6);
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    await first.stop();
    expect(await progressRow(groupId, topic!, 2)).toEqual({
      range_start: '0',
      last_offset: '5',
      last_event_id: old[5],
    });

    await recreateTopic(topic!);
    // The new log: five new events, then at offset 5 (the recorded anchor's offset) a later copy
    // of the event applied there (same event id, a new Kafka timestamp), then two new events.
    const fresh1 = await producer.send(
      topic!,
      Array.from({ length: 5 }, (_, i) => ({ partition: 2, value: { fresh: i } })),
    );
    await producer.send(topic!, [{ partition: 2, eventId: old[5]!, value: { copy: true } }]);
    const fresh2 = await producer.send(
      topic!,
      Array.from({ length: 2 }, (_, i) => ({ partition: 2, value: { fresh: 5 + i } })),
    );
    await resetToEarliest(groupId, topic!);

    const second = consumers.create({ groupId, topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seen = watch(second);
    await second.start();
    await waitFor(() => seen.recorded.applied.length + seen.recorded.duplicates.length === 8);
    expect(seen.skipped).toEqual([]);
    expect(seen.recorded.applied.map((a) => a.event.id)).toEqual([...fresh1, ...fresh2]);
    // The copy is caught by the inbox, as without progress.
    expect(seen.recorded.duplicates.map((d) => d.event.id)).toEqual([old[5]]);
    await expectEachOnce([...old, ...fresh1, ...fresh2]);
    expect(await progressRow(groupId, topic!, 2)).toEqual({
      range_start: '0',
      last_offset: '7',
      last_event_id: fresh2[1],
    });
  });

  it('a topic deleted and recreated under a running, idle consumer: every record of the new log is applied', async () => {
    const [topic] = await createTopicsWithDlq(['progress-live-recreate']);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seen = watch(consumer);
    await consumer.start();
    const old = await producer.send(
      topic!,
      Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { old: i } })),
    );
    await waitFor(() => seen.recorded.applied.length === 6);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    // An idle consumer's next fetch (offset 6) is out of range in the new log (empty at first),
    // so kafkajs starts it from offset 0 (fromBeginning): back into the old log's recorded range,
    // where the anchor check fails.
    await recreateTopic(topic!);
    const fresh = await producer.send(
      topic!,
      Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: { fresh: i } })),
    );
    await waitFor(() => seen.recorded.applied.length === 16, { timeoutMs: 30_000 });
    expect(seen.skipped).toEqual([]);
    await expectEachOnce([...old, ...fresh]);
  });

  it('a topic recreated while the consumer is busy (it goes on at the same offset in the new log): a later reset to the earliest offset still applies every record', async () => {
    const [topic] = await createTopicsWithDlq(['progress-busy-recreate']);
    const groupId = randomName('group');
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let busy = false;
    const slowHandler: typeof handler = async (ctx) => {
      await handler(ctx);
      if ((ctx.event.json() as { old?: number }).old === 5) {
        busy = true;
        await released;
      }
    };
    const first = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      handler: slowHandler,
      recordProgress: true,
    });
    const seenFirst = watch(first);
    await first.start();
    const old = await producer.send(
      topic!,
      Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { old: i } })),
    );
    await waitFor(() => busy);
    // While the handler of offset 5 runs: a new log with 10 records. The consumer's next fetch,
    // at offset 6, is in range there: kafkajs reads new 6..9 and never new 0..5 (as without
    // progress). The progress written then must not claim new 0..5.
    await recreateTopic(topic!);
    const fresh = await producer.send(
      topic!,
      Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: { fresh: i } })),
    );
    release();
    await waitFor(() => seenFirst.recorded.applied.length === 10, { timeoutMs: 30_000 });
    expect(seenFirst.recorded.applied.map((a) => a.event.id)).toEqual([...old, ...fresh.slice(6)]);
    await first.stop();
    const row = (await progressRow(groupId, topic!, 0))!;
    expect(Number(row.range_start)).toBeGreaterThanOrEqual(6);

    // The operator notices and rewinds the group: new 0..5 must be applied now.
    await resetToEarliest(groupId, topic!);
    const second = consumers.create({ groupId, topics: [topic!], database: db.pool, handler, recordProgress: true });
    const seen = watch(second);
    await second.start();
    await waitFor(() => seen.recorded.applied.length === 6, { timeoutMs: 30_000 });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    expect(seen.recorded.applied.map((a) => a.event.id)).toEqual(fresh.slice(0, 6));
    await expectEachOnce([...old, ...fresh]);
  });

  it('a rewind re-drives dead-lettered records, as without progress (they are never inside a range)', async () => {
    const [topic] = await createTopicsWithDlq(['progress-dlq-rewind']);
    const groupId = randomName('group');
    const poisonRuns: string[] = [];
    const failing: typeof handler = async (ctx) => {
      if ((ctx.event.json() as { poison?: boolean }).poison) {
        poisonRuns.push(ctx.event.offset);
        throw new Error('cannot apply this one');
      }
      await handler(ctx);
    };
    const opts = {
      groupId,
      topics: [topic!],
      database: db.pool,
      handler: failing,
      recordProgress: true,
      maxAttempts: 2,
    };
    const first = consumers.create(opts);
    const seenFirst = watch(first);
    await first.start();
    const [a, , , c] = await producer.send(topic!, [
      { partition: 0, value: { n: 'a' } },
      { partition: 0, value: { poison: true } },
      { partition: 0, value: { n: 'no-id' }, eventId: null },
      { partition: 0, value: { n: 'c' } },
    ]);
    await waitFor(() => seenFirst.recorded.applied.length === 2 && seenFirst.recorded.deadLettered.length === 2);
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    await first.stop();
    expect(poisonRuns).toEqual(['1', '1']);
    // The range after the last dead letter: c only.
    expect(await progressRow(groupId, topic!, 0)).toEqual({ range_start: '3', last_offset: '3', last_event_id: c });

    await resetToEarliest(groupId, topic!);
    const second = consumers.create(opts);
    const seen = watch(second);
    await second.start();
    await waitFor(() => seen.recorded.deadLettered.length === 2 && seen.skipped.length === 1, { timeoutMs: 30_000 });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    // The poison message ran again (then dead-lettered again), the record without an event id was
    // dead-lettered again, a is a duplicate in the inbox, c is skipped by progress.
    expect(poisonRuns).toEqual(['1', '1', '1', '1']);
    expect(seen.recorded.deadLettered.map((d) => d.offset)).toEqual(['1', '2']);
    expect(seen.recorded.duplicates.map((d) => d.event.id)).toEqual([a]);
    expect(seen.skipped.map((s) => s.offset)).toEqual(['3']);
    await expectEachOnce([a!, c!]);
  });

  it('a redelivery within one member (the after-commit step failed) is skipped by progress, with a drizzle database', async () => {
    const [topic] = await createTopicsWithDlq(['progress-drizzle']);
    const orm = drizzle(db.pool);
    let failOnce = true;
    const consumer = consumers.create({
      topics: [topic!],
      database: orm,
      recordProgress: true,
      handler: async ({ tx, event }) => {
        await tx.execute(sql`INSERT INTO effects (event_id, "offset") VALUES (${event.id}, ${event.offset})`);
      },
      hooks: {
        afterCommit(event) {
          // Committed, then a failure before the offset is resolved: Kafka's view is "not done".
          if (event.offset === '1' && failOnce) {
            failOnce = false;
            throw new Error('after-commit step failed');
          }
        },
      },
    });
    const seen = watch(consumer);
    await consumer.start();
    const ids = await producer.send(
      topic!,
      Array.from({ length: 3 }, (_, i) => ({ partition: 0, value: { i } })),
    );
    // Offset 1's transaction committed, then its after-commit step failed: no 'applied' for it,
    // its offset stays unresolved, kafkajs fetches it again, and the progress written with its
    // effects proves it handled.
    await waitFor(() => seen.recorded.applied.length + seen.skipped.length === 3);
    expect(seen.recorded.applied.map((a) => a.event.id)).toEqual([ids[0], ids[2]]);
    expect(seen.skipped.map((s) => s.offset)).toEqual(['1']);
    expect(seen.recorded.duplicates).toEqual([]);
    await expectEachOnce(ids);
  });

  it('refuses to start when the progress table is missing (migration 0001 not applied), naming it', async () => {
    const [topic] = await createTopicsWithDlq(['progress-missing']);
    await db.pool.query('CREATE SCHEMA IF NOT EXISTS old_schema');
    await db.pool.query('CREATE TABLE IF NOT EXISTS old_schema.inbox (LIKE outboxkit.inbox INCLUDING ALL)');
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      handler,
      schema: 'old_schema',
      recordProgress: true,
    });
    const err = await consumer.start().catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_STORE_UNAVAILABLE')).toBe(true);
    expect(String((err as Error).message)).toMatch(
      /^The table "old_schema"\.consumer_progress, which recordProgress writes, does not exist .*0001_consumer_progress.*apply outboxkit's migrations/,
    );
    expect((err as { retriable?: boolean }).retriable).toBe(false);
    expect(consumer.state).toBe('stopped');
  });

  it('resetConsumerProgress: typed errors for a bad call, SchemaMissingError without the table', async () => {
    const bad = async (call: () => Promise<unknown>) =>
      call().then(
        () => undefined,
        (e: unknown) => e,
      );
    for (const call of [
      () => resetConsumerProgress(undefined as never, { consumerGroup: 'g' }),
      () => resetConsumerProgress(db.pool, { consumerGroup: 'g', tpoic: 't' } as never),
      () => resetConsumerProgress(db.pool, { consumerGroup: '' }),
      () => resetConsumerProgress(db.pool, { consumerGroup: 'g', topic: '' }),
      () => resetConsumerProgress(db.pool, undefined as never),
    ]) {
      expect(isOutboxkitError(await bad(call), 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    }
    expect(
      String(await bad(() => resetConsumerProgress(db.pool, { consumerGroup: 'g', tpoic: 't' } as never))),
    ).toMatch(/unknown option "tpoic"/);
    await db.pool.query('CREATE SCHEMA IF NOT EXISTS old_schema');
    const missing = await bad(() => resetConsumerProgress(db.pool, { consumerGroup: 'g', schema: 'old_schema' }));
    expect(isOutboxkitError(missing, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
    expect(await resetConsumerProgress(db.pool, { consumerGroup: 'no-such-group' })).toBe(0);
  });

  it('without recordProgress nothing is written to consumer_progress and redeliveries go through the inbox', async () => {
    const [topic] = await createTopicsWithDlq(['progress-off']);
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler });
    const seen = watch(consumer);
    await consumer.start();
    const [id] = await producer.send(topic!, [{ partition: 0, value: {} }]);
    await producer.send(topic!, [{ partition: 0, eventId: id!, value: {} }]);
    await waitFor(() => seen.recorded.applied.length + seen.recorded.duplicates.length === 2);
    expect(seen.skipped).toEqual([]);
    const { rowCount } = await db.pool.query('SELECT 1 FROM outboxkit.consumer_progress WHERE consumer_group = $1', [
      consumer.groupId,
    ]);
    expect(rowCount).toBe(0);
  });
});
