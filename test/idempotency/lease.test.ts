/**
 * Lease mode over real HTTP against the real PostgreSQL: committed claim with owner token and
 * generation, renewal, takeover after expiry, stale owners fenced (LeaseLostError, zero rows),
 * policies reject / wait (LISTEN/NOTIFY) / async (202 + operation resource), errors after effects,
 * and uncertain outcomes resolved only by reconciliation (case C18 and the seed's windows 6 and 7).
 */
import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { cleanupExpiredKeys } from '../../src/idempotency/cleanup.js';
import { executeLeased } from '../../src/idempotency/lease.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { reconcileUncertain } from '../../src/idempotency/reconcile.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { countOrders, ORDERS_TABLE_SQL, post } from './harness.js';
import { closeLeaseApps, gate, get, OPERATION, pay, readLease, startLeaseApp } from './lease-harness.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect(await closeLeaseApps(), 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await closeLeaseApps();
  await db?.drop();
});

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

const body = '{"amount":10}';
const fingerprint = fingerprintRequest({
  tenant: 'tenant-a',
  operation: OPERATION,
  method: 'POST',
  body,
  maxBodyBytes: 1_000,
});

describe('C18 lease mode: committed claim, 409 while live, takeover after expiry, stale owner fenced', () => {
  it('the claim commits before the handler runs, with an owner token, generation 1 and a live lease', async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 5_000,
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'processing', generation: 1, lease_live: true });

    const dup = await post(app, '/payments', { key, body });
    expect(dup.status).toBe(409);
    expect(dup.json()).toMatchObject({ code: 'OUTBOXKIT_KEY_IN_PROGRESS' });
    // Retry-After tells the seconds left on the lease (database clock).
    expect(Number(dup.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
    expect(Number(dup.headers.get('retry-after'))).toBeLessThanOrEqual(5);

    hold.open();
    expect((await first).status).toBe(201);
    const replay = await post(app, '/payments', { key, body });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals((await first).bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('after the lease expires a retry takes over (new token, generation 2); the stale owner cannot complete, renew or write', async () => {
    const hold = gate();
    const inHandler = gate();
    const takeoverRunning = gate();
    const holdTakeover = gate();
    let staleRenew: unknown;
    let staleWrite: unknown;
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 400,
      behaviour: async (c) => {
        if (c.call > 1) {
          takeoverRunning.open();
          await holdTakeover.promise; // the new owner is still processing while the stale one wakes
          return pay(c);
        }
        inHandler.open();
        await hold.promise; // stalls past its lease (a GC pause, a partition)
        staleRenew = await rejection(c.ctx.renew());
        staleWrite = await rejection(c.insertOrder());
        return { status: 201, body: { stale: true } };
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    const firstToken = (await readLease(db.pool, key))!.owner_token;

    expect((await post(app, '/payments', { key, body })).status).toBe(409);
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    // Elapsed time alone changed nothing: the record is still the first owner's.
    expect(await readLease(db.pool, key)).toMatchObject({
      state: 'processing',
      generation: 1,
      owner_token: firstToken,
    });
    expect(await cleanupExpiredKeys(db.pool)).toEqual({ deleted: 0 });

    const takeover = post(app, '/payments', { key, body });
    await takeoverRunning.promise;
    const during = await readLease(db.pool, key);
    expect(during).toMatchObject({ state: 'processing', generation: 2, lease_live: true });
    expect(during!.owner_token).not.toBe(firstToken);

    // The stale owner wakes up while the new owner is processing: only the token tells them apart.
    hold.open();
    const stale = await first;
    expect(stale.status).toBe(409);
    expect(stale.json()).toMatchObject({ code: 'OUTBOXKIT_LEASE_LOST' });
    expect(isOutboxkitError(staleRenew, 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    expect(isOutboxkitError(staleWrite, 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    // Zero rows changed: the record is exactly as the new owner left it, no business row written.
    expect(await readLease(db.pool, key)).toEqual(during);
    expect(await countOrders(db.pool)).toBe(0);

    holdTakeover.open();
    const done = await takeover;
    expect(done.status).toBe(201);
    expect(done.headers.get('idempotent-replayed')).toBeNull();
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 2, response_status: 201 });
    expect(await countOrders(db.pool)).toBe(1);
    const replay = await post(app, '/payments', { key, body });
    expect(replay.bytes.equals(done.bytes)).toBe(true);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('a renewing owner keeps its lease: no takeover while it renews', async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 300,
      behaviour: async (c) => {
        inHandler.open();
        const timer = setInterval(() => void c.ctx.renew().catch(() => {}), 100);
        await hold.promise;
        clearInterval(timer);
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    for (let i = 0; i < 4; i++) {
      await new Promise((r) => setTimeout(r, 200));
      expect((await post(app, '/payments', { key, body })).status).toBe(409);
    }
    hold.open();
    expect((await first).status).toBe(201);
    expect(app.calls.total).toBe(1);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 1 });
    await app.close();
  });

  it('a takeover needs the same fingerprint: another body gets 422 even after the lease expired', async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 200,
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body }).catch(() => undefined);
    await inHandler.promise;
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    const other = await post(app, '/payments', { key, body: '{"amount":99}' });
    expect(other.status).toBe(422);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'processing', generation: 1 });
    hold.open();
    await first;
    await app.close();
  });
});

describe('lease mode errors: released before any effect, failed (stored) after one', () => {
  it('an error before any effect releases the key; the retry executes', async () => {
    const app = await startLeaseApp({
      pool: db.pool,
      behaviour: async (c) => {
        if (c.call === 1) throw new Error('dependency down before any effect');
        return pay(c);
      },
    });
    const key = randomUUID();
    expect((await post(app, '/payments', { key, body })).status).toBe(500);
    expect(await readLease(db.pool, key)).toBeUndefined();
    const retry = await post(app, '/payments', { key, body });
    expect(retry.status).toBe(201);
    expect(app.calls.total).toBe(2);
    await app.close();
  });

  it('an error after an effect marks the record failed (500 stored and replayed), never released', async () => {
    const app = await startLeaseApp({
      pool: db.pool,
      behaviour: async (c) => {
        await c.insertOrder();
        throw new Error('crashed after writing');
      },
    });
    const key = randomUUID();
    const first = await post(app, '/payments', { key, body });
    expect(first.status).toBe(500);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'failed', response_status: 500 });
    const replay = await post(app, '/payments', { key, body });
    expect(replay.status).toBe(500);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    await app.close();
  });

  it('a 503 returned after ctx.effect() is stored as failed, not released', async () => {
    const app = await startLeaseApp({
      pool: db.pool,
      behaviour: async (c) => {
        c.ctx.effect();
        return { status: 503, body: { title: 'provider failed after accepting' } };
      },
    });
    const key = randomUUID();
    expect((await post(app, '/payments', { key, body })).status).toBe(503);
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'failed', response_status: 503 });
    expect((await post(app, '/payments', { key, body })).headers.get('idempotent-replayed')).toBe('true');
    await app.close();
  });
});

describe('lease mode policies', () => {
  it('wait: the duplicate is woken through LISTEN/NOTIFY (not the poll) and gets the replay', async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'wait',
      pollIntervalMs: 10_000, // a wake-up within ~1 s can only come from the notification
      waitTimeoutMs: 20_000,
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    const dupStarted = Date.now();
    const dup = post(app, '/payments', { key, body });
    await new Promise((r) => setTimeout(r, 300));
    const released = Date.now();
    hold.open();
    const [a, b] = await Promise.all([first, dup]);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(b.bytes.equals(a.bytes)).toBe(true);
    expect(Date.now() - released).toBeLessThan(1_500);
    expect(Date.now() - dupStarted).toBeGreaterThanOrEqual(300);
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it("wait is bounded by the caller's deadline: 409 at the deadline", async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'wait',
      waitTimeoutMs: 20_000,
      deadline: (req) => Date.now() + Number(req.headers['x-timeout-ms'] ?? 20_000),
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    const started = Date.now();
    const dup = await post(app, '/payments', { key, body, headers: { 'x-timeout-ms': '400' } });
    const elapsed = Date.now() - started;
    expect(dup.status).toBe(409);
    expect(elapsed).toBeGreaterThanOrEqual(350);
    expect(elapsed).toBeLessThan(2_000);
    hold.open();
    await first;
    await app.close();
  });

  it('async: 202 with the Location of the operation resource, which serves 202 then the stored result; other tenants get 404', async () => {
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'async',
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
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

    hold.open();
    const done = await first;
    const resource = await get(app, location);
    expect(resource.status).toBe(201);
    expect(resource.bytes.equals(done.bytes)).toBe(true);
    expect((await get(app, location, 'tenant-b')).status).toBe(404);
    await app.close();
  });
});

describe('uncertain external outcome → reconciled, never reported as failed', () => {
  it('the record stays uncertain (409/202, not failed, not released, no takeover) until the reconciliation hook resolves it', async () => {
    let downstream: 'unknown' | 'charged' = 'unknown';
    const app = await startLeaseApp({
      pool: db.pool,
      leaseMs: 200,
      behaviour: async (c) => {
        c.ctx.effect(); // about to call the payment provider
        // ... the provider call times out: did it charge?
        return c.ctx.uncertain('payment provider timeout');
      },
    });
    const key = randomUUID();
    const first = await post(app, '/payments', { key, body });
    expect(first.status).toBe(202);
    expect(first.json()).toMatchObject({ state: 'uncertain' });
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'uncertain' });

    // Long past the lease: still no takeover, no failure, no release, no cleanup.
    await new Promise((r) => setTimeout(r, 400));
    const retry = await post(app, '/payments', { key, body });
    expect(retry.status).toBe(409);
    expect(retry.json()).toMatchObject({ code: 'OUTBOXKIT_KEY_IN_PROGRESS' });
    expect(await cleanupExpiredKeys(db.pool)).toEqual({ deleted: 0 });
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'uncertain', generation: 1 });
    expect(app.calls.total).toBe(1);

    const hook = async (r: { reason: string; ownerToken: string }) => {
      expect(r.reason).toBe('payment provider timeout');
      return downstream === 'unknown'
        ? ({ outcome: 'unknown' } as const)
        : ({ outcome: 'completed', response: { status: 201, body: { charged: true, ref: r.ownerToken } } } as const);
    };
    expect(await reconcileUncertain(db.pool, OPERATION, hook)).toMatchObject({ unknown: 1, completed: 0, failed: 0 });
    expect((await post(app, '/payments', { key, body })).status).toBe(409);

    downstream = 'charged';
    expect(await reconcileUncertain(db.pool, OPERATION, hook)).toMatchObject({ completed: 1 });
    const resolved = await post(app, '/payments', { key, body });
    expect(resolved.status).toBe(201);
    expect(resolved.headers.get('idempotent-replayed')).toBe('true');
    expect(resolved.json()).toMatchObject({ charged: true });
    expect(await readLease(db.pool, key)).toMatchObject({ state: 'completed', generation: 1 });
    expect(app.calls.total).toBe(1);
    // A second reconciler finds nothing left to resolve.
    expect(await reconcileUncertain(db.pool, OPERATION, hook)).toMatchObject({ completed: 0, unknown: 0 });
    await app.close();
  });

  it('executeLeased (no HTTP) with policy async answers 202 to retries of an uncertain record', async () => {
    const key = randomUUID();
    const request = { tenant: 'tenant-a', operation: OPERATION, key, fingerprint };
    const opts = { policy: 'async' as const, operationLocation: (id: string) => `/ops/${id}` };
    const first = await executeLeased(db.pool, request, async (ctx) => ctx.uncertain('timeout'), opts);
    expect(first).toMatchObject({ outcome: 'accepted', response: { status: 202 } });
    const retry = await executeLeased(db.pool, request, async () => ({ status: 201, body: {} }), opts);
    expect(retry.outcome).toBe('accepted');
    expect(retry.response.headers.location).toMatch(/^\/ops\/[0-9a-f]{64}$/);
    expect(JSON.parse(retry.response.body.toString())).toMatchObject({ state: 'uncertain' });
  });
});
