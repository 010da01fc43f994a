import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { isOutboxkitError, runTransaction, withPgTransaction } from '../src/index.js';
import { createTestDatabase, type TestDatabase } from './helpers/db.js';

let db: TestDatabase;
let pool1: pg.Pool;
beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('CREATE TABLE t (id int PRIMARY KEY)');
  pool1 = new pg.Pool({ connectionString: db.url, max: 1 });
  pool1.on('error', () => {});
});
afterAll(async () => {
  await pool1.end();
  await db.drop();
});

describe('withPgTransaction', () => {
  it('C24 rolls back a failed transaction, so a pool of one serves the next query', async () => {
    await pool1.query('INSERT INTO t VALUES (1)');
    const err = await withPgTransaction(pool1, async (c) => {
      await c.query('INSERT INTO t VALUES (2)');
      await c.query('INSERT INTO t VALUES (1)'); // unique violation
    }).catch((e: unknown) => e);
    expect((err as { code?: string }).code).toBe('23505');
    expect((await pool1.query('SELECT 1 AS one')).rows[0].one).toBe(1);
    expect((await pool1.query('SELECT count(*)::int AS n FROM t')).rows[0].n).toBe(1);
  });

  it('C24 destroys a client whose ROLLBACK failed instead of returning it to the pool', async () => {
    const err = await withPgTransaction(pool1, async (c) => {
      const { rows } = await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      // Another session kills this one mid-transaction: the ROLLBACK cannot be sent.
      await db.pool.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid]);
      await c.query('SELECT 1');
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect((await pool1.query('SELECT 1 AS one')).rows[0].one).toBe(1);
  });

  it('refuses a COMMIT that PostgreSQL answered with ROLLBACK (an error swallowed inside)', async () => {
    const err = await withPgTransaction(pool1, async (c) => {
      await c.query('INSERT INTO t VALUES (3)');
      await c.query('INSERT INTO t VALUES (1)').catch(() => undefined); // swallowed
      return 'looks fine';
    }).catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
    expect((await pool1.query('SELECT count(*)::int AS n FROM t WHERE id = 3')).rows[0].n).toBe(0);
  });

  it('runTransaction commits on a pool', async () => {
    await runTransaction(pool1, async (c) => c.query('INSERT INTO t VALUES (4)'));
    expect((await pool1.query('SELECT count(*)::int AS n FROM t WHERE id = 4')).rows[0].n).toBe(1);
  });
});
