/**
 * The HTTP contract of idempotent requests (DESIGN "HTTP contract"), over real HTTP against the
 * real PostgreSQL: cases C20, C21, C22, retention, limits, store failures.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/wait-for.js';
import {
  countOrders,
  countRecords,
  createOrder,
  post,
  readRecords,
  startApp,
  useOrdersDatabase,
  type HttpResult,
} from './harness.js';

const db = useOrdersDatabase();

function expectProblem(res: HttpResult, status: number, code: string): Record<string, unknown> {
  expect(res.status).toBe(status);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  expect(res.headers.get('cache-control')).toBe('no-store');
  const body = res.json();
  expect(body).toMatchObject({ status, code, type: expect.stringMatching(/^https:\/\/outboxkit\.dev\/problems\//) });
  return body;
}

describe('new key, replay, missing key', () => {
  it('a new key executes once: 201 and one business row, record completed', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const res = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(res.status).toBe(201);
    expect(res.headers.get('idempotent-replayed')).toBeNull();
    expect(res.headers.get('set-cookie')).toBe('session=abc'); // the first response carries every header
    expect(res.json()).toMatchObject({ body: { amount: 10 } });
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    const [record] = await readRecords(db.pool, key);
    expect(record).toMatchObject({
      tenant: 'tenant-a',
      operation: 'create-order',
      state: 'completed',
      response_status: 201,
    });
    expect(record!.response_body!.equals(res.bytes)).toBe(true);
    await app.close();
  });

  it('a retry replays the same status and bytes with Idempotent-Replayed: true, and allow-listed headers only', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    const second = await post(app, '/orders', { key });
    const third = await post(app, '/orders', { key, body: '{ "amount" : 10 }' }); // same JSON, other bytes
    for (const replay of [second, third]) {
      expect(replay.status).toBe(201);
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.headers.get('content-type')).toBe('application/json');
      expect(replay.headers.get('location')).toBe(first.headers.get('location'));
      expect(replay.headers.get('set-cookie')).toBeNull();
      expect(replay.headers.get('x-execution')).toBeNull();
    }
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });

  it('a missing key gets 400 problem+json; nothing runs, nothing is recorded', async () => {
    const app = await startApp({ pool: db.pool });
    const res = await post(app, '/orders', { key: null });
    const body = expectProblem(res, 400, 'OUTBOXKIT_KEY_MISSING');
    expect(body.type).toBe('https://outboxkit.dev/problems/key-missing');
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('a malformed, too long or repeated key gets 400 key-invalid', async () => {
    const app = await startApp({ pool: db.pool });
    for (const key of ['', 'x'.repeat(256), 'a b', '"unterminated', 'k1, k2', '"k1", "k2"']) {
      const res = await post(app, '/orders', { key });
      expectProblem(res, 400, 'OUTBOXKIT_KEY_INVALID');
    }
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('an sf-string key and the same bare key are the same key', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key: `"${key}"` });
    const second = await post(app, '/orders', { key });
    expect(first.status).toBe(201);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(second.bytes.equals(first.bytes)).toBe(true);
    await app.close();
  });

  it('an optional key: without one, the handler runs unprotected every time; with one, it is protected', async () => {
    const app = await startApp({ pool: db.pool, required: false });
    expect((await post(app, '/orders', { key: null })).status).toBe(201);
    expect((await post(app, '/orders', { key: null })).status).toBe(201);
    expect(app.calls.total).toBe(2);
    expect(await countRecords(db.pool)).toBe(0);
    const key = randomUUID();
    await post(app, '/orders', { key });
    expect((await post(app, '/orders', { key })).headers.get('idempotent-replayed')).toBe('true');
    expect(app.calls.total).toBe(3);
    await app.close();
  });

  it('a body that is not JSON, or holds an integer beyond 2^53, gets 400 body-invalid and nothing recorded', async () => {
    const app = await startApp({ pool: db.pool });
    expectProblem(await post(app, '/orders', { body: 'amount=10' }), 400, 'OUTBOXKIT_BODY_INVALID');
    expectProblem(await post(app, '/orders', { body: '{"id":9007199254740993}' }), 400, 'OUTBOXKIT_BODY_INVALID');
    expectProblem(await post(app, '/orders', { body: '{"a":1,"a":2}' }), 400, 'OUTBOXKIT_BODY_INVALID');
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('an empty body is "no body": fingerprinted as absent (not null) and replayed', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, body: '' });
    expect(first.status).toBe(201);
    expect(first.json()).toMatchObject({ body: null });
    expect((await post(app, '/orders', { key, body: '' })).headers.get('idempotent-replayed')).toBe('true');
    expectProblem(await post(app, '/orders', { key, body: 'null' }), 422, 'OUTBOXKIT_KEY_MISMATCH');
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('a body over the fingerprint limit gets 413 body-too-large; nothing runs, nothing recorded', async () => {
    const app = await startApp({ pool: db.pool, maxBodyBytes: 64 });
    const big = JSON.stringify({ note: 'x'.repeat(100) });
    const res = await post(app, '/orders', { body: big });
    expectProblem(res, 413, 'OUTBOXKIT_BODY_TOO_LARGE');
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    expect(await countOrders(db.pool)).toBe(0);
    // At the limit it is accepted.
    const exact = JSON.stringify({ note: 'x'.repeat(64 - 11) });
    expect(Buffer.byteLength(exact)).toBe(64);
    expect((await post(app, '/orders', { body: exact })).status).toBe(201);
    await app.close();
  });

  it('reply lost after commit: the retry replays the committed result (ambiguity window)', async () => {
    const app = await startApp({ pool: db.pool, dropFirstReply: true });
    const key = randomUUID();
    await expect(post(app, '/orders', { key })).rejects.toThrow();
    expect(await countOrders(db.pool)).toBe(1);
    const retry = await post(app, '/orders', { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    const [record] = await readRecords(db.pool, key);
    expect(retry.bytes.equals(record!.response_body!)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });
});

describe('C19 the same JSON written differently, over HTTP', () => {
  it('reordered members, other number spellings and escapes replay; array order, null for missing and NFD are 422', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, body: '{"a":1,"b":{"x":1,"y":2},"s":"é","l":[1,2]}' });
    expect(first.status).toBe(201);
    for (const same of [
      '{"b":{"y":2,"x":1},"a":1,"s":"é","l":[1,2]}',
      '{ "l": [1.0, 2e0], "s": "\\u00e9", "b": {"x": 10e-1, "y": 2}, "a": 1E+0 }',
    ]) {
      const replay = await post(app, '/orders', { key, body: same });
      expect(replay.status, same).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(first.bytes)).toBe(true);
    }
    for (const other of [
      '{"a":1,"b":{"x":1,"y":2},"s":"é","l":[2,1]}', // array order matters
      '{"a":1,"b":{"x":1,"y":2},"s":"é","l":[1,2],"c":null}', // null is not a missing member
      '{"a":1,"b":{"x":1,"y":2},"s":"e\u0301","l":[1,2]}', // NFD é: no Unicode normalisation
    ]) {
      expectProblem(await post(app, '/orders', { key, body: other }), 422, 'OUTBOXKIT_KEY_MISMATCH');
    }
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });
});

describe('C20 the same key with a different body', () => {
  it('422 problem+json for the second body, also after a server restart; the first body is never returned for it', async () => {
    const key = randomUUID();
    const app1 = await startApp({ pool: db.pool });
    const first = await post(app1, '/orders', { key, body: '{"amount":10}' });
    expect(first.status).toBe(201);
    const mismatch1 = await post(app1, '/orders', { key, body: '{"amount":99}' });
    expectProblem(mismatch1, 422, 'OUTBOXKIT_KEY_MISMATCH');
    expect(mismatch1.bytes.toString()).not.toContain('"amount"');
    await app1.close();

    // "Restart": a new app instance with a new pool on the same database.
    const pool2 = new pg.Pool({ connectionString: db.url, max: 4 });
    try {
      const app2 = await startApp({ pool: pool2 });
      const mismatch2 = await post(app2, '/orders', { key, body: '{"amount":99}' });
      const problem = expectProblem(mismatch2, 422, 'OUTBOXKIT_KEY_MISMATCH');
      expect(problem.type).toBe('https://outboxkit.dev/problems/key-mismatch');
      expect(mismatch2.bytes.includes(first.bytes)).toBe(false);
      expect(mismatch2.bytes.toString()).not.toContain(key);
      // The original request still replays after the restart.
      const replay = await post(app2, '/orders', { key, body: '{"amount":10}' });
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect(app2.calls.total).toBe(0);
      await app2.close();
    } finally {
      await pool2.end();
    }
    expect(await countOrders(db.pool)).toBe(1);
  });

  it('the request target is part of the fingerprint: the same key and body on another resource, or another query, is 422', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders/111/cancel', { key, body: '{}' });
    expect(first.status).toBe(201);
    const replay = await post(app, '/orders/111/cancel', { key, body: '{}' });
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    // Order 222 must never be told it was cancelled by order 111's stored answer.
    expectProblem(await post(app, '/orders/222/cancel', { key, body: '{}' }), 422, 'OUTBOXKIT_KEY_MISMATCH');
    expectProblem(await post(app, '/orders/111/cancel?notify=1', { key, body: '{}' }), 422, 'OUTBOXKIT_KEY_MISMATCH');
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('a declared semantic header is part of the fingerprint; undeclared headers are not', async () => {
    const app = await startApp({ pool: db.pool, semanticHeaders: ['Accept-Language'] });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, headers: { 'accept-language': 'fr', traceparent: '00-a-b-01' } });
    const sameTrace = await post(app, '/orders', {
      key,
      headers: { 'accept-language': 'fr', traceparent: '00-c-d-01' },
    });
    expect(sameTrace.bytes.equals(first.bytes)).toBe(true);
    expectProblem(
      await post(app, '/orders', { key, headers: { 'accept-language': 'de' } }),
      422,
      'OUTBOXKIT_KEY_MISMATCH',
    );
    expect(app.calls.total).toBe(1);
    await app.close();
  });
});

describe('C21 keys are not shared between callers', () => {
  it('tenants A and B with the same key get independent records; B never sees A', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const a = await post(app, '/orders', { key, tenant: 'tenant-a', body: '{"amount":10}' });
    const b = await post(app, '/orders', { key, tenant: 'tenant-b', body: '{"amount":10}' });
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    expect(b.bytes.equals(a.bytes)).toBe(false);
    // B's own retry replays B's result, never A's.
    const bAgain = await post(app, '/orders', { key, tenant: 'tenant-b', body: '{"amount":10}' });
    expect(bAgain.bytes.equals(b.bytes)).toBe(true);
    // A different body from B is judged against B's record only.
    expectProblem(
      await post(app, '/orders', { key, tenant: 'tenant-b', body: '{"amount":99}' }),
      422,
      'OUTBOXKIT_KEY_MISMATCH',
    );
    expect(app.calls.total).toBe(2);
    const records = await readRecords(db.pool, key);
    expect(records.map((r) => r.tenant)).toEqual(['tenant-a', 'tenant-b']);
    await app.close();
  });

  it('B cannot block A: B runs while A holds the same key', async () => {
    let releaseA!: () => void;
    const aHolds = new Promise<void>((r) => (releaseA = r));
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        if (ctx.req.headers['x-tenant'] === 'tenant-a') await aHolds;
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const aPromise = post(app, '/orders', { key, tenant: 'tenant-a' });
    await waitFor(() => app.calls.total === 1);
    const b = await post(app, '/orders', { key, tenant: 'tenant-b' });
    expect(b.status).toBe(201); // not 409: A's claim does not touch B's scope
    releaseA();
    expect((await aPromise).status).toBe(201);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('the same key on two operations is two records', async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    const order = await post(app, '/orders', { key });
    const refund = await post(app, '/refunds', { key });
    expect(order.status).toBe(201);
    expect(refund.status).toBe(201);
    expect(refund.headers.get('idempotent-replayed')).toBeNull();
    expect(app.calls.byOperation).toEqual({ 'create-order': 1, 'create-refund': 1 });
    expect((await readRecords(db.pool, key)).map((r) => r.operation)).toEqual(['create-order', 'create-refund']);
    await app.close();
  });

  it('a request whose tenant cannot be determined is refused with 400, not put in a shared scope', async () => {
    const app = await startApp({ pool: db.pool });
    const res = await post(app, '/orders', { tenant: null });
    const body = expectProblem(res, 400, 'OUTBOXKIT_TENANT_UNRESOLVED');
    expect(body.type).toBe('https://outboxkit.dev/problems/tenant-unresolved');
    expectProblem(await post(app, '/orders', { tenant: '' }), 400, 'OUTBOXKIT_TENANT_UNRESOLVED');
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });
});

describe('C22 errors that must not be replayed forever', () => {
  it('the handler returns 503 first (dependency down): key released, the retry executes and succeeds', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        if (ctx.call === 1) {
          await ctx.insertOrder(); // an effect that must roll back with the 503
          return { status: 503, headers: { 'retry-after': '1' }, body: { error: 'dependency down' } };
        }
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(503);
    expect(first.json()).toEqual({ error: 'dependency down' });
    expect(await countRecords(db.pool)).toBe(0);
    expect(await countOrders(db.pool)).toBe(0);
    const retry = await post(app, '/orders', { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    const replay = await post(app, '/orders', { key });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(retry.bytes)).toBe(true);
    expect(app.calls.total).toBe(2);
    expect(await countOrders(db.pool)).toBe(1); // the 503 call's row rolled back
    await app.close();
  });

  it('the handler throws after writing: key released, no row; the retry executes and succeeds', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        if (ctx.call === 1) {
          await ctx.insertOrder();
          throw new Error('boom after the write');
        }
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(500); // Fastify's error handler
    expect(await countRecords(db.pool)).toBe(0);
    expect(await countOrders(db.pool)).toBe(0);
    const retry = await post(app, '/orders', { key });
    expect(retry.status).toBe(201);
    expect(app.calls.total).toBe(2);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });

  it.each([408, 409, 425, 429, 500])('a %i from the handler is not stored', async (status) => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => (ctx.call === 1 ? { status, body: { status } } : createOrder(ctx)),
    });
    const key = randomUUID();
    expect((await post(app, '/orders', { key })).status).toBe(status);
    expect(await countRecords(db.pool)).toBe(0);
    expect((await post(app, '/orders', { key })).status).toBe(201);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('a final 4xx business rejection (422) is stored as failed and replayed', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async () => ({
        status: 422,
        headers: { 'content-type': 'application/problem+json' },
        body: { title: 'out of stock' },
      }),
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(422);
    const replay = await post(app, '/orders', { key });
    expect(replay.status).toBe(422);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('content-type')).toBe('application/problem+json');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'failed', response_status: 422 });
    await app.close();
  });

  it('store unavailable: 503 with Retry-After and the handler did NOT run; once the store is back the retry executes', async () => {
    const deadPool = new pg.Pool({
      host: '127.0.0.1',
      port: 1,
      user: 'postgres',
      database: 'postgres',
      connectionTimeoutMillis: 5_000,
    });
    const key = randomUUID();
    try {
      const down = await startApp({ pool: deadPool, retryAfterSeconds: 3 });
      const res = await post(down, '/orders', { key });
      const body = expectProblem(res, 503, 'OUTBOXKIT_STORE_UNAVAILABLE');
      expect(res.headers.get('retry-after')).toBe('3');
      expect(body.type).toBe('https://outboxkit.dev/problems/store-unavailable');
      expect(down.calls.total).toBe(0);
      await down.close();
    } finally {
      await deadPool.end();
    }
    const up = await startApp({ pool: db.pool });
    const retry = await post(up, '/orders', { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.calls.total).toBe(1);
    await up.close();
  });
});

describe('key past retention', () => {
  it('an expired record is taken over: the same key starts a new execution (even with another body)', async () => {
    const app = await startApp({ pool: db.pool, retentionMs: 300 });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(first.status).toBe(201);
    expect((await post(app, '/orders', { key, body: '{"amount":10}' })).headers.get('idempotent-replayed')).toBe(
      'true',
    );

    const expired = async (): Promise<boolean> => {
      const { rows } = await db.pool.query<{ e: boolean }>(
        'SELECT expires_at <= now() AS e FROM outboxkit.idempotency_keys WHERE key = $1',
        [key],
      );
      return rows[0]?.e === true;
    };
    await waitFor(expired, { timeoutMs: 5_000 });
    const again = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(again.bytes.equals(first.bytes)).toBe(false);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ generation: 2, state: 'completed' });

    await waitFor(expired, { timeoutMs: 5_000 });
    const other = await post(app, '/orders', { key, body: '{"amount":99}' });
    expect(other.status).toBe(201); // not 422: the old record no longer binds the key
    expect(other.json()).toMatchObject({ body: { amount: 99 } });
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ generation: 3 });
    expect(app.calls.total).toBe(3);
    expect(await countOrders(db.pool)).toBe(3);
    await app.close();
  });
});
