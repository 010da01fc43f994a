/**
 * Retention cleanup: only expired completed/failed records go, in bounded batches; processing
 * and uncertain records stay whatever their age.
 */
import { drizzle } from 'drizzle-orm/node-postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { cleanupExpiredKeys } from '../../src/idempotency/cleanup.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

async function seed(state: string, expired: boolean, n: number, prefix: string): Promise<void> {
  await db.pool.query(
    `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, expires_at)
     SELECT 't', 'op', $1 || g, '\\x00'::bytea, 1, $2, now() + CASE WHEN $3 THEN interval '-1 hour' ELSE interval '1 hour' END
       FROM generate_series(1, $4::int) g`,
    [prefix, state, expired, n],
  );
}

async function remaining(): Promise<Record<string, number>> {
  const { rows } = await db.pool.query<{ k: string; n: number }>(
    `SELECT state || CASE WHEN expires_at <= now() THEN ':expired' ELSE ':live' END AS k, count(*)::int AS n
       FROM outboxkit.idempotency_keys GROUP BY 1 ORDER BY 1`,
  );
  return Object.fromEntries(rows.map((r) => [r.k, r.n]));
}

describe('cleanupExpiredKeys', () => {
  beforeEach(async () => {
    await db.pool.query('TRUNCATE outboxkit.idempotency_keys');
    await seed('completed', true, 7, 'ce');
    await seed('failed', true, 3, 'fe');
    await seed('completed', false, 4, 'cl');
    await seed('processing', true, 2, 'pe');
    await seed('uncertain', true, 1, 'ue');
  });

  it('deletes only expired completed/failed records, in batches, never processing or uncertain ones', async () => {
    const { deleted } = await cleanupExpiredKeys(db.pool, { batchSize: 3 });
    expect(deleted).toBe(10);
    expect(await remaining()).toEqual({ 'completed:live': 4, 'processing:expired': 2, 'uncertain:expired': 1 });
  });

  it('stops after maxBatches (bounded work per call); the next call continues', async () => {
    expect(await cleanupExpiredKeys(db.pool, { batchSize: 2, maxBatches: 2 })).toEqual({ deleted: 4 });
    expect(await cleanupExpiredKeys(drizzle(db.pool), { batchSize: 100 })).toEqual({ deleted: 6 });
    expect(await cleanupExpiredKeys(db.pool)).toEqual({ deleted: 0 });
  });

  it('refuses invalid bounds', async () => {
    await expect(cleanupExpiredKeys(db.pool, { batchSize: 0 })).rejects.toSatisfy((e) =>
      isOutboxkitError(e, 'OUTBOXKIT_INVALID_OPTIONS'),
    );
  });
});
