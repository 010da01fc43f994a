/**
 * Inbox retention: cleanup in bounded batches (library and `outboxkit inbox cleanup`), and the
 * start-time warning when a topic keeps messages at least as long as the inbox keeps rows.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { cleanupInbox, DEFAULT_INBOX_RETENTION_MS } from '../../consumer/index.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { spawnCli } from '../helpers/processes.js';
import { ConsumerRegistry } from './support.js';

const DAY_MS = 24 * 60 * 60 * 1_000;

describe('inbox cleanup', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  beforeEach(() => db.pool.query('TRUNCATE outboxkit.inbox'));
  afterAll(() => db?.drop());

  async function insertRows(group: string, count: number, ageMs: number): Promise<void> {
    await db.pool.query(
      `INSERT INTO outboxkit.inbox (consumer_group, event_id, topic, partition, "offset", processed_at)
       SELECT $1, gen_random_uuid(), 't', 0, g, now() - make_interval(secs => $3::double precision / 1000)
         FROM generate_series(1, $2) AS g`,
      [group, count, ageMs],
    );
  }
  async function rowsOf(group: string): Promise<number> {
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
      [group],
    );
    return rows[0]!.n;
  }

  it('deletes rows older than the retention (default 8 days) in batches and keeps younger ones', async () => {
    expect(DEFAULT_INBOX_RETENTION_MS).toBe(8 * DAY_MS);
    await insertRows('g1', 5, 9 * DAY_MS);
    await insertRows('g2', 2, 30 * DAY_MS);
    await insertRows('g1', 3, 7 * DAY_MS);
    expect(await cleanupInbox(db.pool, { batchSize: 2 })).toEqual({ deleted: 7, more: false });
    expect(await rowsOf('g1')).toBe(3);
    expect(await rowsOf('g2')).toBe(0);
  });

  it('stops after maxBatches and says more remain; can be limited to one group', async () => {
    await insertRows('g1', 5, 2 * DAY_MS);
    await insertRows('g2', 4, 2 * DAY_MS);
    const opts = { retentionMs: DAY_MS, batchSize: 2, maxBatches: 2, consumerGroup: 'g1' };
    expect(await cleanupInbox(db.pool, opts)).toEqual({ deleted: 4, more: true });
    expect(await cleanupInbox(db.pool, opts)).toEqual({ deleted: 1, more: false });
    expect(await rowsOf('g1')).toBe(0);
    expect(await rowsOf('g2')).toBe(4);
  });

  it('refuses invalid bounds with a typed error', async () => {
    await expect(cleanupInbox(db.pool, { batchSize: 0 })).rejects.toMatchObject({ code: 'OUTBOXKIT_INVALID_OPTIONS' });
    await expect(cleanupInbox(db.pool, { retentionMs: -5 })).rejects.toMatchObject({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
    });
    await expect(cleanupInbox(db.pool, { schema: 'bad"schema' })).rejects.toMatchObject({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
    });
  });

  it('outboxkit inbox cleanup deletes expired rows', async () => {
    await insertRows('g1', 3, 9 * DAY_MS);
    await insertRows('g1', 2, DAY_MS);
    const run = spawnCli(['inbox', 'cleanup', '--database-url', db.url, '--batch-size', '2']);
    expect((await run.exited).code).toBe(0);
    expect(run.output.join('')).toContain('deleted 3 inbox rows');
    expect(await rowsOf('g1')).toBe(2);
  });
});

describe('topic retention check at start', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterEach(() => consumers.stopAll());
  afterAll(() => db?.drop());

  async function topicWithDlq(retentionMs?: string): Promise<string> {
    const configEntries = retentionMs === undefined ? undefined : [{ name: 'retention.ms', value: retentionMs }];
    const [topic] = await createTopics(['retention'], { partitions: 1, configEntries });
    const admin = consumers.kafka.admin();
    await admin.connect();
    try {
      await admin.createTopics({
        waitForLeaders: true,
        topics: [{ topic: `${topic}.dlq`, numPartitions: 1, replicationFactor: 1 }],
      });
    } finally {
      await admin.disconnect();
    }
    return topic!;
  }

  function spyLogger(): Logger & { warnings: { fields: unknown; message: string }[] } {
    const warnings: { fields: unknown; message: string }[] = [];
    const noop = () => {};
    return {
      warnings,
      debug: noop,
      info: noop,
      error: noop,
      warn: (fields: unknown, message?: string) => warnings.push({ fields, message: message ?? '' }),
    } as unknown as Logger & { warnings: { fields: unknown; message: string }[] };
  }

  it('warns (log and event) for topics that keep messages as long as the inbox or longer, not for shorter ones', async () => {
    const longer = await topicWithDlq(String(10 * DAY_MS));
    const forever = await topicWithDlq('-1');
    const shorter = await topicWithDlq(String(7 * DAY_MS));
    const logger = spyLogger();
    const consumer = consumers.create({
      topics: [longer, forever, shorter],
      database: db.pool,
      handler: async () => {},
      logger,
    });
    const seen: unknown[] = [];
    consumer.on('consumer:retention-warning', (e) => seen.push(e));
    await consumer.start();
    expect(seen).toEqual(
      expect.arrayContaining([
        { topic: longer, topicRetentionMs: 10 * DAY_MS, inboxRetentionMs: DEFAULT_INBOX_RETENTION_MS },
        { topic: forever, topicRetentionMs: null, inboxRetentionMs: DEFAULT_INBOX_RETENTION_MS },
      ]),
    );
    expect(seen).toHaveLength(2);
    const messages = logger.warnings.map((w) => w.message);
    expect(messages.some((m) => m.includes(longer) && m.includes('inboxRetentionMs'))).toBe(true);
    expect(messages.some((m) => m.includes(forever) && m.includes('forever'))).toBe(true);
    expect(messages.some((m) => m.includes(shorter))).toBe(false);
  });

  it('compares with the configured inboxRetentionMs (equal is not shorter)', async () => {
    const topic = await topicWithDlq(String(DAY_MS));
    const consumer = consumers.create({
      topics: [topic],
      database: db.pool,
      handler: async () => {},
      inboxRetentionMs: DAY_MS,
    });
    const seen: unknown[] = [];
    consumer.on('consumer:retention-warning', (e) => seen.push(e));
    await consumer.start();
    expect(seen).toEqual([{ topic, topicRetentionMs: DAY_MS, inboxRetentionMs: DAY_MS }]);
  });

  it('refuses an invalid inboxRetentionMs', () => {
    expect(() =>
      consumers.create({ topics: ['t'], database: db.pool, handler: async () => {}, inboxRetentionMs: 0 }),
    ).toThrow(expect.objectContaining({ code: 'OUTBOXKIT_INVALID_OPTIONS' }) as Error);
  });
});
