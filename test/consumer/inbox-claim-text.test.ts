/**
 * The inbox claim with its values inlined (it travels with BEGIN in one simple-protocol query):
 * values round-trip exactly, whatever the group and topic contain, and nothing unvalidated is
 * ever inlined.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { claimedByLast, inboxClaimSql, inlineLiterals, type InboxRow } from '../../consumer/inbox-sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

/** The claim of `group` with its values inlined, as the pg.Pool transaction sends it (the row's own group ignored). */
function inboxClaimText(schemaSql: string, group: string): (row: InboxRow) => string {
  return (row) => inboxClaimSql({ schemaSql, row: { ...row, groupId: group } }, inlineLiterals()).text;
}

describe('inboxClaimText', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterAll(async () => {
    await db?.drop();
  });

  const row = {
    groupId: 'ignored',
    eventId: '0190a6f0-7b1c-7cc3-8a5e-2f1b3c4d5e6f',
    topic: 'orders.v1',
    partition: 2,
    offset: '9223372036854775807',
  };

  it('stores the group and topic exactly, quotes and backslashes included, and claims once', async () => {
    const group = String.raw`o'brien \' \\ "; DROP TABLE outboxkit.inbox; --`;
    const claim = inboxClaimText('"outboxkit"', group);
    const client = await db.pool.connect();
    try {
      const first = await client.query(`BEGIN; SET LOCAL lock_timeout = '100ms'; ${claim(row)}`);
      expect(claimedByLast(first as never)).toBe(true);
      const again = await client.query(claim(row));
      expect(claimedByLast(again)).toBe(false);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const { rows } = await db.pool.query(
      'SELECT consumer_group, event_id, topic, partition, "offset"::text AS offset FROM outboxkit.inbox',
    );
    expect(rows).toEqual([
      { consumer_group: group, event_id: row.eventId, topic: row.topic, partition: 2, offset: row.offset },
    ]);
  });

  it.each([
    ['an upper-case or malformed event id', { eventId: "0190A6F0-7B1C-7CC3-8A5E-2F1B3C4D5E6F'" }],
    ['a negative partition', { partition: -1 }],
    ['a fractional partition', { partition: 1.5 }],
    ['an offset that is not a decimal int64', { offset: '1; DROP TABLE x' }],
    ['an offset with 20 digits', { offset: '12345678901234567890' }],
  ])('refuses to inline %s', (_, bad) => {
    const claim = inboxClaimText('"outboxkit"', 'g');
    expect(() => claim({ ...row, ...bad })).toThrow(/Refusing to inline/);
  });
});
