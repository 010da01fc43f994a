/**
 * executeIdempotent() called directly, with a pg.Pool and with a drizzle database, against the
 * real PostgreSQL: the one-transaction guarantees (G1, G2), lock handling, fencing, store errors.
 */
import { randomUUID } from 'node:crypto';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { executeIdempotent } from '../../src/idempotency/execute.js';
import { fingerprintRequest, type Fingerprint } from '../../src/idempotency/fingerprint.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { countOrders, countRecords, ORDERS_TABLE_SQL, readRecords } from './harness.js';

let db: TestDatabase;
const pools: pg.Pool[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await db?.drop();
});

function fingerprintOf(body: string, tenant = 't1', operation = 'op'): Fingerprint {
  return fingerprintRequest({ tenant, operation, body, maxBodyBytes: 10_000 });
}

function request(key: string, body = '{"a":1}', tenant = 't1', operation = 'op') {
  return { tenant, operation, key, fingerprint: fingerprintOf(body, tenant, operation) };
}

async function insertOrder(client: pg.PoolClient, note: string): Promise<void> {
  await client.query('INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4)', [
    't1',
    'op',
    note,
    randomUUID(),
  ]);
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

describe('executeIdempotent with a pg.Pool', () => {
  it('runs once, stores the bytes, replays them; a different fingerprint is a mismatch', async () => {
    const key = randomUUID();
    let calls = 0;
    const handler = async (tx: pg.PoolClient) => {
      calls++;
      await insertOrder(tx, 'x');
      return {
        status: 201,
        headers: { Location: '/o/1', 'Set-Cookie': 's=1' },
        body: { z: 1, a: 'é', big: '9007199254740993' },
      };
    };
    const first = await executeIdempotent(db.pool, request(key), handler);
    expect(first.replayed).toBe(false);
    expect(first.response.body.toString('utf8')).toBe('{"z":1,"a":"é","big":"9007199254740993"}');
    expect(first.response.headers).toEqual({
      location: '/o/1',
      'set-cookie': 's=1',
      'content-type': 'application/json',
    });

    const second = await executeIdempotent(db.pool, request(key), handler);
    expect(second).toEqual({
      replayed: true,
      response: {
        status: 201,
        headers: { location: '/o/1', 'content-type': 'application/json', 'idempotent-replayed': 'true' },
        body: first.response.body,
      },
    });
    expect(calls).toBe(1);

    const mismatch = await rejection(executeIdempotent(db.pool, request(key, '{"a":2}'), handler));
    expect(isOutboxkitError(mismatch, 'OUTBOXKIT_KEY_MISMATCH')).toBe(true);
    expect(calls).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
  });

  it('restores the caller lock_timeout before the handler runs (the claim timeout is for the claim only)', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2, options: '-c lock_timeout=7s' });
    pools.push(pool);
    let seen: string | undefined;
    await executeIdempotent(
      pool,
      request(randomUUID()),
      async (tx) => {
        seen = (await tx.query<{ lock_timeout: string }>('SHOW lock_timeout')).rows[0]?.lock_timeout;
        return { status: 200, body: 'ok' };
      },
      { policy: 'reject', lockTimeoutMs: 100 },
    );
    expect(seen).toBe('7s');
  });

  it('G2 crash before commit: the handler throws after writing → no row, no record, the same error; the retry executes', async () => {
    const key = randomUUID();
    const boom = new Error('boom');
    const err = await rejection(
      executeIdempotent(db.pool, request(key), async (tx) => {
        await insertOrder(tx, 'lost');
        throw boom;
      }),
    );
    expect(err).toBe(boom);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    const retry = await executeIdempotent(db.pool, request(key), async (tx) => {
      await insertOrder(tx, 'kept');
      return { status: 201, body: { ok: true } };
    });
    expect(retry.replayed).toBe(false);
    expect(await countOrders(db.pool)).toBe(1);
  });

  it('a duplicate meeting an uncommitted claim gets KeyInProgressError (55P03) after lockTimeoutMs', async () => {
    const key = randomUUID();
    const holder = await db.pool.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(
        `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, expires_at)
         VALUES ('t1', 'op', $1, $2, 1, 'processing', now() + interval '1 day')`,
        [key, fingerprintOf('{"a":1}').digest],
      );
      const started = Date.now();
      let ran = false;
      const err = await rejection(
        executeIdempotent(
          db.pool,
          request(key),
          async () => {
            ran = true;
            return { status: 200, body: '' };
          },
          { lockTimeoutMs: 150, retryAfterSeconds: 4 },
        ),
      );
      const waited = Date.now() - started;
      expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_IN_PROGRESS')).toBe(true);
      expect((err as { retriable: boolean }).retriable).toBe(true);
      expect((err as { retryAfterSeconds: number }).retryAfterSeconds).toBe(4);
      expect(((err as Error).cause as { code?: string }).code).toBe('55P03');
      expect(waited).toBeGreaterThanOrEqual(140);
      expect(waited).toBeLessThan(2_000);
      expect(ran).toBe(false);
    } finally {
      await holder.query('ROLLBACK');
      holder.release();
    }
  });

  it('a committed processing record (lease mode) is in progress, never taken over by age; a different body is 422', async () => {
    const key = randomUUID();
    await db.pool.query(
      `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, expires_at)
       VALUES ('t1', 'op', $1, $2, 1, 'processing', now() - interval '1 day')`,
      [key, fingerprintOf('{"a":1}').digest],
    );
    let ran = false;
    const handler = async () => {
      ran = true;
      return { status: 200, body: '' };
    };
    expect(
      isOutboxkitError(await rejection(executeIdempotent(db.pool, request(key), handler)), 'OUTBOXKIT_KEY_IN_PROGRESS'),
    ).toBe(true);
    expect(
      isOutboxkitError(
        await rejection(executeIdempotent(db.pool, request(key, '{"a":2}'), handler)),
        'OUTBOXKIT_KEY_MISMATCH',
      ),
    ).toBe(true);
    expect(ran).toBe(false);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'processing', generation: 1 });
  });

  it('an expired completed record is taken over with a new generation and owner token', async () => {
    const key = randomUUID();
    await executeIdempotent(db.pool, request(key), async () => ({ status: 201, body: 'one' }));
    const before = await db.pool.query<{ owner_token: string }>(
      'SELECT owner_token FROM outboxkit.idempotency_keys WHERE key = $1',
      [key],
    );
    await db.pool.query(
      `UPDATE outboxkit.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`,
      [key],
    );
    const again = await executeIdempotent(db.pool, request(key, '{"other":true}'), async () => ({
      status: 201,
      body: 'two',
    }));
    expect(again.replayed).toBe(false);
    expect(again.response.body.toString()).toBe('two');
    const after = await db.pool.query<{ owner_token: string; generation: number; fingerprint: Buffer }>(
      'SELECT owner_token, generation, fingerprint FROM outboxkit.idempotency_keys WHERE key = $1',
      [key],
    );
    expect(after.rows[0]!.generation).toBe(2);
    expect(after.rows[0]!.owner_token).not.toBe(before.rows[0]!.owner_token);
    expect(after.rows[0]!.fingerprint.equals(fingerprintOf('{"other":true}').digest)).toBe(true);
  });

  it('fencing: when the owner token changed, completion stores nothing and everything rolls back (LeaseLostError)', async () => {
    const key = randomUUID();
    const err = await rejection(
      executeIdempotent(db.pool, request(key), async (tx) => {
        await insertOrder(tx, 'fenced');
        await tx.query('UPDATE outboxkit.idempotency_keys SET owner_token = gen_random_uuid() WHERE key = $1', [key]);
        return { status: 201, body: 'stale' };
      }),
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
  });

  it('refuses an invalid request before touching the database', async () => {
    const dead = new pg.Pool({ host: '127.0.0.1', port: 1 });
    pools.push(dead);
    const handler = async () => ({ status: 200, body: '' });
    const cases: Array<[Parameters<typeof executeIdempotent>[1], string]> = [
      [{ ...request('k'), key: '' }, 'OUTBOXKIT_KEY_INVALID'],
      [{ ...request('k'), key: 'é' }, 'OUTBOXKIT_KEY_INVALID'],
      [{ ...request('k'), tenant: '' }, 'OUTBOXKIT_TENANT_UNRESOLVED'],
      [{ ...request('k'), operation: '' }, 'OUTBOXKIT_INVALID_OPTIONS'],
      [{ ...request('k'), fingerprint: { version: 1, digest: Buffer.alloc(3) } }, 'OUTBOXKIT_INVALID_OPTIONS'],
    ];
    for (const [req, code] of cases) {
      expect(isOutboxkitError(await rejection(executeIdempotent(dead, req, handler)), code as never), code).toBe(true);
    }
    expect(
      isOutboxkitError(
        await rejection(executeIdempotent(dead, request('k'), handler, { schema: 'Bad' })),
        'OUTBOXKIT_INVALID_OPTIONS',
      ),
    ).toBe(true);
  });

  it('a configuration error (schema not migrated) is SchemaMissingError, not disguised as store unavailable', async () => {
    const err = await rejection(
      executeIdempotent(db.pool, request(randomUUID()), async () => ({ status: 200, body: '' }), {
        schema: 'not_migrated',
      }),
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
    expect((err as { retriable?: boolean }).retriable).toBe(false);
    expect(((err as Error).cause as { code?: string }).code).toBe('42P01');
  });

  it('an invalid handler response rolls back (nothing stored) and raises InvalidOptionsError', async () => {
    const key = randomUUID();
    const err = await rejection(
      executeIdempotent(db.pool, request(key), async (tx) => {
        await insertOrder(tx, 'x');
        return { status: 201, headers: { 'x-bad': 'a\r\nb' }, body: '' };
      }),
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
  });
});

describe('executeIdempotent with a drizzle database', () => {
  it('claims, runs with the drizzle tx, stores, replays; mismatch; lock_timeout restored', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 3 });
    pools.push(pool);
    const ddb = drizzle(pool);
    const key = randomUUID();
    let calls = 0;
    let lockTimeout: unknown;
    const handler = async (tx: Parameters<Parameters<typeof ddb.transaction>[0]>[0]) => {
      calls++;
      await tx.execute(
        sql`INSERT INTO app_orders (tenant, operation, body, token) VALUES ('t1', 'op', 'drizzle', ${randomUUID()})`,
      );
      lockTimeout = ((await tx.execute(sql`SHOW lock_timeout`)).rows[0] as { lock_timeout: string }).lock_timeout;
      return { status: 201, body: { via: 'drizzle' } };
    };
    const first = await executeIdempotent(ddb, request(key), handler);
    const second = await executeIdempotent(ddb, request(key), handler);
    expect(first.replayed).toBe(false);
    expect(second.replayed).toBe(true);
    expect(second.response.body.equals(first.response.body)).toBe(true);
    expect(calls).toBe(1);
    expect(lockTimeout).toBe('0');
    expect(
      isOutboxkitError(
        await rejection(executeIdempotent(ddb, request(key, '{"a":3}'), handler)),
        'OUTBOXKIT_KEY_MISMATCH',
      ),
    ).toBe(true);

    // A thrown handler error rolls back the drizzle transaction too.
    const key2 = randomUUID();
    const boom = new Error('drizzle boom');
    const err = await rejection(
      executeIdempotent(ddb, request(key2), async (tx) => {
        await tx.execute(
          sql`INSERT INTO app_orders (tenant, operation, body, token) VALUES ('t1', 'op', 'lost', ${randomUUID()})`,
        );
        throw boom;
      }),
    );
    expect(err).toBe(boom);
    expect(await countOrders(db.pool)).toBe(1);
    expect(await readRecords(db.pool, key2)).toEqual([]);
  });

  it('a duplicate meeting an uncommitted claim gets KeyInProgressError through drizzle too (SQLSTATE in the cause chain)', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 3 });
    pools.push(pool);
    const ddb = drizzle(pool);
    const key = randomUUID();
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let claimed!: () => void;
    const isClaimed = new Promise<void>((r) => (claimed = r));
    const first = executeIdempotent(ddb, request(key), async () => {
      claimed();
      await held;
      return { status: 201, body: 'first' };
    });
    await isClaimed;
    const err = await rejection(executeIdempotent(ddb, request(key), async () => ({ status: 201, body: 'second' })));
    expect(isOutboxkitError(err, 'OUTBOXKIT_KEY_IN_PROGRESS')).toBe(true);
    release();
    expect((await first).response.body.toString()).toBe('first');
  });

  it('store unavailable: StoreUnavailableError (retriable) and the handler never runs', async () => {
    const dead = new pg.Pool({ host: '127.0.0.1', port: 1, user: 'postgres', database: 'postgres' });
    pools.push(dead);
    let ran = false;
    const err = await rejection(
      executeIdempotent(drizzle(dead), request(randomUUID()), async () => {
        ran = true;
        return { status: 201, body: '' };
      }),
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_STORE_UNAVAILABLE')).toBe(true);
    expect((err as { retriable: boolean }).retriable).toBe(true);
    expect(ran).toBe(false);
  });
});
