/**
 * The WAL relay's held keys (relay/wal/held-keys.ts, docs/wal-source.md "Held keys") against the
 * real PostgreSQL at wal_level=logical and the real Kafka broker: with `holdKeyBehindFailure` (the
 * default), the later events of a parked event's key are held in the table while the stream goes
 * on past them (the slot confirmed, other keys published); a relay started later holds the same
 * key (the held rows are read back from the table); and once an operator retries the parked event,
 * it and then the held events go out in commit order, and every row is deleted. The partition
 * outage case (a partition without a leader) is in test/cluster/wal-partial-outage.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';

import { listParked, retryParked } from '../../relay/sql.js';
import { createWalRelay, type WalRelay } from '../../relay/wal/wal-relay.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import { withPgTransaction } from '../../src/database.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics, createTopicsOn, readTopic, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { confirmedFlush, currentWalLsn, walRelayTestFile } from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_wal_held';
const outbox = createOutbox({ source: 'wal' });
const file = walRelayTestFile(PUBLICATION);
let db: TestDatabase;
beforeAll(() => {
  db = file.db;
});

async function startRelay(slot: string): Promise<WalRelay> {
  const relay = createWalRelay(file.relayOptions(slot));
  file.relays.push(relay);
  await relay.start();
  return relay;
}

async function enqueue(topic: string, key: string, payload: string): Promise<string> {
  const [written] = await withPgTransaction(db.pool, (c) => outbox.enqueue(c, [{ topic, key, payload, type: 'test' }]));
  return written!.eventId;
}

const ids = (topic: string, until: (n: number) => boolean) =>
  readTopic(
    topic,
    (m) => m.headers['event-id']!,
    (all) => until(all.length),
    30_000,
  );

async function heldRows(): Promise<string[]> {
  const { rows } = await db.pool.query<{ event_id: string }>(
    `SELECT event_id FROM outboxkit.outbox_events
      WHERE next_attempt_at IS NOT NULL AND parked_at IS NULL AND wal_lsn IS NOT NULL ORDER BY wal_lsn, seq`,
  );
  return rows.map((r) => r.event_id);
}

describe('WAL relay: keys held behind a parked event', () => {
  // Breaches caught: a later event of a parked event's key published before it (out of order once
  // the parked one is retried); the stream held behind the parked key (other keys stop, the slot
  // is not confirmed); a restarted relay forgetting the held key (its new events go ahead); held
  // rows never published after the retry, or published out of commit order, or left in the table.
  it('holds the key in the table, across a restart, and publishes it in order after the retry', async () => {
    const [topic] = await createTopics(['wal-held'], { partitions: 1 });
    const missing = `wal-held-missing-${randomBytes(4).toString('hex')}`;
    const slot = await file.createStreamingSlot('held');
    let relay = await startRelay(slot);

    const parked = await enqueue(missing, 'k', 'parked');
    const k1 = await enqueue(topic!, 'k', 'k-1');
    const other1 = await enqueue(topic!, 'other', 'other-1');
    const afterFirst = await currentWalLsn(db.pool);
    // The other key goes out; the parked one's later event is held, and the slot moves past both.
    expect(await ids(topic!, (n) => n >= 1)).toEqual([other1]);
    await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= afterFirst, {
      timeoutMs: 20_000,
      message: () => `slot not confirmed past the held event; stats ${JSON.stringify(relay.stats())}`,
    });
    expect(relay.stats()).toMatchObject({ parked: 1, held: 1, published: 1, heldKeys: 1 });
    expect((await listParked(db.pool, 'outboxkit')).map((p) => p.event_id)).toEqual([parked]);
    expect(await heldRows()).toEqual([k1]);

    // A new relay reads the held key back from the table: the key's new event is held too.
    await relay.stop();
    relay = await startRelay(slot);
    const k2 = await enqueue(topic!, 'k', 'k-2');
    const other2 = await enqueue(topic!, 'other', 'other-2');
    expect(await ids(topic!, (n) => n >= 2)).toEqual([other1, other2]);
    await waitFor(async () => (await heldRows()).length === 2, {
      timeoutMs: 20_000,
      message: () => `k-2 not held; stats ${JSON.stringify(relay.stats())}`,
    });
    expect(await heldRows()).toEqual([k1, k2]);

    // The operator creates the topic and retries: the parked event, then the held ones, in order.
    await createTopicsOn(testKafka(), [{ topic: missing, numPartitions: 1 }]);
    expect(await retryParked(db.pool, '"outboxkit"', [parked])).toBe(1);
    expect(await ids(missing, (n) => n >= 1)).toEqual([parked]);
    expect(await ids(topic!, (n) => n >= 4)).toEqual([other1, other2, k1, k2]);
    await waitFor(async () => (await db.pool.query('SELECT 1 FROM outboxkit.outbox_events')).rowCount === 0, {
      timeoutMs: 15_000,
      message: 'rows left in the table',
    });
    await waitFor(() => relay.stats().heldKeys === 0, { timeoutMs: 10_000, message: 'key still held' });
    // The key flows again, straight from the stream.
    const k3 = await enqueue(topic!, 'k', 'k-3');
    expect(await ids(topic!, (n) => n >= 5)).toEqual([other1, other2, k1, k2, k3]);
  });
});
