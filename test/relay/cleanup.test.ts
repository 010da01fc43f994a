/**
 * Issue 17, point 6: paced retention cleanup. The cleaner deleted up to 100 batches back to back
 * per interval (a burst that raised the writers' latency, and a backlog larger than 100 batches
 * waited for the next interval). It now deletes batch after batch until the backlog is gone, at
 * `cleanupRowsPerSecond` on average. The writers' p99 beside it is measured in bench/cleanup.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

/** `count` rows published two days ago (past any retention), with their key-lock rows. */
async function seedPublished(count: number, prefix: string): Promise<void> {
  await db.pool.query(
    `WITH keys AS (SELECT $1 || g AS key, g FROM generate_series(1, $2::int) AS g),
          locks AS (INSERT INTO outboxkit.outbox_key_locks SELECT hashtextextended(key, 7) FROM keys ON CONFLICT DO NOTHING)
     INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload, headers, published_at)
     SELECT gen_random_uuid(), 'cleanup-old', key, g % 64, 't', '\\x7b7d', '{}', now() - interval '2 days' FROM keys`,
    [prefix, count],
  );
}

async function oldRows(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = 'cleanup-old'`,
  );
  return rows[0]!.n;
}

describe('retention cleanup', () => {
  it('deletes a backlog of more than 100 batches in one go (no wait for the next interval)', async () => {
    await seedPublished(1_000, 'burst-');
    const relay = await startRelay(db.url, {
      cleanupIntervalMs: 5_000,
      cleanupBatchSize: 5,
      cleanupRowsPerSecond: 0,
    });
    const first = new Promise<number>((resolve) => relay.once('relay:cleaned', () => resolve(performance.now())));
    await waitFor(async () => (await oldRows()) === 0, { timeoutMs: 30_000 });
    // 200 batches of 5 within the first cleanup, long before the next interval (the old cleaner
    // stopped after 100 batches and left the rest for the next two intervals: 10 s more).
    expect(performance.now() - (await first)).toBeLessThan(4_000);
    // The key-lock rows of the deleted events went with them.
    const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks');
    expect(rows[0]!.n).toBe(0);
    await relay.stopAndForget();
  }, 60_000);

  it('paces its batches to cleanupRowsPerSecond: 2,000 rows at 1,000 rows/s take at least 2 s', async () => {
    await seedPublished(2_000, 'paced-');
    const deletedAt: number[] = [];
    const relay = await startRelay(db.url, {
      cleanupIntervalMs: 100,
      cleanupBatchSize: 200,
      cleanupRowsPerSecond: 1_000,
    });
    relay.on('relay:cleaned', ({ deleted }) => {
      for (let i = 0; i < deleted; i += 200) deletedAt.push(performance.now());
    });
    await waitFor(async () => (await oldRows()) === 0, { timeoutMs: 30_000 });
    // 10 batches of 200: 9 pauses after the first batch, each filling the batch's 200 ms share.
    expect(deletedAt).toHaveLength(10);
    expect(deletedAt.at(-1)! - deletedAt[0]!).toBeGreaterThanOrEqual(9 * 200 * 0.95);
    await relay.stopAndForget();
  }, 60_000);

  it('stop() ends a paced cleanup between batches without waiting for the backlog', async () => {
    await seedPublished(2_000, 'stop-');
    const relay = await startRelay(db.url, {
      cleanupIntervalMs: 100,
      cleanupBatchSize: 100,
      cleanupRowsPerSecond: 10,
    });
    await new Promise<void>((resolve) => relay.once('relay:cleaned', () => resolve()));
    const started = performance.now();
    await relay.stopAndForget();
    // A batch of 100 at 10 rows/s waits 10 s: stop() does not.
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(await oldRows()).toBeGreaterThan(1_000);
  }, 60_000);
});
