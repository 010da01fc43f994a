/**
 * The facts about PostgreSQL's logical replication (pgoutput, through pg-logical-replication) that
 * the WAL source of the relay will rely on (docs/wal-source.md), checked against a real
 * PostgreSQL at wal_level=logical (test/helpers/wal.ts). Nothing of outboxkit runs here: each test
 * would fail if the stream, the slot or the library behaved otherwise than the relay's design
 * assumes, so a PostgreSQL or library upgrade that breaks an assumption shows up here first.
 *
 * Each test gets its own slot (dropped after it) on a table shaped like outboxkit.outbox_events.
 */
import type pg from 'pg';
import { LogicalReplicationService, PgoutputPlugin, type Pgoutput } from 'pg-logical-replication';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  bigIntToLsn,
  confirmedFlush,
  createOutboxEventsTable,
  createWalTestDatabase,
  lsnToBigInt,
  randomSlotName,
  slotActive,
  waitForSlotInactive,
  WalTestResources,
} from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_facts';

let db: TestDatabase;
const readers: Reader[] = [];
const opened = new WalTestResources();

beforeAll(async () => {
  db = await createWalTestDatabase({ poolSize: 4 });
  await createOutboxEventsTable(db.pool, { headers: true });
  await db.pool.query(`CREATE PUBLICATION ${PUBLICATION} FOR TABLE outbox_events WITH (publish = 'insert')`);
});

afterEach(async () => {
  for (const r of readers.splice(0)) await r.stop();
  await opened.release(db.pool);
});

afterAll(async () => {
  await db?.drop();
});

/** A new slot; returns its name and the LSN it was created at (its first confirmed_flush_lsn). */
async function createSlot(): Promise<{ slot: string; createdAt: bigint }> {
  const slot = randomSlotName('facts');
  const { rows } = await db.pool.query<{ lsn: string }>(
    `SELECT lsn::text AS lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`,
    [slot],
  );
  opened.trackSlot(slot);
  return { slot, createdAt: lsnToBigInt(rows[0]!.lsn) };
}

/** A writer connection of its own (for transactions that interleave). */
function writer(): Promise<pg.Client> {
  return opened.connect(db.url);
}

async function insert(c: pg.Client | pg.Pool, key: string): Promise<void> {
  await c.query(`INSERT INTO outbox_events (topic, key, type, payload) VALUES ('facts', $1, 'fact', '\\x00')`, [key]);
}

/**
 * Two transactions on connections of their own, committing in the opposite order of their inserts
 * (`firstInserted` commits second), then `last` in a transaction of its own; returns once `reader`
 * has received `last`.
 */
async function commitOutOfInsertOrder(
  reader: Reader,
  firstInserted: string,
  secondInserted: string,
  last: string,
): Promise<void> {
  const t1 = await writer();
  const t2 = await writer();
  await t1.query('BEGIN');
  await insert(t1, firstInserted);
  await t2.query('BEGIN');
  await insert(t2, secondInserted);
  await t2.query('COMMIT');
  await t1.query('COMMIT');
  await insert(db.pool, last);
  await reader.waitForKey(last);
}

interface Received {
  /** The LSN the library passes with the message (XLogData's start: the commit's end for a commit). */
  lsn: string;
  message: Pgoutput.Message;
}

interface Reader {
  service: LogicalReplicationService;
  received: Received[];
  errors: Error[];
  /** Settles when the replication connection ends (an error from the server included). */
  ended: Promise<unknown>;
  /** Keys of the inserted rows, in stream order. */
  keys(): string[];
  /** Waits until a row with this key arrived. */
  waitForKey(key: string): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Reads `slot` through the library with its automatic acknowledgement off and no periodic status
 * of its own (`timeoutSeconds: 0`): the test alone decides what is confirmed.
 */
function startReader(
  slot: string,
  options: { messages?: boolean; timeoutSeconds?: number; connectionOptions?: string } = {},
): Reader {
  const service = new LogicalReplicationService(
    {
      connectionString: db.url,
      ...(options.connectionOptions === undefined ? {} : { options: options.connectionOptions }),
    },
    { acknowledge: { auto: false, timeoutSeconds: options.timeoutSeconds ?? 0 } },
  );
  const received: Received[] = [];
  const errors: Error[] = [];
  service.on('data', (lsn: string, message: Pgoutput.Message) => {
    received.push({ lsn, message });
  });
  service.on('error', (err: Error) => errors.push(err));
  const plugin = new PgoutputPlugin({
    // Protocol 1: no streaming of in-progress transactions, so only committed ones arrive.
    protoVersion: 1,
    publicationNames: [PUBLICATION],
    messages: options.messages ?? false,
  });
  const ended = service.subscribe(plugin, slot).then(
    (v) => v,
    (err: unknown) => err,
  );
  const keys = () => received.flatMap(({ message: m }) => (m.tag === 'insert' ? [String(m.new.key)] : []));
  let stopped = false;
  const reader: Reader = {
    service,
    received,
    errors,
    ended,
    keys,
    async waitForKey(key) {
      await waitFor(() => keys().includes(key), {
        timeoutMs: 10_000,
        message: () => `row ${key} did not arrive; got ${JSON.stringify(keys())}`,
      });
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      await service.destroy();
      await ended;
    },
  };
  readers.push(reader);
  return reader;
}

/**
 * Confirms `lsn` to PostgreSQL as flushed, exactly. The library's acknowledge(x) reports x + 1
 * (see "acknowledge() reports one byte past the LSN it is given" below), so it is given lsn - 1.
 */
async function confirm(reader: Reader, lsn: bigint): Promise<void> {
  const sent = await reader.service.acknowledge(bigIntToLsn(lsn - 1n));
  expect(sent).toBe(true);
}

function commits(reader: Reader): Pgoutput.MessageCommit[] {
  return reader.received.flatMap(({ message: m }) => (m.tag === 'commit' ? [m] : []));
}

/** The commit message that ends the transaction holding the row with this key. */
function commitOf(reader: Reader, key: string): Pgoutput.MessageCommit {
  const at = reader.received.findIndex(({ message: m }) => m.tag === 'insert' && m.new.key === key);
  const commit = reader.received.slice(at).find(({ message: m }) => m.tag === 'commit');
  if (at < 0 || commit === undefined) throw new Error(`no committed row ${key}`);
  return commit.message as Pgoutput.MessageCommit;
}

describe('pgoutput through pg-logical-replication', () => {
  // Breach caught: rows delivered in insert (or sequence) order rather than commit order, which is
  // what the table relay's per-key locks exist to prevent and what the WAL relay takes for granted.
  it('delivers the rows of committed transactions in commit order, not insert order', async () => {
    const { slot } = await createSlot();
    const reader = startReader(slot);
    await commitOutOfInsertOrder(reader, 'first-inserted', 'second-inserted', 'third');

    expect(reader.keys()).toEqual(['second-inserted', 'first-inserted', 'third']);
    // One begin ... commit frame per transaction, in ascending commit LSNs.
    const ends = commits(reader).map((c) => lsnToBigInt(c.commitEndLsn!));
    expect(ends).toHaveLength(3);
    expect([...ends].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))).toEqual(ends);
    // The rows of a transaction sit between its begin and its commit.
    expect(reader.received.map((r) => r.message.tag).filter((t) => t !== 'relation')).toEqual([
      'begin',
      'insert',
      'commit',
      'begin',
      'insert',
      'commit',
      'begin',
      'insert',
      'commit',
    ]);
  });

  // Breach caught: a row of a rolled-back transaction, or one undone by ROLLBACK TO SAVEPOINT
  // inside a committed transaction, reaching the reader (the relay would publish an event that
  // never committed).
  it('never delivers rows of a rolled-back transaction or of a rolled-back savepoint', async () => {
    const { slot } = await createSlot();
    const reader = startReader(slot);
    const c = await writer();
    await c.query('BEGIN');
    await insert(c, 'rolled-back');
    await c.query('ROLLBACK');

    await c.query('BEGIN');
    await insert(c, 'kept-before-savepoint');
    await c.query('SAVEPOINT s1');
    await insert(c, 'undone-by-savepoint');
    await c.query('SAVEPOINT s2');
    await insert(c, 'undone-nested');
    await c.query('ROLLBACK TO SAVEPOINT s1');
    await insert(c, 'kept-after-savepoint');
    // A released (not rolled-back) savepoint keeps its rows.
    await c.query('SAVEPOINT s3');
    await insert(c, 'kept-released-savepoint');
    await c.query('RELEASE SAVEPOINT s3');
    await c.query('COMMIT');
    await insert(db.pool, 'marker');
    await reader.waitForKey('marker');

    expect(reader.keys()).toEqual([
      'kept-before-savepoint',
      'kept-after-savepoint',
      'kept-released-savepoint',
      'marker',
    ]);
    // Two transactions reached the stream: the rolled-back one left no empty frame either.
    expect(commits(reader)).toHaveLength(2);
  });

  // Breach caught: the slot advancing without the reader's acknowledgement (the relay would lose
  // events it had not yet published after a crash), or a reconnect that does not start again after
  // the acknowledged LSN (skipping unacknowledged transactions, or repeating acknowledged ones).
  it('moves confirmed_flush_lsn only when acknowledged, and redelivers what was not after a reconnect', async () => {
    const { slot, createdAt } = await createSlot();
    const reader = startReader(slot);
    // Interleaved, committing in the opposite order of their inserts, then a third: the second
    // commit's record follows the first's directly, the case where an off-by-one confirmation
    // skips a transaction.
    await commitOutOfInsertOrder(reader, 'a', 'b', 'c');
    expect(reader.keys()).toEqual(['b', 'a', 'c']);

    // Received, but not acknowledged: the slot stays where it was created, also after a
    // keepalive round trip or two (the server sends one within wal_sender_timeout / 2).
    await waitFor(() => reader.received.length > 0);
    await new Promise((r) => setTimeout(r, 1_500));
    expect(await confirmedFlush(db.pool, slot)).toBe(createdAt);

    // Acknowledge the first transaction (b) at its commit's end LSN.
    const bEnd = lsnToBigInt(commitOf(reader, 'b').commitEndLsn!);
    // The commit message arrives at its end LSN: that is what the library passes with it.
    expect(lsnToBigInt(reader.received.find((r) => r.message === commitOf(reader, 'b'))!.lsn)).toBe(bEnd);
    await confirm(reader, bEnd);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) === bEnd, {
      timeoutMs: 5_000,
      message: 'confirmed_flush_lsn did not reach the acknowledged LSN',
    });

    // A new reader (the old one gone, as after a crash) starts after the acknowledged LSN: a and c
    // again, never b.
    await reader.stop();
    await waitForSlotInactive(db.pool, slot);
    const again = startReader(slot);
    await again.waitForKey('c');
    expect(again.keys()).toEqual(['a', 'c']);
    expect(await confirmedFlush(db.pool, slot)).toBe(bEnd);
  });

  // Breach caught (a library trap the relay must avoid): acknowledge(lsn) confirms lsn + 1. Given a
  // commit's end LSN it confirms one byte past it, and a transaction whose commit record starts
  // exactly there (the next commit, when its rows were written earlier) is skipped on reconnect.
  // If the library changes this, confirm() above and the relay's confirmation must change too.
  it('acknowledge() reports one byte past the LSN it is given (a commit right after is then skipped)', async () => {
    const { slot } = await createSlot();
    const reader = startReader(slot);
    await commitOutOfInsertOrder(reader, 'a', 'b', 'c');

    const b = commitOf(reader, 'b');
    const a = commitOf(reader, 'a');
    const bEnd = lsnToBigInt(b.commitEndLsn!);
    await reader.service.acknowledge(bigIntToLsn(bEnd));
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) === bEnd + 1n, {
      timeoutMs: 5_000,
      message: 'acknowledge(x) did not confirm x + 1',
    });

    await reader.stop();
    await waitForSlotInactive(db.pool, slot);
    const again = startReader(slot);
    await again.waitForKey('c');
    if (lsnToBigInt(a.commitLsn!) === bEnd) {
      // a's commit record starts where b's ends (nothing else wrote WAL between the two commits,
      // the usual case on this cluster): a committed, was never acknowledged, and is lost.
      expect(again.keys()).toEqual(['c']);
    } else {
      // Another session's WAL record fell between the two commits: a survives this time.
      expect(again.keys()).toEqual(['a', 'c']);
    }
  });

  // Breach caught (a library trap the relay must avoid): with auto acknowledgement off, a nonzero
  // `timeoutSeconds` still confirms the last LSN received (keepalives' included) every
  // timeoutSeconds, although the library's README says it then does "not advance the WAL flush
  // position". The relay must pass timeoutSeconds: 0 and send its own status updates.
  it('with auto acknowledgement off, a periodic status (timeoutSeconds > 0) still confirms what arrived', async () => {
    const { slot, createdAt } = await createSlot();
    const reader = startReader(slot, { timeoutSeconds: 1 });
    await insert(db.pool, 'never-acknowledged');
    await reader.waitForKey('never-acknowledged');
    const end = lsnToBigInt(commits(reader)[0]!.commitEndLsn!);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) > createdAt, {
      timeoutMs: 10_000,
      message: 'the periodic status did not move confirmed_flush_lsn (the library may have been fixed)',
    });
    expect(await confirmedFlush(db.pool, slot)).toBeGreaterThan(end);
  });

  // Breach caught: transactional logical messages not reaching the reader with pgoutput's
  // `messages` option (a message-only outbox would lose every event), arriving without it, or a
  // rolled-back one arriving (an event of a rolled-back transaction published).
  it('delivers transactional logical messages with the messages option, never a rolled-back one', async () => {
    const { slot } = await createSlot();
    const withMessages = startReader(slot, { messages: true });
    const c = await writer();
    const emit = (content: string) =>
      c.query(`SELECT pg_logical_emit_message(true, 'outboxkit', $1::bytea)`, [Buffer.from(content)]);
    await c.query('BEGIN');
    await insert(c, 'row-beside-message');
    await emit('committed');
    await c.query('COMMIT');
    await c.query('BEGIN');
    await emit('rolled-back');
    await c.query('ROLLBACK');
    await c.query('BEGIN');
    await emit('undone-by-savepoint-before');
    await c.query('SAVEPOINT s');
    await emit('undone-by-savepoint');
    await c.query('ROLLBACK TO SAVEPOINT s');
    await c.query('COMMIT');
    await insert(db.pool, 'marker');
    await withMessages.waitForKey('marker');

    const messages = withMessages.received.flatMap(({ message: m }) => (m.tag === 'message' ? [m] : []));
    expect(messages.map((m) => [m.prefix, m.transactional, Buffer.from(m.content).toString()])).toEqual([
      ['outboxkit', true, 'committed'],
      ['outboxkit', true, 'undone-by-savepoint-before'],
    ]);
    // Inside its transaction's frame, in the order written: begin, insert, message, commit.
    expect(
      withMessages.received
        .map((r) => r.message.tag)
        .filter((t) => t !== 'relation')
        .slice(0, 4),
    ).toEqual(['begin', 'insert', 'message', 'commit']);

    // Without the option, the same slot position yields the rows only.
    await withMessages.stop();
    await waitForSlotInactive(db.pool, slot);
    const withoutMessages = startReader(slot);
    await withoutMessages.waitForKey('marker');
    expect(withoutMessages.received.some((r) => r.message.tag === 'message')).toBe(false);
    expect(withoutMessages.keys()).toEqual(['row-beside-message', 'marker']);
  });

  // Breach caught: a reader that waits (Kafka down) without acknowledging being cut off by
  // wal_sender_timeout although it answers the server's keepalives, or answers that move the slot.
  // The first half shows the timeout is live on this connection (a silent reader is cut off), so
  // the second half's survival means something.
  it('keeps a waiting reader connected by answering keepalives, without moving the slot', async () => {
    const timeoutMs = 2_000;
    const connectionOptions = `-c wal_sender_timeout=${timeoutMs}`;

    const { slot: silentSlot } = await createSlot();
    const silent = startReader(silentSlot, { connectionOptions });
    await waitFor(() => !silent.service.isStop(), { timeoutMs: 10_000, message: 'silent reader did not start' });
    const silentStart = Date.now();
    const silentEnd = await Promise.race([
      silent.ended.then(() => 'ended'),
      new Promise((r) => setTimeout(() => r('still connected'), timeoutMs * 4)),
    ]);
    expect(silentEnd).toBe('ended');
    // Cut off by the timeout (the server logs "terminating walsender process due to replication
    // timeout"; the client only sees the connection end), not earlier by anything else.
    expect(String(await silent.ended)).toMatch(/Connection terminated/i);
    expect(Date.now() - silentStart).toBeGreaterThanOrEqual(timeoutMs - 200);
    expect(await slotActive(db.pool, silentSlot)).toBe(false);

    const { slot, createdAt } = await createSlot();
    const waiting = startReader(slot, { connectionOptions });
    let replies = 0;
    // What the relay does while Kafka is down: answer each keepalive that asks for a reply with the
    // LSN it has confirmed so far (unchanged), never with what it received.
    waiting.service.on('heartbeat', (_lsn: string, _ts: number, shouldRespond: boolean) => {
      if (!shouldRespond) return;
      replies += 1;
      void confirm(waiting, createdAt);
    });
    await insert(db.pool, 'waits');
    await waiting.waitForKey('waits');
    const outcome = await Promise.race([
      waiting.ended.then(() => 'ended'),
      new Promise((r) => setTimeout(() => r('still connected'), timeoutMs * 4)),
    ]);
    expect(outcome).toBe('still connected');
    expect(replies).toBeGreaterThan(0);
    expect(await slotActive(db.pool, slot)).toBe(true);
    expect(await confirmedFlush(db.pool, slot)).toBe(createdAt);
  });
});
