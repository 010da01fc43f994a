import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('C24 · a client left in an aborted transaction (consumer)', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    // One connection: a client returned to the pool in a failed transaction would break all that follows.
    db = await createTestDatabase({ poolSize: 1 });
    await db.pool.query('CREATE TABLE taken (id int PRIMARY KEY)');
    await db.pool.query('INSERT INTO taken VALUES (1)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  async function inboxCount(eventId: string): Promise<number> {
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE event_id = $1',
      [eventId],
    );
    return rows[0]!.n;
  }

  it('rolls back after a constraint error in the handler; SELECT 1 through the same pool of size 1 then succeeds', async () => {
    const [topic] = await createTopicsWithDlq(['c24']);
    const handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
      const { id } = event.json() as { id: number };
      await tx.query('INSERT INTO taken VALUES ($1)', [id]); // id 1 violates the primary key (23505)
    };
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, maxAttempts: 2 });
    const seen = record(consumer);
    await consumer.start();
    const [bad] = await producer.send(topic!, [{ partition: 0, value: { id: 1 } }]);
    await waitFor(() => seen.deadLettered.length === 1, { message: 'constraint violation dead-lettered' });

    const { rows } = await db.pool.query('SELECT 1 AS ok');
    expect(rows).toEqual([{ ok: 1 }]);
    expect(seen.deadLettered[0]!.reason).toMatch(/duplicate key value violates unique constraint "taken_pkey"/);
    expect(seen.deadLettered[0]!.attempts).toBe(2);
    expect(seen.errors).toHaveLength(0);
    expect(await inboxCount(bad!)).toBe(0);

    // The consumer's own next transaction on the same single connection works too.
    const [good] = await producer.send(topic!, [{ partition: 0, value: { id: 2 } }]);
    await waitFor(() => seen.applied.length === 1, { message: 'next event applied on the same connection' });
    expect(await inboxCount(good!)).toBe(1);
    expect(db.pool.totalCount).toBeLessThanOrEqual(1);
  });

  it('does not acknowledge as applied an event whose handler swallowed a failed statement', async () => {
    const [topic] = await createTopicsWithDlq(['c24-swallow']);
    const handler: DedupHandler<pg.Pool> = async ({ tx }) => {
      // The application catches the error and returns normally: the transaction is aborted, and
      // COMMIT would silently roll back the inbox row.
      await tx.query('INSERT INTO taken VALUES (1)').catch(() => {});
    };
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, maxAttempts: 2 });
    const seen = record(consumer);
    await consumer.start();
    const [id] = await producer.send(topic!, [{ partition: 1, value: {} }]);
    await waitFor(() => seen.deadLettered.length === 1, { message: 'dead-lettered, not applied' });
    expect(seen.applied).toHaveLength(0);
    expect(seen.retries).toHaveLength(1);
    expect(seen.deadLettered[0]!.reason).toMatch(/its transaction had failed/);
    expect(await inboxCount(id!)).toBe(0);
    expect((await db.pool.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });
});
