/**
 * The WAL source's writer, `createOutbox({ source: 'wal' })`, against a real PostgreSQL at
 * wal_level=logical (test/helpers/wal.ts), read back through the relay's slot reader
 * (relay/wal/slot-reader.ts) on the publication `migrate({ walPublication: true })` creates: the
 * events of committed transactions arrive in commit order with their columns; nothing of a
 * rolled-back transaction, of a savepoint rolled back, or of a refused call arrives; no key lock and
 * no NOTIFY are written; a transaction of 100,000 distinct keys commits. Each test names the breach
 * it catches.
 *
 * The test database is empty on the WAL server (no template there): migrate() builds the schema.
 */
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { WalSlotReader, WalTransaction } from '../../relay/wal/slot-reader.js';
import { ensureLogicalSlot } from '../../relay/wal/slot-sql.js';
import { isOutboxkitError } from '../../src/errors.js';
import { migrate } from '../../src/migrate.js';
import { createOutbox, type EnqueuedEvent } from '../../src/outbox/enqueue.js';
import { laneOf } from '../../src/outbox/event.js';
import type { OutboxEventInput } from '../../src/outbox/event.js';
import type { TestDatabase } from '../helpers/db.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  createWalTestDatabase,
  randomSlotName,
  startRecordingReader,
  waitForTransaction,
  WalTestResources,
} from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_outbox_events';

let db: TestDatabase;
const readers: WalSlotReader[] = [];
const opened = new WalTestResources();

const walOutbox = createOutbox({ source: 'wal' });

beforeAll(async () => {
  db = await createWalTestDatabase({ poolSize: 4 });
  const first = await migrate({ connectionString: db.url, walPublication: true });
  // Catches: migrate() not creating the publication, or under another name than documented.
  expect(first.walPublication).toEqual({ name: PUBLICATION, created: true });
});

afterEach(async () => {
  for (const r of readers.splice(0)) await r.stop({ timeoutMs: 1_000 });
  await opened.release(db.pool);
});

afterAll(async () => {
  await db?.drop();
});

function client(): Promise<pg.Client> {
  return opened.connect(db.url);
}

interface Started {
  txs: WalTransaction[];
  /** The keys of each transaction handed over, in order. */
  keys(): (string | null)[][];
  /** Waits until a transaction holding `key` has been handed over, and returns it. */
  waitForKey(key: string, timeoutMs?: number): Promise<WalTransaction>;
}

/**
 * A new slot (created now, so it streams what commits from here on) and a reader on it that
 * records every transaction and confirms it.
 */
async function startReader(): Promise<Started> {
  const slot = randomSlotName('writer');
  await ensureLogicalSlot(db.pool, slot);
  opened.trackSlot(slot);
  const { txs } = await startRecordingReader(
    {
      connection: { connectionString: db.url },
      slot,
      publication: PUBLICATION,
      statusIntervalMs: 500,
      handler: async (tx, reader) => {
        reader.confirm(tx.commitEndLsn);
      },
    },
    readers,
  );
  const keysOf = (tx: WalTransaction) => tx.events.map((e) => (e.kind === 'row' ? (e.row.key as string | null) : null));
  return {
    txs,
    keys: () => txs.map(keysOf),
    waitForKey: (key, timeoutMs = 15_000) => waitForTransaction<string | null>(txs, keysOf, key, { timeoutMs }),
  };
}

function event(key: string, extra: Partial<OutboxEventInput> = {}): OutboxEventInput {
  return { topic: 'orders', key, type: 'order.created', payload: { key }, ...extra };
}

/** A committed transaction that only marks a point of the stream: what committed before it has arrived once it has. */
async function marker(key = `marker-${randomBytes(3).toString('hex')}`): Promise<string> {
  const c = await client();
  await c.query('BEGIN');
  await walOutbox.enqueue(c, event(key));
  await c.query('COMMIT');
  return key;
}

async function keyLockRows(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_key_locks');
  return rows[0]!.n;
}

describe("createOutbox({ source: 'wal' })", () => {
  it('hands the slot reader committed events in commit order, with their columns, and the events of a call in the order given', async () => {
    const stream = await startReader();
    const a = await client();
    const b = await client();
    await a.query('BEGIN');
    await b.query('BEGIN');
    const key = `k-${randomBytes(3).toString('hex')}`;
    // A writes the key first, B second, and B commits first. Catches: a per-key lock left in the
    // WAL writer (B's enqueue would wait for A's commit and the race below would time out), and
    // an order that is not commit order.
    const [fromA] = await walOutbox.enqueue(a, event(key, { payload: Buffer.from('from A'), aggregateType: 'order' }));
    const fromB = await Promise.race([
      walOutbox.enqueue(b, [
        event(key, { payload: Buffer.from('from B'), headers: { 'x-h': 'v' }, aggregateId: 'agg-1' }),
        // Given after `key`, but sorted before it by key: the table writer's sort would reorder them.
        event(`0-${key}`, { payload: Buffer.from('from B, second') }),
      ]),
      new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error("B's enqueue waited for A: the WAL writer locked the key")), 3_000),
      ),
    ]);
    await b.query('COMMIT');
    await a.query('COMMIT');
    const txA = await stream.waitForKey(key);
    await waitFor(() => stream.txs.length >= 2, { timeoutMs: 15_000 });
    expect(stream.keys()).toEqual([[key, `0-${key}`], [key]]);
    expect(txA).toBe(stream.txs[0]);

    // Every column of the row the relay will publish.
    const rowB = stream.txs[0]!.events[0]!;
    expect(rowB.kind).toBe('row');
    if (rowB.kind !== 'row') return;
    expect(rowB.schema).toBe('outboxkit');
    expect(rowB.table).toBe('outbox_events');
    const expected: EnqueuedEvent = fromB[0]!;
    expect(rowB.row).toMatchObject({
      event_id: expected.eventId,
      topic: 'orders',
      key,
      lane: laneOf(key),
      type: 'order.created',
      aggregate_id: 'agg-1',
    });
    expect(String(rowB.row.seq)).toBe(expected.seq);
    expect(Buffer.from(rowB.row.payload as Buffer).toString()).toBe('from B');
    expect(rowB.row.headers).toMatchObject({ 'x-h': 'v' });
    const rowA = stream.txs[1]!.events[0]!;
    expect(rowA.kind === 'row' && rowA.row.event_id).toBe(fromA!.eventId);
    expect(rowA.kind === 'row' && rowA.row.aggregate_type).toBe('order');
  });

  it('never hands over events of a rolled-back transaction, of a rolled-back savepoint, or of a refused call', async () => {
    const stream = await startReader();
    const c = await client();
    const tag = randomBytes(3).toString('hex');
    // Catches: a writer that writes outside the caller's transaction (its own connection or an
    // autonomous statement): these events would arrive.
    await c.query('BEGIN');
    await walOutbox.enqueue(c, [event(`rolled-back-${tag}`), event(`rolled-back-2-${tag}`)]);
    await c.query('ROLLBACK');

    await c.query('BEGIN');
    await walOutbox.enqueue(c, event(`kept-1-${tag}`));
    await c.query('SAVEPOINT s');
    await walOutbox.enqueue(c, event(`undone-${tag}`));
    await c.query('ROLLBACK TO SAVEPOINT s');
    await walOutbox.enqueue(c, event(`kept-2-${tag}`));
    // A call refused because one explicit event id exists already writes nothing, and the caller
    // may catch the error and commit. Catches: undoing the call's other rows with a DELETE only,
    // which the insert-only publication does not stream (the relay would publish `refused`).
    const existing = uuidv7();
    await walOutbox.enqueue(c, event(`kept-3-${tag}`, { eventId: existing }));
    const err = await walOutbox
      .enqueue(c, [event(`refused-${tag}`), event(`refused-dup-${tag}`, { eventId: existing })])
      .catch((e: unknown) => e);
    expect(isOutboxkitError(err) && err.code).toBe('OUTBOXKIT_INVALID_EVENT');
    await c.query('COMMIT');

    const end = await marker();
    await stream.waitForKey(end);
    expect(stream.keys()).toEqual([[`kept-1-${tag}`, `kept-2-${tag}`, `kept-3-${tag}`], [end]]);
    // The refused call's rows are gone from the table too.
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE key LIKE $1',
      [`refused%${tag}`],
    );
    expect(rows[0]!.n).toBe(0);
  });

  it('writes no outbox_key_locks row and sends no NOTIFY (a table writer beside it does both)', async () => {
    const listener = await client();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(`${n.channel}:${n.payload ?? ''}`));
    await listener.query(`LISTEN ${walOutbox.channel}`);
    const locksBefore = await keyLockRows();

    const c = await client();
    await c.query('BEGIN');
    await walOutbox.enqueue(c, [event(`nl-${randomBytes(3).toString('hex')}`), event('another-key')]);
    await c.query('COMMIT');
    // Notifications reach a listener in commit order: once this one has arrived, a NOTIFY of the
    // transaction before it would have arrived first.
    await db.pool.query(`NOTIFY ${walOutbox.channel}, 'marker'`);
    await waitFor(() => heard.includes(`${walOutbox.channel}:marker`), { timeoutMs: 10_000 });
    // Catches: the WAL writer still notifying, or still taking per-key row locks.
    expect(heard).toEqual([`${walOutbox.channel}:marker`]);
    expect(await keyLockRows()).toBe(locksBefore);

    // The control: the same checks see a table writer's NOTIFY and lock rows (so they can fail).
    await c.query('BEGIN');
    await createOutbox().enqueue(c, event(`table-${randomBytes(3).toString('hex')}`));
    await c.query('COMMIT');
    await waitFor(() => heard.length === 2, { timeoutMs: 10_000 });
    expect(heard[1]).toBe(`${walOutbox.channel}:`);
    expect(await keyLockRows()).toBe(locksBefore + 1);
  });

  it('commits a transaction of 100,000 distinct keys, which the slot streams whole and in order', async () => {
    const stream = await startReader();
    const c = await client();
    const tag = randomBytes(3).toString('hex');
    const n = 100_000;
    const events = Array.from({ length: n }, (_, i) => event(`bulk-${tag}-${i}`, { payload: Buffer.from([i % 256]) }));
    const locksBefore = await keyLockRows();
    const started = performance.now();
    await c.query('BEGIN');
    const written = await walOutbox.enqueue(c, events);
    await c.query('COMMIT');
    const commitMs = performance.now() - started;
    // Catches: a per-key lock of any kind (row or lock-table entry) creeping back into the WAL
    // writer, or a limit on the call's size below PostgreSQL's.
    expect(written).toHaveLength(n);
    expect(await keyLockRows()).toBe(locksBefore);
    const tx = await stream.waitForKey(`bulk-${tag}-0`, 60_000);
    const streamedMs = performance.now() - started;
    expect(tx.events).toHaveLength(n);
    const keys = tx.events.map((e) => (e.kind === 'row' ? e.row.key : null));
    expect(keys.every((k, i) => k === `bulk-${tag}-${i}`)).toBe(true);
    console.log(
      `100,000 keys: enqueue + commit ${commitMs.toFixed(0)} ms, streamed to the reader ${streamedMs.toFixed(0)} ms`,
    );
    // "Quickly": well under a minute on the project's 2-core CI kind of machine.
    expect(commitMs).toBeLessThan(30_000);
  }, 120_000);
});

describe("migrate's walPublication", () => {
  it('is idempotent and safe from several processes at once, and keeps an existing publication as it is', async () => {
    // Catches: a second migrate (or several at once) failing on "publication already exists".
    const again = await Promise.all([
      migrate({ connectionString: db.url, walPublication: true }),
      migrate({ connectionString: db.url, walPublication: true }),
    ]);
    expect(again.map((r) => r.walPublication)).toEqual([
      { name: PUBLICATION, created: false },
      { name: PUBLICATION, created: false },
    ]);
    const named = await Promise.all([
      migrate({ connectionString: db.url, walPublication: 'my_outbox_pub' }),
      migrate({ connectionString: db.url, walPublication: 'my_outbox_pub' }),
    ]);
    expect(named.map((r) => r.walPublication?.created).sort()).toEqual([false, true]);
    const { rows } = await db.pool.query<{ pubname: string; tables: string; pubinsert: boolean; pubdelete: boolean }>(
      `SELECT p.pubname, string_agg(t.schemaname || '.' || t.tablename, ',') AS tables, p.pubinsert, p.pubdelete
         FROM pg_publication p JOIN pg_publication_tables t USING (pubname)
        GROUP BY p.pubname, p.pubinsert, p.pubdelete ORDER BY p.pubname`,
    );
    // Catches: a publication that streams more than the outbox's inserts (the relay's deletes
    // would come back through the stream).
    expect(rows).toEqual([
      { pubname: 'my_outbox_pub', tables: 'outboxkit.outbox_events', pubinsert: true, pubdelete: false },
      { pubname: PUBLICATION, tables: 'outboxkit.outbox_events', pubinsert: true, pubdelete: false },
    ]);
  });
});

describe('a table relay on a schema with a WAL publication', () => {
  it('warns at start that it would publish WAL-written rows without their per-key order', async () => {
    // Catches: a table relay started silently beside a WAL source (found by a new user: it
    // published rows written with source 'wal', which took no per-key lock).
    const warnings: string[] = [];
    const logger = { debug() {}, info() {}, error() {}, warn: (_o: unknown, msg: string) => void warnings.push(msg) };
    const relay = await startRelay(db.url, { logger });
    await relay.stopAndForget();
    expect(warnings.filter((w) => w.includes('A publication streams this schema'))).toHaveLength(1);
  });
});
