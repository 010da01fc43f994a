import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import pg from 'pg';
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

describe('PostgreSQL outage (G5: a database failure is not the message’s fault)', () => {
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
});
