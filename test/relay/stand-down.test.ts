/**
 * A relay that cannot reach Kafka must not hold lanes: beside a healthy relay, every event is
 * published although the broken relay keeps running (found by a review: it used to keep its share
 * of the lanes, and their events, for as long as it lived).
 */
import { Kafka, logLevel } from 'kafkajs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 8 });
});
afterAll(async () => {
  await db.drop();
});

async function lanesOf(owner: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id = $1',
    [owner],
  );
  return rows[0]!.n;
}

describe('a relay whose broker is unreachable', () => {
  it('stands down after a lease: a healthy relay takes its lanes and publishes every event', async () => {
    const [topic] = await createTopics(['stand-down'], { partitions: 3 });
    const healthy = await startRelay(db.url, { relayId: 'healthy' });
    // Nothing listens on port 1: every connect is refused at once.
    const unreachable = new Kafka({
      clientId: 'unreachable',
      brokers: ['127.0.0.1:1'],
      logLevel: logLevel.NOTHING,
      retry: { retries: 0 },
    });
    const broken = await startRelay(db.url, { relayId: 'broken', kafka: unreachable, verifyTopics: false });
    const standingDown = new Promise((resolve) => broken.once('relay:standing-down', resolve));
    // Before it stands down, the broken relay may have taken its share (fair share of 2 instances).
    const ids: string[] = [];
    for (let i = 0; i < 40; i++) {
      await withPgTransaction(db.pool, async (c) => {
        const [e] = await enqueue(c, { topic: topic!, key: `k-${i}`, type: 't', payload: i });
        ids.push(e!.eventId);
      });
    }
    await standingDown;
    await waitFor(async () => (await lanesOf('broken')) === 0, { timeoutMs: 10_000 });
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
        );
        return rows[0]!.n === 0;
      },
      { timeoutMs: 20_000 },
    );
    expect(broken.heldLanes()).toEqual([]);
    // The healthy relay takes the released lanes at its next maintenance tick (a third of a lease).
    await waitFor(async () => (await lanesOf('healthy')) === 64, { timeoutMs: 10_000 });
    expect(healthy.heldLanes()).toHaveLength(64);
  }, 60_000);
});
