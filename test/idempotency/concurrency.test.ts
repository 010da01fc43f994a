/**
 * C17 · concurrent requests with one key, over real HTTP against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  closeAll,
  countOrders,
  createOrder,
  ORDERS_TABLE_SQL,
  post,
  readRecords,
  sleep,
  startApp,
  type HttpResult,
} from './harness.js';

let db: TestDatabase;
const pools: pg.Pool[] = [];

function newPool(max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: db.url, max });
  pools.push(pool);
  return pool;
}

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect(await closeAll(), 'a test left an app open').toBe(0);
  await Promise.all(pools.splice(0).map((p) => p.end()));
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await closeAll();
  await db?.drop();
});

const CONCURRENT = 20;
const HANDLER_MS = 500;

describe('C17 concurrent requests with one key', () => {
  it('policy reject: the handler runs once, the 19 others get 409 with Retry-After, the first result is never overwritten', async () => {
    let settled = 0;
    let othersDone!: () => void;
    const allOthersDone = new Promise<void>((r) => (othersDone = r));
    const app = await startApp({
      pool: newPool(CONCURRENT + 5),
      behaviour: async (ctx) => {
        // Takes 500 ms, and stays open until the 19 duplicates were answered, so that every one of
        // them meets the open claim (bounded: a duplicate that is never answered fails the test).
        await Promise.all([sleep(HANDLER_MS), Promise.race([allOthersDone, sleep(10_000)])]);
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const body = '{"amount":10}';
    const requests = Array.from({ length: CONCURRENT }, () =>
      post(app, '/orders', { key, body }).then((res) => {
        if (res.status !== 201 && ++settled === CONCURRENT - 1) othersDone();
        return res;
      }),
    );
    const results = await Promise.all(requests);

    const created = results.filter((r) => r.status === 201);
    const conflicts = results.filter((r) => r.status === 409);
    expect(created).toHaveLength(1);
    expect(conflicts).toHaveLength(CONCURRENT - 1);
    expect(created[0]!.headers.get('idempotent-replayed')).toBeNull();
    for (const c of conflicts) {
      expect(c.headers.get('retry-after')).toBe('1');
      expect(c.headers.get('content-type')).toBe('application/problem+json');
      expect(c.json()).toMatchObject({
        code: 'OUTBOXKIT_KEY_IN_PROGRESS',
        type: 'https://outboxkit.dev/problems/key-in-progress',
      });
    }
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);

    // The first result is stored once and never overwritten; retries now replay it.
    const [record] = await readRecords(db.pool, key);
    expect(record).toMatchObject({ state: 'completed', generation: 1, response_status: 201 });
    expect(record!.response_body!.equals(created[0]!.bytes)).toBe(true);
    const later = await Promise.all(Array.from({ length: 5 }, () => post(app, '/orders', { key, body })));
    for (const r of later) {
      expect(r.status).toBe(201);
      expect(r.headers.get('idempotent-replayed')).toBe('true');
      expect(r.bytes.equals(created[0]!.bytes)).toBe(true);
    }
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('policy wait, pool of 10: the handler runs once and all 19 others get the replay; no starvation', async () => {
    const pool = newPool(10);
    const app = await startApp({
      pool,
      policy: 'wait',
      waitTimeoutMs: 10_000,
      behaviour: async (ctx) => {
        await sleep(HANDLER_MS);
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const started = Date.now();
    const results: HttpResult[] = await Promise.all(
      Array.from({ length: CONCURRENT }, () => post(app, '/orders', { key, body: '{"amount":10}' })),
    );
    const elapsedMs = Date.now() - started;

    expect(results.map((r) => r.status)).toEqual(Array(CONCURRENT).fill(201));
    const fresh = results.filter((r) => r.headers.get('idempotent-replayed') === null);
    const replays = results.filter((r) => r.headers.get('idempotent-replayed') === 'true');
    expect(fresh).toHaveLength(1);
    expect(replays).toHaveLength(CONCURRENT - 1);
    for (const r of replays) expect(r.bytes.equals(fresh[0]!.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    const [record] = await readRecords(db.pool, key);
    expect(record!.response_body!.equals(fresh[0]!.bytes)).toBe(true);
    expect(record!.generation).toBe(1);
    // Everyone was served well within the wait deadline, and the pool drained.
    expect(elapsedMs).toBeLessThan(5_000);
    expect(pool.waitingCount).toBe(0);
    await app.close();
  });

  it('policy wait: a duplicate that outlives waitTimeoutMs gets 409 with Retry-After', async () => {
    const app = await startApp({
      pool: newPool(5),
      policy: 'wait',
      waitTimeoutMs: 200,
      behaviour: async (ctx) => {
        await sleep(1_500);
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const first = post(app, '/orders', { key });
    await waitFor(() => app.calls.total === 1); // the first holds the claim
    const started = Date.now();
    const second = await post(app, '/orders', { key });
    expect(second.status).toBe(409);
    expect(second.headers.get('retry-after')).toBe('1');
    expect(Date.now() - started).toBeLessThan(1_300);
    expect((await first).status).toBe(201);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('policy wait: when the first rolls back (503), the waiting duplicate claims the key and executes', async () => {
    const app = await startApp({
      pool: newPool(5),
      policy: 'wait',
      behaviour: async (ctx) => {
        if (ctx.call === 1) {
          await ctx.insertOrder();
          await sleep(400);
          return { status: 503, body: { error: 'dependency down' } };
        }
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const first = post(app, '/orders', { key });
    await waitFor(() => app.calls.total === 1); // the first holds the claim
    const second = await post(app, '/orders', { key });
    expect((await first).status).toBe(503);
    expect(second.status).toBe(201);
    expect(second.headers.get('idempotent-replayed')).toBeNull();
    expect(app.calls.total).toBe(2);
    expect(await countOrders(db.pool)).toBe(1);
    const third = await post(app, '/orders', { key });
    expect(third.bytes.equals(second.bytes)).toBe(true);
    await app.close();
  });
});
