import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createDedupConsumer, type DedupConsumerOptions, type DedupHandler } from '../../consumer/index.js';
import { isOutboxkitError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedOffsets, ConsumerRegistry, createTopicsWithDlq, FAST, record, TestProducer } from './support.js';

describe('createDedupConsumer', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  let topic: string;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
    [topic] = (await createTopicsWithDlq(['lifecycle'])) as [string];
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
    await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
  };

  async function inboxHas(eventId: string): Promise<boolean> {
    return (await db.pool.query('SELECT 1 FROM outboxkit.inbox WHERE event_id = $1', [eventId])).rowCount === 1;
  }

  describe('options', () => {
    const base = (): DedupConsumerOptions<pg.Pool> => ({
      kafka: consumers.kafka,
      groupId: 'g',
      topics: ['orders'],
      database: db.pool,
      handler,
    });
    it.each<[string, Partial<DedupConsumerOptions<pg.Pool>>, RegExp]>([
      ['an empty groupId', { groupId: '' }, /groupId/],
      ['no topics', { topics: [] }, /topics/],
      ['an illegal topic name', { topics: ['orders!'] }, /invalid topic "orders!"/],
      ['a repeated topic', { topics: ['a', 'a'] }, /repeat/],
      ['a dead-letter topic equal to a consumed topic', { topics: ['a', 'b'], deadLetterTopic: () => 'b' }, /loop/],
      ['maxAttempts 0', { maxAttempts: 0 }, /maxAttempts must be an integer from 1/],
      ['retryMaxMs below retryInitialMs', { retryInitialMs: 500, retryMaxMs: 100 }, /retryMaxMs \(100\)/],
      ['a negative lockTimeoutMs', { lockTimeoutMs: -1 }, /lockTimeoutMs/],
      [
        'heartbeatIntervalMs not below sessionTimeoutMs',
        { sessionTimeoutMs: 6_000, heartbeatIntervalMs: 6_000 },
        /heartbeatIntervalMs/,
      ],
      ['an invalid schema name', { schema: 'Bad-Name' }, /Invalid schema name/],
      ['a database that is neither pool nor drizzle', { database: {} as pg.Pool }, /database must be/],
      ['a handler that is not a function', { handler: 'nope' as unknown as DedupHandler<pg.Pool> }, /handler/],
      [
        'an unknown transactionScope',
        { transactionScope: 'partition' as unknown as 'batch' },
        /transactionScope must be 'message' or 'batch'/,
      ],
      ['batchMaxMessages 0', { batchMaxMessages: 0 }, /batchMaxMessages must be an integer from 1/],
      ['a negative batchMaxMs', { batchMaxMs: -1 }, /batchMaxMs/],
    ])('rejects %s with InvalidOptionsError', (_, override, message) => {
      let caught: unknown;
      try {
        createDedupConsumer({ ...base(), ...override });
      } catch (err) {
        caught = err;
      }
      expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
      expect((caught as Error).message).toMatch(message);
    });
  });

  describe('start', () => {
    it('fails with TopicMissingError naming a missing dead-letter topic, and creates nothing', async () => {
      const [bare] = await createTopics(['no-dlq']);
      const consumer = consumers.create({ topics: [bare!], database: db.pool, handler });
      const err = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_TOPIC_MISSING')).toBe(true);
      expect((err as Error).message).toContain(`"${bare}.dlq"`);
      expect((err as Error).message).toContain('outboxkit topics ensure');
      const admin = consumers.kafka.admin();
      await admin.connect();
      try {
        expect(await admin.listTopics()).not.toContain(`${bare}.dlq`);
      } finally {
        await admin.disconnect();
      }
    });

    it('fails with TopicMissingError naming a missing source topic', async () => {
      const missing = randomName('absent');
      const consumer = consumers.create({ topics: [topic, missing], database: db.pool, handler });
      const err = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_TOPIC_MISSING')).toBe(true);
      expect((err as Error).message).toContain(`"${missing}", "${missing}.dlq"`);
    });

    it('fails with InboxUnavailableError when the inbox table is not in the configured schema', async () => {
      const consumer = consumers.create({ topics: [topic], database: db.pool, handler, schema: 'not_migrated' });
      const err = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_STORE_UNAVAILABLE')).toBe(true);
      expect((err as Error).message).toMatch(/"not_migrated"\.inbox does not exist.*outboxkit migrate/);
    });

    it('refuses a second start and a start after stop; stop is idempotent', async () => {
      const consumer = consumers.create({ topics: [topic], database: db.pool, handler });
      await consumer.start();
      const second = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(second, 'OUTBOXKIT_LIFECYCLE')).toBe(true);
      const stopping = consumer.stop();
      expect(consumer.stop()).toBe(stopping);
      await stopping;
      const again = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(again, 'OUTBOXKIT_LIFECYCLE')).toBe(true);
      // Stopping a consumer that never started is fine too.
      await consumers.create({ topics: [topic], database: db.pool, handler }).stop();
    });

    it('stops when the signal given to start() is aborted', async () => {
      const controller = new AbortController();
      const consumer = consumers.create({ topics: [topic], database: db.pool, handler });
      await consumer.start(controller.signal);
      controller.abort();
      await consumer.stop(); // the same memoised stop that the abort began
      const again = await consumer.start().catch((e: unknown) => e);
      expect(isOutboxkitError(again, 'OUTBOXKIT_LIFECYCLE')).toBe(true);
    });
  });

  describe('stop', () => {
    it('aborts the signal of a handler in flight; the event is neither recorded nor acknowledged, and runs again later', async () => {
      const [own] = await createTopicsWithDlq(['stop']);
      const groupId = randomName('group');
      let entered = false;
      let sawAbort = false;
      const consumer = consumers.create({
        groupId,
        topics: [own!],
        database: db.pool,
        handler: async ({ tx, event, signal }) => {
          await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
          entered = true;
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
          sawAbort = true;
          throw signal.reason;
        },
      });
      const seen = record(consumer);
      await consumer.start();
      const [id] = await producer.send(own!, [{ partition: 0, value: {} }]);
      await waitFor(() => entered, { message: 'handler in flight' });
      await consumer.stop({ timeoutMs: 10_000 });
      expect(sawAbort).toBe(true);
      expect(seen.retries).toHaveLength(0);
      expect(seen.deadLettered).toHaveLength(0);
      expect(await inboxHas(id!)).toBe(false);
      expect((await committedOffsets(consumers.kafka, groupId, own!)).get(0) ?? -1).toBeLessThanOrEqual(0);

      const next = consumers.create({ groupId, topics: [own!], database: db.pool, handler });
      const seenNext = record(next);
      await next.start();
      await waitFor(() => seenNext.applied.length === 1);
      expect(await inboxHas(id!)).toBe(true);
    });
  });

  it('runs handlers in a drizzle transaction when given a drizzle database', async () => {
    const [own] = await createTopicsWithDlq(['drizzle']);
    const orm = drizzle(db.pool);
    const consumer = consumers.create({
      topics: [own!],
      database: orm,
      handler: async ({ tx, event }) => {
        await tx.execute(sql`INSERT INTO effects (event_id) VALUES (${event.id})`);
      },
    });
    const seen = record(consumer);
    await consumer.start();
    const [id] = await producer.send(own!, [{ partition: 1, value: {} }]);
    await waitFor(() => seen.applied.length === 1);
    expect(await inboxHas(id!)).toBe(true);
    expect((await db.pool.query('SELECT 1 FROM effects WHERE event_id = $1', [id])).rowCount).toBe(1);
  });

  it('calls hooks.afterCommit after the transaction committed and before the offset is committed', async () => {
    const [own] = await createTopicsWithDlq(['hook']);
    const groupId = randomName('group');
    const observed: { outcome: string; inboxCommitted: boolean; committedOffset: number }[] = [];
    const consumer = createDedupConsumer({
      ...FAST,
      kafka: consumers.client,
      groupId,
      topics: [own!],
      database: db.pool,
      handler,
      hooks: {
        async afterCommit(event, outcome) {
          observed.push({
            outcome,
            inboxCommitted: await inboxHas(event.id),
            committedOffset: (await committedOffsets(consumers.kafka, groupId, own!)).get(event.partition) ?? -1,
          });
        },
      },
    });
    try {
      const seen = record(consumer);
      await consumer.start();
      const [id] = await producer.send(own!, [{ partition: 2, value: {} }]);
      await producer.send(own!, [{ partition: 2, eventId: id, value: {} }]);
      await waitFor(() => seen.applied.length + seen.duplicates.length === 2);
      expect(observed).toEqual([
        { outcome: 'applied', inboxCommitted: true, committedOffset: -1 },
        { outcome: 'duplicate', inboxCommitted: true, committedOffset: expect.any(Number) },
      ]);
      // The offset of the second message was not committed when its hook ran.
      expect(observed[1]!.committedOffset).toBeLessThanOrEqual(1);
    } finally {
      await consumer.stop();
    }
  });

  it('with the default fetch wait, retries a failed handler after its backoff, not after an idle fetch wait', async () => {
    // kafkajs waits up to maxWaitTimeInMs before it fetches again when every partition it would
    // fetch is paused: with a 5 s default each retry of an idle partition took 5 s, whatever the
    // backoff (100 ms doubling here).
    const [own] = await createTopicsWithDlq(['retry-pace'], 1);
    let runs = 0;
    const consumer = consumers.create({
      topics: [own!],
      database: db.pool,
      fetchMaxWaitMs: undefined, // the default
      retryInitialMs: 100,
      retryMaxMs: 200,
      handler: async ({ tx, event }) => {
        if (++runs <= 3) throw new Error(`transient ${runs}`);
        await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await producer.send(own!, [{ partition: 0, value: {} }]);
    await waitFor(() => seen.retries.length >= 1, { message: 'the first failure' });
    const firstFailure = performance.now();
    await waitFor(() => seen.applied.length === 1, { timeoutMs: 30_000, message: 'applied after 3 retries' });
    // Three backoffs of at most 100, 200 and 200 ms, plus up to a fetch wait each (500 ms by
    // default): well under 5 s; with a 5 s fetch wait it took 15 s.
    expect(performance.now() - firstFailure).toBeLessThan(5_000);
    expect(seen.retries.map((r) => r.delayMs).every((d) => d <= 200)).toBe(true);
  });
});
