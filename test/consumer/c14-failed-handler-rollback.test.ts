import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  committedAtLogEnd,
  committedOffsets,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  TestProducer,
} from './support.js';

describe('C14 · the dedup record must not outlive a failed handler', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE business (event_id uuid NOT NULL, run int NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  /** Committed rows of the event, read outside the handler's transaction. */
  async function committedRows(eventId: string): Promise<{ inbox: number; business: number }> {
    const { rows } = await db.pool.query<{ inbox: number; business: number }>(
      `SELECT (SELECT count(*)::int FROM outboxkit.inbox WHERE event_id = $1) AS inbox,
              (SELECT count(*)::int FROM business WHERE event_id = $1) AS business`,
      [eventId],
    );
    return rows[0]!;
  }

  it('rolls back the inbox row with the business row, and the retry runs the handler again until it succeeds', async () => {
    const [topic] = await createTopicsWithDlq(['c14']);
    const seenBeforeRun: { inbox: number; business: number }[] = [];
    let runs = 0;
    const handler: DedupHandler<pg.Pool> = async ({ tx, event, attempt }) => {
      runs += 1;
      // What the previous runs left committed, seen from another connection.
      seenBeforeRun.push(await committedRows(event.id));
      await tx.query('INSERT INTO business (event_id, run) VALUES ($1, $2)', [event.id, attempt]);
      if (attempt < 3) throw new Error(`failure on run ${attempt}`);
    };
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, maxAttempts: 5 });
    const seen = record(consumer);
    await consumer.start();
    const [id] = await producer.send(topic!, [{ partition: 1, value: { n: 1 } }]);

    await waitFor(() => seen.applied.length === 1, { message: 'applied after two failures' });
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(runs).toBe(3);
    expect(seenBeforeRun).toEqual([
      { inbox: 0, business: 0 },
      { inbox: 0, business: 0 },
      { inbox: 0, business: 0 },
    ]);
    expect(seen.retries.map((r) => [r.attempt, (r.error as Error).message])).toEqual([
      [1, 'failure on run 1'],
      [2, 'failure on run 2'],
    ]);
    expect(seen.applied[0]!.attempt).toBe(3);
    expect(await committedRows(id!)).toEqual({ inbox: 1, business: 1 });
    const { rows } = await db.pool.query('SELECT run FROM business WHERE event_id = $1', [id]);
    expect(rows).toEqual([{ run: 3 }]);
    expect(seen.deadLettered).toHaveLength(0);
  });

  it('leaves no inbox row and no committed offset when a consumer stops during failures; the redelivery runs the handler again', async () => {
    const [topic] = await createTopicsWithDlq(['c14-redelivery']);
    const groupId = randomName('group');
    let failingRuns = 0;
    const failing = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      maxAttempts: 1_000,
      handler: async ({ tx, event }) => {
        failingRuns += 1;
        await tx.query('INSERT INTO business (event_id, run) VALUES ($1, 0)', [event.id]);
        throw new Error('still failing');
      },
    });
    const failed = record(failing);
    await failing.start();
    const [id] = await producer.send(topic!, [{ partition: 0, value: { n: 2 } }]);
    await waitFor(() => failed.retries.length >= 2, { message: 'two failed runs' });
    await failing.stop();

    expect(await committedRows(id!)).toEqual({ inbox: 0, business: 0 });
    // Nothing was acknowledged: the group has no committed offset past the message.
    expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(0);
    expect(failed.deadLettered).toHaveLength(0);
    expect(failingRuns).toBeGreaterThanOrEqual(2);

    const succeeding = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        await tx.query('INSERT INTO business (event_id, run) VALUES ($1, 1)', [event.id]);
      },
    });
    const applied = record(succeeding);
    await succeeding.start();
    await waitFor(() => applied.applied.length === 1, { message: 'the redelivered event applied' });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!));
    expect(applied.applied[0]!.event.id).toBe(id);
    expect(await committedRows(id!)).toEqual({ inbox: 1, business: 1 });
  });
});
