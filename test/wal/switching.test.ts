/**
 * Switching a running system between table mode (table writers, table relays) and WAL mode
 * (`createOutbox({ source: 'wal' })`, the WAL relay), as docs/runbooks.md, "Switching between
 * table mode and WAL mode", says, against the PostgreSQL at wal_level=logical
 * (test/helpers/wal.ts) and the real broker: concurrent writers of a few shared keys, rolled from
 * one source to the other one at a time, with pending rows at each switch. The topic must hold
 * every committed event, and each key's first occurrences in commit order (duplicates with the same
 * event-id are allowed: the dedup consumer absorbs them).
 *
 * Commit order is known from the transactions themselves: after its event, each one takes the
 * row lock of its key's counter (`switch_counters`) and records the counter's value with the
 * event id, so of two transactions of a key the one with the smaller number committed first. The
 * event's `seq` is drawn before that lock, so WAL writers (no key lock) often commit out of seq
 * order; each switch also forces one such pair (`interleave()`). The two other tests take the
 * orders the runbook calls unsafe and check that the same check sees the reorder.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it, beforeAll } from 'vitest';
import type pg from 'pg';
import { backlog } from '../../relay/sql.js';
import { dropWalSlot, walSlotsStatus } from '../../relay/wal/slot-sql.js';
import { createWalRelay, type WalRelay } from '../../relay/wal/wal-relay.js';
import { createOutbox, type EnqueuedEvent, type Outbox, type OutboxSource } from '../../src/outbox/enqueue.js';
import type { Queryable } from '../../src/database.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics, randomName, readTopic } from '../helpers/kafka.js';
import { finished, spawnCli } from '../helpers/processes.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';
import { randomSlotName, walRelayTestFile } from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_switching';
const OUTBOXES: Record<OutboxSource, Outbox> = {
  table: createOutbox(),
  wal: createOutbox({ source: 'wal' }),
};
/** Concurrent writers, and the keys they share. */
const WRITERS = 6;
const KEY_COUNT = 3;

const file = walRelayTestFile(PUBLICATION, { poolSize: WRITERS + 6 });
const { relays, slots } = file;
let db: TestDatabase;
beforeAll(async () => {
  db = file.db;
  await db.pool.query(`
    CREATE TABLE switch_counters (key text PRIMARY KEY, n int NOT NULL);
    CREATE TABLE switch_commits (
      event_id uuid PRIMARY KEY, topic text NOT NULL, key text NOT NULL, n int NOT NULL, seq bigint NOT NULL,
      source text NOT NULL)`);
});

function q(pool: pg.Pool): Queryable {
  return {
    query: async <R>(text: string, values: readonly unknown[] = []) => {
      const r = await pool.query(text, [...values]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
}

/**
 * Writes one event of `key` in its own transaction on `c` with the writer of `source`, then takes
 * the key's counter (its row lock orders the commits of the key) and records its value; `pauseMs`
 * between the two widens the window in which another writer of the key draws a later seq and
 * commits first.
 */
async function write(c: pg.PoolClient, source: OutboxSource, topic: string, key: string, pauseMs: number) {
  await c.query('BEGIN');
  try {
    const [event] = await OUTBOXES[source].enqueue(c, { topic, key, type: 'switch.test', payload: { key } });
    // Load shaping, not synchronisation: the seq is drawn; the commit order is decided next.
    if (pauseMs > 0) await sleep(pauseMs);
    await recordCommit(c, event!, topic, key, source);
    await c.query('COMMIT');
  } catch (err) {
    await c.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

/** Takes `key`'s counter (row lock until commit) and records the event's place in commit order. */
async function recordCommit(
  c: pg.PoolClient,
  event: EnqueuedEvent,
  topic: string,
  key: string,
  source: OutboxSource,
): Promise<void> {
  await c.query(
    `WITH c AS (UPDATE switch_counters SET n = n + 1 WHERE key = $3 RETURNING n)
     INSERT INTO switch_commits (event_id, topic, key, n, seq, source) SELECT $1, $2, $3, n, $5, $4 FROM c`,
    [event.eventId, topic, key, source, event.seq],
  );
}

/**
 * Two WAL-writer transactions of `key` that commit in the opposite order of their seqs (the WAL
 * writer takes no key lock): `first` draws the smaller seq and, once `finish()` is called, commits
 * last. `second` has committed when this resolves. Only a relay that keeps commit order publishes
 * `second` first.
 */
async function interleave(topic: string, key: string): Promise<{ finish(): Promise<void> }> {
  const first = await db.pool.connect();
  const second = await db.pool.connect();
  try {
    await first.query('BEGIN');
    const [a] = await OUTBOXES.wal.enqueue(first, { topic, key, type: 'switch.test', payload: { key, forced: 'a' } });
    await write(second, 'wal', topic, key, 0);
    return {
      async finish() {
        try {
          await recordCommit(first, a!, topic, key, 'wal');
          await first.query('COMMIT');
        } finally {
          first.release();
        }
      },
    };
  } catch (err) {
    first.release();
    throw err;
  } finally {
    second.release();
  }
}

/**
 * {@link WRITERS} writers looping over the keys, each with its own source, rolled one writer at a
 * time as a deployment rolls its processes: a writer finishes the transaction it is in with the
 * source it began with.
 */
class Writers {
  private readonly sources: OutboxSource[];
  private readonly inFlight = { table: 0, wal: 0 };
  private running = true;
  private readonly loops: Promise<void>[];
  readonly errors: unknown[] = [];

  constructor(
    private readonly topic: string,
    private readonly keys: readonly string[],
    source: OutboxSource,
  ) {
    this.sources = Array.from({ length: WRITERS }, () => source);
    this.loops = this.sources.map((_, i) => this.loop(i));
  }

  private async loop(i: number): Promise<void> {
    while (this.running) {
      const source = this.sources[i]!;
      const key = this.keys[Math.floor(Math.random() * this.keys.length)]!;
      const c = await db.pool.connect();
      this.inFlight[source] += 1;
      try {
        await write(c, source, this.topic, key, Math.floor(Math.random() * 5));
      } catch (err) {
        this.errors.push(err);
      } finally {
        this.inFlight[source] -= 1;
        c.release();
      }
      await sleep(15 + Math.floor(Math.random() * 10));
    }
  }

  /** Moves the writers to `source` one at a time, `gapMs` apart, then waits until none of the other source's transactions is open. */
  async roll(source: OutboxSource, gapMs = 60): Promise<void> {
    for (let i = 0; i < this.sources.length; i++) {
      this.sources[i] = source;
      await sleep(gapMs);
    }
    const other = source === 'wal' ? 'table' : 'wal';
    await waitFor(() => this.inFlight[other] === 0, { timeoutMs: 5_000, message: `${other} writers still open` });
  }

  async stop(): Promise<void> {
    this.running = false;
    await Promise.all(this.loops);
    expect(this.errors).toEqual([]);
  }
}

async function counted(text: string, values: unknown[] = []): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(text, values);
  return rows[0]!.n;
}

const unpublished = () =>
  counted('SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL AND parked_at IS NULL');

/** Waits until `n` more events were committed on `topic` (pending rows, when no relay runs). */
async function committedMore(topic: string, n: number): Promise<void> {
  const sql = 'SELECT count(*)::int AS n FROM switch_commits WHERE topic = $1';
  const target = (await counted(sql, [topic])) + n;
  await waitFor(async () => (await counted(sql, [topic])) >= target, { timeoutMs: 10_000, message: 'writes' });
}

function startWalRelay(slot: string): Promise<WalRelay> {
  const relay = createWalRelay(file.relayOptions(slot));
  relays.push(relay);
  return relay.start().then(() => relay);
}

/** Waits until the WAL relay's first resync has ended, as `outboxkit status` shows it. */
async function resyncDone(slot: string): Promise<void> {
  await waitFor(
    async () => {
      const [s] = await walSlotsStatus(q(db.pool), '"outboxkit"', slot);
      return s !== undefined && s.active && !s.resyncPending && s.resyncedAt !== null;
    },
    { timeoutMs: 15_000, message: `the resync of ${slot} did not end` },
  );
}

interface Commit {
  key: string;
  n: number;
  source: string;
}

/**
 * Reads `topic` until every event committed to it arrived, and returns what breaks the
 * contract: events missing, and each key's first occurrences out of commit order.
 */
async function checkTopic(
  topic: string,
): Promise<{ missing: number; reordered: string[]; events: number; copies: number }> {
  const { rows } = await db.pool.query<Commit & { event_id: string }>(
    'SELECT event_id, key, n, source FROM switch_commits WHERE topic = $1',
    [topic],
  );
  const commits = new Map(rows.map((r) => [r.event_id, r]));
  const seen = new Set<string>();
  const messages = await readTopic(
    topic,
    ({ headers, partition, offset }) => {
      seen.add(headers['event-id']!);
      return { eventId: headers['event-id']!, partition, offset: Number(offset) };
    },
    () => [...commits.keys()].every((id) => seen.has(id)),
    30_000,
  ).catch(() => undefined);
  if (messages === undefined) {
    return {
      missing: [...commits.keys()].filter((id) => !seen.has(id)).length,
      reordered: [],
      events: commits.size,
      copies: 0,
    };
  }
  messages.sort((a, b) => a.partition - b.partition || a.offset - b.offset);
  const first = new Set<string>();
  const last = new Map<string, Commit>();
  const reordered: string[] = [];
  for (const m of messages) {
    const commit = commits.get(m.eventId);
    if (commit === undefined || first.has(m.eventId)) continue;
    first.add(m.eventId);
    const before = last.get(commit.key);
    if (before !== undefined && commit.n < before.n) {
      reordered.push(
        `${commit.key}: #${commit.n} (${commit.source} writer) first published after #${before.n} (${before.source} writer)`,
      );
    }
    if (before === undefined || commit.n > before.n) last.set(commit.key, commit);
  }
  return { missing: 0, reordered, events: commits.size, copies: messages.length };
}

/** Pairs of events of one key on `topic` that committed in the opposite order of their seqs. */
function outOfSeqOrder(topic: string): Promise<number> {
  return counted(
    `SELECT count(*)::int AS n FROM switch_commits a
       JOIN switch_commits b ON b.topic = a.topic AND b.key = a.key AND a.seq < b.seq AND a.n > b.n
      WHERE a.topic = $1`,
    [topic],
  );
}

/** Topic and keys of one test, the keys' counters at 0. */
async function setUp(prefix: string): Promise<{ topic: string; keys: string[] }> {
  const [topic] = await createTopics([prefix], { partitions: 3 });
  const keys = Array.from({ length: KEY_COUNT }, (_, i) => `${randomName('key')}-${i}`);
  await db.pool.query('INSERT INTO switch_counters (key, n) SELECT unnest($1::text[]), 0', [keys]);
  return { topic: topic!, keys };
}

describe('switching between table mode and WAL mode (docs/runbooks.md)', () => {
  // Breach caught: an event lost, or a key's events first published out of commit order, at
  // either switch (a resync of WAL-writer rows, a table relay publishing WAL-writer rows in seq
  // order, a WAL relay stopped before the WAL writers' rows were out).
  it('table → WAL → table with concurrent writers: every event, first occurrences in commit order', async () => {
    const { topic, keys } = await setUp('switching');
    const slot = randomSlotName('switching');
    slots.push(slot);
    let tableRelay = await startRelay(db.url, { pollIntervalMs: 50 });
    const writers = new Writers(topic, keys, 'table');
    try {
      await committedMore(topic, 60);

      // Table → WAL. 1: stop the table relays; rows stay pending (the writers go on).
      await tableRelay.stopAndForget();
      const publishedByTable = await counted(
        'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NOT NULL',
      );
      await committedMore(topic, 40);
      expect(await unpublished()).toBeGreaterThan(0);
      // 2: start the WAL relay (a new slot: it resyncs the pending rows in seq order, then streams);
      // wait until `outboxkit status` shows the resync ended and the slot read.
      const walRelay = await startWalRelay(slot);
      await resyncDone(slot);
      // 3: roll the writers to source 'wal'; table writers and WAL writers side by side meanwhile.
      await writers.roll('wal');
      await (await interleave(topic, keys[0]!)).finish();
      await committedMore(topic, 60);

      // Nothing deletes the rows the table relay published (its retention cleaner no longer runs,
      // and the WAL relay deletes only what it publishes): they stay until deleted by hand.
      expect(
        await counted('SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NOT NULL'),
      ).toBe(publishedByTable);
      expect(publishedByTable).toBeGreaterThan(0);
      // The runbook's statement, here without the 65 min wait: the stream carries inserts only.
      const deleted = await db.pool.query(
        `DELETE FROM outboxkit.outbox_events WHERE seq IN (
           SELECT seq FROM outboxkit.outbox_events WHERE published_at < now() - $1::interval LIMIT 10000)`,
        ['0 minutes'],
      );
      expect(deleted.rowCount).toBe(publishedByTable);

      // WAL → table. 1: roll the writers back to table mode while the WAL relay runs; a WAL
      // transaction still open during the roll commits last, out of seq order.
      const late = await interleave(topic, keys[1]!);
      await writers.roll('table');
      await late.finish();
      // 2: the last WAL writer is gone: wait until no row older than that moment waits.
      const { rows } = await db.pool.query<{ t: Date }>('SELECT now() AS t');
      const lastWalWriter = rows[0]!.t;
      await waitFor(
        async () =>
          (await counted(
            `SELECT count(*)::int AS n FROM outboxkit.outbox_events
              WHERE published_at IS NULL AND parked_at IS NULL AND created_at <= $1`,
            [lastWalWriter],
          )) === 0,
        { timeoutMs: 15_000, message: 'the WAL relay did not publish the rows of the WAL writers' },
      );
      // `outboxkit status` says the same: no pending row, or the oldest younger than that moment.
      const waiting = await backlog(q(db.pool), '"outboxkit"');
      const sinceLast = await counted('SELECT (extract(epoch FROM now() - $1::timestamptz) * 1000)::int AS n', [
        lastWalWriter,
      ]);
      expect(waiting.pending === 0 || waiting.oldestPendingMs < sinceLast, JSON.stringify(waiting)).toBe(true);
      // ...so every WAL writer's row is published and gone.
      expect(
        await counted(
          `SELECT count(*)::int AS n FROM outboxkit.outbox_events e JOIN switch_commits c USING (event_id)
            WHERE c.source = 'wal'`,
        ),
      ).toBe(0);
      // The slot cannot be dropped while a WAL relay holds it.
      await expect(dropWalSlot(db.pool, '"outboxkit"', slot)).rejects.toMatchObject({
        code: 'OUTBOXKIT_WAL_STREAM_FAILED',
      });
      // 3: stop the WAL relay; table writers' rows wait for the table relay.
      await walRelay.stop();
      await committedMore(topic, 40);
      expect(await unpublished()).toBeGreaterThan(0);
      // 4: start the table relays, 5: drop the slot.
      tableRelay = await startRelay(db.url, { pollIntervalMs: 50 });
      const dropped = await finished(
        spawnCli(['wal', 'drop-slot', '--wal-slot', slot, '--database-url', db.url, '--json']),
      );
      expect({ code: dropped.code, stderr: dropped.stderr }).toEqual({ code: 0, stderr: '' });
      expect(JSON.parse(dropped.stdout)).toEqual({ slot, dropped: true, forgotten: 2 });
      expect(await counted('SELECT count(*)::int AS n FROM pg_replication_slots WHERE slot_name = $1', [slot])).toBe(0);
      expect(await walSlotsStatus(q(db.pool), '"outboxkit"', slot)).toEqual([]);
      await committedMore(topic, 40);
    } finally {
      await writers.stop();
    }
    await waitFor(async () => (await unpublished()) === 0, { timeoutMs: 15_000, message: 'rows left unpublished' });
    const result = await checkTopic(topic);
    expect(result).toMatchObject({ missing: 0, reordered: [] });
    expect(result.events).toBeGreaterThan(200);
    // The check had something to catch: pairs of a key committed out of seq order (the two forced
    // ones, and those the WAL writers made on their own).
    expect(await outOfSeqOrder(topic)).toBeGreaterThanOrEqual(2);
    await tableRelay.stopAndForget();
  });

  // The runbook's unsafe order, table → WAL: writers on source 'wal' before the WAL relay
  // streamed. Their rows committed before the slot existed reach Kafka through the resync, in seq
  // order, not in commit order.
  it('unsafe: WAL writers before the WAL relay has resynced, their rows go out in seq order', async () => {
    const { topic, keys } = await setUp('switching-early-writers');
    const slot = randomSlotName('switching');
    slots.push(slot);
    await (await interleave(topic, keys[0]!)).finish();
    await startWalRelay(slot);
    await resyncDone(slot);
    const result = await checkTopic(topic);
    expect(result.missing).toBe(0);
    expect(result.reordered).toEqual([`${keys[0]}: #1 (wal writer) first published after #2 (wal writer)`]);
  });

  // The runbook's unsafe order, WAL → table: the WAL relay stopped (and a table relay started)
  // while writers still use source 'wal'. The table relay publishes their rows in seq order.
  it('unsafe: the table relay before the WAL writers were rolled back and drained, their rows go out in seq order', async () => {
    const { topic, keys } = await setUp('switching-early-relay');
    const slot = randomSlotName('switching');
    slots.push(slot);
    const walRelay = await startWalRelay(slot);
    await walRelay.stop();
    await (await interleave(topic, keys[0]!)).finish();
    const tableRelay = await startRelay(db.url, { pollIntervalMs: 50 });
    const result = await checkTopic(topic);
    expect(result.missing).toBe(0);
    expect(result.reordered).toEqual([`${keys[0]}: #1 (wal writer) first published after #2 (wal writer)`]);
    await tableRelay.stopAndForget();
  });
});
