/**
 * The read-first path (one plain SELECT before any transaction answers a terminal, unexpired
 * record) and the pg.Pool round-trip savings (BEGIN with the claim's lock_timeout, the claim with
 * its SAVEPOINT as one simple-protocol query), against the real PostgreSQL.
 *
 * To prove a response came from the read-first path, a test holds the record's row lock in another
 * transaction (`SELECT ... FOR UPDATE`): the claim path would wait on it and answer 409 after
 * `lockTimeoutMs`; a plain SELECT does not wait.
 */
import { randomUUID } from 'node:crypto';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { executeIdempotent } from '../../src/idempotency/execute.js';
import { executeLeased } from '../../src/idempotency/lease.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import type { IdempotencyOutcomeEvent } from '../../src/idempotency/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { closeAll, countOrders, ORDERS_TABLE_SQL, post, readRecords, startApp } from './harness.js';
import { closeLeaseApps, OPERATION, startLeaseApp } from './lease-harness.js';

let db: TestDatabase;
const pools: pg.Pool[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  await closeAll();
  await closeLeaseApps();
  await Promise.all(pools.splice(0).map((p) => p.end()));
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await closeAll();
  await closeLeaseApps();
  await db?.drop();
});

/** Holds the row lock of `key`'s record in an open transaction until `release()`. */
async function lockRecord(key: string): Promise<{ release(): Promise<void> }> {
  const client = await db.pool.connect();
  await client.query('BEGIN');
  const { rowCount } = await client.query('SELECT 1 FROM outboxkit.idempotency_keys WHERE key = $1 FOR UPDATE', [key]);
  expect(rowCount).toBe(1);
  return {
    async release() {
      await client.query('ROLLBACK');
      client.release();
    },
  };
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

function fp(body: string, tenant = 't1', operation = 'op') {
  return fingerprintRequest({ tenant, operation, body, maxBodyBytes: 10_000 });
}

describe('read-first: a terminal, unexpired record is answered by one plain SELECT', () => {
  it('one-transaction mode over HTTP: the replay is byte-identical with Idempotent-Replayed, and a mismatch is 422, while the row is locked', async () => {
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const app = await startApp({ pool: db.pool, lockTimeoutMs: 50, onOutcome: (e) => outcomes.push(e) });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(201);

    const lock = await lockRecord(key);
    try {
      const started = Date.now();
      const replay = await post(app, '/orders', { key });
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect(replay.headers.get('location')).toBe(first.headers.get('location'));
      expect(replay.headers.get('set-cookie')).toBeNull();

      const mismatch = await post(app, '/orders', { key, body: '{"amount":11}' });
      expect(mismatch.status).toBe(422);
      expect(mismatch.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      // Neither waited for the lock (the claim path would have answered 409 after 50 ms each).
      expect(Date.now() - started).toBeLessThan(2_000);
    } finally {
      await lock.release();
    }
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    expect(outcomes.map((e) => e.outcome)).toEqual(['new', 'replayed', 'mismatch']);
  });

  it('a stored rejection (failed record) is replayed by the read-first path too', async () => {
    const app = await startApp({
      pool: db.pool,
      lockTimeoutMs: 50,
      behaviour: async (ctx) => {
        await ctx.insertOrder();
        return ctx.exec.reject(422, { title: 'out of stock' });
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(422);
    const lock = await lockRecord(key);
    try {
      const replay = await post(app, '/orders', { key });
      expect(replay.status).toBe(422);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(first.bytes)).toBe(true);
    } finally {
      await lock.release();
    }
    expect(await countOrders(db.pool)).toBe(0);
  });

  it('lease mode over HTTP: replay and 422 while the row is locked', async () => {
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const app = await startLeaseApp({ pool: db.pool, lockTimeoutMs: 50, onOutcome: (e) => outcomes.push(e) });
    const key = randomUUID();
    const first = await post(app, '/payments', { key });
    expect(first.status).toBe(201);
    const lock = await lockRecord(key);
    try {
      const replay = await post(app, '/payments', { key });
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect((await post(app, '/payments', { key, body: '{"amount":11}' })).status).toBe(422);
    } finally {
      await lock.release();
    }
    expect(app.calls.total).toBe(1);
    expect(outcomes.map((e) => [e.operation, e.outcome])).toEqual([
      [OPERATION, 'new'],
      [OPERATION, 'replayed'],
      [OPERATION, 'mismatch'],
    ]);
  });

  it('with a drizzle database: replay and mismatch while the row is locked', async () => {
    const ddb = drizzle(db.pool);
    const key = randomUUID();
    const request = (body: string) => ({ tenant: 't1', operation: 'op', key, fingerprint: fp(body) });
    const first = await executeIdempotent(ddb, request('{"a":1}'), async () => ({ status: 201, body: { n: 1 } }), {
      lockTimeoutMs: 50,
    });
    const lock = await lockRecord(key);
    try {
      const replay = await executeIdempotent(ddb, request('{"a":1}'), () => Promise.reject(new Error('ran')), {
        lockTimeoutMs: 50,
      });
      expect(replay.replayed).toBe(true);
      expect(replay.response.body.equals(first.response.body)).toBe(true);
      expect(replay.response.headers['idempotent-replayed']).toBe('true');
      const err = await rejection(
        executeIdempotent(ddb, request('{"a":2}'), () => Promise.reject(new Error('ran')), { lockTimeoutMs: 50 }),
      );
      expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_MISMATCH')).toBe(true);
    } finally {
      await lock.release();
    }
  });
});

describe('read-first misses go through the atomic claim', () => {
  it('a committed processing record (live lease) still yields 409 in both modes, and an uncertain one too', async () => {
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const processing = randomUUID();
    const uncertain = randomUUID();
    for (const [key, state] of [
      [processing, 'processing'],
      [uncertain, 'uncertain'],
    ] as const) {
      await db.pool.query(
        `INSERT INTO outboxkit.idempotency_keys
                (tenant, operation, key, fingerprint, fingerprint_version, state, owner_token, lease_expires_at, expires_at)
         VALUES ('t1', 'op', $1, $2, 1, $3, $4, now() + interval '1 hour', now() + interval '1 day')`,
        [key, fp('{"a":1}').digest, state, randomUUID()],
      );
    }
    const ran = () => Promise.reject(new Error('the handler must not run'));
    const options = { onOutcome: (e: IdempotencyOutcomeEvent) => outcomes.push(e) };
    for (const key of [processing, uncertain]) {
      const request = { tenant: 't1', operation: 'op', key, fingerprint: fp('{"a":1}') };
      expect(
        isOutboxkitError(
          await rejection(executeIdempotent(db.pool, request, ran, options)),
          'OUTBOXKIT_KEY_IN_PROGRESS',
        ),
      ).toBe(true);
      expect(
        isOutboxkitError(await rejection(executeLeased(db.pool, request, ran, options)), 'OUTBOXKIT_KEY_IN_PROGRESS'),
      ).toBe(true);
    }
    expect(outcomes.map((e) => e.outcome)).toEqual(['in_progress', 'in_progress', 'uncertain', 'uncertain']);
    expect((await readRecords(db.pool, processing))[0]).toMatchObject({ state: 'processing', generation: 1 });
  });

  it('an expired completed record is not replayed: the request executes again (generation 2, outcome expired), in both modes', async () => {
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const options = { onOutcome: (e: IdempotencyOutcomeEvent) => outcomes.push(e) };
    for (const mode of ['one-transaction', 'lease'] as const) {
      const key = randomUUID();
      const request = { tenant: 't1', operation: 'op', key, fingerprint: fp('{"a":1}') };
      const run = (n: number) =>
        mode === 'lease'
          ? executeLeased(db.pool, request, async () => ({ status: 201, body: { n } }), options)
          : executeIdempotent(db.pool, request, async () => ({ status: 201, body: { n } }), options);
      expect((await run(1)).replayed).toBe(false);
      expect((await run(2)).replayed).toBe(true);
      await db.pool.query(`UPDATE outboxkit.idempotency_keys SET expires_at = now() - interval '1 ms' WHERE key = $1`, [
        key,
      ]);
      const again = await run(3);
      expect(again.replayed).toBe(false);
      expect(JSON.parse(again.response.body.toString())).toEqual({ n: 3 });
      expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'completed', generation: 2 });
    }
    expect(outcomes.map((e) => e.outcome)).toEqual(['new', 'replayed', 'expired', 'new', 'replayed', 'expired']);
  });

  it('a store failure on the read-first SELECT is 503 (store_error), the handler never runs', async () => {
    const dead = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none', connectionTimeoutMillis: 500 });
    pools.push(dead);
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const request = { tenant: 't1', operation: 'op', key: randomUUID(), fingerprint: fp('{}') };
    const ran = () => Promise.reject(new Error('the handler must not run'));
    const options = { onOutcome: (e: IdempotencyOutcomeEvent) => outcomes.push(e) };
    for (const call of [
      () => executeIdempotent(dead, request, ran, options),
      () => executeLeased(dead, request, ran, options),
    ]) {
      expect(isOutboxkitError(await rejection(call()), 'OUTBOXKIT_STORE_UNAVAILABLE')).toBe(true);
    }
    expect(outcomes.map((e) => e.outcome)).toEqual(['store_error', 'store_error']);
  });
});

describe('pg.Pool round trips: BEGIN with the lock_timeout, the claim with its SAVEPOINT', () => {
  /** A pool whose clients count the queries sent (one query call = one round trip). */
  function countingPool(options: pg.PoolConfig = {}): { pool: pg.Pool; sent: string[] } {
    const pool = new pg.Pool({ connectionString: db.url, max: 2, ...options });
    pools.push(pool);
    const sent: string[] = [];
    const wrapped = new WeakSet<object>();
    pool.on('acquire', (client) => {
      if (wrapped.has(client)) return;
      wrapped.add(client);
      const original = client.query.bind(client) as (...args: unknown[]) => unknown;
      (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
        const first = args[0];
        sent.push(typeof first === 'string' ? first : String((first as { text?: string }).text));
        return original(...args);
      };
    });
    return { pool, sent };
  }

  it('a new key takes 6 round trips with one handler statement (read, BEGIN+setting, claim+SAVEPOINT, handler, completion, COMMIT); a replay takes 1', async () => {
    const { pool, sent } = countingPool();
    const request = { tenant: 't1', operation: 'op', key: randomUUID(), fingerprint: fp('{"a":1}') };
    await executeIdempotent(pool, request, async (tx) => {
      await tx.query(
        "INSERT INTO app_orders (tenant, operation, body, token) VALUES ('t1', 'op', 'x', gen_random_uuid())",
      );
      return { status: 201, body: 'ok' };
    });
    expect(sent).toHaveLength(6);
    expect(sent[1]).toMatch(/^BEGIN; SELECT set_config/);
    expect(sent[2]).toMatch(/SAVEPOINT outboxkit_claim$/);
    sent.length = 0;
    const replay = await executeIdempotent(pool, request, () => Promise.reject(new Error('ran')));
    expect(replay.replayed).toBe(true);
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatch(/^SELECT state/);
  });

  it('readFirst: false — a new key takes 5 round trips (no SELECT first); replays and mismatches are answered from the claim, in both modes', async () => {
    const { pool, sent } = countingPool();
    const outcomes: IdempotencyOutcomeEvent[] = [];
    const options = { readFirst: false, onOutcome: (e: IdempotencyOutcomeEvent) => outcomes.push(e) };
    for (const mode of ['one-transaction', 'lease'] as const) {
      const key = randomUUID();
      const request = (body: string) => ({ tenant: 't1', operation: 'op', key, fingerprint: fp(body) });
      const run = (body: string, handler: () => Promise<{ status: number; body: string }>) =>
        mode === 'lease'
          ? executeLeased(pool, request(body), handler, options)
          : executeIdempotent(pool, request(body), handler, options);
      sent.length = 0;
      const first = await run('{"a":1}', async () => ({ status: 201, body: 'ok' }));
      expect(first.replayed).toBe(false);
      expect(sent.some((q) => /^SELECT state/.test(q))).toBe(false);
      if (mode === 'one-transaction') {
        expect(sent).toHaveLength(4); // BEGIN+setting, claim+SAVEPOINT, completion, COMMIT (no handler statement)
        expect(sent[0]).toMatch(/^BEGIN; SELECT set_config/);
      }
      sent.length = 0;
      const replay = await run('{"a":1}', () => Promise.reject(new Error('the handler must not run')));
      expect(replay.replayed).toBe(true);
      expect(replay.response.body.toString()).toBe('ok');
      expect(sent[0]).toMatch(/^BEGIN/); // the claim path answered, not a plain SELECT
      const err = await rejection(run('{"a":2}', () => Promise.reject(new Error('the handler must not run'))));
      expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_MISMATCH')).toBe(true);
    }
    expect(outcomes.map((e) => e.outcome)).toEqual(['new', 'replayed', 'mismatch', 'new', 'replayed', 'mismatch']);
  });

  it('readFirst must be a boolean', async () => {
    const request = { tenant: 't1', operation: 'op', key: randomUUID(), fingerprint: fp('{}') };
    const err = await rejection(
      executeIdempotent(db.pool, request, async () => ({ status: 201, body: '' }), {
        readFirst: 'no' as unknown as boolean,
      }),
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
  });

  it('the caller lock_timeout (session SET) is restored for the handler; the claim uses its own', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    await pool.query('SET lock_timeout = 4321');
    let seen: string | undefined;
    await executeIdempotent(
      pool,
      { tenant: 't1', operation: 'op', key: randomUUID(), fingerprint: fp('{}') },
      async (tx) => {
        seen = (await tx.query<{ lock_timeout: string }>('SHOW lock_timeout')).rows[0]?.lock_timeout;
        return { status: 201, body: '' };
      },
      { lockTimeoutMs: 25 },
    );
    expect(seen).toBe('4321ms');
    expect((await pool.query<{ lock_timeout: string }>('SHOW lock_timeout')).rows[0]?.lock_timeout).toBe('4321ms');
  });

  it('tenants and keys with quotes, backslashes and SQL are stored verbatim by the literal claim; a stored rejection still rolls back to the savepoint', async () => {
    const tenant = `t'1\\"; DROP TABLE app_orders; --`;
    const key = `k'\\x00'; SELECT 1; --`;
    const request = { tenant, operation: "op'\\", key, fingerprint: fp('{"a":1}', tenant, "op'\\") };
    const first = await executeIdempotent(db.pool, request, async (tx, ctx) => {
      await tx.query(
        "INSERT INTO app_orders (tenant, operation, body, token) VALUES ('t1', 'op', 'x', gen_random_uuid())",
      );
      return ctx.reject(422, { title: 'no' });
    });
    expect(first.response.status).toBe(422);
    expect(await countOrders(db.pool)).toBe(0);
    const rows = await readRecords(db.pool, key);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ tenant, operation: "op'\\", key, state: 'failed', response_status: 422 });
    const replay = await executeIdempotent(db.pool, request, () => Promise.reject(new Error('ran')));
    expect(replay.replayed).toBe(true);
    expect(replay.response.body.equals(first.response.body)).toBe(true);
  });
});
