import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, HEADER_EVENT_ID, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { spawnRelay } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 12 });
});
afterAll(async () => {
  await db.drop();
});

describe('three relays, one killed mid-stream', () => {
  it('publishes every event, and each key keeps its order of first occurrences', async () => {
    const [topic] = await createTopics(['failover'], { partitions: 3 });
    const victim = spawnRelay(db.url, {}, ['--relay-id', 'victim']);
    await startRelay(db.url);
    await startRelay(db.url);
    await waitFor(async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id = 'victim'`,
      );
      return rows[0]!.n > 0;
    });
    const keys = Array.from({ length: 12 }, (_, i) => `agg-${i}`);
    const expected = new Map<string, string[]>(keys.map((k) => [k, []]));
    let killed = false;
    // 12 keys x 25 versions, written by 4 concurrent writers; the relay child dies on the way.
    let n = 0;
    const writer = async () => {
      while (n < 300) {
        const i = n++;
        const key = keys[i % keys.length]!;
        await withPgTransaction(db.pool, async (c) => {
          const [e] = await enqueue(c, { topic: topic!, key, type: 'v', payload: i });
          // Versions of a key in commit order: the per-key lock serialises its writers.
          expected.get(key)!.push(e!.eventId);
        });
        if (i === 120 && !killed) {
          killed = true;
          victim.proc.kill('SIGKILL');
        }
      }
    };
    await Promise.all(Array.from({ length: 4 }, writer));
    await victim.exited;
    const seen = await readTopic(
      topic!,
      (m) => ({ key: m.key!, id: m.headers[HEADER_EVENT_ID]! }),
      (all) => new Set(all.map((a) => a.id)).size >= 300,
      60_000,
    );
    for (const key of keys) {
      const firsts: string[] = [];
      for (const s of seen) if (s.key === key && !firsts.includes(s.id)) firsts.push(s.id);
      expect(firsts, key).toEqual(expected.get(key));
    }
    await waitFor(async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
      );
      return rows[0]!.n === 0;
    });
  });
});
