/**
 * The Express 5 adapter over real HTTP against the real PostgreSQL: the main rows of the HTTP
 * contract (DESIGN "HTTP contract"), as the Fastify adapter's test/idempotency/http-contract.test.ts.
 */
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express, { type NextFunction, type Request, type Response } from 'express';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import { idempotentHandler, type ExpressIdempotencyOptions } from '../../src/http/express.js';
import type { ExecutionContext } from '../../src/idempotency/execute.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  countOrders,
  countRecords,
  ORDERS_TABLE_SQL,
  post,
  readRecords,
  type HttpResult,
} from '../idempotency/harness.js';

let db: TestDatabase;
const open = new Set<ExpressApp>();

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  const left = [...open];
  await Promise.all(left.map((a) => a.close()));
  expect(left.length, 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await Promise.all([...open].map((a) => a.close()));
  await db?.drop();
});

interface ExpressApp {
  url: string;
  calls: { total: number; byOperation: Record<string, number> };
  close(): Promise<void>;
}

interface Ctx {
  call: number;
  req: Request;
  exec: ExecutionContext;
  insertOrder(): Promise<string>;
}

async function createOrder(ctx: Ctx): Promise<HandlerResponse> {
  const id = await ctx.insertOrder();
  return {
    status: 201,
    headers: { location: `/orders/${id}`, 'set-cookie': 'session=abc' },
    body: { id, body: (ctx.req.body as unknown) ?? null, execution: randomUUID() },
  };
}

async function startExpress(
  options: Partial<Omit<ExpressIdempotencyOptions<pg.Pool>, 'db' | 'operation' | 'resolveTenant'>> & {
    pool: pg.Pool;
    behaviour?: (ctx: Ctx) => Promise<HandlerResponse>;
    /** `raw+text`: express.raw for JSON, plus express.text() (an app that also parses text bodies). */
    parser?: 'raw' | 'json' | 'raw+text';
  },
): Promise<ExpressApp> {
  const { pool, behaviour = createOrder, parser = 'raw', ...idem } = options;
  const app = express();
  const calls = { total: 0, byOperation: {} as Record<string, number> };
  const parsers = {
    raw: [express.raw({ type: 'application/json', limit: '1mb' })],
    json: [express.json()],
    'raw+text': [express.raw({ type: 'application/json', limit: '1mb' }), express.text()],
  };
  const route = [
    ...parsers[parser],
    idempotentHandler(
      {
        ...idem,
        db: pool,
        operation: 'create-order',
        resolveTenant: (req) => {
          const t = req.headers['x-tenant'];
          return typeof t === 'string' ? t : undefined;
        },
      },
      async (req, tx, exec) => {
        calls.total++;
        const call = calls.total;
        const insertOrder = async (): Promise<string> => {
          const q = joinTransaction(tx as TransactionHandle, 'test');
          const { rows } = await q.query<{ id: string }>(
            'INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4) RETURNING id::text AS id',
            [String(req.headers['x-tenant'] ?? ''), 'create-order', JSON.stringify(req.body ?? null), randomUUID()],
          );
          return rows[0]!.id;
        };
        return behaviour({ call, req, exec, insertOrder });
      },
    ),
  ];
  app.post('/orders', ...route);
  // The same operation inside a mounted router, on many resources: req.url is relative there.
  const shop = express.Router();
  shop.post('/orders/:id/cancel', ...route);
  app.use('/shop', shop);
  // The application's own error middleware: what the handler throws ends up here, after the rollback.
  app.use((err: Error, _req: Request, res: Response, _next: NextFunction) => {
    res.status(500).json({ error: err.name, code: (err as { code?: unknown }).code ?? null });
  });
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  const handle: ExpressApp = {
    url: `http://127.0.0.1:${port}`,
    calls,
    async close() {
      open.delete(handle);
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
  open.add(handle);
  return handle;
}

function expectProblem(res: HttpResult, status: number, code: string): Record<string, unknown> {
  expect(res.status).toBe(status);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  expect(res.headers.get('cache-control')).toBe('no-store');
  const body = res.json();
  expect(body).toMatchObject({ status, code, type: expect.stringMatching(/^https:\/\/outboxkit\.dev\/problems\//) });
  return body;
}

describe('Express adapter: the HTTP contract over real HTTP', () => {
  it('a new key executes once: 201, one row, record completed with the bytes sent', async () => {
    const app = await startExpress({ pool: db.pool });
    const key = randomUUID();
    const res = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(res.status).toBe(201);
    expect(res.headers.get('idempotent-replayed')).toBeNull();
    expect(res.headers.get('content-type')).toBe('application/json'); // no charset added by Express
    expect(res.headers.get('etag')).toBeNull(); // no ETag added by Express
    expect(res.headers.get('set-cookie')).toBe('session=abc');
    expect(res.json()).toMatchObject({ body: { amount: 10 } });
    const [record] = await readRecords(db.pool, key);
    expect(record).toMatchObject({ state: 'completed', response_status: 201, tenant: 'tenant-a' });
    expect(record!.response_body!.equals(res.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('a retry replays status, bytes and allow-listed headers with Idempotent-Replayed: true', async () => {
    const app = await startExpress({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    const again = await post(app, '/orders', { key });
    const reordered = await post(app, '/orders', { key, body: '{ "amount" : 10 }' });
    for (const replay of [again, reordered]) {
      expect(replay.status).toBe(201);
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.headers.get('location')).toBe(first.headers.get('location'));
      expect(replay.headers.get('content-type')).toBe('application/json');
      expect(replay.headers.get('set-cookie')).toBeNull();
    }
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });

  it('a missing key gets 400 problem+json; a malformed one 400 key-invalid; nothing runs or is recorded', async () => {
    const app = await startExpress({ pool: db.pool });
    expectProblem(await post(app, '/orders', { key: null }), 400, 'OUTBOXKIT_KEY_MISSING');
    expectProblem(await post(app, '/orders', { key: 'k1, k2' }), 400, 'OUTBOXKIT_KEY_INVALID');
    expectProblem(await post(app, '/orders', { tenant: null }), 400, 'OUTBOXKIT_TENANT_UNRESOLVED');
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('the same key with a different body gets 422 problem+json, never the first result', async () => {
    const app = await startExpress({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/orders', { key, body: '{"amount":10}' });
    const other = await post(app, '/orders', { key, body: '{"amount":99}' });
    expectProblem(other, 422, 'OUTBOXKIT_KEY_MISMATCH');
    expect(other.bytes.includes(first.bytes)).toBe(false);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('the request target is fingerprinted whole, also inside a mounted router: another resource is 422', async () => {
    const app = await startExpress({ pool: db.pool });
    const key = randomUUID();
    const first = await post(app, '/shop/orders/111/cancel', { key, body: '{}' });
    expect(first.status).toBe(201);
    expect((await post(app, '/shop/orders/111/cancel', { key, body: '{}' })).bytes.equals(first.bytes)).toBe(true);
    expectProblem(await post(app, '/shop/orders/222/cancel', { key, body: '{}' }), 422, 'OUTBOXKIT_KEY_MISMATCH');
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('a concurrent duplicate gets 409 with Retry-After while the first holds the key; then the replay', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const app = await startExpress({
      pool: db.pool,
      retryAfterSeconds: 2,
      behaviour: async (ctx) => {
        if (ctx.call === 1) await held;
        return createOrder(ctx);
      },
    });
    const key = randomUUID();
    const firstPromise = post(app, '/orders', { key });
    await waitFor(() => app.calls.total === 1);
    const dup = await post(app, '/orders', { key });
    expectProblem(dup, 409, 'OUTBOXKIT_KEY_IN_PROGRESS');
    expect(dup.headers.get('retry-after')).toBe('2');
    release();
    const first = await firstPromise;
    expect(first.status).toBe(201);
    const replay = await post(app, '/orders', { key });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('store unavailable: 503 with Retry-After and the handler never runs unprotected', async () => {
    const deadPool = new pg.Pool({ host: '127.0.0.1', port: 1, user: 'postgres', database: 'postgres' });
    try {
      const app = await startExpress({ pool: deadPool, retryAfterSeconds: 3 });
      const res = await post(app, '/orders');
      expectProblem(res, 503, 'OUTBOXKIT_STORE_UNAVAILABLE');
      expect(res.headers.get('retry-after')).toBe('3');
      expect(app.calls.total).toBe(0);
      await app.close();
    } finally {
      await deadPool.end();
    }
  });

  it('a body over maxBodyBytes gets 413; a body that is not I-JSON 400; nothing recorded', async () => {
    const app = await startExpress({ pool: db.pool, maxBodyBytes: 64 });
    expectProblem(
      await post(app, '/orders', { body: JSON.stringify({ note: 'x'.repeat(100) }) }),
      413,
      'OUTBOXKIT_BODY_TOO_LARGE',
    );
    expectProblem(await post(app, '/orders', { body: '{"a":1,"a":2}' }), 400, 'OUTBOXKIT_BODY_INVALID');
    expectProblem(
      await post(app, '/orders', { body: 'amount=10', headers: { 'content-type': 'text/plain' } }),
      400,
      'OUTBOXKIT_BODY_INVALID',
    );
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('ctx.reject(): a stored business rejection is replayed; the writes before it are rolled back', async () => {
    const app = await startExpress({
      pool: db.pool,
      behaviour: async (ctx) => {
        await ctx.insertOrder(); // undone: rolled back to the claim's savepoint
        return ctx.exec.reject(422, { title: 'Out of stock' });
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(422);
    const replay = await post(app, '/orders', { key });
    expect(replay.status).toBe(422);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(0);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'failed', response_status: 422 });
    await app.close();
  });

  it('a thrown handler error rolls back and reaches the error middleware; the retry executes', async () => {
    const app = await startExpress({
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
    expect(first.status).toBe(500);
    expect(first.json()).toEqual({ error: 'Error', code: null });
    expect(await countOrders(db.pool)).toBe(0);
    expect((await post(app, '/orders', { key })).status).toBe(201);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('a route set up with express.json() instead of express.raw() is refused (500 via next), never run unfingerprinted', async () => {
    const app = await startExpress({ pool: db.pool, parser: 'json' });
    const res = await post(app, '/orders');
    expect(res.status).toBe(500);
    expect(res.json()).toEqual({ error: 'InvalidOptionsError', code: 'OUTBOXKIT_INVALID_OPTIONS' });
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('a text body (express.text() decoded it) gets 400 body-invalid: bodies differing only in invalid UTF-8 never replay each other', async () => {
    const app = await startExpress({ pool: db.pool, parser: 'raw+text' });
    const key = randomUUID();
    for (const byte of [0xff, 0xfe]) {
      const body = Buffer.concat([Buffer.from('{"note":"'), Buffer.from([byte]), Buffer.from('"}')]);
      const res = await post(app, '/orders', { key, body, headers: { 'content-type': 'text/plain' } });
      expectProblem(res, 400, 'OUTBOXKIT_BODY_INVALID');
      expect(String(res.json().detail)).toMatch(/not kept as raw bytes \(content type "text\/plain"\)/);
      // Invalid UTF-8 is 400 whatever the content type.
      expectProblem(await post(app, '/orders', { key, body }), 400, 'OUTBOXKIT_BODY_INVALID');
    }
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });

  it('__proto__ and constructor.prototype members get 400 body-invalid, as Fastify refuses them; nothing runs', async () => {
    const app = await startExpress({ pool: db.pool });
    for (const body of [
      '{"__proto__":{"isAdmin":true},"amount":10}',
      '{"amount":10,"meta":{"\\u005f_proto__":{"isAdmin":true}}}',
      '{"constructor":{"prototype":{"isAdmin":true}},"amount":10}',
    ]) {
      const res = await post(app, '/orders', { body });
      expectProblem(res, 400, 'OUTBOXKIT_BODY_INVALID');
      expect(String(res.json().detail)).toMatch(/prototype poisoning/);
    }
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });
});
