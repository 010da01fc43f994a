/**
 * Two ambiguity windows from the seeds, over real HTTP against the real PostgreSQL:
 * - a pool of 10 with 20 concurrent duplicates does not starve (lease mode, policy `wait`):
 *   waiting duplicates hold no pooled connection, so the owner can still write and finish;
 * - replay after the created resource changed or was deleted → the stored representation.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { closeAll, ORDERS_TABLE_SQL, post, startApp } from './harness.js';
import { closeLeaseApps, pay, startLeaseApp } from './lease-harness.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 10 });
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect((await closeAll()) + (await closeLeaseApps()), 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await db?.drop();
});

describe('a pool of 10 with 20 concurrent duplicates does not starve (lease mode, policy wait)', () => {
  it('the handler runs once, writes after the duplicates started waiting, and all 20 get the same result', async () => {
    let ownerWriteMs = -1;
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'wait',
      waitTimeoutMs: 10_000,
      pollIntervalMs: 200,
      lockTimeoutMs: 1, // duplicates' claims time out on each other's row lock: they must keep waiting, not 409
      behaviour: async (c) => {
        await new Promise((r) => setTimeout(r, 500)); // the duplicates pile up meanwhile
        const t0 = Date.now();
        const response = await pay(c); // needs a pooled connection (fenced transaction) while 19 duplicates wait
        ownerWriteMs = Date.now() - t0;
        return response;
      },
    });
    const key = randomUUID();
    const started = Date.now();
    const results = await Promise.all(Array.from({ length: 20 }, () => post(app, '/payments', { key, body: '{}' })));
    const elapsed = Date.now() - started;
    expect(results.map((r) => r.status)).toEqual(Array(20).fill(201));
    expect(results.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(19);
    for (const r of results) expect(r.bytes.equals(results[0]!.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    // The owner got a pooled connection at once: the waiting duplicates hold none between polls.
    expect(ownerWriteMs).toBeGreaterThanOrEqual(0);
    expect(ownerWriteMs).toBeLessThan(1_000);
    expect(elapsed).toBeLessThan(5_000);
    await app.close();
  });
});

describe('replay after the created resource changed → the stored representation', () => {
  it('a retry after the order was updated, then deleted, gets the stored bytes, not the current state', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(first.status).toBe(201);
    const id = (first.json() as { id: string }).id;

    await db.pool.query(`UPDATE app_orders SET body = '{"amount":0,"cancelled":true}' WHERE id = $1`, [id]);
    const afterUpdate = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(afterUpdate.status).toBe(201);
    expect(afterUpdate.headers.get('idempotent-replayed')).toBe('true');
    expect(afterUpdate.bytes.equals(first.bytes)).toBe(true);

    await db.pool.query('DELETE FROM app_orders WHERE id = $1', [id]);
    const afterDelete = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(afterDelete.status).toBe(201);
    expect(afterDelete.bytes.equals(first.bytes)).toBe(true);
    expect(afterDelete.headers.get('location')).toBe(first.headers.get('location'));
    expect(app.calls.total).toBe(1);
    await app.close();
  });
});
