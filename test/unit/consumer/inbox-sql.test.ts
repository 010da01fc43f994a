/**
 * The inbox claim's builders (consumer/inbox-sql.ts, consumer/progress-sql.ts) without
 * infrastructure: one statement written with bind parameters (drizzle) or inlined literals (the
 * `pg.Pool` simple-protocol string), and the progress claim built on the inbox claim's INSERT.
 * test/consumer/inbox-claim-text.test.ts runs the inlined form against PostgreSQL.
 */
import { describe, expect, it } from 'vitest';
import {
  bindParameters,
  inboxClaimSql,
  inboxInsertText,
  inlineLiterals,
  lockTimeoutSql,
} from '../../../consumer/inbox-sql.js';
import { claimWithProgressSql } from '../../../consumer/progress-sql.js';

const schemaSql = '"outboxkit"';
const row = {
  groupId: "o'brien",
  eventId: '0190a6f0-7b1c-7cc3-8a5e-2f1b3c4d5e6f',
  topic: 'orders',
  partition: 2,
  offset: '41',
};
const progress = { rangeStart: 40n, lastOffset: 41n, lastEventId: row.eventId, lastTimestamp: -1n };

describe('inbox claim builders', () => {
  it('bind parameters: typed placeholders, the values beside the text', () => {
    expect(inboxClaimSql({ schemaSql, row })).toEqual({
      text:
        'INSERT INTO "outboxkit".inbox (consumer_group, event_id, topic, partition, "offset") ' +
        'VALUES ($1::text, $2::uuid, $3::text, $4::int, $5::bigint) ' +
        'ON CONFLICT (consumer_group, event_id) DO NOTHING RETURNING 1 AS claimed',
      values: ["o'brien", row.eventId, 'orders', 2, '41'],
    });
    expect(lockTimeoutSql(5_000)).toEqual({
      text: "SELECT set_config('lock_timeout', $1::text, true)",
      values: ['5000ms'],
    });
  });

  it('inlined literals: the same statement, quoted once, no values beside it', () => {
    expect(inboxClaimSql({ schemaSql, row }, inlineLiterals())).toEqual({
      text:
        'INSERT INTO "outboxkit".inbox (consumer_group, event_id, topic, partition, "offset") ' +
        `VALUES ('o''brien', '${row.eventId}', 'orders', 2, 41) ` +
        'ON CONFLICT (consumer_group, event_id) DO NOTHING RETURNING 1 AS claimed',
      values: [],
    });
    expect(lockTimeoutSql(5_000, inlineLiterals()).text).toBe("SELECT set_config('lock_timeout', '5000ms', true)");
  });

  it('the progress claim is built on the inbox claim’s INSERT, with either writer', () => {
    const inline = claimWithProgressSql({ schemaSql, row, progress }, inlineLiterals());
    expect(inline.text).toContain(`WITH claim AS (${inboxInsertText(schemaSql, row, inlineLiterals())} RETURNING 1)`);
    expect(inline.text).toContain(`SELECT 'o''brien', 'orders', 2, 40, 41, '${row.eventId}', -1, now()`);

    const bound = claimWithProgressSql({ schemaSql, row, progress });
    expect(bound.text).toContain(`WITH claim AS (${inboxInsertText(schemaSql, row, bindParameters())} RETURNING 1)`);
    expect(bound.text).toContain(
      'SELECT $6::text, $7::text, $8::int, $9::bigint, $10::bigint, $11::uuid, $12::bigint, now()',
    );
    expect(bound.values).toEqual([
      ...inboxClaimSql({ schemaSql, row }).values,
      "o'brien",
      'orders',
      2,
      '40',
      '41',
      row.eventId,
      '-1',
    ]);
  });
});
