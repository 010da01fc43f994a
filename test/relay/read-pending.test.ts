/**
 * The relay's read statement (relay/sql.ts readPending) against the real PostgreSQL, under both
 * plans PostgreSQL may run a prepared statement with: custom (parameters as constants) and generic
 * (parameters unknown at planning, what a named statement settles on after a few executions).
 * Rows come in numeric seq order, excluded seqs (a batch in flight, rows waiting for their
 * marking) are skipped and nothing else is, the byte bound holds, and `page_rows` says how many
 * rows the page found before it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { laneOf } from '../../src/outbox/event.js';
import type { Queryable } from '../../src/database.js';
import { OUTBOX_LANES } from '../../src/constants.js';
import { readPending } from '../../relay/sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

const allLanes = Array.from({ length: OUTBOX_LANES }, (_, i) => i);

/** A one-connection Queryable whose session runs prepared statements with the given plan mode. */
async function session(
  planMode: 'force_custom_plan' | 'force_generic_plan',
): Promise<Queryable & { end(): Promise<void> }> {
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  await client.query(`SET plan_cache_mode = ${planMode}`);
  return {
    async query<R>(text: string, values?: readonly unknown[], options?: { name?: string }) {
      const r = await client.query({ text, values: values as unknown[], name: options?.name });
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
    end: () => client.end(),
  };
}

/** Inserts `n` pending rows of `bytes` payload bytes; returns their seqs in insertion order. */
async function insert(n: number, bytes = 10, key = (i: number) => `k${i % 7}`): Promise<string[]> {
  const keys = Array.from({ length: n }, (_, i) => key(i));
  const { rows } = await db.pool.query<{ seq: string }>(
    `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload)
     SELECT gen_random_uuid(), 't', k.key, k.lane, 'e', convert_to(rpad('x', $3, 'x'), 'UTF8')
       FROM unnest($1::text[], $2::smallint[]) WITH ORDINALITY AS k(key, lane, n)
      ORDER BY k.n
     RETURNING seq::text`,
    [keys, keys.map(laneOf), bytes],
  );
  return rows.map((r) => r.seq).sort((a, b) => Number(a) - Number(b));
}

describe.each(['force_custom_plan', 'force_generic_plan'] as const)('readPending (%s)', (planMode) => {
  beforeAll(async () => {
    await db.pool.query('TRUNCATE outboxkit.outbox_events');
    // Seqs that cross from 5 to 6 digits: text order would put 100000 before 99996.
    await db.pool.query(`ALTER TABLE outboxkit.outbox_events ALTER COLUMN seq RESTART WITH 99990`);
  });

  it('returns rows in numeric seq order, skips exactly the excluded seqs, and counts the page', async () => {
    await db.pool.query('TRUNCATE outboxkit.outbox_events');
    const seqs = await insert(30);
    expect(seqs.some((s) => s.length === 5) && seqs.some((s) => s.length === 6)).toBe(true);
    const s = await session(planMode);
    try {
      // Several executions: a named statement's generic plan is used from the sixth on.
      for (let round = 0; round < 7; round++) {
        const all = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 1_000_000,
          holdKeys: true,
          exclude: [],
        });
        expect(all.map((r) => r.seq)).toEqual(seqs);
        expect(all[0]!.page_rows).toBe(30);

        // The first 12 in flight, and two later ones waiting for their marking: excluded; a seq
        // that is not pending at all (excluded or not) changes nothing.
        const excluded = [...seqs.slice(0, 12), seqs[20]!, seqs[25]!, '1'];
        const rest = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 10,
          maxBytes: 1_000_000,
          holdKeys: true,
          exclude: excluded,
        });
        const expected = seqs.filter((q) => !excluded.includes(q));
        expect(rest.map((r) => r.seq)).toEqual(expected.slice(0, 10));
        expect(rest[0]!.page_rows).toBe(10);
        const tail = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 1_000_000,
          holdKeys: true,
          exclude: excluded,
        });
        expect(tail.map((r) => r.seq)).toEqual(expected);
        expect(tail[0]!.page_rows).toBe(expected.length);
      }
    } finally {
      await s.end();
    }
  });

  it('bounds a read by payload bytes, always returns the first row, and reads only the given lanes', async () => {
    await db.pool.query('TRUNCATE outboxkit.outbox_events');
    const seqs = await insert(6, 400);
    const s = await session(planMode);
    try {
      for (let round = 0; round < 7; round++) {
        const two = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 999,
          holdKeys: true,
          exclude: [],
        });
        expect(two.map((r) => r.seq)).toEqual(seqs.slice(0, 2));
        expect(two[0]!.page_rows).toBe(6); // more rows are pending than were returned
        expect(two[0]!.payload).toEqual(Buffer.from('x'.repeat(400)));
        const one = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 1,
          holdKeys: true,
          exclude: [],
        });
        expect(one.map((r) => r.seq)).toEqual(seqs.slice(0, 1));
        const lane = laneOf('k0');
        const own = await readPending(s, 'outboxkit', { lanes: [lane], maxRows: 100, maxBytes: 1_000_000 });
        expect(own.length).toBeGreaterThan(0);
        expect(own.every((r) => r.lane === lane)).toBe(true);
      }
    } finally {
      await s.end();
    }
  });

  it('holds back the later rows of a key whose earlier row is in backoff, and no other key', async () => {
    await db.pool.query('TRUNCATE outboxkit.outbox_events');
    const seqs = await insert(6, 10, (i) => (i % 2 === 0 ? 'held' : 'free'));
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET next_attempt_at = now() + interval '1 hour' WHERE seq = $1`,
      [seqs[0]],
    );
    const s = await session(planMode);
    try {
      for (let round = 0; round < 7; round++) {
        const rows = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 1_000_000,
          holdKeys: true,
          exclude: [],
        });
        expect(rows.map((r) => r.key)).toEqual(['free', 'free', 'free']);
        const unheld = await readPending(s, 'outboxkit', {
          lanes: allLanes,
          maxRows: 100,
          maxBytes: 1_000_000,
          holdKeys: false,
          exclude: [],
        });
        expect(unheld.map((r) => r.seq)).toEqual(seqs.slice(1));
      }
    } finally {
      await s.end();
    }
  });
});
