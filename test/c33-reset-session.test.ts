/**
 * C33 (/work/shared/cases/workloads.md, issue 17 point 5): a pooled connection whose session was
 * reset. A pool (max 2) runs a pooler's reset query (`DEALLOCATE ALL`, or `DISCARD ALL`) on each
 * connection it gets back, as PgBouncer's `server_reset_query` or an application's release hook
 * would. The server then has none of outboxkit's named prepared statements, while node-postgres
 * still lists them as parsed on that client (`client.connection.parsedStatements`) and would send a
 * Bind for a statement that no longer exists: SQLSTATE 26000, and the caller's transaction aborted.
 *
 * Right: order transactions with `enqueue()` (plain pg and drizzle over node-postgres on the same
 * pool) all commit, and idempotent requests whose keys are replayed (pg.Pool and drizzle) all
 * answer, each replay with the stored response. Around it: the named statements are still used
 * where no reset came (the speed of B1), and a `DEALLOCATE` of one statement by name or a
 * pipelined client does not break a transaction either.
 */
import { randomUUID } from 'node:crypto';
import { drizzle } from 'drizzle-orm/node-postgres';
import { sql } from 'drizzle-orm';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, enqueue } from '../src/index.js';
import { executeIdempotent } from '../src/idempotency/execute.js';
import type { IdempotentResult } from '../src/idempotency/state-machine.js';
import { executeLeased } from '../src/idempotency/lease.js';
import { fingerprintRequest } from '../src/idempotency/fingerprint.js';
import { createTestDatabase, type TestDatabase } from './helpers/db.js';
import { createTopics } from './helpers/kafka.js';
import { startRelay } from './helpers/relay.js';
import { waitFor } from './helpers/wait-for.js';

let db: TestDatabase;
const pools: pg.Pool[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('CREATE TABLE c33_orders (id uuid PRIMARY KEY, via text NOT NULL)');
});

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});

afterAll(async () => {
  await db?.drop();
});

const RESETS = ['DEALLOCATE ALL', 'DISCARD ALL'] as const;
type Reset = (typeof RESETS)[number];

/**
 * A pool of 2 that runs `reset` on every connection released to it. The reset is queued on the
 * client before the pool hands it out again (node-postgres runs a client's queries in order), so
 * the next transaction on it always meets a reset session. `resets()` counts the resets done.
 */
function resettingPool(reset: Reset): { pool: pg.Pool; resets(): number } {
  const pool = new pg.Pool({ connectionString: db.url, max: 2 });
  pools.push(pool);
  let done = 0;
  pool.on('release', (err, client) => {
    if (err) return;
    client.query(reset).then(
      () => done++,
      () => {},
    );
  });
  return { pool, resets: () => done };
}

/** outboxkit's prepared statements on the server session of `client`. */
async function outboxkitStatements(client: pg.ClientBase): Promise<string[]> {
  const { rows } = await client.query<{ name: string }>(
    "SELECT name FROM pg_prepared_statements WHERE name LIKE 'outboxkit\\_%' ORDER BY name",
  );
  return rows.map((r) => r.name);
}

async function orderCount(via: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM c33_orders o JOIN outboxkit.outbox_events e ON e.key = o.id::text WHERE o.via = $1',
    [via],
  );
  return rows[0]!.n;
}

const event = (id: string) => ({ topic: 'c33-orders', key: id, type: 'order.created', payload: { id } });

/**
 * One order transaction through plain pg: BEGIN, the order row, enqueue(), COMMIT. With
 * `checkPrepared`, it also asserts that enqueue()'s statement is a prepared statement of the
 * session by then (parsed again after a reset, not given up).
 */
async function plainOrder(pool: pg.Pool, via: string, checkPrepared = false): Promise<void> {
  const client = await pool.connect();
  let failed: Error | undefined;
  try {
    await client.query('BEGIN');
    const id = randomUUID();
    await client.query('INSERT INTO c33_orders (id, via) VALUES ($1, $2)', [id, via]);
    await enqueue(client, event(id));
    if (checkPrepared) expect((await outboxkitStatements(client)).join(' ')).toMatch(/outboxkit_enqueue_/);
    const commit = await client.query('COMMIT');
    // COMMIT of an aborted transaction is answered ROLLBACK, not an error.
    expect(commit.command).toBe('COMMIT');
  } catch (err) {
    failed = err as Error;
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release(failed);
  }
}

/** One order transaction through drizzle over node-postgres on the same pool. */
async function drizzleOrder(pool: pg.Pool, via: string): Promise<void> {
  await drizzle(pool).transaction(async (tx) => {
    const id = randomUUID();
    await tx.execute(sql`INSERT INTO c33_orders (id, via) VALUES (${id}, ${via})`);
    await enqueue(tx, event(id));
  });
}

function fingerprint(body: string) {
  return fingerprintRequest({ tenant: 't1', operation: 'c33-order', body, maxBodyBytes: 10_000 });
}

function request(key: string, body: string) {
  return { tenant: 't1', operation: 'c33-order', key, fingerprint: fingerprint(body) };
}

describe.each(RESETS)('C33 a pool (max 2) that runs %s on every released connection', (reset) => {
  it('C33 every order transaction with enqueue() commits, through plain pg and drizzle over node-postgres on one pool', async () => {
    const { pool, resets } = resettingPool(reset);
    const via = `orders-${reset}`;
    // One after the other (each transaction meets the session the previous one's release reset),
    // then four at a time over the two connections.
    for (let i = 0; i < 12; i++) await (i % 3 === 2 ? drizzleOrder(pool, via) : plainOrder(pool, via, true));
    for (let round = 0; round < 6; round++) {
      await Promise.all([plainOrder(pool, via), drizzleOrder(pool, via), plainOrder(pool, via), plainOrder(pool, via)]);
    }
    expect(await orderCount(via)).toBe(12 + 6 * 4);
    expect(resets()).toBeGreaterThanOrEqual(12);
  });

  it('C33 idempotent requests whose keys are replayed all answer: pg.Pool and drizzle, one-transaction and lease mode', async () => {
    const { pool, resets } = resettingPool(reset);
    const outbox = createOutbox();
    const orm = drizzle(pool);
    const secret = { operationIdSecret: 'c33-'.repeat(10) };
    /** Runs the request of `key` the way `how` says; the handler writes an order and its event. */
    const callers: Record<string, (key: string, body: string, via: string) => Promise<IdempotentResult>> = {
      'pg.Pool, one transaction': (key, body, via) =>
        executeIdempotent(pool, request(key, body), async (tx) => ({ status: 201, body: await order(tx, via) })),
      'drizzle, one transaction': (key, body, via) =>
        executeIdempotent(orm, request(key, body), async (tx) => ({ status: 201, body: await drizzleWrite(tx, via) })),
      'pg.Pool, lease': (key, body, via) =>
        executeLeased(
          pool,
          request(key, body),
          async (ctx) => ({ status: 201, body: await ctx.transaction((tx) => order(tx, via)) }),
          secret,
        ),
      'drizzle, lease': (key, body, via) =>
        executeLeased(
          orm,
          request(key, body),
          async (ctx) => ({ status: 201, body: await ctx.transaction((tx) => drizzleWrite(tx, via)) }),
          secret,
        ),
    };
    async function order(tx: pg.PoolClient, via: string): Promise<{ id: string }> {
      const id = randomUUID();
      await tx.query('INSERT INTO c33_orders (id, via) VALUES ($1, $2)', [id, via]);
      await outbox.enqueue(tx, event(id));
      return { id };
    }
    async function drizzleWrite(tx: Parameters<Parameters<typeof orm.transaction>[0]>[0], via: string) {
      const id = randomUUID();
      await tx.execute(sql`INSERT INTO c33_orders (id, via) VALUES (${id}, ${via})`);
      await outbox.enqueue(tx, event(id));
      return { id };
    }
    for (const [how, call] of Object.entries(callers)) {
      const via = `idempotent-${reset}-${how}`;
      const keys: string[] = Array.from({ length: 6 }, () => randomUUID());
      const body = (key: string) => `{"n":${keys.indexOf(key)}}`;
      const first = new Map<string, Buffer>();
      for (const key of keys) {
        const result = await call(key, body(key), via);
        expect(result.replayed, `${how}: first request of ${key}`).toBe(false);
        expect(result.response.status).toBe(201);
        first.set(key, result.response.body);
      }
      // Each key replayed three times, in turns and two at a time: every replay answers with the
      // stored response, and nothing runs again.
      for (let round = 0; round < 3; round++) {
        for (let i = 0; i < keys.length; i += 2) {
          const pair = keys.slice(i, i + 2);
          const replays = await Promise.all(pair.map((key) => call(key, body(key), via)));
          for (const [j, result] of replays.entries()) {
            expect(result.replayed, `${how}: replay of ${pair[j]}`).toBe(true);
            expect(result.response.status).toBe(201);
            expect(result.response.body.equals(first.get(pair[j]!)!)).toBe(true);
          }
        }
      }
      expect(await orderCount(via), how).toBe(keys.length);
    }
    expect(resets()).toBeGreaterThanOrEqual(40);
  });
});

describe('C33 the relay on an application pool (max 2) that runs DISCARD ALL on every released connection', () => {
  it('C33 drains every event with no failed pass (its read and mark stay named, parsed again after each reset)', async () => {
    const [topic] = await createTopics(['c33-relay']);
    // The other tests' events name a topic that does not exist: not this relay's business.
    await db.pool.query('DELETE FROM outboxkit.outbox_events');
    const { pool, resets } = resettingPool('DISCARD ALL');
    const relay = await startRelay(db.url, { pool });
    const errors: unknown[] = [];
    relay.on('relay:error', ({ error }) => errors.push(error));
    for (let i = 0; i < 30; i++) {
      const client = await db.pool.connect();
      try {
        await client.query('BEGIN');
        await enqueue(client, { topic: topic!, key: `k${i % 3}`, type: 't', payload: i });
        await client.query('COMMIT');
      } finally {
        client.release();
      }
    }
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL',
          [topic],
        );
        return rows[0]!.n === 0;
      },
      { timeoutMs: 30_000, message: () => `pending events left; relay errors: ${errors.map(String).join('; ')}` },
    );
    await relay.stopAndForget();
    expect(errors.map(String)).toEqual([]);
    expect(resets()).toBeGreaterThan(0);
  });
});

describe('C33 around the reset: what stays fast, and what else must not break a transaction', () => {
  it('C33 without a reset, enqueue() and the idempotency statements stay named prepared statements on the connection (parsed once)', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    for (let i = 0; i < 3; i++) await plainOrder(pool, 'no-reset');
    const key = randomUUID();
    for (let i = 0; i < 3; i++) {
      await executeIdempotent(
        pool,
        { tenant: 't1', operation: 'c33-order', key, fingerprint: fingerprint('{}') },
        async () => ({ status: 201, body: {} }),
      );
    }
    const client = await pool.connect();
    try {
      const names = await outboxkitStatements(client);
      expect(
        names.some((n) => n.startsWith('outboxkit_enqueue_')),
        names.join(', '),
      ).toBe(true);
      expect(
        names.filter((n) => n.startsWith('outboxkit_idem_')),
        names.join(', '),
      ).toHaveLength(2);
    } finally {
      client.release();
    }
  });

  it('C33 after DEALLOCATE of one outboxkit statement by name, the next enqueue() on that connection still commits', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    await plainOrder(pool, 'deallocate-one');
    const client = await pool.connect();
    try {
      const [name] = (await outboxkitStatements(client)).filter((n) => n.startsWith('outboxkit_enqueue_'));
      expect(name).toBeDefined();
      await client.query(`DEALLOCATE ${name}`);
    } finally {
      client.release();
    }
    await plainOrder(pool, 'deallocate-one');
    await plainOrder(pool, 'deallocate-one');
    expect(await orderCount('deallocate-one')).toBe(3);
  });

  it('C33 a client in pipeline mode runs enqueue() unnamed, so a DEALLOCATE ALL between its transactions breaks nothing', async () => {
    const client = new pg.Client({ connectionString: db.url, pipeline: true } as pg.ClientConfig);
    await client.connect();
    try {
      for (let i = 0; i < 3; i++) {
        await client.query('BEGIN');
        const id = randomUUID();
        await client.query('INSERT INTO c33_orders (id, via) VALUES ($1, $2)', [id, 'pipeline']);
        await enqueue(client, event(id));
        expect(await outboxkitStatements(client)).toEqual([]);
        expect((await client.query('COMMIT')).command).toBe('COMMIT');
        await client.query('DEALLOCATE ALL');
      }
    } finally {
      await client.end();
    }
    expect(await orderCount('pipeline')).toBe(3);
  });

  it('C33 a DISCARD ALL sent by the application itself between transactions of one client does not break the next enqueue()', async () => {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      for (let i = 0; i < 4; i++) {
        await client.query('BEGIN');
        const id = randomUUID();
        await client.query('INSERT INTO c33_orders (id, via) VALUES ($1, $2)', [id, 'own-client']);
        await enqueue(client, event(id));
        expect((await client.query('COMMIT')).command).toBe('COMMIT');
        await client.query(i % 2 === 0 ? 'DISCARD ALL' : 'DEALLOCATE ALL');
      }
    } finally {
      await client.end();
    }
    expect(await orderCount('own-client')).toBe(4);
  });
});
