/**
 * `outboxkit parked list` (relay/sql.ts listParkedSql) lists the oldest parked events first: by
 * seq as a number. Found by a new-user trial: ordered by the output column `seq::text AS seq`,
 * seq 10 came before 9, and `--limit 3` of 3,000 parked events showed seq 1000 while 116 waited.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listParked } from '../../relay/sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

describe('parked list order', () => {
  it('lists by seq as a number (9 before 10, 900,000,000,000 before 1,000,000,000,000)', async () => {
    for (const seq of ['1000000000000', '10', '900000000000', '9']) {
      await db.pool.query(
        `INSERT INTO outboxkit.outbox_events (seq, event_id, topic, key, lane, type, payload, parked_at, last_error)
         OVERRIDING SYSTEM VALUE
         VALUES ($1::bigint, gen_random_uuid(), 't', 'k', 0, 'x', '\\x00', now(), 'refused')`,
        [seq],
      );
    }
    const parked = await listParked(db.pool, 'outboxkit');
    expect(parked.map((p) => p.seq)).toEqual(['9', '10', '900000000000', '1000000000000']);
    expect((await listParked(db.pool, 'outboxkit', 2)).map((p) => p.seq)).toEqual(['9', '10']);
  });
});
