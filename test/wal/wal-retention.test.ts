/**
 * The WAL relay's retention cleanup (relay/cleanup.ts, run by relay/wal/wal-relay.ts) against the
 * real PostgreSQL at wal_level=logical and the real broker. The WAL relay deletes the rows it
 * publishes at once; rows marked published by other paths (a table relay before a switch to WAL
 * mode, `outboxkit parked skip`) used to stay forever. The relay holding the slot's lease now
 * deletes them past `publishedRetentionMs` (at least 65 min, `EVENT_ID_REUSE_WINDOW_MS`), as the
 * table relay does, while it streams; a standby deletes nothing; a failed cleanup is a warning.
 * Each test names the breach it catches.
 *
 * Rows "published two hours ago" are inserted before the test's slot is made (so the stream never
 * brings them, as a table relay's rows before a switch), with `published_at` set then.
 */
import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { skipParked } from '../../relay/sql.js';
import { createWalRelay, type WalRelay, type WalRelayOptions } from '../../relay/wal/wal-relay.js';
import { withPgTransaction } from '../../src/database.js';
import type { Logger } from '../../src/logger.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { waitForSlotInactive, walRelayTestFile } from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_wal_retention';
const outbox = createOutbox({ source: 'wal' });

const file = walRelayTestFile(PUBLICATION);
const { relays } = file;
let db: TestDatabase;
beforeAll(() => {
  db = file.db;
});

/** Cleans every 100 ms, in batches of 100; retention 1 min (65 min in effect: the floor). */
const RETENTION: Partial<WalRelayOptions> = {
  publishedRetentionMs: 60_000,
  cleanupIntervalMs: 100,
  cleanupBatchSize: 100,
  cleanupRowsPerSecond: 0,
};

async function startRelay(
  slot: string,
  options: Partial<WalRelayOptions> = {},
): Promise<WalRelay & { cleaned: number[] }> {
  const relay = createWalRelay(file.relayOptions(slot, { ...RETENTION, ...options }));
  relays.push(relay);
  const cleaned: number[] = [];
  relay.on('wal:cleaned', ({ deleted }) => cleaned.push(deleted));
  await relay.start();
  return Object.assign(relay, { cleaned });
}

/**
 * `count` rows of `topic`, as a table relay leaves them: published `publishedAgo` ago (a
 * PostgreSQL interval; null: pending), created a day before, with their key-lock rows; `parked`
 * also parked (with an operator's skip in `last_error` when published).
 */
async function seed(
  topic: string,
  count: number,
  publishedAgo: string | null,
  options: { parked?: boolean } = {},
): Promise<void> {
  await db.pool.query(
    `WITH keys AS (SELECT $1 || '-' || g AS key, g FROM generate_series(1, $2::int) AS g),
          locks AS (INSERT INTO outboxkit.outbox_key_locks SELECT hashtextextended(key, 7) FROM keys ON CONFLICT DO NOTHING)
     INSERT INTO outboxkit.outbox_events
            (event_id, topic, key, lane, type, payload, headers, created_at, published_at, parked_at, last_error)
     SELECT gen_random_uuid(), $1, key, g % 64, 't', '\\x7b7d', '{}', now() - interval '1 day',
            now() - $3::interval, CASE WHEN $4 THEN now() - interval '1 day' END,
            CASE WHEN $4 THEN 'KafkaJSProtocolError: too large [skipped by operator]' END
       FROM keys`,
    [topic, count, publishedAgo, options.parked === true],
  );
}

/** The rows of `topic` left, and how many of them are published. */
async function rowsOf(topic: string): Promise<{ rows: number; published: number }> {
  const { rows } = await db.pool.query<{ rows: number; published: number }>(
    `SELECT count(*)::int AS rows, count(published_at)::int AS published FROM outboxkit.outbox_events WHERE topic = $1`,
    [topic],
  );
  return rows[0]!;
}

/** Enqueues `transactions` transactions of `perTransaction` events of `topic` through the WAL writer. */
async function enqueueMany(topic: string, transactions: number, perTransaction: number): Promise<string[]> {
  const ids: string[] = [];
  for (let t = 0; t < transactions; t++) {
    const written = await withPgTransaction(db.pool, (c) =>
      outbox.enqueue(
        c,
        Array.from({ length: perTransaction }, (_, i) => ({
          topic,
          key: `k${(t * perTransaction + i) % 7}`,
          type: 'test.event',
          payload: { t, i },
        })),
      ),
    );
    ids.push(...written.map((e) => e.eventId));
  }
  return ids;
}

/**
 * The `event-id`s on `topic` (one partition: commit order), read until `count` distinct ones came,
 * each at its first occurrence (a new reader may bring again what the former one had not confirmed).
 */
async function eventIdsOn(topic: string, count: number): Promise<string[]> {
  const all = await readTopic(
    topic,
    ({ headers }) => headers['event-id']!,
    (read) => new Set(read).size >= count,
    30_000,
  );
  return [...new Set(all)];
}

const tick = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('WAL relay retention', () => {
  // Breach caught: published rows left forever in WAL mode (no cleanup in the WAL relay: a table
  // relay's rows after a switch, rows `parked skip` marked), or a cleanup that deletes pending or
  // parked rows, or published rows within the 65-min event-id reuse window, or that holds the
  // stream back (events not all published meanwhile).
  it('deletes rows published past retention while it streams; pending, parked and recent rows stay', async () => {
    const [topic] = await createTopics(['wal-retention'], { partitions: 1 });
    const suffix = randomBytes(3).toString('hex');
    const old = `ret-old-${suffix}`;
    const skipped = `ret-skipped-${suffix}`;
    const recent = `ret-recent-${suffix}`;
    const justNow = `ret-just-now-${suffix}`;
    const pending = `ret-pending-${suffix}`;
    const parked = `ret-parked-${suffix}`;
    await db.pool.query('DELETE FROM outboxkit.outbox_key_locks');
    await seed(old, 1_000, '2 hours');
    await seed(skipped, 3, '2 hours', { parked: true });
    await seed(recent, 20, '30 minutes'); // past publishedRetentionMs, within the floor
    await seed(justNow, 20, '1 minute');
    await seed(pending, 20, null);
    await seed(parked, 5, null, { parked: true });
    const slot = await file.createStreamingSlot('retention');

    // Paced (1,000 rows/s: about a second for the backlog) so that it runs beside the stream.
    const relay = await startRelay(slot, { cleanupRowsPerSecond: 1_000 });
    const ids = await enqueueMany(topic!, 40, 5);
    await waitFor(async () => (await rowsOf(old)).rows === 0 && (await rowsOf(skipped)).rows === 0, {
      timeoutMs: 30_000,
      message: () => `old rows left (stats ${JSON.stringify(relay.stats())})`,
    });
    expect(await eventIdsOn(topic!, ids.length)).toEqual(ids);
    await waitFor(async () => (await rowsOf(topic!)).rows === 0, {
      timeoutMs: 10_000,
      message: 'the streamed rows were not deleted',
    });

    expect(await rowsOf(recent)).toEqual({ rows: 20, published: 20 });
    expect(await rowsOf(justNow)).toEqual({ rows: 20, published: 20 });
    expect(await rowsOf(pending)).toEqual({ rows: 20, published: 0 });
    expect(await rowsOf(parked)).toEqual({ rows: 5, published: 0 });
    expect(relay.cleaned.reduce((a, b) => a + b, 0)).toBe(1_003);
    expect(relay.stats()).toMatchObject({ cleaned: 1_003, published: ids.length });
    // The key-lock rows of the deleted table-mode rows went with them (those of the rows kept stay).
    const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks');
    expect(rows[0]!.n).toBe(20 + 20 + 20 + 5);
  });

  // Breach caught: the rows `outboxkit parked skip` marks published in WAL mode never deleted (the
  // relay parks an event in its row; skip marks it published; nothing else deletes it).
  it('deletes a parked event the operator skipped once it is past retention', async () => {
    const [topic] = await createTopics(['wal-retention-skip'], {
      partitions: 1,
      configEntries: [{ name: 'max.message.bytes', value: '2000' }],
    });
    const slot = await file.createStreamingSlot('retention_skip');
    const relay = await startRelay(slot);
    const [large] = await withPgTransaction(db.pool, (c) =>
      outbox.enqueue(c, { topic: topic!, key: 'big', type: 'test.event', payload: Buffer.alloc(5_000, 1) }),
    );
    await waitFor(() => relay.stats().parked === 1, { timeoutMs: 15_000, message: 'the large event was not parked' });
    expect(await skipParked(db.pool, 'outboxkit', [large!.eventId])).toBe(1);
    // Within the reuse window it stays; two hours later (published_at moved back) it goes.
    await tick(500);
    expect(await rowsOf(topic!)).toEqual({ rows: 1, published: 1 });
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET published_at = published_at - interval '2 hours' WHERE event_id = $1`,
      [large!.eventId],
    );
    await waitFor(async () => (await rowsOf(topic!)).rows === 0, {
      timeoutMs: 10_000,
      message: 'the skipped row was not deleted',
    });
    expect(relay.stats().cleaned).toBe(1);
  });

  // Breach caught: a cleanup run by every WAL relay of the slot (a standby, or a relay that lost
  // the lease, deleting beside the reader), or by none once the lease changed hands.
  it('only the relay holding the slot lease deletes; a standby on the same slot does not', async () => {
    const [topic] = await createTopics(['wal-retention-standby'], { partitions: 1 });
    const suffix = randomBytes(3).toString('hex');
    // Published just now (kept), before the slot: moved past retention once A stands by (an
    // UPDATE, which the publication does not stream).
    const old = `ret-standby-${suffix}`;
    await seed(old, 300, '1 second');
    const slot = await file.createStreamingSlot('retention_standby');
    const idA = `retention-a-${suffix}`;
    const idB = `retention-b-${suffix}`;
    // A renews its lease every second, and loses it at the first renewal after B took it.
    const a = await startRelay(slot, { relayId: idA, leaseMs: 3_000, brokerTimeoutMs: 1_000 });
    const before = await enqueueMany(topic!, 2, 2);
    await waitFor(() => a.stats().published === before.length, { timeoutMs: 15_000, message: 'A published nothing' });
    // B takes the lease over as a takeover does (a new owner, the fencing token raised); A, its
    // renewal refused, stops its reader and stands by, polling the lease.
    await db.pool.query(
      `UPDATE outboxkit.wal_slot_leases
          SET owner_id = $2, instance_id = NULL, fencing_token = fencing_token + 1,
              lease_expires_at = now() + interval '1 hour'
        WHERE slot_name = $1`,
      [slot, idB],
    );
    await waitFor(() => !a.stats().leaseHeld && a.stats().standbyOf === idB, {
      timeoutMs: 10_000,
      message: () => `A did not stand by: ${JSON.stringify(a.stats())}`,
    });
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET published_at = published_at - interval '2 hours' WHERE topic = $1`,
      [old],
    );
    // Twenty of A's cleanup intervals, and a lease poll or two: a standby deletes nothing.
    await tick(2_000);
    expect(await rowsOf(old)).toEqual({ rows: 300, published: 300 });
    expect(a.cleaned).toEqual([]);

    // B starts under the lease's owner id (its former walsender, A's, has ended) and reads.
    await waitForSlotInactive(db.pool, slot);
    const b = await startRelay(slot, { relayId: idB });
    expect(b.stats().leaseHeld).toBe(true);
    const after = await enqueueMany(topic!, 5, 2);
    await waitFor(async () => (await rowsOf(old)).rows === 0, {
      timeoutMs: 15_000,
      message: 'the reader did not delete the old rows',
    });
    expect(b.cleaned.reduce((x, y) => x + y, 0)).toBe(300);
    expect(a.cleaned).toEqual([]);
    expect(a.stats()).toMatchObject({ leaseHeld: false, standbyOf: idB, cleaned: 0 });
    expect(await eventIdsOn(topic!, before.length + after.length)).toEqual([...before, ...after]);
  });

  // Breach caught: a failing cleanup that stops or holds the stream (or the relay), that is not
  // reported, or that is not tried again once the cause is gone.
  it('logs a failed cleanup as a warning, streams on, and deletes once the failure is gone', async () => {
    const [topic] = await createTopics(['wal-retention-fail'], { partitions: 1 });
    const old = `ret-fail-${randomBytes(3).toString('hex')}`;
    await seed(old, 50, '2 hours');
    // Every DELETE of these rows fails (the stream's deletes of other topics go through).
    await db.pool.query(
      `CREATE FUNCTION outboxkit.refuse_retention_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF OLD.topic = '${old}' THEN RAISE EXCEPTION 'retention delete refused by the test'; END IF; RETURN OLD; END $$;
       CREATE TRIGGER refuse_retention_delete BEFORE DELETE ON outboxkit.outbox_events
         FOR EACH ROW EXECUTE FUNCTION outboxkit.refuse_retention_delete();`,
    );
    try {
      const slot = await file.createStreamingSlot('retention_fail');
      const warnings: [Record<string, unknown>, string][] = [];
      const logger: Logger = { debug() {}, info() {}, error() {}, warn: (obj, msg) => warnings.push([obj, msg]) };
      const relay = await startRelay(slot, { logger });
      await waitFor(() => warnings.filter(([, msg]) => msg === 'published-row cleanup failed').length >= 3, {
        timeoutMs: 10_000,
        message: () => `no cleanup warnings: ${JSON.stringify(warnings.map(([, m]) => m))}`,
      });
      const failure = warnings.find(([, msg]) => msg === 'published-row cleanup failed')!;
      expect(String((failure[0].err as Error).message)).toContain('retention delete refused by the test');
      const ids = await enqueueMany(topic!, 10, 3);
      expect(await eventIdsOn(topic!, ids.length)).toEqual(ids);
      await waitFor(async () => (await rowsOf(topic!)).rows === 0, {
        timeoutMs: 10_000,
        message: 'the streamed rows were not deleted',
      });
      expect(await rowsOf(old)).toEqual({ rows: 50, published: 50 });

      await db.pool.query('DROP TRIGGER refuse_retention_delete ON outboxkit.outbox_events');
      await waitFor(async () => (await rowsOf(old)).rows === 0, {
        timeoutMs: 10_000,
        message: 'the old rows were not deleted after the failure ended',
      });
      expect(relay.stats().cleaned).toBe(50);
    } finally {
      await db.pool.query('DROP TRIGGER IF EXISTS refuse_retention_delete ON outboxkit.outbox_events');
      await db.pool.query('DROP FUNCTION IF EXISTS outboxkit.refuse_retention_delete()');
    }
  });
});
