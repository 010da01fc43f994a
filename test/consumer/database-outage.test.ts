import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { sql, type SQL } from 'drizzle-orm';
import { PgDialect } from 'drizzle-orm/pg-core';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import type { DrizzleTransaction } from '../../src/database.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  committedAtLogEnd,
  committedOffsets,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  TestProducer,
} from './support.js';

describe('PostgreSQL outage (G5: a failure of the consumer’s own database connection is not the message’s fault)', () => {
  let db: TestDatabase;
  let admin: pg.Client;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    // The outage below terminates the pool's idle connections: expected, not a test failure.
    db.pool.on('error', () => {});
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
    admin = new pg.Client({ connectionString: inject('databaseUrl') });
    await admin.connect();
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await admin?.end();
    await producer.close();
    await db?.drop();
  });

  it('retries without counting attempts or dead-lettering while the database refuses connections, then applies', async () => {
    const [topic] = await createTopicsWithDlq(['db-outage']);
    const name = new URL(db.url).pathname.slice(1);
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      maxAttempts: 2,
      handler: async ({ tx, event }) => {
        await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
      },
    });
    const seen = record(consumer);
    await consumer.start();

    await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS false`);
    await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [name]);
    let outageOver = false;
    try {
      const [id] = await producer.send(topic!, [{ partition: 0, value: {} }]);
      // Far more failures than maxAttempts: none of them may dead-letter the message.
      await waitFor(() => seen.errors.length >= 5, { message: 'five failed tries during the outage' });
      expect(seen.deadLettered).toHaveLength(0);
      expect(seen.retries).toHaveLength(0);
      expect(seen.applied).toHaveLength(0);
      expect((await committedOffsets(consumers.kafka, consumer.groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(0);

      await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS true`);
      outageOver = true;
      await waitFor(() => seen.applied.length === 1, { message: 'applied once the database is back' });
      await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
      expect(seen.applied[0]!.event.id).toBe(id);
      expect(seen.deadLettered).toHaveLength(0);
    } finally {
      if (!outageOver) await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS true`);
    }
  });

  it.each([
    ['pg.Pool', 'message'],
    ['pg.Pool', 'batch'],
    ['drizzle', 'message'],
    ['drizzle', 'batch'],
  ] as const)(
    'C31 %s, %s scope: the consumer’s own connection ending under the handler’s statement on tx is an outage (not counted), then applied once',
    async (driver, transactionScope) => {
      const [topic] = await createTopicsWithDlq(['db-own-connection'], 1);
      const ended = new Set<string>();
      const consumer = consumers.create({
        topics: [topic!],
        database: driver === 'pg.Pool' ? db.pool : drizzle(db.pool),
        transactionScope,
        // One counted failure would dead-letter it.
        maxAttempts: 1,
        handler: async ({ tx, event }) => {
          const q = async (statement: SQL) => {
            if (driver === 'drizzle') return (tx as DrizzleTransaction).execute(statement);
            const { sql: text, params } = new PgDialect().sqlToQuery(statement);
            return (tx as pg.PoolClient).query(text, params);
          };
          await q(sql`INSERT INTO effects (event_id) VALUES (${event.id})`);
          // Two messages: the second ends its session the first time it runs (SQLSTATE 57P01, as in a failover).
          if (event.offset === '1' && !ended.has(event.id)) {
            ended.add(event.id);
            await q(sql`SELECT pg_terminate_backend(pg_backend_pid())`);
          }
        },
      });
      const seen = record(consumer);
      await consumer.start();
      const ids = await producer.send(topic!, [
        { partition: 0, value: {} },
        { partition: 0, value: {} },
      ]);
      await waitFor(() => seen.applied.length === 2, { message: 'both applied after the lost connection' });
      await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
      expect(seen.deadLettered).toHaveLength(0);
      expect(seen.retries).toHaveLength(0);
      expect(seen.errors.length).toBeGreaterThanOrEqual(1);
      expect(seen.errors[0]!.error).toMatchObject({ code: 'OUTBOXKIT_STORE_UNAVAILABLE', retriable: true });
      const { rows } = await db.pool.query<{ event_id: string; n: number }>(
        'SELECT event_id::text, count(*)::int AS n FROM effects WHERE event_id = ANY($1::uuid[]) GROUP BY 1',
        [ids],
      );
      expect(rows.map((r) => r.n)).toEqual([1, 1]);
    },
  );
});
