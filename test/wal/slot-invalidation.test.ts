/**
 * A replication slot really invalidated by PostgreSQL (`max_slot_wal_keep_size` passed,
 * `pg_replication_slots.wal_status = 'lost'`), and the WAL relay's recovery from it
 * (relay/wal/wal-relay.ts; docs/wal-source.md, "Slot loss and resync"): the relay reports the loss
 * (a warning, `wal:resync` and outboxkit_wal_relay_resyncs_total with reason `lost`,
 * `wal_slots.resync_reason = 'lost'` for `outboxkit status`), drops and creates the slot again, and
 * publishes every row of the outbox table before streaming, so every event written reaches Kafka,
 * none invented, in per-key commit order of first appearances. Twice: a relay stopped while its
 * slot is lost (the check at start), and a daemon paused (SIGSTOP) whose walsender the
 * invalidating checkpoint ends (the check after a lost replication connection).
 *
 * The invalidation needs server-wide settings (`max_slot_wal_keep_size`, checkpoints on demand)
 * that would invalidate the slots of the other WAL test files on the shared WAL server (5433), so
 * this file runs a PostgreSQL cluster of its own (test/helpers/private-cluster.ts: `initdb` into a
 * folder of os.tmpdir() and `pg_ctl` on a free port). It is stopped (`pg_ctl stop -m immediate`)
 * and removed after the file, whatever happened. The file skips, saying why, only when no PostgreSQL
 * binaries are installed. Kafka is the tests' broker.
 *
 * The topic has one partition, so the topic's order is the order of the relay's sends.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';

import type { Queryable } from '../../src/database.js';
import { walSlotsStatus } from '../../relay/wal/slot-sql.js';
import { createWalRelay, type WalRelay, type WalRelayEvents } from '../../relay/wal/wal-relay.js';
import { withPgTransaction } from '../../src/database.js';
import type { Logger } from '../../src/logger.js';
import { migrate } from '../../src/migrate.js';
import { createOutbox, type Outbox } from '../../src/outbox/enqueue.js';
import { walSlotName } from '../../src/schema-name.js';
import { createTopics, messagesIn, readTopic } from '../helpers/kafka.js';
import { privateCluster, privateClusterBaseSettings } from '../helpers/private-cluster.js';
import { spawnCli, type Spawned } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';
import { waitForSlotInactive } from '../helpers/wal.js';

/** This file's own cluster, in a folder of its own under os.tmpdir() (test/helpers/private-cluster.ts). */
const cluster = privateCluster({
  file: 'test/wal/slot-invalidation.test.ts',
  folder: 'outboxkit-slot-lost',
  what: 'slot invalidation test',
  settings,
});
const skipReason = cluster.skipReason;

/**
 * The cluster's settings. `max_slot_wal_keep_size` of 1 MB is less than one 16 MB WAL segment, so
 * a checkpoint whose redo point is in a later segment than a slot's `restart_lsn` invalidates the
 * slot (PostgreSQL's KeepLogSeg keeps whole segments). Checkpoints come only when the test asks
 * (`checkpoint_timeout` of an hour, WAL generated only by the test), so the running relay's slot is
 * never invalidated behind the test's back.
 */
function settings(port: number): Record<string, string> {
  return {
    ...privateClusterBaseSettings(port),
    max_slot_wal_keep_size: `'1MB'`,
    wal_keep_size: '0',
    min_wal_size: `'32MB'`,
    max_wal_size: `'32MB'`,
    checkpoint_timeout: `'1h'`,
  };
}

let url: string;
let pool: pg.Pool | undefined;
const relays: WalRelay[] = [];

beforeAll(async () => {
  if (skipReason !== undefined) return;
  url = await cluster.start();
  pool = new pg.Pool({ connectionString: url, max: 4 });
}, 120_000);

afterAll(async () => {
  for (const relay of relays.splice(0)) await relay.stop({ timeoutMs: 2_000 }).catch(() => undefined);
  await pool?.end().catch(() => undefined);
  await cluster.stop();
}, 60_000);

function q(p: pg.Pool): Queryable {
  return {
    query: async <R>(text: string, values: readonly unknown[] = []) => {
      const r = await p.query(text, [...values]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
}

interface Written {
  id: string;
  key: string;
}

/** `n` events over three keys, one or two per transaction, through `writer`; in commit order. */
async function enqueueMany(writer: Outbox, topic: string, n: number, tag: string): Promise<Written[]> {
  const out: Written[] = [];
  for (let i = 0; i < n; i += 2) {
    const keys = [`k${i % 3}`, ...(i + 1 < n ? [`k${(i + 1) % 3}`] : [])];
    const written = await withPgTransaction(pool!, (c) =>
      writer.enqueue(
        c,
        keys.map((key, j) => ({ topic, key, type: 'test.event', payload: `${tag}-${i + j}` })),
      ),
    );
    written.forEach((e, j) => out.push({ id: e.eventId, key: keys[j]! }));
  }
  return out;
}

async function walStatus(slot: string): Promise<string | null | undefined> {
  const { rows } = await pool!.query<{ wal_status: string | null }>(
    'SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1',
    [slot],
  );
  return rows[0]?.wal_status;
}

async function rowsLeft(schema: string): Promise<number> {
  const { rows } = await pool!.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".outbox_events`);
  return rows[0]!.n;
}

/**
 * WAL past `max_slot_wal_keep_size`: rows of a table outside the publication, a segment switch and
 * a checkpoint, again until PostgreSQL invalidates `slot` (a walsender still reading it is ended
 * by the checkpoint). Returns the `wal_status` seen after each round.
 */
async function invalidate(slot: string): Promise<(string | null | undefined)[]> {
  await pool!.query('CREATE TABLE IF NOT EXISTS scratch (id int, filler text)');
  const statuses: (string | null | undefined)[] = [];
  await waitFor(
    async () => {
      await pool!.query(`INSERT INTO scratch SELECT g, md5(g::text) FROM generate_series(1, 20000) g`);
      await pool!.query('SELECT pg_switch_wal()');
      await pool!.query('CHECKPOINT');
      statuses.push(await walStatus(slot));
      return statuses.at(-1) === 'lost';
    },
    { timeoutMs: 30_000, message: () => `slot ${slot} was not invalidated; wal_status: ${statuses.join(', ')}` },
  );
  return statuses;
}

/**
 * Reads every record of `topic` (once it holds what Kafka counts) and checks them against
 * `written`: no record of an event not written, every event at least once, and first appearances
 * in commit order per key and overall (one writer at a time, so commit order is seq order, and a
 * resync's order is the stream's).
 */
async function expectEveryEventOnce(topic: string, written: Written[]): Promise<void> {
  const total = await messagesIn(topic);
  const ids = await readTopic(
    topic,
    ({ headers }) => headers['event-id']!,
    (all) => all.length >= total,
    20_000,
  );
  const keyOf = new Map(written.map((w) => [w.id, w.key]));
  expect(
    ids.filter((id) => !keyOf.has(id)),
    'records of no event written',
  ).toEqual([]);
  const firsts = [...new Set(ids)];
  expect(firsts, 'events published').toHaveLength(written.length);
  for (const key of ['k0', 'k1', 'k2']) {
    expect(
      firsts.filter((id) => keyOf.get(id) === key),
      `first appearances of key ${key}`,
    ).toEqual(written.filter((w) => w.key === key).map((w) => w.id));
  }
  expect(firsts).toEqual(written.map((w) => w.id));
}

/** An embedded WAL relay on the default schema with fast test timings; its resyncs and warnings. */
function startRelay(slot: string, publication: string) {
  const seen = { resyncs: [] as WalRelayEvents['wal:resync'][0][], warnings: [] as string[] };
  const logger: Logger = {
    debug: () => {},
    info: () => {},
    warn: (_obj, msg) => seen.warnings.push(msg),
    error: () => {},
  };
  const relay = createWalRelay({
    connection: url,
    slot,
    publication,
    brokers: inject('kafkaBrokers'),
    relayId: `${slot}-relay`,
    logger,
    statusIntervalMs: 200,
    brokerTimeoutMs: 3_000,
    retryInitialMs: 50,
    retryMaxMs: 500,
  });
  relay.on('wal:resync', (r) => seen.resyncs.push(r));
  relays.push(relay);
  return { relay, seen, started: relay.start() };
}

/** The first JSON log line of a CLI relay whose message is `msg` and that `match` accepts, parsed. */
async function logLine(
  relay: Spawned,
  msg: string,
  match: (entry: Record<string, unknown>) => boolean = () => true,
  timeoutMs = 20_000,
): Promise<Record<string, unknown>> {
  return waitFor(
    () =>
      relay.stdout
        .join('')
        .split('\n')
        .filter((l) => l.includes(msg))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((entry) => entry.msg === msg && match(entry)),
    { timeoutMs, message: () => `log line "${msg}" (${relay.output.join('').slice(-3000)})` },
  );
}

const LOST_WARNING =
  'replication slot lost: creating it again, then publishing every row of the outbox table before streaming (resync)';

describe.skipIf(skipReason !== undefined)('WAL relay: a slot invalidated by max_slot_wal_keep_size', () => {
  // Breach caught: a lost slot taken as healthy (its reader fails at every start with "can no
  // longer get changes from replication slot", SQLSTATE 55000, and nothing more is published: the
  // `stopped`, `afterLoss` and `later` events never come); the slot created again without the
  // resync (the rows written while the relay was down are in no stream of the new slot); the loss
  // not reported (no warning, no `wal:resync` with reason `lost`, no `resync_reason = 'lost'` in
  // wal_slots for `outboxkit status`). Tried by hand (2026-12-07): with `wal_status = 'lost'` not
  // read as a loss the test fails waiting for the resync; with the resync's rows skipped for a lost
  // slot it fails at the resync's count (0 events of 8), and, that check removed, at the topic's
  // (6 events of 14).
  it('a stopped relay: reports the loss, creates the slot again and publishes every event in order', async () => {
    const slot = 'outboxkit_slot_stopped';
    const { walPublication } = await migrate({ connectionString: url, walPublication: true });
    const publication = walPublication!.name;
    const [topic] = await createTopics(['wal-slot-lost'], { partitions: 1 });
    const writer = createOutbox({ source: 'wal' });

    // A relay streams, then stops; its slot stays, holding the WAL from its confirmed position.
    const first = startRelay(slot, publication);
    await first.started;
    await waitFor(() => first.seen.resyncs.length === 1, { timeoutMs: 20_000, message: 'no first resync' });
    expect(first.seen.resyncs[0]).toMatchObject({ reason: 'missing', events: 0 });
    const streamed = await enqueueMany(writer, topic!, 4, 'streamed');
    await waitFor(() => first.relay.stats().published === 4, { timeoutMs: 20_000, message: 'not streamed' });
    await first.relay.stop({ timeoutMs: 5_000 });
    await waitForSlotInactive(pool!, slot);
    expect(await walStatus(slot)).toBe('reserved');
    const stopped = await enqueueMany(writer, topic!, 5, 'stopped');

    await invalidate(slot);
    const [lost] = await walSlotsStatus(q(pool!), '"outboxkit"', slot);
    expect(lost).toMatchObject({ exists: true, walStatus: 'lost', retainedBytes: null, resyncPending: false });
    const afterLoss = await enqueueMany(writer, topic!, 3, 'after-loss');
    const pending = await rowsLeft('outboxkit');
    expect(pending).toBeGreaterThanOrEqual(stopped.length + afterLoss.length);

    // The next relay finds the slot lost, reports it, drops it, creates it and resyncs.
    const second = startRelay(slot, publication);
    await second.started;
    await waitFor(() => second.seen.resyncs.length === 1, { timeoutMs: 20_000, message: 'no resync after the loss' });
    expect(second.seen.resyncs[0]).toMatchObject({ slot, reason: 'lost', events: pending, parked: 0 });
    expect(second.seen.warnings).toContain(LOST_WARNING);
    expect(second.relay.stats()).toMatchObject({ resyncs: 1, resynced: pending });
    const [recreated] = await walSlotsStatus(q(pool!), '"outboxkit"', slot);
    expect(recreated).toMatchObject({
      exists: true,
      walStatus: 'reserved',
      resyncPending: false,
      resyncReason: 'lost',
    });

    // The new slot streams.
    const later = await enqueueMany(writer, topic!, 2, 'later');
    await waitFor(() => second.relay.stats().published === pending + later.length, {
      timeoutMs: 20_000,
      message: () => `not streamed after the resync; stats ${JSON.stringify(second.relay.stats())}`,
    });
    await waitFor(async () => (await rowsLeft('outboxkit')) === 0, { timeoutMs: 20_000, message: 'rows not deleted' });
    await expectEveryEventOnce(topic!, [...streamed, ...stopped, ...afterLoss, ...later]);

    // Its slot would be invalidated by the next test's checkpoints: stopped and dropped now.
    await second.relay.stop({ timeoutMs: 5_000 });
    await waitForSlotInactive(pool!, slot);
    await pool!.query('SELECT pg_drop_replication_slot($1)', [slot]);
  });

  // Breach caught: a running relay whose walsender PostgreSQL ended to invalidate its slot (the
  // relay paused meanwhile: SIGSTOP of a real `outboxkit relay --source wal`) reading again
  // without the slot check (its reader fails for good on the lost slot), or recreating the slot
  // without the resync (the `paused` and `afterLoss` events lost); the loss missing from the
  // daemon's log and from outboxkit_wal_relay_resyncs_total{reason="lost"}.
  it('a paused CLI relay: its walsender ended and its slot lost, it resyncs once continued and says so', async () => {
    const schema = 'okit_paused';
    const slot = walSlotName(schema);
    await migrate({ connectionString: url, schema, walPublication: true });
    const [topic] = await createTopics(['wal-slot-lost-paused'], { partitions: 1 });
    const writer = createOutbox({ source: 'wal', schema });

    const relay = spawnCli(
      [
        'relay',
        '--source',
        'wal',
        '--database-url',
        url,
        '--schema',
        schema,
        '--broker-timeout-ms',
        '3000',
        '--wal-status-interval-ms',
        '1000',
        '--metrics-port',
        '0',
        '--log-level',
        'info',
      ],
      { OUTBOXKIT_RELAY_ID: 'paused-relay' },
    );
    await logLine(relay, 'WAL relay started', undefined, 40_000);
    const port = Number((await logLine(relay, 'metrics and health endpoints listening')).port);
    const metrics = async () => (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    const streamed = await enqueueMany(writer, topic!, 4, 'streamed');
    await waitFor(async () => (await rowsLeft(schema)) === 0, { timeoutMs: 20_000, message: 'not streamed' });

    relay.proc.kill('SIGSTOP');
    try {
      const paused = await enqueueMany(writer, topic!, 5, 'paused');
      await invalidate(slot);
      const afterLoss = await enqueueMany(writer, topic!, 3, 'after-loss');
      expect(await rowsLeft(schema)).toBe(paused.length + afterLoss.length);
      relay.proc.kill('SIGCONT');

      const warning = await logLine(relay, LOST_WARNING);
      expect(warning).toMatchObject({ slot, reason: 'lost', walStatus: 'lost' });
      const done = await logLine(relay, 'WAL relay resync done', (e) => e.reason === 'lost');
      expect(done).toMatchObject({ slot, reason: 'lost' });
      // The relay may have streamed, published and deleted a prefix of the `paused` transactions
      // (SIGSTOP takes effect a moment after kill() returns; the walsender sent them before it was
      // ended, and the continued relay reads what its socket holds before the connection's end):
      // seen once in about 25 runs, 6 events resynced instead of 8, the topic complete. The resync
      // publishes the rest. The `afterLoss` rows were written after the walsender ended: only the
      // resync has them.
      expect(done.events).toBeGreaterThanOrEqual(afterLoss.length);
      expect(done.events).toBeLessThanOrEqual(paused.length + afterLoss.length);
      await waitFor(async () => /^outboxkit_wal_relay_resyncs_total\{reason="lost"\} 1$/m.test(await metrics()), {
        timeoutMs: 10_000,
        message: 'outboxkit_wal_relay_resyncs_total{reason="lost"} is not 1',
      });
      const [recreated] = await walSlotsStatus(q(pool!), `"${schema}"`, slot);
      expect(recreated).toMatchObject({ exists: true, walStatus: 'reserved', resyncReason: 'lost' });

      const later = await enqueueMany(writer, topic!, 2, 'later');
      await waitFor(async () => (await rowsLeft(schema)) === 0, { timeoutMs: 20_000, message: 'not streamed after' });
      await expectEveryEventOnce(topic!, [...streamed, ...paused, ...afterLoss, ...later]);
    } finally {
      relay.proc.kill('SIGCONT');
    }
    relay.proc.kill('SIGTERM');
    expect((await relay.exited).code).toBe(0);
  });
});
