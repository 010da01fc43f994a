/**
 * Lease mode through the Express 5 adapter over real HTTP against the real PostgreSQL: the same
 * contract as the Fastify adapter's (test/idempotency/lease.test.ts): committed claim and 409 while
 * the lease is live, policies `wait` (LISTEN/NOTIFY) and `async` (202 + Location, served by
 * `operationHandler`), takeover after expiry with the stale owner fenced, errors to `next(err)`.
 */
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express, { type NextFunction, type Request, type Response } from 'express';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import { leasedHandler, operationHandler, type ExpressLeaseOptions } from '../../src/http/express.js';
import type { LeaseContext } from '../../src/idempotency/lease.js';
import type { IdempotencyOutcomeEvent } from '../../src/idempotency/metrics.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { countOrders, ORDERS_TABLE_SQL, post, postAndHangUp, type HttpResult } from '../idempotency/harness.js';
import { gate, get, readLease } from '../idempotency/lease-harness.js';

const OPERATION = 'create-payment';
const body = '{"amount":10}';

let db: TestDatabase;
const open = new Set<ExpressLeaseApp>();

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

interface ExpressLeaseApp {
  url: string;
  calls: { total: number; byOperation: Record<string, number> };
  close(): Promise<void>;
}

interface Call {
  call: number;
  req: Request;
  ctx: LeaseContext<pg.Pool>;
  /** One business row in a fenced transaction; returns its id. */
  insertOrder(): Promise<string>;
}

async function pay(c: Call): Promise<HandlerResponse> {
  const id = await c.insertOrder();
  return { status: 201, headers: { location: `/payments/${id}` }, body: { id, execution: randomUUID() } };
}

const resolveTenant = (req: Request) => {
  const t = req.headers['x-tenant'];
  return typeof t === 'string' ? t : undefined;
};

async function startExpressLease(
  options: Partial<Omit<ExpressLeaseOptions<pg.Pool>, 'db' | 'operation' | 'resolveTenant'>> & {
    behaviour?: (c: Call) => Promise<HandlerResponse>;
  },
): Promise<ExpressLeaseApp> {
  const { behaviour = pay, ...lease } = options;
  const app = express();
  const calls = { total: 0, byOperation: {} as Record<string, number> };
  app.post(
    '/payments',
    express.raw({ type: 'application/json', limit: '1mb' }),
    leasedHandler(
      {
        operationLocation: (id) => `/operations/payments/${id}`,
        operationIdSecret: 'a test secret of 32 bytes or more, never a real one',
        ...lease,
        db: db.pool,
        operation: OPERATION,
        resolveTenant,
      },
      async (req, ctx) => {
        calls.total++;
        calls.byOperation[OPERATION] = (calls.byOperation[OPERATION] ?? 0) + 1;
        const insertOrder = () =>
          ctx.transaction(async (tx) => {
            const q = joinTransaction(tx as TransactionHandle, 'test');
            const { rows } = await q.query<{ id: string }>(
              'INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4) RETURNING id::text AS id',
              [String(req.headers['x-tenant'] ?? ''), OPERATION, JSON.stringify(req.body ?? null), ctx.ownerToken],
            );
            return rows[0]!.id;
          });
        return behaviour({ call: calls.total, req, ctx, insertOrder });
      },
    ),
  );
  app.get('/operations/payments/:operationId', operationHandler({ db: db.pool, operation: OPERATION, resolveTenant }));
  // The application's own error middleware: what the handler throws ends up here.
  app.use((err: Error, _req: Request, res: Response, _next: NextFunction) => {
    res.status(500).json({ error: err.message, code: (err as { code?: unknown }).code ?? null });
  });
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const handle: ExpressLeaseApp = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
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

function expectProblem(res: HttpResult, status: number, code: string): void {
  expect(res.status).toBe(status);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  expect(res.json()).toMatchObject({ status, code });
}

/** A handler held until the test opens `hold`; `inHandler` opens when it starts. */
function held(after: (c: Call) => Promise<HandlerResponse> = pay) {
  const hold = gate();
  const inHandler = gate();
  return {
    hold,
    inHandler,
    behaviour: async (c: Call) => {
      inHandler.open();
      await hold.promise;
      return after(c);
    },
  };
}

describe('Express leasedHandler: lease mode over real HTTP', () => {
  it('the claim commits first; a duplicate gets 409 with the lease time left; then the replay, byte for byte', async () => {
    const h = held();
    const app = await startExpressLease({ leaseMs: 5_000, behaviour: h.behaviour });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await h.inHandler.promise;
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'processing', generation: 1, lease_live: true });

    const dup = await post(app, '/payments', { key, body });
    expectProblem(dup, 409, 'OUTBOXKIT_KEY_IN_PROGRESS');
    expect(Number(dup.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
    expect(Number(dup.headers.get('retry-after'))).toBeLessThanOrEqual(5);

    h.hold.open();
    const done = await first;
    expect(done.status).toBe(201);
    expect(done.headers.get('etag')).toBeNull(); // written as is, no ETag added by Express
    const replay = await post(app, '/payments', { key, body });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(done.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });

  it('wait: the duplicate is woken through LISTEN/NOTIFY (not the poll) and gets the replay', async () => {
    const h = held();
    const app = await startExpressLease({
      policy: 'wait',
      pollIntervalMs: 10_000, // a wake-up within ~1 s can only come from the notification
      waitTimeoutMs: 20_000,
      behaviour: h.behaviour,
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await h.inHandler.promise;
    const dup = post(app, '/payments', { key, body });
    await waitFor(async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()",
      );
      return rows[0]!.n > 0;
    });
    await new Promise((r) => setTimeout(r, 200));
    const released = Date.now();
    h.hold.open();
    const [a, b] = await Promise.all([first, dup]);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(b.bytes.equals(a.bytes)).toBe(true);
    expect(Date.now() - released).toBeLessThan(1_500);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it("wait is bounded by the caller's deadline: 409 at the deadline", async () => {
    const h = held();
    const app = await startExpressLease({
      policy: 'wait',
      waitTimeoutMs: 20_000,
      deadline: (req) => Date.now() + Number(req.headers['x-timeout-ms'] ?? 20_000),
      behaviour: h.behaviour,
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await h.inHandler.promise;
    const started = Date.now();
    const dup = await post(app, '/payments', { key, body, headers: { 'x-timeout-ms': '400' } });
    const elapsed = Date.now() - started;
    expectProblem(dup, 409, 'OUTBOXKIT_KEY_IN_PROGRESS');
    expect(elapsed).toBeGreaterThanOrEqual(350);
    expect(elapsed).toBeLessThan(2_000);
    h.hold.open();
    expect((await first).status).toBe(201);
    await app.close();
  });

  it('wait: a duplicate whose client disconnects stops waiting (not after waitTimeoutMs); a malformed deadline is 400', async () => {
    const h = held();
    const outcomes: (IdempotencyOutcomeEvent & { at: number })[] = [];
    const app = await startExpressLease({
      policy: 'wait',
      waitTimeoutMs: 20_000,
      deadline: (req) => {
        const seconds = req.headers['request-timeout'];
        return typeof seconds === 'string' ? Date.now() + 1_000 * Number(seconds) : undefined;
      },
      onOutcome: (e) => outcomes.push({ ...e, at: Date.now() }),
      behaviour: h.behaviour,
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await h.inHandler.promise;
    const hungUpAt = await postAndHangUp(app.url, '/payments', { key, body }, 300).then(() => Date.now());
    const ended = await waitFor(() => outcomes.find((o) => o.outcome === 'in_progress'), { timeoutMs: 5_000 });
    expect(ended.at - hungUpAt).toBeLessThan(3_000);
    const malformed = await post(app, '/payments', {
      key,
      body,
      headers: { 'request-timeout': 'soon' },
      signal: AbortSignal.timeout(5_000),
    });
    expectProblem(malformed, 400, 'OUTBOXKIT_DEADLINE_INVALID');
    h.hold.open();
    expect((await first).status).toBe(201);
    await app.close();
  });

  it('async: 202 with the Location of the operation resource, which serves 202 then the stored result; other tenants and unknown ids get 404', async () => {
    const h = held();
    const app = await startExpressLease({ policy: 'async', behaviour: h.behaviour });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await h.inHandler.promise;
    const dup = await post(app, '/payments', { key, body });
    expect(dup.status).toBe(202);
    const location = dup.headers.get('location')!;
    expect(location).toMatch(/^\/operations\/payments\/[0-9a-f]{64}$/);
    expect(location).not.toContain(key);
    expect(dup.headers.get('retry-after')).not.toBeNull();
    const pending = await get(app, location);
    expect(pending.status).toBe(202);
    expect(pending.json()).toMatchObject({ state: 'processing' });
    expect((await get(app, location, 'tenant-b')).status).toBe(404);
    expect((await get(app, '/operations/payments/not-an-id')).status).toBe(404);

    h.hold.open();
    const done = await first;
    expect(done.status).toBe(201);
    const resource = await get(app, location);
    expect(resource.status).toBe(201);
    expect(resource.headers.get('idempotent-replayed')).toBe('true');
    expect(resource.bytes.equals(done.bytes)).toBe(true);
    expect((await get(app, location, 'tenant-b')).status).toBe(404);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('after the lease expires a retry takes over; the stale owner gets 409 lease-lost and writes nothing', async () => {
    const stale = held(async () => ({ status: 201, body: { stale: true } }));
    const app = await startExpressLease({
      leaseMs: 300,
      behaviour: async (c) => (c.call === 1 ? stale.behaviour(c) : pay(c)),
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await stale.inHandler.promise;
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    const takeover = await post(app, '/payments', { key, body });
    expect(takeover.status).toBe(201);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 2 });

    stale.hold.open();
    const late = await first;
    expectProblem(late, 409, 'OUTBOXKIT_LEASE_LOST');
    const replay = await post(app, '/payments', { key, body });
    expect(replay.bytes.equals(takeover.bytes)).toBe(true);
    expect(await countOrders(db.pool)).toBe(1);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it("the handler's error before any effect goes to next(err) and releases the key; the retry executes", async () => {
    const app = await startExpressLease({
      behaviour: async (c) => {
        if (c.call === 1) throw new Error('payment provider refused the connection');
        return pay(c);
      },
    });
    const key = randomUUID();
    const failed = await post(app, '/payments', { key, body });
    expect(failed.status).toBe(500);
    expect(failed.json()).toMatchObject({ error: 'payment provider refused the connection' });
    expect(await readLease(db.pool, key)).toBeUndefined();
    const retry = await post(app, '/payments', { key, body });
    expect(retry.status).toBe(201);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('refuses a missing key (400) before anything is claimed', async () => {
    const app = await startExpressLease({});
    expectProblem(await post(app, '/payments', { key: null, body }), 400, 'OUTBOXKIT_KEY_MISSING');
    const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.idempotency_keys');
    expect(rows[0]!.n).toBe(0);
    expect(app.calls.total).toBe(0);
    await app.close();
  });
});
