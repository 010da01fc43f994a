/**
 * C29 (../shared/cases/workloads.md): bulk transactions. enqueue() used to take one advisory lock
 * per distinct key until commit: with PostgreSQL's defaults (max_locks_per_transaction 64,
 * max_connections 100) a transaction of about 14,000 distinct keys failed with SQLSTATE 53200 "out
 * of shared memory", and while a large one was open, other sessions' small enqueues failed the
 * same way. Keys are now row-locked in outbox_key_locks, which takes no lock-table entry per key.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type pg from 'pg';
import { ENQUEUE_LOCK_TABLE_ENTRIES, enqueue, HEADER_EVENT_ID, withPgTransaction } from '../../src/index.js';
import { deletePublished } from '../../relay/sql.js';
import { createTestDatabase, pendingOn, type TestDatabase } from '../helpers/db.js';
import { createTopics, messagesIn, readTopic } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 24 });
  await db.pool.query(`
    CREATE TABLE imported (id text PRIMARY KEY, payload text NOT NULL);
    CREATE TABLE key_versions (key text PRIMARY KEY, v int NOT NULL);
    CREATE TABLE versions (event_id uuid PRIMARY KEY, v int NOT NULL);`);
  // The case is about PostgreSQL's defaults: a server with a larger lock table would hide it.
  const { rows } = await db.pool.query<{ n: string }>(`SELECT current_setting('max_locks_per_transaction') AS n`);
  expect(Number(rows[0]!.n), 'C29 runs against max_locks_per_transaction 64 (the default)').toBeLessThanOrEqual(64);
});
afterAll(async () => {
  await db.drop();
});

const event = (topic: string, key: string, payload: unknown = 1) => ({ topic, key, type: 'imported', payload });

/** Events of `count` distinct keys `<prefix>-<n>` (zero-padded: sorted order is number order). */
function keyed(topic: string, prefix: string, count: number) {
  return Array.from({ length: count }, (_, i) => event(topic, `${prefix}-${String(i).padStart(6, '0')}`, i));
}

const pending = (topic: string) => pendingOn(db.pool, topic);

/** Entries of the shared lock table that `pid` holds or waits for (pg_locks, fast path included). */
async function locksOf(pid: number): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_locks WHERE pid = $1', [pid]);
  return rows[0]!.n;
}

describe('C29 bulk transactions', () => {
  it('one transaction of 100,000 business rows and 100,000 events over 100,000 distinct keys commits, and the relay publishes them all', async () => {
    const [topic] = await createTopics(['c29-one'], { partitions: 6 });
    const events = keyed(topic!, 'one', 100_000);
    await withPgTransaction(db.pool, async (c) => {
      await c.query(
        `INSERT INTO imported SELECT 'one-' || lpad(g::text, 6, '0'), 'row ' || g FROM generate_series(0, 99999) AS g`,
      );
      const out = await enqueue(c, events);
      expect(out).toHaveLength(100_000);
    });
    expect(await pending(topic!)).toBe(100_000);
    await startRelay(db.url, { batchSize: 5_000, maxBatchBytes: 10_000_000 });
    await waitFor(async () => (await pending(topic!)) === 0, { timeoutMs: 120_000 });
    expect(await messagesIn(topic!)).toBeGreaterThanOrEqual(100_000);
  }, 240_000);

  it('4 imports of 25,000 distinct keys at once beside 8 ordinary writers: all commit, no writer waits on keys it does not share, per-key order holds for shared keys', async () => {
    const [bulkTopic, sharedTopic, ownTopic] = await createTopics(['c29-bulk', 'c29-shared', 'c29-own'], {
      partitions: 6,
    });
    const shared = Array.from({ length: 40 }, (_, i) => `shared-${String(i).padStart(2, '0')}`);
    await db.pool.query('INSERT INTO key_versions SELECT unnest($1::text[]), 0', [shared]);

    /**
     * A writer of shared keys takes each key's version from key_versions after enqueue(): the
     * key's row lock (taken by enqueue) orders the transactions, so versions count commits of the
     * key. Without per-key locking, seq (drawn at enqueue) would not follow that order.
     */
    async function writeShared(c: pg.PoolClient, keys: readonly string[]): Promise<void> {
      const out = await enqueue(
        c,
        keys.map((k) => event(sharedTopic!, k)),
      );
      const { rows } = await c.query<{ key: string; v: number }>(
        'UPDATE key_versions SET v = v + 1 WHERE key = ANY($1::text[]) RETURNING key, v',
        [[...keys]],
      );
      const version = new Map(rows.map((r) => [r.key, r.v]));
      await c.query('INSERT INTO versions SELECT unnest($1::uuid[]), unnest($2::int[])', [
        out.map((e) => e.eventId),
        out.map((e) => version.get(e.key!)!),
      ]);
    }

    let phase: 'before' | 'during' | 'done' = 'before';
    let before = 0;
    const errors: unknown[] = [];
    let ownCommits = 0;
    // Ordinary writers: one event of a key no import touches, with a lock timeout far below an
    // import's length (a writer made to wait for an import fails: 55P03; 1 s, not less: a writer
    // may wait briefly for the table's extension lock while imports grow it), and now and then a
    // shared key (which does wait for the imports that hold it). Their latency beside an import is
    // measured in bench/bulk-import.ts, where the import runs in a process of its own.
    const ordinary = async (w: number) => {
      for (let i = 0; phase !== 'done'; i++) {
        try {
          await withPgTransaction(db.pool, async (c) => {
            await c.query(`SET LOCAL lock_timeout = '1s'`);
            await enqueue(c, event(ownTopic!, `own-${w}-${i}`));
          });
          ownCommits++;
          if (phase === 'before') before++;
        } catch (err) {
          errors.push(err);
        }
        if (i % 10 === 0) {
          await withPgTransaction(db.pool, (c) => writeShared(c, [shared[(w * 7 + i) % shared.length]!])).catch(
            (err: unknown) => errors.push(err),
          );
        }
      }
    };
    const writers = Array.from({ length: 8 }, (_, w) => ordinary(w));
    await waitFor(() => before >= 200, { timeoutMs: 60_000 });
    phase = 'during';
    const imports = [0, 1, 2, 3].map((n) =>
      withPgTransaction(db.pool, async (c) => {
        await c.query(
          'INSERT INTO imported SELECT $1 || lpad(g::text, 6, $2), $3 FROM generate_series(0, 24999) AS g',
          [`imp${n}-`, '0', 'x'],
        );
        await enqueue(c, keyed(bulkTopic!, `imp${n}`, 25_000));
        await writeShared(c, shared);
      }),
    );
    await Promise.all(imports);
    phase = 'done';
    await Promise.all(writers);

    const describe = (e: unknown) => `${(e as { code?: string }).code ?? ''} ${String(e)}`;
    expect(errors.map(describe)).toEqual([]);
    expect(ownCommits).toBeGreaterThan(before);

    await startRelay(db.url, { batchSize: 5_000, maxBatchBytes: 10_000_000 });
    await waitFor(
      async () => (await pending(bulkTopic!)) + (await pending(sharedTopic!)) + (await pending(ownTopic!)) === 0,
      { timeoutMs: 120_000 },
    );
    expect(await messagesIn(bulkTopic!)).toBeGreaterThanOrEqual(100_000);
    expect(await messagesIn(ownTopic!)).toBeGreaterThanOrEqual(ownCommits);

    // Per-key order of the shared keys: first occurrences in version (commit) order.
    const { rows } = await db.pool.query<{ event_id: string; v: number }>('SELECT event_id, v FROM versions');
    const version = new Map(rows.map((r) => [r.event_id, r.v]));
    const seen = await readTopic(
      sharedTopic!,
      (m) => ({ key: m.key!, v: version.get(m.headers[HEADER_EVENT_ID]!) }),
      (all) => new Set(all.map((m) => `${m.key}/${m.v}`)).size >= version.size,
      60_000,
    );
    const last = new Map<string, number>();
    const firsts = new Set<string>();
    for (const { key, v } of seen) {
      if (v === undefined || firsts.has(`${key}/${v}`)) continue;
      firsts.add(`${key}/${v}`);
      expect(v, `key ${key}: version ${v} after ${last.get(key)}`).toBe((last.get(key) ?? 0) + 1);
      last.set(key, v);
    }
    expect(firsts.size).toBe(version.size);
  }, 300_000);

  it('transactions with disjoint keys never wait for each other, whatever order their calls take (no deadlock)', async () => {
    const [topic] = await createTopics(['c29-disjoint']);
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      for (const c of [a, b]) await c.query(`BEGIN; SET LOCAL lock_timeout = '1s'`);
      // 20,000 keys each in four calls, one transaction going up its keys, the other down.
      const up = keyed(topic!, 'up', 20_000);
      const down = keyed(topic!, 'down', 20_000).reverse();
      for (let i = 0; i < 4; i++) {
        await Promise.all([
          enqueue(a, up.slice(i * 5_000, (i + 1) * 5_000)),
          enqueue(b, down.slice(i * 5_000, (i + 1) * 5_000)),
        ]);
      }
      await Promise.all([a.query('COMMIT'), b.query('COMMIT')]);
    } finally {
      a.release();
      b.release();
    }
    expect(await pending(topic!)).toBe(40_000);
  }, 120_000);

  it(`an enqueue() call takes at most ENQUEUE_LOCK_TABLE_ENTRIES (${ENQUEUE_LOCK_TABLE_ENTRIES}) lock-table entries, whatever its number of keys`, async () => {
    const [topic] = await createTopics(['c29-locks']);
    const counts: number[] = [];
    for (const n of [1, 20_000]) {
      const c = await db.pool.connect();
      try {
        const { rows } = await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        await c.query('BEGIN');
        await enqueue(c, keyed(topic!, `locks${n}`, n));
        counts.push(await locksOf(rows[0]!.pid));
        await c.query('COMMIT');
      } finally {
        c.release();
      }
    }
    // The advisory-lock code held one entry per key here (or failed with 53200).
    for (const n of counts) expect(n).toBeLessThanOrEqual(ENQUEUE_LOCK_TABLE_ENTRIES);
  }, 60_000);

  it('a writer of a key waits for the open transaction that holds it, and its seq follows that commit, also when the key first appears in the first transaction', async () => {
    const [topic] = await createTopics(['c29-wait']);
    const first = await db.pool.connect();
    try {
      await first.query('BEGIN');
      // A new key and, in the same call, many others: the lock on 'new-key' is taken before any seq.
      const [held] = await enqueue(first, [event(topic!, 'new-key'), ...keyed(topic!, 'many', 1_000)]);
      let done = false;
      const second = withPgTransaction(db.pool, (c) =>
        enqueue(c, [event(topic!, 'another'), event(topic!, 'new-key', 2)]),
      ).then((r) => {
        done = true;
        return r;
      });
      await waitFor(async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rows[0]!.n > 0;
      });
      expect(done).toBe(false);
      await first.query('COMMIT');
      const out = await second;
      const later = out.find((e) => e.key === 'new-key')!;
      expect(BigInt(later.seq)).toBeGreaterThan(BigInt(held!.seq));
      // 'another' was drawn after the wait too: no seq of the waiting call precedes the first
      // call's last one ('new-key' sorts after 'many-…', so it drew the first call's last seq).
      expect(BigInt(out.find((e) => e.key === 'another')!.seq)).toBeGreaterThan(BigInt(held!.seq));
    } finally {
      first.release();
    }
  });

  it('REPEATABLE READ: a writer whose snapshot predates another writer’s first event of a key gets SQLSTATE 40001 and its retry commits in order; a key seen before just waits', async () => {
    const [topic] = await createTopics(['c29-rr']);
    await withPgTransaction(db.pool, (c) => enqueue(c, event(topic!, 'rr-old')));
    for (const key of ['rr-new', 'rr-old']) {
      const first = await db.pool.connect();
      const second = await db.pool.connect();
      try {
        await first.query('BEGIN');
        await second.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        await second.query('SELECT 1'); // the snapshot is taken here
        const [a] = await enqueue(first, event(topic!, key));
        const pending = enqueue(second, event(topic!, key)).then(
          (r) => r,
          (err: unknown) => err as Error & { code?: string },
        );
        await first.query('COMMIT');
        const result = await pending;
        if (key === 'rr-new') {
          expect((result as { code?: string }).code).toBe('40001');
          await second.query('ROLLBACK');
          await second.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
          const [b] = await enqueue(second, event(topic!, key));
          await second.query('COMMIT');
          expect(BigInt(b!.seq)).toBeGreaterThan(BigInt(a!.seq));
        } else {
          expect(Array.isArray(result), String(result)).toBe(true);
          await second.query('COMMIT');
          expect(BigInt((result as { seq: string }[])[0]!.seq)).toBeGreaterThan(BigInt(a!.seq));
        }
      } finally {
        first.release();
        second.release();
      }
    }
  });

  it('retention deletes the key-lock rows of the keys whose events it deletes, and skips one a writer holds', async () => {
    const [topic] = await createTopics(['c29-retention']);
    await withPgTransaction(db.pool, (c) => enqueue(c, keyed(topic!, 'ret', 100)));
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET published_at = now() - interval '2 days' WHERE topic = $1`,
      [topic],
    );
    const keyRows = async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks
          WHERE key_hash IN (SELECT hashtextextended(key, 7) FROM outboxkit.outbox_events WHERE topic = $1)`,
        [topic],
      );
      return rows[0]!.n;
    };
    expect(await keyRows()).toBe(100);
    const holder = await db.pool.connect();
    try {
      await holder.query('BEGIN');
      await enqueue(holder, event(topic!, 'ret-000007', 'held'));
      const before = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks');
      const deleted = await deletePublished(db.pool, 'outboxkit', { retentionMs: 86_400_000, batchSize: 1_000 });
      expect(deleted).toBe(100);
      const after = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks');
      // 99 key rows gone; the held one stays (and was not waited for).
      expect(before.rows[0]!.n - after.rows[0]!.n).toBe(99);
      await holder.query('COMMIT');
    } finally {
      holder.release();
    }
  });
});
