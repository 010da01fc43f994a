import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { drizzle } from 'drizzle-orm/node-postgres';
import { createOutbox, enqueue, isOutboxkitError } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

const event = (over: Record<string, unknown> = {}) => ({
  topic: 'orders',
  key: 'k1',
  type: 'order.created',
  payload: { a: 1 },
  ...over,
});

async function count(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events');
  return rows[0]!.n;
}

/** A drizzle database, whatever its driver: its transaction callback's handle is what enqueue() takes. */
interface DrizzleLike<Tx> {
  transaction<T>(run: (tx: Tx) => Promise<T>): Promise<T>;
}

/**
 * enqueue() in a drizzle transaction: a rollback leaves no row, a commit leaves it, and the
 * transaction handle kept after its callback ended is refused (nothing written).
 */
async function rollsBackAndRefusesLateUse<Tx extends Parameters<typeof enqueue>[0]>(orm: DrizzleLike<Tx>) {
  const before = await count();
  await orm
    .transaction(async (tx) => {
      await enqueue(tx, event());
      throw new Error('rollback');
    })
    .catch(() => undefined);
  expect(await count()).toBe(before);
  let leaked: Tx | undefined;
  await orm.transaction(async (tx) => {
    await enqueue(tx, event());
    leaked = tx;
  });
  expect(await count()).toBe(before + 1);
  const late = await enqueue(leaked!, event()).catch((e: unknown) => e);
  expect(isOutboxkitError(late, 'OUTBOXKIT_NOT_IN_TRANSACTION'), String(late)).toBe(true);
  expect(await count()).toBe(before + 1);
}

describe('enqueue()', () => {
  it('writes in the caller transaction: a rollback leaves no row, a commit leaves it', async () => {
    const before = await count();
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await enqueue(client, event());
      await client.query('ROLLBACK');
      expect(await count()).toBe(before);
      await client.query('BEGIN');
      const [written] = await enqueue(client, event());
      await client.query('COMMIT');
      expect(written?.eventId).toMatch(/^[0-9a-f-]{36}$/);
      expect(await count()).toBe(before + 1);
    } finally {
      client.release();
    }
  });

  describe('C23 phantom events: writing outside the transaction', () => {
    it('refuses a pool, and nothing is written', async () => {
      const before = await count();
      // @ts-expect-error a pool is refused by type
      const err = await enqueue(db.pool, event()).catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
      expect(await count()).toBe(before);
    });

    it('refuses a client outside BEGIN and one in an aborted transaction', async () => {
      const client = await db.pool.connect();
      try {
        const outside = await enqueue(client, event()).catch((e: unknown) => e);
        expect(isOutboxkitError(outside, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
        await client.query('BEGIN');
        await client.query('SELECT 1/0').catch(() => undefined);
        const aborted = await enqueue(client, event()).catch((e: unknown) => e);
        expect(isOutboxkitError(aborted, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
    });

    it('with node-postgres before 8.21 (no getTransactionStatus): refuses a client outside BEGIN, after COMMIT and in an aborted transaction, and rolls back with one inside', async () => {
      // A real older node-postgres, as an application may pin it: its clients cannot tell their
      // transaction status, so the database is asked.
      const OldPool = (await import('pg-8-20')).default.Pool;
      const old = new OldPool({ connectionString: db.url, max: 1 });
      const client = await old.connect();
      expect(typeof (client as { getTransactionStatus?: unknown }).getTransactionStatus).toBe('undefined');
      const refused = async () => {
        const err = await enqueue(client, event()).catch((e: unknown) => e);
        expect(isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
      };
      try {
        const before = await count();
        await refused(); // no BEGIN yet
        await client.query('BEGIN');
        await enqueue(client, event());
        await client.query('ROLLBACK');
        expect(await count()).toBe(before);
        await client.query('BEGIN');
        await enqueue(client, event());
        await client.query('COMMIT');
        expect(await count()).toBe(before + 1);
        await refused(); // after COMMIT
        await client.query('BEGIN');
        await client.query('SELECT 1/0').catch(() => undefined);
        await refused(); // aborted
        await client.query('ROLLBACK');
        expect(await count()).toBe(before + 1);
      } finally {
        client.release();
        await old.end();
      }
    });

    it('with drizzle over node-postgres before 8.21: a tx used after its callback ended is refused', async () => {
      const OldPool = (await import('pg-8-20')).default.Pool;
      const old = new OldPool({ connectionString: db.url, max: 1 });
      try {
        await rollsBackAndRefusesLateUse(drizzle(old));
      } finally {
        await old.end();
      }
    });

    it('refuses an object that only offers query() when it runs outside a transaction', async () => {
      const before = await count();
      const wrapper = { query: db.pool.query.bind(db.pool) }; // e.g. a "db" helper around a pool
      const err = await enqueue(wrapper, event()).catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
      expect(await count()).toBe(before);
    });

    it('refuses the top-level drizzle db, accepts its transaction, and rolls back with it', async () => {
      const orm = drizzle(db.pool);
      const before = await count();
      // @ts-expect-error the top-level db is refused by type
      const err = await enqueue(orm, event()).catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
      expect(await count()).toBe(before);
      await rollsBackAndRefusesLateUse(orm);
    });
  });

  it('rejects invalid events before writing anything, even when others in the call are valid', async () => {
    const before = await count();
    const outbox = createOutbox({ maxPayloadBytes: 100 });
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      for (const bad of [
        event({ topic: '' }),
        event({ topic: 'has space' }),
        event({ type: '' }),
        event({ payload: 10n }),
        event({ payload: undefined }),
        event({ payload: 'x'.repeat(200) }),
        event({ eventId: 'not-a-uuid' }),
        event({ headers: { a: 1 } }),
        // PostgreSQL refuses these in jsonb, which would abort the caller's transaction.
        event({ headers: { a: '\ud800' } }),
        event({ headers: { ['\udc00']: 'v' } }),
        event({ key: 'k\ud800' }),
        event({ payload: new Map([['a', 1]]) }),
        event({ payload: { n: Number.NaN } }),
        event({ payload: { at: new Date(Number.NaN) } }),
        // Headers count against maxHeaderBytes (16 KiB by default), not against the payload limit.
        event({ headers: { big: 'x'.repeat(16_384) } }),
        // A typo of a field name would otherwise drop its value silently.
        event({ paylaod: { a: 1 } }),
        event({ aggregate_id: 'o-1' }),
      ]) {
        const err = await outbox.enqueue(client, [event(), bad]).catch((e: unknown) => e);
        expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT'), String(err)).toBe(true);
      }
      // The caller's transaction is still usable (an aborted one would fail this with 25P02).
      await client.query('SELECT 1');
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    expect(await count()).toBe(before);
  });

  it("bounds the headers, the relay's own included, by maxHeaderBytes; refuses unknown or out-of-range options", async () => {
    const outbox = createOutbox({ maxHeaderBytes: 100 });
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      // event-id (8 + 36 bytes) and event-type (10 + 13 bytes) leave 33 bytes for the given headers.
      await outbox.enqueue(client, event({ headers: { h: 'x'.repeat(32) } }));
      const err = await outbox.enqueue(client, event({ headers: { h: 'x'.repeat(33) } })).catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT'), String(err)).toBe(true);
      expect(String((err as Error).message)).toContain('101 bytes');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    for (const bad of [
      { maxPayloadBytes: 0 },
      { maxPayloadBytes: 2 ** 31 },
      { maxHeaderBytes: 1.5 },
      { maxPayloadByte: 10 }, // a typo must not pass silently
    ]) {
      expect(() => createOutbox(bad as never), JSON.stringify(bad)).toThrow(
        expect.objectContaining({ code: 'OUTBOXKIT_INVALID_OPTIONS' }),
      );
    }
    expect(() => createOutbox({ maxPayloadByte: 10 } as never)).toThrow(/"maxPayloadByte"/);
  });

  it('stores payloads as bytes, byte for byte (C10)', async () => {
    const client = await db.pool.connect();
    const raw = Buffer.from('{"id":9007199254740993,"amt":"0010"}');
    try {
      await client.query('BEGIN');
      const [a, b] = await enqueue(client, [event({ payload: raw }), event({ payload: '"quoted"' })]);
      await client.query('COMMIT');
      const { rows } = await db.pool.query<{ event_id: string; payload: Buffer }>(
        'SELECT event_id, payload FROM outboxkit.outbox_events WHERE event_id = ANY($1::uuid[])',
        [[a!.eventId, b!.eventId]],
      );
      const byId = new Map(rows.map((r) => [r.event_id, r.payload]));
      expect(byId.get(a!.eventId)!.equals(raw)).toBe(true);
      expect(byId.get(b!.eventId)!.toString()).toBe('"\\"quoted\\""');
    } finally {
      client.release();
    }
  });
});

describe('enqueue() with drizzle over postgres-js', () => {
  it('refuses a postgres-js drizzle tx used after its callback ended (its connection outside any transaction)', async () => {
    const { default: postgres } = await import('postgres');
    const { drizzle: drizzlePg } = await import('drizzle-orm/postgres-js');
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    const orm = drizzlePg(sql);
    try {
      const before = await count();
      let leaked: Parameters<Parameters<typeof orm.transaction>[0]>[0] | undefined;
      await orm.transaction(async (tx) => {
        await enqueue(tx, event({ key: 'pgjs-leak' }));
        leaked = tx;
      });
      expect(await count()).toBe(before + 1);
      const late = await enqueue(leaked!, event({ key: 'pgjs-leak' })).catch((e: unknown) => e);
      expect(isOutboxkitError(late, 'OUTBOXKIT_NOT_IN_TRANSACTION'), String(late)).toBe(true);
      expect(await count()).toBe(before + 1);
    } finally {
      await sql.end();
    }
  });

  it('joins the transaction: commit keeps the rows, a rollback leaves none, the top-level db is refused', async () => {
    const { default: postgres } = await import('postgres');
    const { drizzle: drizzlePg } = await import('drizzle-orm/postgres-js');
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    const orm = drizzlePg(sql);
    try {
      const before = await count();
      // @ts-expect-error the top-level db is refused by type
      const refused = await enqueue(orm, event()).catch((e: unknown) => e);
      expect(isOutboxkitError(refused, 'OUTBOXKIT_NOT_IN_TRANSACTION')).toBe(true);
      await orm
        .transaction(async (tx) => {
          await enqueue(tx, event({ key: 'pgjs' }));
          throw new Error('rollback');
        })
        .catch(() => undefined);
      expect(await count()).toBe(before);
      const raw = Buffer.from('{"n":9007199254740993}');
      const written = await orm.transaction(async (tx) =>
        enqueue(tx, [event({ key: 'pgjs', payload: raw }), event({ key: 'pgjs' })]),
      );
      expect(written).toHaveLength(2);
      expect(written.every((w) => /^\d+$/.test(w.seq))).toBe(true);
      expect(await count()).toBe(before + 2);
      const { rows } = await db.pool.query<{ payload: Buffer }>(
        'SELECT payload FROM outboxkit.outbox_events WHERE event_id = $1',
        [written[0]!.eventId],
      );
      expect(rows[0]!.payload.equals(raw)).toBe(true);
    } finally {
      await sql.end();
    }
  });
});

describe('enqueue() edge cases', () => {
  it('reports an event id that already exists as InvalidEventError, writes nothing of the call, keeps the transaction usable', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      const [first] = await enqueue(client, event());
      const count = async () =>
        Number((await client.query('SELECT count(*) AS n FROM outboxkit.outbox_events')).rows[0].n);
      const before = await count();
      // The valid events of the call sort before and after the duplicate (keys 'a…' and 'z…').
      const err = await enqueue(client, [
        event({ key: 'a-valid' }),
        event({ eventId: first!.eventId }),
        event({ key: 'z-valid' }),
      ]).catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
      expect(String((err as Error).message)).toContain(first!.eventId);
      // Nothing of the failed call, and the transaction still usable: a caller that catches the
      // error and commits publishes only what it wrote before.
      expect(await count()).toBe(before);
      await client.query('COMMIT');
      const { rows } = await db.pool.query('SELECT key FROM outboxkit.outbox_events WHERE key IN ($1, $2)', [
        'a-valid',
        'z-valid',
      ]);
      expect(rows).toEqual([]);
    } finally {
      client.release();
    }
  });

  it('reports missing tables as SchemaMissingError', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      const err = await createOutbox({ schema: 'not_migrated' })
        .enqueue(client, event())
        .catch((e: unknown) => e);
      expect(isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
  });
});
