import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, HEADER_EVENT_ID, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 20 });
  await db.pool.query(
    `CREATE TABLE agg (id text PRIMARY KEY, v int NOT NULL); CREATE TABLE versions (event_id uuid PRIMARY KEY, v int NOT NULL)`,
  );
});
afterAll(async () => {
  await db.drop();
});

describe('per-key commit order', () => {
  it('a second writer of a key waits for the first to commit, so seq follows commit order', async () => {
    const [topic] = await createTopics(['order-lock']);
    const first = await db.pool.connect();
    await first.query('BEGIN');
    const [a] = await enqueue(first, { topic: topic!, key: 'K', type: 't', payload: 1 });
    let secondDone = false;
    const second = withPgTransaction(db.pool, (c) =>
      enqueue(c, { topic: topic!, key: 'K', type: 't', payload: 2 }),
    ).then((r) => {
      secondDone = true;
      return r;
    });
    // Another key is not held up.
    await withPgTransaction(db.pool, (c) => enqueue(c, { topic: topic!, key: 'other', type: 't', payload: 3 }));
    await new Promise((r) => setTimeout(r, 300));
    expect(secondDone).toBe(false);
    await first.query('COMMIT');
    first.release();
    const [b] = await second;
    expect(BigInt(b!.seq)).toBeGreaterThan(BigInt(a!.seq));
  });

  it.each([
    ['default batching', {}],
    ['maximum batching', { batchSize: 5_000, maxBatchBytes: 10_000_000 }],
  ])(
    'C02 one key, many writers, two relays (%s): first occurrences in commit order, none missing',
    async (_, relayOptions) => {
      const [topic] = await createTopics(['c02']);
      await db.pool.query(`INSERT INTO agg VALUES ('X', 0) ON CONFLICT (id) DO UPDATE SET v = 0`);
      await db.pool.query('TRUNCATE versions');
      await startRelay(db.url, relayOptions);
      await startRelay(db.url, relayOptions);
      let next = 0;
      // Each transaction enqueues, then takes its version from the aggregate row: the row lock
      // order is the commit order, so versions count commits. Without the writer's per-key lock,
      // seq (drawn at enqueue) would not follow that order.
      const writer = async () => {
        while (next < 200) {
          next++;
          await withPgTransaction(db.pool, async (c) => {
            const [e] = await enqueue(c, { topic: topic!, key: 'X', type: 'v', payload: 'x' });
            const { rows } = await c.query<{ v: number }>(`UPDATE agg SET v = v + 1 WHERE id = 'X' RETURNING v`);
            await c.query('INSERT INTO versions VALUES ($1, $2)', [e!.eventId, rows[0]!.v]);
            // Other keys written at the same time.
            await enqueue(c, { topic: topic!, key: `noise-${next % 7}`, type: 'n', payload: next });
          });
        }
      };
      await Promise.all(Array.from({ length: 8 }, writer));
      const { rows } = await db.pool.query<{ event_id: string; v: number }>('SELECT event_id, v FROM versions');
      const version = new Map(rows.map((r) => [r.event_id, r.v]));
      expect(version.size).toBe(200);
      const seen = await readTopic(
        topic!,
        (m) => (m.key === 'X' ? version.get(m.headers[HEADER_EVENT_ID]!) : undefined),
        (all) => new Set(all.filter((v) => v !== undefined)).size >= 200,
        60_000,
      );
      const firsts: number[] = [];
      const seenSet = new Set<number>();
      for (const v of seen) {
        if (v === undefined || seenSet.has(v)) continue;
        seenSet.add(v);
        firsts.push(v);
      }
      expect(firsts).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
      await waitFor(async () => {
        const r = await db.pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL',
          [topic],
        );
        return r.rows[0]!.n === 0;
      });
    },
  );
});
