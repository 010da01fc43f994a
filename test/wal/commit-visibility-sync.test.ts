/**
 * The commit-visibility race of test/wal/commit-visibility.test.ts, made deterministic: a writer's
 * commit held between "flushed, decoded and streamed" and "visible to other sessions" for as long
 * as the test wants, by synchronous replication. With `synchronous_standby_names` naming a standby
 * that never connects, a session with `synchronous_commit = on` writes and flushes its commit
 * record (a logical walsender decodes and sends it) and then waits in SyncRepWaitForLSN before it
 * leaves the server's list of running transactions, so no other session sees its rows until the
 * wait ends (PostgreSQL's `RecordTransactionCommit`; "Synchronous Replication" in its docs). Every
 * other session runs with `synchronous_commit = local` (the cluster's default here), so only that
 * writer waits. The test checks these facts on the server, then that the WAL relay (docs/wal-source.md,
 * "Removing the durable copies") publishes the held transaction but neither deletes its rows (it
 * cannot see them) nor confirms the slot past its commit, holds the later transactions behind it
 * in commit order, and once the wait ends deletes every row and confirms past them all.
 *
 * The setting is server-wide, so this file runs a PostgreSQL cluster of its own
 * (test/helpers/private-cluster.ts), stopped and removed after the file. The file skips, saying
 * why, only when no PostgreSQL binaries are installed. Kafka is the tests' broker; the topic has
 * one partition, so the topic's order is the order of the relay's sends.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';

import { transactionsVisible } from '../../relay/sql.js';
import { createWalRelay, type WalRelay, type WalRelayEvents } from '../../relay/wal/wal-relay.js';
import { withPgTransaction } from '../../src/database.js';
import { migrate } from '../../src/migrate.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import { createTopics, messagesIn, readTopic } from '../helpers/kafka.js';
import { privateCluster, privateClusterBaseSettings } from '../helpers/private-cluster.js';
import { waitFor } from '../helpers/wait-for.js';
import { confirmedFlush, lsnToBigInt } from '../helpers/wal.js';

/** A standby name no walsender has: a commit with `synchronous_commit = on` waits until the setting is emptied. */
const ABSENT_STANDBY = 'outboxkit_absent_standby';

const cluster = privateCluster({
  file: 'test/wal/commit-visibility-sync.test.ts',
  folder: 'outboxkit-visibility-sync',
  what: 'commit visibility test',
  settings: (port) => ({
    ...privateClusterBaseSettings(port),
    synchronous_standby_names: `'${ABSENT_STANDBY}'`,
    // Every session's default: only the writer that sets `on` waits for the absent standby (the
    // relay's lease renewals, the tests' other writers and the migration commit at once).
    synchronous_commit: 'local',
  }),
});

let url: string;
let pool: pg.Pool | undefined;
const relays: WalRelay[] = [];
const clients: pg.Client[] = [];

beforeAll(async () => {
  if (cluster.skipReason !== undefined) return;
  url = await cluster.start();
  pool = new pg.Pool({ connectionString: url, max: 6 });
}, 120_000);

afterAll(async () => {
  for (const relay of relays.splice(0)) await relay.stop({ timeoutMs: 2_000 }).catch(() => undefined);
  for (const client of clients.splice(0)) await client.end().catch(() => undefined);
  await pool?.end().catch(() => undefined);
  await cluster.stop();
}, 60_000);

/**
 * The transactions writing outboxkit.outbox_events that `probe` (a test_decoding slot) decoded so
 * far, in commit order: xid (32 bits) and commit end LSN (the LSN a relay confirms). Peeked, so
 * the probe slot keeps them.
 */
async function decodedCommits(probe: string): Promise<{ xid: number; lsn: string }[]> {
  const { rows } = await pool!.query<{ lsn: string; xid: string; data: string }>(
    `SELECT lsn::text AS lsn, xid::text AS xid, data FROM pg_logical_slot_peek_changes($1, NULL, NULL, 'include-xids', '1')`,
    [probe],
  );
  const outbox = new Set(rows.filter((r) => r.data.startsWith('table outboxkit.outbox_events:')).map((r) => r.xid));
  return rows
    .filter((r) => r.data.startsWith('COMMIT ') && outbox.has(r.xid))
    .map((r) => ({ xid: Number(r.xid), lsn: r.lsn }));
}

/** The server sessions waiting for a synchronous standby (`wait_event = 'SyncRep'`). */
async function syncRepWaiters(): Promise<number[]> {
  const { rows } = await pool!.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' ORDER BY pid`,
  );
  return rows.map((r) => r.pid);
}

/** The time the relay's walsender last received a status update (pg_stat_replication.reply_time). */
async function replyTime(slot: string): Promise<string | undefined> {
  const { rows } = await pool!.query<{ t: string | null }>(
    `SELECT r.reply_time::text AS t FROM pg_stat_replication r
       JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`,
    [slot],
  );
  return rows[0]?.t ?? undefined;
}

/**
 * Waits for two status updates of the relay after this call (the first might have been written
 * before it), so that the slot's `confirmed_flush_lsn` then says what the relay confirms now.
 */
async function nextStatusUpdates(slot: string): Promise<void> {
  let last = await replyTime(slot);
  for (let i = 0; i < 2; i++) {
    const before = last;
    last = await waitFor(
      async () => {
        const t = await replyTime(slot);
        return t !== undefined && t !== before ? t : undefined;
      },
      { timeoutMs: 20_000, message: `no status update from the relay on slot ${slot}` },
    );
  }
}

/** The heap tuples of `xid` in outboxkit.outbox_events, read from its pages (pageinspect): all, and those not deleted. */
async function tuplesOf(xid: number): Promise<{ all: number; live: number }> {
  const { rows } = await pool!.query<{ all: number; live: number }>(
    `SELECT count(*)::int AS all, count(*) FILTER (WHERE h.t_xmax::text = '0')::int AS live
       FROM generate_series(0, pg_relation_size('outboxkit.outbox_events') / current_setting('block_size')::int - 1) AS b,
            heap_page_items(get_raw_page('outboxkit.outbox_events', b::int)) AS h
      WHERE h.t_xmin::text = $1`,
    [String(xid)],
  );
  return rows[0]!;
}

async function rowsLeft(): Promise<number> {
  const { rows } = await pool!.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events');
  return rows[0]!.n;
}

describe.skipIf(cluster.skipReason !== undefined)('WAL relay: a commit streamed before it is visible', () => {
  // Breach caught: the relay's wait for its batch's transactions to be visible (waitVisible() in
  // relay/wal/wal-relay.ts, after a DELETE that took fewer rows than were acknowledged) left out:
  // the relay then confirms the slot past the held transaction, whose rows its DELETE passed over,
  // and they stay in the table for good. Tried by hand (2026-12-07), with that wait removed from
  // settle(): the test fails at "confirmed_flush_lsn not past the held commit" (the slot confirmed
  // 56 bytes past the held commit's end: its end, then a keepalive's WAL end); that check removed,
  // at the relay's counts (4 events published: the batch settled while its rows were invisible).
  it('publishes the held transaction, deletes its rows and confirms past it only once it is visible', async () => {
    const { walPublication } = await migrate({ connectionString: url, walPublication: true });
    await pool!.query('CREATE EXTENSION IF NOT EXISTS pageinspect');
    const [topic] = await createTopics(['wal-visibility-sync'], { partitions: 1 });
    // A second slot, read with test_decoding only by peeking: what the server decodes, and each
    // commit's end LSN (the LSN a relay confirms). Created before the held transaction begins
    // (creating a logical slot waits for the transactions running then).
    const probe = 'visibility_probe';
    await pool!.query(`SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, [probe]);

    const slot = 'outboxkit_visibility_sync';
    const published: WalRelayEvents['wal:published'][0][] = [];
    const resyncs: WalRelayEvents['wal:resync'][0][] = [];
    const relay = createWalRelay({
      connection: url,
      slot,
      publication: walPublication!.name,
      brokers: inject('kafkaBrokers'),
      statusIntervalMs: 200,
      retryInitialMs: 50,
      retryMaxMs: 500,
    });
    relay.on('wal:published', (p) => published.push(p));
    relay.on('wal:resync', (r) => resyncs.push(r));
    relays.push(relay);
    await relay.start();
    await waitFor(() => resyncs.length === 1, { timeoutMs: 30_000, message: 'no resync of the new slot' });

    const outbox = createOutbox({ source: 'wal' });
    const ids: string[] = [];
    // The pipeline live: one transaction published and deleted before the held one.
    const first = await withPgTransaction(pool!, (c) =>
      outbox.enqueue(c, [{ topic: topic!, key: 'k0', type: 'test.event', payload: 'first' }]),
    );
    ids.push(...first.map((e) => e.eventId));
    await waitFor(async () => (await rowsLeft()) === 0, { timeoutMs: 30_000, message: 'first event not streamed' });

    // The held writer: its commit waits for the absent standby.
    const writer = new pg.Client({ connectionString: url });
    clients.push(writer);
    await writer.connect();
    await writer.query('SET synchronous_commit = on');
    const writerPid = (await writer.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await writer.query('BEGIN');
    const held = await outbox.enqueue(
      writer,
      ['k0', 'k1', 'k2'].map((key, i) => ({ topic: topic!, key, type: 'test.event', payload: `held-${i}` })),
    );
    ids.push(...held.map((e) => e.eventId));
    const xid = Number(
      (await writer.query<{ xid: string }>('SELECT (pg_current_xact_id()::text::bigint & 4294967295)::text AS xid'))
        .rows[0]!.xid,
    );
    let committed = false;
    const commit = writer.query('COMMIT').then(() => {
      committed = true;
    });
    // Awaited once the wait ends; a test failing before then ends the client with the COMMIT pending.
    commit.catch(() => undefined);

    // The facts: the COMMIT waits in SyncRep (the only session that does), the server decodes the
    // transaction meanwhile, and a new session does not see its rows.
    await waitFor(async () => (await syncRepWaiters()).includes(writerPid), {
      timeoutMs: 20_000,
      message: "the writer's COMMIT is not waiting for the synchronous standby",
    });
    const heldCommit = await waitFor(async () => (await decodedCommits(probe)).find((c) => c.xid === xid), {
      timeoutMs: 20_000,
      message: 'the held transaction is not decoded',
    });
    expect(committed).toBe(false);
    expect(
      (
        await pool!.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE event_id = ANY($1)',
          [held.map((e) => e.eventId)],
        )
      ).rows[0]!.n,
    ).toBe(0);
    expect(await transactionsVisible(pool!, [xid])).toBe(false);

    // The relay streams it and publishes its events.
    await waitFor(async () => (await messagesIn(topic!)) === 1 + held.length, {
      timeoutMs: 30_000,
      message: 'the held transaction was not published',
    });
    // Then it waits for the transaction to be visible (its polls in pg_stat_activity), or, without
    // that wait, has confirmed past it already.
    await waitFor(
      async () =>
        lsnToBigInt(relay.stats().confirmedLsn) >= lsnToBigInt(heldCommit.lsn) ||
        (
          await pool!.query(
            `SELECT 1 FROM pg_stat_activity
              WHERE application_name = 'outboxkit-wal-relay' AND query LIKE '%pg_visible_in_snapshot%'`,
          )
        ).rowCount! > 0,
      { timeoutMs: 20_000, message: 'the relay neither waits for the held transaction nor confirmed it' },
    );
    await nextStatusUpdates(slot);
    expect(await confirmedFlush(pool!, slot), 'confirmed_flush_lsn not past the held commit').toBeLessThan(
      lsnToBigInt(heldCommit.lsn),
    );
    // Its rows are in the table, not deleted: the relay's DELETE could not see them.
    expect(await tuplesOf(xid)).toEqual({ all: held.length, live: held.length });
    expect(await syncRepWaiters()).toEqual([writerPid]);
    expect(relay.stats()).toMatchObject({ leaseHeld: true, published: 1 });

    // Other writers' transactions commit at once (synchronous_commit = local), reach the relay,
    // and wait behind the held one: the relay publishes and confirms in commit order.
    const later: string[] = [];
    for (let t = 0; t < 3; t++) {
      const written = await withPgTransaction(pool!, (c) =>
        outbox.enqueue(
          c,
          ['k1', 'k2'].map((key, i) => ({ topic: topic!, key, type: 'test.event', payload: `later-${t}-${i}` })),
        ),
      );
      later.push(...written.map((e) => e.eventId));
    }
    await waitFor(() => relay.stats().queued === 3, {
      timeoutMs: 20_000,
      message: () => `the later transactions did not reach the relay; stats ${JSON.stringify(relay.stats())}`,
    });
    expect(await rowsLeft()).toBe(later.length);
    expect(await messagesIn(topic!)).toBe(1 + held.length);
    await nextStatusUpdates(slot);
    expect(await confirmedFlush(pool!, slot)).toBeLessThan(lsnToBigInt(heldCommit.lsn));
    expect(committed).toBe(false);
    const commits = await decodedCommits(probe);
    const lastCommit = commits.at(-1)!;
    expect(commits.map((c) => c.xid).indexOf(xid), 'the held commit before the later ones').toBe(commits.length - 4);

    // The wait ends: the held commit returns, becomes visible, and the relay catches up.
    await pool!.query(`ALTER SYSTEM SET synchronous_standby_names = ''`);
    await pool!.query('SELECT pg_reload_conf()');
    await waitFor(() => committed, { timeoutMs: 20_000, message: "the writer's COMMIT did not return" });
    await commit;
    ids.push(...later);
    await waitFor(async () => (await rowsLeft()) === 0, { timeoutMs: 30_000, message: 'rows left in the table' });
    await waitFor(async () => (await confirmedFlush(pool!, slot)) >= lsnToBigInt(lastCommit.lsn), {
      timeoutMs: 20_000,
      message: 'the slot is not confirmed past the later transactions',
    });
    // The held transaction's batch: its rows deleted by the relay once they were visible.
    expect(published.find((p) => p.lsn === heldCommit.lsn)).toMatchObject({
      events: held.length,
      deleted: held.length,
      transactions: 1,
    });
    expect(await tuplesOf(xid)).toMatchObject({ live: 0 });
    const onTopic = await readTopic(
      topic!,
      ({ headers }) => headers['event-id']!,
      (all) => all.length >= ids.length,
      20_000,
    );
    expect(onTopic).toEqual(ids);
    expect(await rowsLeft()).toBe(0);
    await relay.stop({ timeoutMs: 5_000 });
  });
});
