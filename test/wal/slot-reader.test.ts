/**
 * The WAL source's read path (relay/wal/slot-reader.ts) against a real PostgreSQL at
 * wal_level=logical (test/helpers/wal.ts): whole committed transactions in commit order, nothing
 * that rolled back, confirmations that move the slot exactly and never past an unconfirmed
 * transaction, redelivery after a crash before confirm(), a reader kept alive while its handler
 * waits, and back-pressure. Each test names the breach it catches.
 *
 * Each test gets its own slot (dropped after it) on a table shaped like outboxkit.outbox_events.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import {
  createWalSlotReader,
  type WalSlotReader,
  type WalSlotReaderOptions,
  type WalTransaction,
} from '../../relay/wal/slot-reader.js';
import { ensureLogicalSlot, ensurePublication, readSlot } from '../../relay/wal/slot-sql.js';
import { parseLsn } from '../../relay/wal/lsn.js';
import { isOutboxkitError } from '../../src/errors.js';
import type { TestDatabase } from '../helpers/db.js';
import { kill } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  confirmedFlush,
  currentWalLsn,
  createOutboxEventsTable,
  createWalTestDatabase,
  randomSlotName,
  slotActive,
  startRecordingReader,
  waitForSlotInactive,
  waitForTransaction,
  WalTestResources,
} from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_reader';
const PREFIX = 'outboxkit';
const CHILD = path.resolve('test/wal/fixtures/slot-reader-child.ts');

let db: TestDatabase;
const readers: WalSlotReader[] = [];
const opened = new WalTestResources();
const children: ChildProcess[] = [];

beforeAll(async () => {
  db = await createWalTestDatabase({ poolSize: 4 });
  await createOutboxEventsTable(db.pool);
  // A table outside the publication: its rows must never reach the reader.
  await db.pool.query('CREATE TABLE other_rows (key text)');
  await ensurePublication(db.pool, PUBLICATION, ['public.outbox_events']);
});

afterEach(async () => {
  for (const c of children.splice(0)) await kill(c, 'SIGKILL');
  for (const r of readers.splice(0)) await r.stop({ timeoutMs: 1_000 });
  await opened.release(db.pool);
});

afterAll(async () => {
  await db?.drop();
});

/** A new slot through ensureLogicalSlot(); returns its name and its first confirmed_flush_lsn. */
async function createSlot(): Promise<{ slot: string; createdAt: bigint }> {
  const slot = randomSlotName('reader');
  expect(await ensureLogicalSlot(db.pool, slot)).toBe(true);
  opened.trackSlot(slot);
  return { slot, createdAt: await confirmedFlush(db.pool, slot) };
}

function writer(): Promise<pg.Client> {
  return opened.connect(db.url);
}

async function insert(c: pg.Client | pg.Pool, key: string, payload: Buffer = Buffer.from([0])): Promise<void> {
  await c.query(`INSERT INTO outbox_events (topic, key, type, payload) VALUES ('t', $1, 'e', $2)`, [key, payload]);
}

async function emit(c: pg.Client | pg.Pool, prefix: string, content: string): Promise<void> {
  await c.query('SELECT pg_logical_emit_message(true, $1, $2::bytea)', [prefix, Buffer.from(content)]);
}

interface Started {
  reader: WalSlotReader;
  /** Transactions handed over, in order. */
  txs: WalTransaction[];
  /** The keys (rows) and `msg:<content>` (messages) of each transaction handed over. */
  shape(): string[][];
  waitForKey(key: string): Promise<WalTransaction>;
}

function describeTx(tx: WalTransaction): string[] {
  return tx.events.map((e) => (e.kind === 'row' ? String(e.row.key) : `msg:${e.content.toString()}`));
}

/**
 * Starts a reader on `slot` that records every transaction; `handler` runs after the recording
 * (the default resolves at once and confirms nothing).
 */
async function startReader(
  slot: string,
  options: Partial<Omit<WalSlotReaderOptions, 'slot' | 'publication'>> & { connectionOptions?: string } = {},
): Promise<Started> {
  const { connectionOptions, ...rest } = options;
  const { reader, txs } = await startRecordingReader(
    {
      connection: {
        connectionString: db.url,
        ...(connectionOptions === undefined ? {} : { options: connectionOptions }),
      },
      slot,
      publication: PUBLICATION,
      messagePrefix: PREFIX,
      statusIntervalMs: 200,
      ...rest,
    },
    readers,
  );
  return {
    reader,
    txs,
    shape: () => txs.map(describeTx),
    waitForKey: (key) => waitForTransaction(txs, describeTx, key),
  };
}

function waitInactive(slot: string): Promise<void> {
  return waitForSlotInactive(db.pool, slot);
}

describe('WAL slot reader', () => {
  // Breach caught: transactions handed over in insert order rather than commit order, split or
  // merged frames, rows of a table outside the publication, messages of another prefix, or a
  // transaction's events out of the order it wrote them.
  it('hands over whole committed transactions in commit order, with their rows and messages', async () => {
    const { slot } = await createSlot();
    const { txs, shape, waitForKey } = await startReader(slot);
    const t1 = await writer();
    const t2 = await writer();
    await t1.query('BEGIN');
    await insert(t1, 'a1');
    await t2.query('BEGIN');
    await insert(t2, 'b1');
    await insert(t1, 'a2');
    await emit(t1, PREFIX, 'a-message');
    await emit(t1, 'someone-else', 'ignored');
    await t1.query(`INSERT INTO other_rows VALUES ('not-published')`);
    await insert(t2, 'b2');
    await t2.query('COMMIT');
    await insert(t1, 'a3');
    await t1.query('COMMIT');
    await insert(db.pool, 'c');
    await waitForKey('c');

    expect(shape()).toEqual([['b1', 'b2'], ['a1', 'a2', 'msg:a-message', 'a3'], ['c']]);
    const ends = txs.map((tx) => parseLsn(tx.commitEndLsn));
    expect([...ends].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0))).toEqual(ends);
    expect(new Set(ends).size).toBe(3);
    expect(txs.every((tx) => typeof tx.xid === 'number' && tx.xid > 0)).toBe(true);
    const row = txs[0]!.events[0]!;
    expect(row).toMatchObject({ kind: 'row', schema: 'public', table: 'outbox_events' });
    expect(row.kind === 'row' && Buffer.isBuffer(row.row.payload)).toBe(true);
  });

  // Breach caught: rows or messages of a rolled-back transaction, or undone by ROLLBACK TO
  // SAVEPOINT inside a committed one, handed over (an event that never committed published).
  it('hands over nothing of a rolled-back transaction or a rolled-back savepoint', async () => {
    const { slot } = await createSlot();
    const { shape, waitForKey } = await startReader(slot);
    const c = await writer();
    await c.query('BEGIN');
    await insert(c, 'rolled-back');
    await emit(c, PREFIX, 'rolled-back');
    await c.query('ROLLBACK');

    await c.query('BEGIN');
    await insert(c, 'kept-1');
    await c.query('SAVEPOINT s1');
    await insert(c, 'undone');
    await emit(c, PREFIX, 'undone');
    await c.query('SAVEPOINT s2');
    await insert(c, 'undone-nested');
    await c.query('ROLLBACK TO SAVEPOINT s1');
    await insert(c, 'kept-2');
    await c.query('COMMIT');

    // A committed transaction whose only row a savepoint undid: nothing to hand over.
    await c.query('BEGIN');
    await c.query('SAVEPOINT s');
    await insert(c, 'undone-alone');
    await c.query('ROLLBACK TO SAVEPOINT s');
    await c.query('COMMIT');
    await insert(db.pool, 'marker');
    await waitForKey('marker');

    expect(shape()).toEqual([['kept-1', 'kept-2'], ['marker']]);
  });

  // Breach caught: the slot confirmed on receipt or on the handler's success rather than on
  // confirm(); confirmed one byte past the commit (the library's acknowledge(L) trap: B, whose
  // commit record starts where A's ends, would be skipped on restart); or moved past an earlier
  // unconfirmed transaction when a later one is confirmed first.
  it('moves confirmed_flush_lsn exactly to the confirmed commit, never past an unconfirmed earlier one', async () => {
    const { slot, createdAt } = await createSlot();
    const first = await startReader(slot);
    const t1 = await writer();
    const t2 = await writer();
    // A's and B's rows are written before either commits, so B's commit record follows A's
    // directly: the case where an off-by-one confirmation skips B.
    await t1.query('BEGIN');
    await insert(t1, 'a');
    await t2.query('BEGIN');
    await insert(t2, 'b');
    await t1.query('COMMIT');
    await t2.query('COMMIT');
    await insert(db.pool, 'c');
    const c = await first.waitForKey('c');
    const [a, b] = first.txs;
    expect(first.shape()).toEqual([['a'], ['b'], ['c']]);

    // Handed over and the handlers resolved, nothing confirmed: the slot stays put across several
    // status updates (200 ms apart) and keepalive answers, below A's end. (Before A arrived, an
    // idle reader may have confirmed a keepalive's position: other databases of the server write.)
    const updates = first.reader.stats().statusUpdates;
    await waitFor(() => first.reader.stats().statusUpdates >= updates + 3, { timeoutMs: 5_000 });
    const base = await confirmedFlush(db.pool, slot);
    expect(base).toBeGreaterThanOrEqual(createdAt);
    expect(base).toBeLessThan(parseLsn(a!.commitEndLsn));
    await waitFor(() => first.reader.stats().statusUpdates >= updates + 6, { timeoutMs: 5_000 });
    expect(await confirmedFlush(db.pool, slot)).toBe(base);

    // C confirmed before A and B: still nothing may move.
    first.reader.confirm(c.commitEndLsn);
    await waitFor(() => first.reader.stats().statusUpdates >= updates + 9, { timeoutMs: 5_000 });
    expect(await confirmedFlush(db.pool, slot)).toBe(base);

    // A confirmed: the slot moves to A's commit end exactly, not past it (B is unconfirmed).
    first.reader.confirm(a!.commitEndLsn);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) === parseLsn(a!.commitEndLsn), {
      timeoutMs: 5_000,
      message: `confirmed_flush_lsn is not A's end ${a!.commitEndLsn}`,
    });
    const settled = first.reader.stats().statusUpdates;
    await waitFor(() => first.reader.stats().statusUpdates >= settled + 3, { timeoutMs: 5_000 });
    expect(await confirmedFlush(db.pool, slot)).toBe(parseLsn(a!.commitEndLsn));
    expect(first.reader.stats()).toMatchObject({ confirmedLsn: a!.commitEndLsn, unconfirmed: 2 });

    // A new reader gets B and C again (never A): nothing was skipped.
    await first.reader.stop();
    await waitInactive(slot);
    const second = await startReader(slot);
    await second.waitForKey('c');
    expect(second.shape()).toEqual([['b'], ['c']]);
    expect(second.txs[0]!.commitEndLsn).toBe(b!.commitEndLsn);

    // B confirmed, C was before: the slot jumps to C's end.
    second.reader.confirm(second.txs[1]!.commitEndLsn);
    await new Promise((r) => setTimeout(r, 600));
    expect(await confirmedFlush(db.pool, slot)).toBe(parseLsn(a!.commitEndLsn));
    second.reader.confirm(b!.commitEndLsn);
    // C's end, or past it: once nothing is open, a keepalive's position may be confirmed too.
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= parseLsn(c.commitEndLsn), {
      timeoutMs: 5_000,
      message: "confirmed_flush_lsn did not reach C's end once B was confirmed",
    });
  });

  // Breach caught: an empty transaction (only a message of another prefix) holding the slot back
  // for ever, or settled ahead of an unconfirmed transaction before it.
  it('confirms past transactions with nothing to hand over, once those before them are confirmed', async () => {
    const { slot, createdAt } = await createSlot();
    const { reader, waitForKey } = await startReader(slot);
    await insert(db.pool, 'x');
    const x = await waitForKey('x');
    await emit(db.pool, 'someone-else', 'not ours');
    await waitFor(() => reader.stats().received >= 2, { timeoutMs: 5_000, message: 'the empty frame did not arrive' });
    await new Promise((r) => setTimeout(r, 600));
    // Not past x (before x arrived, an idle reader may have confirmed a keepalive's position).
    const held = await confirmedFlush(db.pool, slot);
    expect(held).toBeGreaterThanOrEqual(createdAt);
    expect(held).toBeLessThan(parseLsn(x.commitEndLsn));

    reader.confirm(x.commitEndLsn);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) > parseLsn(x.commitEndLsn), {
      timeoutMs: 5_000,
      message: 'the slot did not move past the empty transaction',
    });
  });

  // Breach caught: a transaction lost when the reader dies after its handler succeeded and before
  // confirm() (the relay crashing between Kafka's acknowledgement and the confirmation), or a
  // confirmed one coming again. The reader is a real child process, SIGKILLed.
  it('redelivers after a SIGKILL between the handler and confirm(), never what was confirmed', async () => {
    const { slot } = await createSlot();
    const proc = spawn(process.execPath, ['--import', 'tsx', CHILD], {
      env: { ...process.env, TEST_DATABASE_URL: db.url, SLOT: slot, PUBLICATION },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(proc);
    let out = '';
    proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    await waitFor(() => out.includes('STREAMING'), { timeoutMs: 30_000, message: () => `child: ${out}` });

    await insert(db.pool, 'confirm-1');
    await insert(db.pool, 'pending-1');
    const confirmed = await waitFor(() => /CONFIRMED (\S+)/.exec(out)?.[1], { message: () => `child: ${out}` });
    const handled = await waitFor(() => /HANDLED (\S+) pending-1/.exec(out)?.[1], { message: () => `child: ${out}` });
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) === parseLsn(confirmed), {
      timeoutMs: 5_000,
      message: 'the child confirmation did not reach the slot',
    });
    await kill(proc, 'SIGKILL');
    await waitInactive(slot);

    await insert(db.pool, 'after-crash');
    const again = await startReader(slot);
    await again.waitForKey('after-crash');
    expect(again.shape()).toEqual([['pending-1'], ['after-crash']]);
    expect(again.txs[0]!.commitEndLsn).toBe(handled);
  });

  // Breach caught: a lost connection (the walsender terminated) not reported, reported untyped,
  // or the transaction handled before it lost on restart.
  it('reports a terminated walsender as a retriable WalStreamError and redelivers on restart', async () => {
    const { slot } = await createSlot();
    const first = await startReader(slot);
    await insert(db.pool, 'y');
    const y = await first.waitForKey('y');
    await db.pool.query('SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1', [
      slot,
    ]);
    const err = await first.reader.ended.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_WAL_STREAM_FAILED')).toBe(true);
    expect((err as { retriable: boolean }).retriable).toBe(true);
    // Confirming after the loss reaches no server: the slot stays, the transaction comes again.
    first.reader.confirm(y.commitEndLsn);
    await waitInactive(slot);

    const second = await startReader(slot);
    const again = await second.waitForKey('y');
    expect(again.commitEndLsn).toBe(y.commitEndLsn);
  });

  // Breach caught: a failing handler skipped over (its transaction lost) instead of stopping the
  // reader with its error for the next reader to redeliver.
  it('stops on a handler error, rejecting ended with it, and the transaction comes again', async () => {
    const { slot } = await createSlot();
    const boom = new Error('downstream refused');
    const first = await startReader(slot, {
      handler: async () => {
        throw boom;
      },
    });
    await insert(db.pool, 'fails');
    await insert(db.pool, 'after');
    const outcome = await Promise.race([
      first.reader.ended.then(
        () => 'resolved',
        (e: unknown) => e,
      ),
      new Promise((r) => setTimeout(() => r('still running'), 10_000)),
    ]);
    expect(outcome).toBe(boom);
    expect(first.shape()).toEqual([['fails']]);
    await waitInactive(slot);
    const second = await startReader(slot);
    await second.waitForKey('after');
    expect(second.shape()).toEqual([['fails'], ['after']]);
  });

  // Breach caught: stop() cutting off the handler in progress, leaving the walsender (and so the
  // slot) held, or rejecting `ended`.
  it('stops cleanly: waits for the handler in progress, releases the slot, resolves ended', async () => {
    const { slot } = await createSlot();
    let finished = false;
    const { reader, txs } = await startReader(slot, {
      handler: async (tx) => {
        await new Promise((r) => setTimeout(r, 300));
        reader.confirm(tx.commitEndLsn);
        finished = true;
      },
    });
    await insert(db.pool, 'in-flight');
    await waitFor(() => txs.length === 1);
    await reader.stop();
    expect(finished).toBe(true);
    await expect(reader.ended).resolves.toBeUndefined();
    await waitInactive(slot);
    // Its end, or past it (an idle reader confirms a keepalive's position).
    expect(await confirmedFlush(db.pool, slot)).toBeGreaterThanOrEqual(parseLsn(txs[0]!.commitEndLsn));
    await reader.stop();
  });

  // Breach caught: a reader whose handler waits on its caller (Kafka down) being ended by
  // wal_sender_timeout: while the handler runs the stream is paused and the server's keepalives
  // sit unread, so only the reader's own status updates keep it connected.
  it('stays connected while its handler blocks for longer than wal_sender_timeout', async () => {
    const timeoutMs = 2_000;
    const { slot, createdAt } = await createSlot();
    let release!: () => void;
    const blocked = new Promise<void>((r) => (release = r));
    const { reader, txs, waitForKey } = await startReader(slot, {
      connectionOptions: `-c wal_sender_timeout=${timeoutMs}`,
      statusIntervalMs: 500,
      handler: async (tx) => {
        if (describeTx(tx).includes('blocks')) await blocked;
      },
    });
    await insert(db.pool, 'blocks');
    await waitFor(() => txs.length === 1);
    await insert(db.pool, 'waits-behind');
    const outcome = await Promise.race([
      reader.ended.then(
        () => 'ended',
        (e: unknown) => `failed: ${String(e)}`,
      ),
      new Promise((r) => setTimeout(() => r('still connected'), timeoutMs * 3)),
    ]);
    expect(outcome).toBe('still connected');
    expect(await slotActive(db.pool, slot)).toBe(true);
    expect(txs).toHaveLength(1);
    // Not past the blocked transaction (an idle keepalive's position before it may be confirmed).
    expect(await confirmedFlush(db.pool, slot)).toBeGreaterThanOrEqual(createdAt);
    expect(await confirmedFlush(db.pool, slot)).toBeLessThan(parseLsn(txs[0]!.commitEndLsn));
    release();
    await waitForKey('waits-behind');
  });

  // Breach caught: an idle outbox holding its slot where it was while the rest of the database
  // writes (PostgreSQL 15's pgoutput sends nothing for a transaction outside the publication), so
  // the slot retains every WAL segment since (a trial: 65 MB after 200,000 rows elsewhere) and
  // reaches max_slot_wal_keep_size; and, the other way, a keepalive's position confirmed past a
  // transaction handed over and not yet confirmed.
  it("confirms the server's position while nothing is open, never past an open transaction", async () => {
    const { slot, createdAt } = await createSlot();
    const { reader, waitForKey } = await startReader(slot);
    const elsewhere = async () => {
      for (let i = 0; i < 5; i++) {
        await db.pool.query('INSERT INTO other_rows SELECT g::text FROM generate_series(1, 2000) g');
      }
      return currentWalLsn(db.pool);
    };
    // Nothing of the publication: the slot follows the server.
    const written = await elsewhere();
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= written, {
      timeoutMs: 15_000,
      message: () => `confirmed_flush_lsn stayed behind ${written} (created at ${createdAt})`,
    });

    // A transaction handed over and not confirmed: writes elsewhere do not move the slot past it.
    const before = await confirmedFlush(db.pool, slot);
    await insert(db.pool, 'open');
    const open = await waitForKey('open');
    await elsewhere();
    const updates = reader.stats().statusUpdates;
    await waitFor(() => reader.stats().statusUpdates >= updates + 3, { timeoutMs: 5_000 });
    const held = await confirmedFlush(db.pool, slot);
    expect(held).toBeGreaterThanOrEqual(before);
    expect(held).toBeLessThan(parseLsn(open.commitEndLsn));

    // Confirmed: the slot moves past it, and on with the server again.
    reader.confirm(open.commitEndLsn);
    const later = await elsewhere();
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= later, {
      timeoutMs: 15_000,
      message: () => `confirmed_flush_lsn stayed behind ${later} after the confirmation`,
    });
  });

  // Breach caught: keepalives that ask for a reply left unanswered by an idle reader (its
  // periodic status far apart here), so wal_sender_timeout ends it.
  it('answers the keepalives of an idle stream, which keeps it connected past wal_sender_timeout', async () => {
    const timeoutMs = 2_000;
    const { slot } = await createSlot();
    const { reader, waitForKey } = await startReader(slot, {
      connectionOptions: `-c wal_sender_timeout=${timeoutMs}`,
      statusIntervalMs: 600_000,
    });
    const outcome = await Promise.race([
      reader.ended.then(
        () => 'ended',
        (e: unknown) => `failed: ${String(e)}`,
      ),
      new Promise((r) => setTimeout(() => r('still connected'), timeoutMs * 3)),
    ]);
    expect(outcome).toBe('still connected');
    // Answered: with the periodic update 10 minutes away and nothing confirmed, every status
    // update came from a keepalive, asked for (keepalivesAnswered) or one whose position the reader
    // confirmed on its own (other databases of the shared server writing, which CI's parallel WAL
    // test files do: the walsender then never has to ask).
    expect(reader.stats().statusUpdates).toBeGreaterThan(0);
    await insert(db.pool, 'still-flowing');
    await waitForKey('still-flowing');
  });

  // Breach caught: a slow handler letting the reader pull the whole backlog into memory (no
  // back-pressure): with the stream paused while the handler runs, the reader holds what one
  // socket read brought (up to 64 KiB, about 30 of these 2 KiB transactions), not the 1,500 of
  // the backlog. (Measured here: 6 held while the handler blocked.)
  it('holds a bounded number of transactions while its handler is slow', async () => {
    const total = 1_500;
    const { slot } = await createSlot();
    let release!: () => void;
    const blocked = new Promise<void>((r) => (release = r));
    // 992 bytes each, sent as 1,984 hex characters: about 2 KiB of stream per transaction.
    await db.pool.query(
      `DO $$ BEGIN
         FOR i IN 1..${total} LOOP
           INSERT INTO outbox_events (topic, key, type, payload) VALUES ('t', 'k' || i, 'e', decode(repeat(md5(random()::text), 62), 'hex'));
           COMMIT;
         END LOOP;
       END $$`,
    );
    // The backlog is committed before the reader starts, so its first socket reads are full.
    const { reader, txs } = await startReader(slot, {
      handler: async (tx) => {
        if (txs.length === 1) await blocked;
        reader.confirm(tx.commitEndLsn);
      },
    });
    await waitFor(() => txs.length === 1);
    // The first handler blocks. Give the stream time to push what it can.
    await new Promise((r) => setTimeout(r, 1_500));
    const whileBlocked = reader.stats();
    expect(txs).toHaveLength(1);
    expect(whileBlocked.received).toBeLessThan(100);
    expect(whileBlocked.maxBuffered).toBeLessThan(100);
    release();
    await waitFor(() => txs.length === total, {
      timeoutMs: 60_000,
      message: () => `handed over ${txs.length} of ${total}`,
    });
    expect(txs.map((tx) => describeTx(tx)[0])).toEqual(Array.from({ length: total }, (_, i) => `k${i + 1}`));
    expect(reader.stats().maxBuffered).toBeLessThan(100);
    expect(reader.stats().unconfirmed).toBe(0);
  });

  // Breach caught: two readers on one slot both streaming (one slot has one reader), or the
  // refusal reported untyped; a missing slot reported as retriable (it never will succeed).
  it('refuses a second reader of a held slot and a missing slot with typed errors', async () => {
    const { slot } = await createSlot();
    await startReader(slot);
    const second = createWalSlotReader({
      connection: { connectionString: db.url },
      slot,
      publication: PUBLICATION,
      handler: async () => {},
    });
    readers.push(second);
    const busy = await second.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isOutboxkitError(busy, 'OUTBOXKIT_WAL_STREAM_FAILED')).toBe(true);
    expect((busy as { retriable: boolean; cause: { code?: string } }).retriable).toBe(true);
    expect((busy as { cause: { code?: string } }).cause.code).toBe('55006');

    const missing = createWalSlotReader({
      connection: { connectionString: db.url },
      slot: 'reader_missing',
      publication: PUBLICATION,
      handler: async () => {},
    });
    const err = await missing.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_WAL_STREAM_FAILED')).toBe(true);
    expect((err as { retriable: boolean }).retriable).toBe(false);
  });

  // Breach caught: the setup helpers failing on a second run (a relay restart would fail), or
  // taking a slot of another plugin for theirs.
  // Breach caught: a status update per confirm(), which a relay confirming a batch of 500
  // one-event transactions in a loop paid 500 socket writes for (11 % of the WAL relay's CPU in
  // bench/wal.ts's drain).
  it('sends one status update for the confirm() calls of one synchronous run, at the last of them', async () => {
    const { slot } = await createSlot();
    const { reader, waitForKey } = await startReader(slot, { statusIntervalMs: 60_000 });
    const keys = ['s1', 's2', 's3', 's4', 's5'];
    for (const key of keys) await insert(db.pool, key);
    const txs = [];
    for (const key of keys) txs.push(await waitForKey(key));
    const before = reader.stats().statusUpdates;
    for (const tx of txs) reader.confirm(tx.commitEndLsn);
    expect(reader.stats().statusUpdates).toBe(before);
    await Promise.resolve();
    expect(reader.stats().statusUpdates).toBe(before + 1);
    const last = parseLsn(txs[txs.length - 1]!.commitEndLsn);
    // At the last transaction's end, or past it (a keepalive's position, once nothing is open).
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= last, {
      timeoutMs: 5_000,
      message: "confirmed_flush_lsn did not reach the last transaction's end",
    });
  });

  it('creates the publication and the slot once, and refuses a slot of another plugin', async () => {
    expect(await ensurePublication(db.pool, PUBLICATION, ['public.outbox_events'])).toBe(false);
    const { slot } = await createSlot();
    expect(await ensureLogicalSlot(db.pool, slot)).toBe(false);
    expect((await readSlot(db.pool, slot))?.plugin).toBe('pgoutput');

    const other = `reader_td_${randomBytes(3).toString('hex')}`;
    await db.pool.query(`SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, [other]);
    opened.trackSlot(other);
    const err = await ensureLogicalSlot(db.pool, other).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
  });
});
