/**
 * How a lease-mode duplicate waits (policy `wait`) against the real PostgreSQL: its deadline is
 * validated before any query, every wait ends at `waitTimeoutMs` whatever the deadline, at an
 * aborted signal (the client went away), and it looks at the record at a bounded rate.
 */
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isOutboxkitError, type OutboxkitError } from '../../src/errors.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { executeLeased } from '../../src/idempotency/lease.js';
import type { IdempotencyOutcomeEvent } from '../../src/idempotency/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { countRecords, ORDERS_TABLE_SQL, post, postAndHangUp } from './harness.js';
import { closeLeaseApps, gate, OPERATION, pay, startLeaseApp } from './lease-harness.js';

let db: TestDatabase;
/** Handlers a test holds: let go after each test, also one that failed before it let them go. */
const holding: { release(): void; done?: Promise<unknown> }[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  const held = holding.splice(0);
  for (const h of held) h.release();
  await Promise.all(held.map((h) => h.done?.catch(() => {})));
  expect(await closeLeaseApps(), 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await closeLeaseApps();
  await db?.drop();
});

const body = '{"amount":10}';
const fingerprint = fingerprintRequest({
  tenant: 'tenant-a',
  operation: OPERATION,
  method: 'POST',
  body,
  maxBodyBytes: 1_000,
});
const request = (key: string) => ({ tenant: 'tenant-a', operation: OPERATION, key, fingerprint });
const created = async () => ({ status: 201, body: { ok: true } });

/** Counts the connections `pool` hands out while `fn` runs (each claim attempt takes one). */
async function acquiresDuring<T>(pool: pg.Pool, fn: () => Promise<T>): Promise<{ result: T; acquires: number }> {
  let acquires = 0;
  const count = () => acquires++;
  pool.on('acquire', count);
  try {
    const result = await fn();
    return { result, acquires };
  } finally {
    pool.off('acquire', count);
  }
}

/** What `promise` settled with, or 'still waiting' after `ms`. */
function settledWithin(promise: Promise<unknown>, ms: number): Promise<unknown> {
  return Promise.race([
    promise.then(
      (v) => v,
      (e: unknown) => e,
    ),
    new Promise((r) => setTimeout(() => r('still waiting'), ms).unref()),
  ]);
}

/** A leased execution of `key` held in its handler until `hold` opens. */
async function heldOwner(key: string, inFencedTransaction = false) {
  const inHandler = gate();
  const hold = gate();
  const done = executeLeased(db.pool, request(key), async (ctx) => {
    if (inFencedTransaction) {
      // Holds the record's row lock (FOR UPDATE) the whole time: duplicates' claims time out on it.
      await ctx.transaction(async () => {
        inHandler.open();
        await hold.promise;
      });
    } else {
      inHandler.open();
      await hold.promise;
    }
    return created();
  });
  holding.push({ release: hold.open, done });
  await inHandler.promise;
  return {
    async finish() {
      hold.open();
      return done;
    },
  };
}

describe('lease-mode wait: deadline, timeout, abort and poll rate', () => {
  it('a deadline that is not a finite number is refused with DeadlineInvalidError before any query', async () => {
    let calls = 0;
    const handler = async () => {
      calls++;
      return created();
    };
    for (const deadline of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, '5000', null]) {
      const { result: err, acquires } = await acquiresDuring(db.pool, () =>
        executeLeased(db.pool, { ...request(randomUUID()), deadline: deadline as number }, handler, {
          policy: 'wait',
        }).catch((e: unknown) => e),
      );
      expect(isOutboxkitError(err, 'OUTBOXKIT_DEADLINE_INVALID'), String(deadline)).toBe(true);
      expect((err as Error).message).toMatch(/deadline must be a finite time in ms since the epoch/);
      expect(acquires).toBe(0);
    }
    expect(calls).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
  });

  it('a malformed Request-Timeout header (NaN deadline) gets 400 deadline-invalid at once instead of polling forever', async () => {
    const hold = gate();
    holding.push({ release: hold.open });
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'wait',
      waitTimeoutMs: 20_000,
      deadline: (req) => {
        const seconds = req.headers['request-timeout'];
        return typeof seconds === 'string' ? Date.now() + 1_000 * Number(seconds) : undefined;
      },
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    const dup = await post(app, '/payments', {
      key,
      body,
      headers: { 'request-timeout': 'soon' },
      signal: AbortSignal.timeout(5_000),
    });
    expect(dup.status).toBe(400);
    expect(dup.headers.get('content-type')).toBe('application/problem+json');
    expect(dup.json()).toMatchObject({
      type: 'https://outboxkit.dev/problems/deadline-invalid',
      code: 'OUTBOXKIT_DEADLINE_INVALID',
    });
    hold.open();
    expect((await first).status).toBe(201);
    await app.close();
  });

  it('waitTimeoutMs bounds a wait whatever the deadline, and a wait looks at a locked record at most ~10 times in 1.5 s', async () => {
    const key = randomUUID();
    const owner = await heldOwner(key, true);
    const started = Date.now();
    const { result: err, acquires } = await acquiresDuring(db.pool, () =>
      executeLeased(db.pool, { ...request(key), deadline: Date.now() + 3_600_000 }, created, {
        policy: 'wait',
        waitTimeoutMs: 1_500,
        lockTimeoutMs: 5,
      }).catch((e: unknown) => e),
    );
    const elapsed = Date.now() - started;
    expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_IN_PROGRESS')).toBe(true);
    expect(elapsed).toBeGreaterThanOrEqual(1_400);
    expect(elapsed).toBeLessThan(4_000);
    // Pauses of 25, 50, 100, 200, 400, 500, 500 ms: about 8 claims, the read-first and one read of
    // the locked record's id. (Without a floor and backoff it claimed every 20 ms: about 50.)
    expect(acquires).toBeLessThanOrEqual(15);
    expect((await owner.finish()).outcome).toBe('executed');
  });

  it('an aborted signal ends the wait at once with KeyInProgressError; it never stops an execution of a new key', async () => {
    const key = randomUUID();
    const owner = await heldOwner(key);
    const controller = new AbortController();
    const started = Date.now();
    const waiting = executeLeased(db.pool, { ...request(key), signal: controller.signal }, created, {
      policy: 'wait',
      waitTimeoutMs: 20_000,
    });
    setTimeout(() => controller.abort(new Error('client gone')), 300);
    const err = await settledWithin(waiting, 5_000);
    expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_IN_PROGRESS')).toBe(true);
    expect(((err as OutboxkitError).cause as Error).message).toBe('client gone');
    expect(Date.now() - started).toBeLessThan(3_000);
    expect((await owner.finish()).outcome).toBe('executed');

    // Already aborted, a new key: the claim commits and the execution runs to its end.
    const fresh = await executeLeased(db.pool, { ...request(randomUUID()), signal: AbortSignal.abort() }, created, {
      policy: 'wait',
    });
    expect(fresh.outcome).toBe('executed');
  });

  it('Fastify: a duplicate whose client disconnects stops waiting (not after waitTimeoutMs)', async () => {
    const hold = gate();
    holding.push({ release: hold.open });
    const inHandler = gate();
    const outcomes: (IdempotencyOutcomeEvent & { at: number })[] = [];
    const app = await startLeaseApp({
      pool: db.pool,
      policy: 'wait',
      waitTimeoutMs: 20_000,
      onOutcome: (e) => outcomes.push({ ...e, at: Date.now() }),
      behaviour: async (c) => {
        inHandler.open();
        await hold.promise;
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body });
    await inHandler.promise;
    const hungUpAt = await postAndHangUp(app.url, '/payments', { key, body }, 300).then(() => Date.now());
    const ended = await waitFor(() => outcomes.find((o) => o.outcome === 'in_progress'), { timeoutMs: 5_000 });
    expect(ended.at - hungUpAt).toBeLessThan(3_000);
    hold.open();
    expect((await first).status).toBe(201);
    await app.close();
  });
});
