/**
 * The WAL relay (relay/wal/wal-relay.ts) against the real PostgreSQL at wal_level=logical
 * (test/helpers/wal.ts) and the real Kafka broker: committed events published in commit order with
 * the table relay's record, nothing of a rolled-back transaction, rows deleted once published, the
 * slot confirmed only after Kafka's acknowledgement (a real child process SIGKILLed in between),
 * a refused event parked while the stream goes on, and a broker cut off and back losing nothing.
 * Each test names the breach it catches.
 *
 * The database is migrated (outboxkit's own `outbox_events`); each test gets its own slot.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { beforeAll, describe, expect, inject, it } from 'vitest';

import { toRecord } from '../../relay/record.js';
import { listParked, readPending, retryParked } from '../../relay/sql.js';
import { createWalRelay, type WalRelay, type WalRelayOptions } from '../../relay/wal/wal-relay.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import { withPgTransaction } from '../../src/database.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics, createTopicsOn, messagesIn, readTopic, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { confirmedFlush, currentWalLsn, slotActive, walRelayTestFile } from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_wal_relay';
const CHILD = path.resolve('test/wal/fixtures/wal-relay-child.ts');
/** The WAL writer: the same row as the table writer, without key locks or NOTIFY. */
const outbox = createOutbox({ source: 'wal' });

/** The migrated database, and what each test started (stopped and dropped after it). */
const file = walRelayTestFile(PUBLICATION);
const { relays, children } = file;
let db: TestDatabase;
beforeAll(() => {
  db = file.db;
});

/**
 * A slot made before any of the test's rows, recorded in wal_slots as a relay records one it made
 * (no resync pending): the relay streams it without a resync, so these tests see the stream alone
 * (test/wal/wal-resync.test.ts has the resync's).
 */
function createSlot(): Promise<string> {
  return file.createStreamingSlot('relay');
}

async function startRelay(slot: string, options: Partial<WalRelayOptions> = {}): Promise<WalRelay> {
  const relay = createWalRelay(file.relayOptions(slot, options));
  relays.push(relay);
  await relay.start();
  return relay;
}

/** Enqueues `events` in one transaction through the WAL writer. */
async function enqueue(
  events: { topic: string; key: string | null; payload: unknown; headers?: Record<string, string> }[],
): Promise<string[]> {
  const written = await withPgTransaction(db.pool, (c) =>
    outbox.enqueue(
      c,
      events.map((e) => ({ ...e, type: 'test.event' })),
    ),
  );
  return written.map((e) => e.eventId);
}

interface Message {
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string>;
  partition: number;
}

function readAll(topic: string, until: (all: Message[]) => boolean, timeoutMs = 30_000): Promise<Message[]> {
  return readTopic(
    topic,
    ({ key, value, headers, partition }) => ({ key, value, headers, partition }),
    until,
    timeoutMs,
  );
}

async function rowsLeft(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events');
  return rows[0]!.n;
}

async function currentLsn(): Promise<bigint> {
  const { rows } = await db.pool.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
  const [hi, lo] = rows[0]!.lsn.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

describe('WAL relay', () => {
  // Breach caught: a record that differs from the table relay's for the same row (a bytea taken
  // as text, headers reordered or lost, event-id/event-type missing, a null key sent as ''), or
  // events published in sequence order instead of commit order, or rows left behind after
  // publishing.
  it('publishes committed events with the table relay record, in commit order, and deletes the rows', async () => {
    const [topic] = await createTopics(['wal-relay'], { partitions: 1 });
    const slot = await createSlot();
    const binary = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    await enqueue([
      { topic: topic!, key: 'k', payload: { n: 1, big: '12345678901234567890' }, headers: { traceparent: 'x-1' } },
      { topic: topic!, key: null, payload: binary, headers: { 'é-ü': 'ünïcode ✓', a: '' } },
    ]);
    await enqueue([{ topic: topic!, key: 'k', payload: 'second' }]);
    // Two interleaved transactions committing in the opposite order of their inserts (the WAL
    // writer takes no key lock): the later seq commits first and must go first.
    const first = new pg.Client({ connectionString: db.url });
    const second = new pg.Client({ connectionString: db.url });
    await first.connect();
    await second.connect();
    try {
      const insert = (c: pg.Client, payload: string) =>
        outbox.enqueue(c, { topic: topic!, key: 'k', type: 'test.event', payload: Buffer.from(payload) });
      await first.query('BEGIN');
      await second.query('BEGIN');
      await insert(first, 'drawn-first-committed-last');
      await insert(second, 'drawn-last-committed-first');
      await second.query('COMMIT');
      await first.query('COMMIT');
    } finally {
      await first.end();
      await second.end();
    }
    // What the table relay would send for these rows: its own read (relay/sql.ts) and record.
    const queryable = {
      query: async <R>(text: string, values: readonly unknown[] = [], o?: { name?: string }) => {
        const r = await db.pool.query({ text, values: [...values], name: o?.name });
        return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
      },
    };
    const pending = await readPending(queryable, 'outboxkit', {
      lanes: Array.from({ length: 64 }, (_, i) => i),
      maxRows: 100,
      maxBytes: 10_000_000,
    });
    const expected = new Map(pending.map((r) => [r.event_id, toRecord(r)]));
    expect(expected.size).toBe(5);

    await startRelay(slot);
    const messages = await readAll(topic!, (all) => all.length >= 5);
    expect(messages).toHaveLength(5);
    for (const m of messages) {
      const want = expected.get(m.headers['event-id']!)!;
      expect(want, `unknown event ${m.headers['event-id']}`).toBeDefined();
      expect(m.key).toBe(want.key);
      expect(m.value!.equals(want.value)).toBe(true);
      expect(m.headers).toEqual(want.headers);
    }
    expect(messages.map((m) => m.value!.toString()).slice(2)).toEqual([
      '"second"', // a string payload is JSON-encoded by the writer
      'drawn-last-committed-first',
      'drawn-first-committed-last',
    ]);
    await waitFor(async () => (await rowsLeft()) === 0, { timeoutMs: 10_000, message: 'published rows not deleted' });
  });

  // Breach caught: one send per transaction when many wait (a backlog drained at a send's latency
  // per transaction), or transactions put together out of commit order.
  it('puts waiting transactions together in one send, in commit order', async () => {
    const [topic] = await createTopics(['wal-batch'], { partitions: 1 });
    const slot = await createSlot();
    const ids: string[] = [];
    for (let i = 0; i < 40; i++) ids.push(...(await enqueue([{ topic: topic!, key: `k${i % 3}`, payload: i }])));
    const relay = createWalRelay({
      connection: db.url,
      slot,
      publication: PUBLICATION,
      brokers: inject('kafkaBrokers'),
      batchSize: 25,
    });
    relays.push(relay);
    const batches: { events: number; transactions: number }[] = [];
    relay.on('wal:published', (b) => batches.push(b));
    await relay.start();
    await waitFor(() => relay.stats().published === 40, { timeoutMs: 20_000, message: 'backlog not published' });
    expect(batches.reduce((n, b) => n + b.transactions, 0)).toBe(40);
    expect(Math.max(...batches.map((b) => b.events))).toBeLessThanOrEqual(25);
    expect(batches.length).toBeLessThan(40);
    const messages = await readAll(topic!, (all) => all.length >= 40);
    expect(messages.map((m) => m.headers['event-id'])).toEqual(ids);
  });

  // Breach caught: a relay that dies with its replication connection (the walsender terminated,
  // a server restart) instead of reading the slot again, or that loses what the lost reader held.
  it('reads the slot again after its walsender is terminated', async () => {
    const [topic] = await createTopics(['wal-reconnect'], { partitions: 1 });
    const slot = await createSlot();
    const confirmedAtStart = await confirmedFlush(db.pool, slot);
    const relay = await startRelay(slot);
    const [before] = await enqueue([{ topic: topic!, key: 'r', payload: 'before' }]);
    await waitFor(() => relay.stats().published === 1, { timeoutMs: 15_000, message: 'first event not published' });
    // Confirmed on the server before the cut: otherwise the first event may come again (a
    // duplicate, not a loss) and the exact list below would not hold.
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) > confirmedAtStart, {
      timeoutMs: 5_000,
      message: 'first event not confirmed',
    });
    const streamErrors: Error[] = [];
    relay.on('wal:error', (e) => e.what === 'stream' && streamErrors.push(e.error));
    await db.pool.query('SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1', [
      slot,
    ]);
    const [after] = await enqueue([{ topic: topic!, key: 'r', payload: 'after' }]);
    await waitFor(() => relay.stats().published === 2, { timeoutMs: 20_000, message: 'not published after the loss' });
    expect(streamErrors.length).toBeGreaterThan(0);
    const messages = await readAll(topic!, (all) => all.length >= 2);
    expect(messages.map((m) => m.headers['event-id'])).toEqual([before, after]);
  });

  // Breach caught: an event of a rolled-back transaction (or of a savepoint rolled back) published.
  it('publishes nothing of a rolled-back transaction', async () => {
    const [topic] = await createTopics(['wal-rollback'], { partitions: 1 });
    const slot = await createSlot();
    const relay = await startRelay(slot);
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    try {
      await c.query('BEGIN');
      await outbox.enqueue(c, { topic: topic!, key: 'r', type: 't', payload: 'rolled-back' });
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      await c.query('SAVEPOINT s');
      await outbox.enqueue(c, { topic: topic!, key: 'r', type: 't', payload: 'undone-by-savepoint' });
      await c.query('ROLLBACK TO SAVEPOINT s');
      await outbox.enqueue(c, { topic: topic!, key: 'r', type: 't', payload: 'committed' });
      await c.query('COMMIT');
    } finally {
      await c.end();
    }
    await waitFor(() => relay.stats().published >= 1, { timeoutMs: 15_000, message: 'nothing published' });
    const messages = await readAll(topic!, (all) => all.length >= 1);
    expect(messages.map((m) => m.value!.toString())).toEqual(['"committed"']);
  });

  // Breach caught: the slot confirmed before Kafka acknowledged (or the rows' deletion taken as
  // settled): a relay killed between the acknowledgement and the confirmation would lose the
  // batch. The relay is a real child process that SIGKILLs itself at the crash point.
  for (const point of ['wal-relay:after-send', 'wal-relay:after-delete'] as const) {
    it(`republishes after a SIGKILL at ${point}, nothing lost, the slot not moved`, async () => {
      const [topic] = await createTopics(['wal-crash'], { partitions: 1 });
      const slot = await createSlot();
      const before = await confirmedFlush(db.pool, slot);
      const first = await enqueue([{ topic: topic!, key: 'c', payload: 'one' }]);
      // At or past the first transaction's commit end: the slot must stay below it.
      const afterFirst = await currentWalLsn(db.pool);
      const ids = [
        ...first,
        ...(await enqueue([
          { topic: topic!, key: 'c', payload: 'two' },
          { topic: topic!, key: 'd', payload: 'three' },
        ])),
      ];
      const proc = spawn(process.execPath, ['--import', 'tsx', CHILD], {
        env: {
          ...process.env,
          TEST_DATABASE_URL: db.url,
          SLOT: slot,
          PUBLICATION,
          KAFKA_BROKERS: inject('kafkaBrokers').join(','),
          // The next relay takes the crashed one's lease over at once: a restart with the same id.
          RELAY_ID: `crashed-${slot}`,
          OUTBOXKIT_CRASH_POINT: point,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.push(proc);
      let out = '';
      proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
      const exit = await new Promise<NodeJS.Signals | null>((r) => proc.once('exit', (_c, signal) => r(signal)));
      expect(exit, `child: ${out}`).toBe('SIGKILL');
      // Kafka has the first batch (the first transaction, or more if they were waiting together);
      // the slot did not move past it.
      const count = await messagesIn(topic!);
      const sent = await readAll(topic!, (all) => all.length >= count);
      expect(sent.length).toBeGreaterThan(0);
      expect(sent.map((m) => m.headers['event-id'])).toEqual(ids.slice(0, sent.length));
      // Not past the first transaction (a keepalive's position before it may have been confirmed).
      const confirmed = await confirmedFlush(db.pool, slot);
      expect(confirmed).toBeGreaterThanOrEqual(before);
      expect(confirmed).toBeLessThan(afterFirst);
      expect(await rowsLeft()).toBe(point === 'wal-relay:after-send' ? 3 : 3 - sent.length);
      await waitFor(async () => !(await slotActive(db.pool, slot)), { timeoutMs: 10_000, message: 'slot busy' });

      const relay = await startRelay(slot, { relayId: `crashed-${slot}` });
      await waitFor(() => relay.stats().published >= 3, { timeoutMs: 15_000, message: 'not republished' });
      const all = await readAll(topic!, (m) => m.length >= sent.length + 3);
      // Everything again from the first unconfirmed transaction, in the same order (duplicates with
      // the same event-id): every event at least once.
      expect(all.map((m) => m.headers['event-id'])).toEqual([...ids.slice(0, sent.length), ...ids]);
      expect(await rowsLeft()).toBe(0);
      await waitFor(async () => (await confirmedFlush(db.pool, slot)) > before, {
        timeoutMs: 5_000,
        message: 'slot not confirmed after the republish',
      });
    });
  }

  // Breach caught: an event Kafka refuses for itself dropped (not parked, not visible), or holding
  // back every later event of the stream, or the slot never confirmed past it.
  it('parks a too-large event with its error while later events go on', async () => {
    const [topic] = await createTopics(['wal-large'], {
      partitions: 1,
      configEntries: [{ name: 'max.message.bytes', value: '2000' }],
    });
    const slot = await createSlot();
    const relay = await startRelay(slot);
    const [small1] = await enqueue([{ topic: topic!, key: 'a', payload: 'small-1' }]);
    const [large] = await enqueue([{ topic: topic!, key: 'b', payload: Buffer.alloc(5_000, 1) }]);
    const [small2, small3] = await enqueue([
      { topic: topic!, key: 'c', payload: 'small-2' },
      { topic: topic!, key: 'd', payload: 'small-3' },
    ]);
    const messages = await readAll(topic!, (all) => all.length >= 3);
    expect(messages.map((m) => m.headers['event-id'])).toEqual([small1, small2, small3]);
    await waitFor(() => relay.stats().parked === 1 && relay.stats().published === 3, {
      timeoutMs: 10_000,
      message: () => `stats ${JSON.stringify(relay.stats())}`,
    });
    const parked = await listParked(db.pool, 'outboxkit');
    expect(parked.map((p) => p.event_id)).toEqual([large]);
    expect(parked[0]!.last_error).toMatch(/TOO_LARGE/);
    // Only the parked row stays; the slot moved past all four transactions.
    expect(await rowsLeft()).toBe(1);
    const end = await currentLsn();
    await enqueue([{ topic: topic!, key: 'e', payload: 'after' }]);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= end, {
      timeoutMs: 10_000,
      message: 'slot not confirmed past the parked event',
    });
  });

  // Breach caught: an event for a topic that does not exist holding the whole stream (kafkajs
  // retries an unknown topic as a broker failure) or dropped instead of parked.
  // Its later event has the same key: without holdKeyBehindFailure it goes ahead
  // (test/wal/wal-relay-held.test.ts has the default, which holds it).
  it('parks an event whose topic does not exist while later events go on', async () => {
    const [topic] = await createTopics(['wal-exists'], { partitions: 1 });
    const slot = await createSlot();
    const relay = await startRelay(slot, { holdKeyBehindFailure: false });
    const missing = `wal-missing-${randomBytes(4).toString('hex')}`;
    const [lost] = await enqueue([{ topic: missing, key: 'm', payload: 'nowhere' }]);
    const [next] = await enqueue([{ topic: topic!, key: 'm', payload: 'after' }]);
    const messages = await readAll(topic!, (all) => all.length >= 1);
    expect(messages.map((m) => m.headers['event-id'])).toEqual([next]);
    await waitFor(() => relay.stats().parked === 1, { timeoutMs: 20_000, message: 'not parked' });
    const parked = await listParked(db.pool, 'outboxkit');
    expect(parked.map((p) => p.event_id)).toEqual([lost]);
    expect(parked[0]!.last_error).toMatch(/UNKNOWN_TOPIC_OR_PARTITION/);

    // Breach caught: `outboxkit parked retry` a no-op in WAL mode (an UPDATE is not streamed, so
    // the requeued row sat in the table, listed nowhere, until a resync). The operator creates the
    // topic and retries: the running relay publishes it from the table and deletes its row.
    await createTopicsOn(testKafka(), [{ topic: missing, numPartitions: 1 }]);
    expect(await retryParked(db.pool, '"outboxkit"', [lost!])).toBe(1);
    const retried = await readAll(missing, (all) => all.length >= 1);
    expect(retried.map((m) => m.headers['event-id'])).toEqual([lost]);
    await waitFor(async () => (await rowsLeft()) === 0, { timeoutMs: 10_000, message: 'retried row not deleted' });
    expect(await listParked(db.pool, 'outboxkit')).toEqual([]);
  });

  // Breach caught: the events of a missing topic parked one send at a time, each after kafkajs's
  // metadata retries (about 3.3 s): N such events held the stream for N × 3.3 s (bench/wal.ts's
  // first version left 18 of them, parked 27 s to 77 s after the start).
  it('parks many events of a missing topic together, not one send each', async () => {
    const [topic] = await createTopics(['wal-exists-many'], { partitions: 1 });
    const slot = await createSlot();
    const relay = await startRelay(slot, { holdKeyBehindFailure: false });
    const missing = `wal-missing-${randomBytes(4).toString('hex')}`;
    const started = performance.now();
    const lost = await enqueue(
      Array.from({ length: 24 }, (_, n) => ({ topic: missing, key: `k${n}`, payload: `nowhere ${n}` })),
    );
    const [next] = await enqueue([{ topic: topic!, key: 'k0', payload: 'after' }]);
    // One send's retries (a few seconds), then the whole chunk parked at once; one send each would
    // take 24 times as long.
    await waitFor(() => relay.stats().parked === 24, { timeoutMs: 20_000, message: 'not all parked' });
    expect(performance.now() - started).toBeLessThan(20_000);
    const messages = await readAll(topic!, (all) => all.length >= 1);
    expect(messages.map((m) => m.headers['event-id'])).toEqual([next]);
    const parked = await listParked(db.pool, 'outboxkit');
    expect(parked.map((p) => p.event_id).sort()).toEqual([...lost].sort());
    for (const p of parked) expect(p.last_error).toMatch(/UNKNOWN_TOPIC_OR_PARTITION/);
  });

  // Breach caught (a new-user trial): with holdKeyBehindFailure, the oldest of several parked
  // events of one key retried by an operator stayed pending for good: the walk of held rows held
  // the key for the parked rows after it before it settled the retried one before them.
  it('publishes the retried oldest of several parked events of one key; the later ones stay parked', async () => {
    const slot = await createSlot();
    const relay = await startRelay(slot, { holdKeyBehindFailure: true });
    const missing = `wal-missing-${randomBytes(4).toString('hex')}`;
    const ids = await enqueue([0, 1, 2].map((n) => ({ topic: missing, key: 'one-key', payload: `n${n}` })));
    await waitFor(() => relay.stats().parked === 3, { timeoutMs: 20_000, message: 'not all parked' });
    await createTopicsOn(testKafka(), [{ topic: missing, numPartitions: 1 }]);
    expect(await retryParked(db.pool, '"outboxkit"', [ids[0]!])).toBe(1);
    const published = await readAll(missing, (all) => all.length >= 1);
    expect(published.map((m) => m.headers['event-id'])).toEqual([ids[0]]);
    const parked = await listParked(db.pool, 'outboxkit');
    expect(parked.map((p) => p.event_id).sort()).toEqual([ids[1], ids[2]].sort());
    // Retried in order, the others follow it.
    expect(await retryParked(db.pool, '"outboxkit"', [ids[1]!, ids[2]!])).toBe(2);
    const all = await readAll(missing, (m) => m.length >= 3);
    expect(all.map((m) => m.headers['event-id'])).toEqual(ids);
  });

  // Breach caught: events lost or confirmed while the broker cannot be reached (a send that failed
  // taken as settled), or a relay that gives up (stops, exits) instead of holding the stream and
  // retrying until the broker answers again.
  it('holds the stream while the broker is unreachable and publishes everything once it is back', async () => {
    const [topic] = await createTopics(['wal-outage'], { partitions: 1 });
    const slot = await createSlot();
    const cut = brokerCut();
    const relay = await startRelay(slot, {
      kafka: new Kafka({
        clientId: 'wal-outage',
        brokers: inject('kafkaBrokers'),
        socketFactory: cut.socketFactory,
        logLevel: logLevel.NOTHING,
      }),
      brokerTimeoutMs: 1_500,
    });
    const [warm] = await enqueue([{ topic: topic!, key: 'w', payload: 'before' }]);
    await waitFor(() => relay.stats().published === 1, { timeoutMs: 15_000, message: 'first event not published' });

    cut.down();
    const sendErrors: number[] = [];
    relay.on('wal:error', (e) => e.what === 'send' && sendErrors.push(e.attempt));
    const during: string[] = [];
    let afterFirstDuring = 0n;
    for (let i = 0; i < 5; i++) {
      during.push(...(await enqueue([{ topic: topic!, key: `k${i % 2}`, payload: `during-${i}` }])));
      if (i === 0) afterFirstDuring = await currentWalLsn(db.pool);
    }
    await waitFor(() => sendErrors.length >= 2, { timeoutMs: 30_000, message: 'no failed sends while cut off' });
    // Nothing settled while the broker is away: the rows stay, the slot does not move.
    expect(relay.stats().published).toBe(1);
    expect(await rowsLeft()).toBe(5);
    // Not past the first event written while cut off (an idle keepalive's position before it may be).
    expect(await confirmedFlush(db.pool, slot)).toBeLessThan(afterFirstDuring);

    cut.up();
    await waitFor(() => relay.stats().published === 6, {
      timeoutMs: 30_000,
      message: 'not published after the outage',
    });
    const messages = await readAll(topic!, (all) => new Set(all.map((m) => m.headers['event-id'])).size >= 6);
    const firsts = [...new Set(messages.map((m) => m.headers['event-id']))];
    expect(firsts).toEqual([warm, ...during]);
    expect(await rowsLeft()).toBe(0);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) > afterFirstDuring, {
      timeoutMs: 5_000,
      message: 'slot not confirmed after the outage',
    });
  });
});

/**
 * A cut in the network between the relay's Kafka client and the real broker: `down()` closes every
 * connection and sends new ones to a closed port; `up()` lets them through again.
 */
function brokerCut() {
  let cutOff = false;
  const sockets = new Set<net.Socket>();
  return {
    socketFactory: ({ host, port, onConnect }: { host: string; port: number; onConnect: () => void }) => {
      const socket = net.connect({ host: cutOff ? '127.0.0.1' : host, port: cutOff ? 1 : port }, onConnect);
      socket.setKeepAlive(true, 60_000);
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
      return socket;
    },
    down() {
      cutOff = true;
      for (const s of sockets) s.destroy();
    },
    up() {
      cutOff = false;
    },
  };
}
