/**
 * Automatic lease renewal (`renewEveryMs`) against the real PostgreSQL: a handler that outlives
 * its lease is not taken over while renewal runs, renewal stops when the handler ends, and a
 * renewal that finds the record taken over aborts `ctx.signal` and fences the completion
 * (`LeaseLostError`, nothing stored).
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { executeLeased } from '../../src/idempotency/lease.js';
import { resolveLeaseOptions } from '../../src/idempotency/lease-options.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { countOrders, ORDERS_TABLE_SQL, post } from './harness.js';
import { closeLeaseApps, gate, pay, readLease, startLeaseApp, OPERATION } from './lease-harness.js';

let db: TestDatabase;
const pools = new Set<pg.Pool>();

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect(await closeLeaseApps(), 'a test left an app open').toBe(0);
  await Promise.all([...pools].map((p) => p.end()));
  pools.clear();
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await closeLeaseApps();
  await db?.drop();
});

const body = '{"amount":10}';

/** A logger that counts messages, to observe renewals from outside. */
function countingLogger(): Logger & { count(msg: string): number } {
  const seen: string[] = [];
  const log = (_obj: Record<string, unknown>, msg: string) => void seen.push(msg);
  return { debug: log, info: log, warn: log, error: log, count: (msg) => seen.filter((m) => m === msg).length };
}

/** A pool of one connection: holding it stalls every renewal of the app that uses it. */
function singleConnectionPool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  pools.add(pool);
  return pool;
}

/** Resolves when `signal` aborts, or after `timeoutMs`; tells which. */
function aborted(signal: AbortSignal, timeoutMs: number): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

describe('renewEveryMs: automatic lease renewal', () => {
  it('a handler that runs 4 lease durations is never taken over; renewal stops when it ends', async () => {
    const logger = countingLogger();
    const hold = gate();
    const inHandler = gate();
    let signal: AbortSignal | undefined;
    // Four renewals per lease: a loaded machine may delay a few without losing it.
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 500,
      renewEveryMs: 100,
      logger,
      behaviour: async (c) => {
        signal = c.ctx.signal;
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const started = Date.now();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    // Retries keep arriving after the lease length has passed several times over: each finds a
    // live lease (409), none takes over.
    while (Date.now() - started < 2_000) {
      await new Promise((r) => setTimeout(r, 150));
      const retry = await post(app, '/payments', { key, body });
      expect(retry.status).toBe(409);
      expect(retry.json()).toMatchObject({ code: 'OUTBOXKIT_KEY_IN_PROGRESS' });
      expect(await readLease(db.pool, key)).toMatchObject({ state: 'processing', generation: 1, lease_live: true });
    }
    hold.open();
    const done = await first;
    expect(done.status).toBe(201);
    expect(app.calls.total).toBe(1);
    expect(signal?.aborted).toBe(false);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 1 });
    const renewals = logger.count('idempotency lease renewed');
    expect(renewals).toBeGreaterThanOrEqual(8);

    // Stopped with the handler: no renewal in the next five intervals.
    await new Promise((r) => setTimeout(r, 500));
    expect(logger.count('idempotency lease renewed')).toBe(renewals);
    expect(logger.count('idempotency lease renewal failed; trying again')).toBe(0);
    // A renewal after the completion would find the record no longer processing and report a loss.
    expect(logger.count('idempotency lease lost to another execution')).toBe(0);
    expect(signal?.aborted).toBe(false);
    await app.close();
  });

  it('a renewal that finds the record taken over aborts ctx.signal; the completion raises LeaseLostError and stores nothing', async () => {
    const logger = countingLogger();
    const stalledPool = singleConnectionPool();
    const inHandler = gate();
    let reason: unknown;
    let wasAborted: boolean | undefined;
    // Owner A renews through a pool whose one connection the test will hold (pool exhaustion):
    // its renewals stall, its lease expires, and B takes over.
    const a = await startLeaseApp({
      pool: stalledPool,
      leaseMs: 300,
      renewEveryMs: 100,
      logger,
      behaviour: async (c) => {
        inHandler.open();
        wasAborted = await aborted(c.ctx.signal, 10_000);
        reason = c.ctx.signal.reason;
        // A handler that ignores the signal and reports success: its completion must still fail.
        return { status: 201, body: { stale: true } };
      },
    });
    const b = await startLeaseApp({ pool: db.pool, leaseMs: 5_000 });
    const key = randomUUID();
    const first = post(a, '/payments', { key, body });
    await inHandler.promise;
    const tokenA = (await readLease(db.pool, key))!.owner_token;
    const renewedBefore = await waitFor(() => logger.count('idempotency lease renewed'), { timeoutMs: 5_000 });

    const stall = await stalledPool.connect();
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    const takeover = await post(b, '/payments', { key, body });
    expect(takeover.status).toBe(201);
    const after = await readLease(db.pool, key);
    expect(after).toMatchObject({ state: 'completed', generation: 2 });
    expect(after!.owner_token).not.toBe(tokenA);
    stall.release();

    const stale = await first;
    expect(wasAborted).toBe(true);
    expect(isOutboxkitError(reason, 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    expect(stale.status).toBe(409);
    expect(stale.json()).toMatchObject({ code: 'OUTBOXKIT_LEASE_LOST' });
    // Nothing of A's changed the record: it is exactly as B left it.
    expect(await readLease(db.pool, key)).toEqual(after);
    expect(await countOrders(db.pool)).toBe(1);
    const replay = await post(b, '/payments', { key, body });
    expect(replay.bytes.equals(takeover.bytes)).toBe(true);

    // Renewal stopped at the loss.
    const renewals = logger.count('idempotency lease renewed');
    expect(renewals).toBeGreaterThanOrEqual(renewedBefore);
    await new Promise((r) => setTimeout(r, 400));
    expect(logger.count('idempotency lease renewed')).toBe(renewals);
    expect(logger.count('idempotency lease lost to another execution')).toBe(1);
    await Promise.all([a.close(), b.close()]);
  });

  it('a handler that throws on the abort ends with LeaseLostError, not its own error, and releases nothing', async () => {
    const stalledPool = singleConnectionPool();
    const inHandler = gate();
    const fingerprint = fingerprintRequest({ tenant: 'tenant-a', operation: OPERATION, body, maxBodyBytes: 1_000 });
    const key = randomUUID();
    const request = { tenant: 'tenant-a', operation: OPERATION, key, fingerprint };
    const first = executeLeased(
      stalledPool,
      request,
      async (ctx) => {
        inHandler.open();
        // What fetch(url, { signal }) does: reject with the abort.
        await new Promise((_, reject) =>
          ctx.signal.addEventListener('abort', () => reject(new Error('The operation was aborted'))),
        );
        return { status: 201, body: {} };
      },
      { leaseMs: 300, renewEveryMs: 100 },
    ).catch((err: unknown) => err);
    await inHandler.promise;
    const stall = await stalledPool.connect();
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    const holdB = gate();
    const inB = gate();
    const second = executeLeased(
      db.pool,
      request,
      async () => {
        inB.open();
        await holdB.promise;
        return { status: 201, body: { owner: 'b' } };
      },
      { leaseMs: 5_000 },
    );
    await inB.promise;
    const during = await readLease(db.pool, key);
    expect(during).toMatchObject({ state: 'processing', generation: 2, lease_live: true });
    stall.release();

    const err = await first;
    expect(isOutboxkitError(err, 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    // A's failure before any effect released nothing: B still owns the record.
    expect(await readLease(db.pool, key)).toEqual(during);
    holdB.open();
    expect((await second).outcome).toBe('executed');
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 2 });
  });

  it('renewEveryMs must be shorter than leaseMs', () => {
    expect(() => resolveLeaseOptions({ leaseMs: 1_000, renewEveryMs: 1_000 })).toThrow(/renewEveryMs/);
    expect(() => resolveLeaseOptions({ leaseMs: 1_000, renewEveryMs: 5 })).toThrow(/renewEveryMs/);
    expect(resolveLeaseOptions({ leaseMs: 1_000, renewEveryMs: 300 }).renewEveryMs).toBe(300);
    expect(resolveLeaseOptions({ leaseMs: 1_000 }).renewEveryMs).toBeUndefined();
  });
});
