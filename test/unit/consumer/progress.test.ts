/**
 * The partition progress rules (consumer/progress.ts), without infrastructure: when a batch
 * trusts a row, what is skipped, and what row is written.
 */
import { describe, expect, it } from 'vitest';
import {
  beginBatch,
  isProvenHandled,
  markDeadLettered,
  markWritten,
  newPartitionProgress,
  progressAfter,
  type RecordIdentity,
  type StoredProgress,
} from '../../../consumer/progress.js';
import { inlineLiterals, type InboxRow } from '../../../consumer/inbox-sql.js';
import { claimWithProgressSql } from '../../../consumer/progress-sql.js';

const ID_A = '0190a1b2-0000-7000-8000-00000000000a';
const ID_B = '0190a1b2-0000-7000-8000-00000000000b';

/** A stored row: offsets 10..20 handled, the record at 20 was ID_A at timestamp 1000. */
const STORED: StoredProgress = { rangeStart: 10n, lastOffset: 20n, lastEventId: ID_A, lastTimestamp: 1000n };

/** A batch's lookup from records given as [offset, event id, timestamp]. */
function records(...list: [number, string | null, number][]): (o: bigint) => RecordIdentity | undefined {
  const byOffset = new Map<bigint, RecordIdentity>(
    list.map(([offset, eventId, timestamp]) => [
      BigInt(offset),
      { offset: BigInt(offset), eventId, timestamp: BigInt(timestamp) },
    ]),
  );
  return (o) => byOffset.get(o);
}

describe('beginBatch: when a batch trusts the known row', () => {
  it('trusts it when the batch holds its last record with the same event id and timestamp', () => {
    const p = newPartitionProgress(STORED);
    expect(beginBatch(p, 15n, records([15, ID_B, 900], [20, ID_A, 1000], [21, ID_B, 1001]))).toBe(true);
    expect(isProvenHandled(p, 15n)).toBe(true);
    expect(isProvenHandled(p, 20n)).toBe(true);
    expect(isProvenHandled(p, 21n)).toBe(false);
    expect(isProvenHandled(p, 9n)).toBe(false);
  });

  it('never trusts another record at the anchor offset: a recreated topic (other id) or a later copy (other timestamp)', () => {
    const recreated = newPartitionProgress(STORED);
    expect(beginBatch(recreated, 0n, records([0, ID_B, 5], [20, ID_B, 1000]))).toBe(false);
    expect(isProvenHandled(recreated, 15n)).toBe(false);

    const copy = newPartitionProgress(STORED);
    expect(beginBatch(copy, 0n, records([20, ID_A, 5000]))).toBe(false);
    expect(isProvenHandled(copy, 20n)).toBe(false);
  });

  it('trusts nothing in a batch without the anchor, even one that follows it at once', () => {
    // The next fetch after the anchor: it may read another log (a topic recreated under a running
    // consumer goes on at the same offset), so nothing of the row carries over.
    const p = newPartitionProgress(STORED);
    expect(beginBatch(p, 21n, records([21, ID_B, 1], [22, ID_B, 2]))).toBe(false);
    expect(progressAfter(p, { offset: 22n, eventId: ID_B, timestamp: 2n }).rangeStart).toBe(21n);
    // Nor does a batch that ends before the anchor.
    expect(beginBatch(p, 10n, records([10, ID_B, 1], [15, ID_B, 2]))).toBe(false);
    expect(isProvenHandled(p, 12n)).toBe(false);
  });

  it('is a no-op without a known row', () => {
    const p = newPartitionProgress(null);
    expect(beginBatch(p, 0n, records([0, ID_A, 1]))).toBe(false);
    expect(isProvenHandled(p, 0n)).toBe(false);
    expect(isProvenHandled(undefined, 0n)).toBe(false);
  });
});

describe('progressAfter: the row a batch writes', () => {
  it('from the batch’s fetch offset while it trusts nothing', () => {
    const p = newPartitionProgress(null);
    beginBatch(p, 30n, records());
    expect(progressAfter(p, { offset: 32n, eventId: ID_B, timestamp: 7n })).toEqual({
      rangeStart: 30n,
      lastOffset: 32n,
      lastEventId: ID_B,
      lastTimestamp: 7n,
    });
  });

  it('joined with the trusted row when the batch began inside it', () => {
    const p = newPartitionProgress(STORED);
    beginBatch(p, 15n, records([20, ID_A, 1000]));
    expect(progressAfter(p, { offset: 21n, eventId: ID_B, timestamp: 1001n })).toEqual({
      rangeStart: 10n,
      lastOffset: 21n,
      lastEventId: ID_B,
      lastTimestamp: 1001n,
    });
  });

  it('an offset reset to before the trusted range: the batch’s own range until it reaches it, then one range with its anchor', () => {
    const p = newPartitionProgress(STORED);
    beginBatch(p, 3n, records([3, ID_B, 1], [20, ID_A, 1000]));
    for (let o = 3n; o <= 8n; o++) {
      expect(isProvenHandled(p, o)).toBe(false);
      const row = progressAfter(p, { offset: o, eventId: ID_B, timestamp: o });
      expect(row).toEqual({ rangeStart: 3n, lastOffset: o, lastEventId: ID_B, lastTimestamp: o });
      markWritten(p, row);
    }
    // 9 is the last one before the range: the union 3..20, anchored at the trusted row's record.
    const joined = progressAfter(p, { offset: 9n, eventId: ID_B, timestamp: 9n });
    expect(joined).toEqual({ rangeStart: 3n, lastOffset: 20n, lastEventId: ID_A, lastTimestamp: 1000n });
    markWritten(p, joined);
    for (const o of [10n, 15n, 20n]) expect(isProvenHandled(p, o)).toBe(true);
    expect(isProvenHandled(p, 21n)).toBe(false);
    expect(progressAfter(p, { offset: 21n, eventId: ID_B, timestamp: 21n }).rangeStart).toBe(3n);
  });

  it('a row the process wrote is trusted by a later batch only if it holds that row’s anchor', () => {
    const p = newPartitionProgress(null);
    beginBatch(p, 40n, records([40, ID_A, 1]));
    const row = progressAfter(p, { offset: 40n, eventId: ID_A, timestamp: 1n });
    markWritten(p, row);
    // Refetched (its offset was not resolved): same record, proven handled.
    expect(beginBatch(p, 40n, records([40, ID_A, 1], [41, ID_B, 2]))).toBe(true);
    expect(isProvenHandled(p, 40n)).toBe(true);
    expect(progressAfter(p, { offset: 41n, eventId: ID_B, timestamp: 2n }).rangeStart).toBe(40n);
    // Another record at offset 40 (the topic was recreated meanwhile): nothing proven.
    expect(beginBatch(p, 40n, records([40, ID_B, 9]))).toBe(false);
    expect(isProvenHandled(p, 40n)).toBe(false);
  });

  it('never covers a dead-lettered record: the range starts again after it', () => {
    const p = newPartitionProgress(null);
    beginBatch(p, 0n, records());
    markWritten(p, progressAfter(p, { offset: 0n, eventId: ID_A, timestamp: 1n }));
    markDeadLettered(p, 1n);
    expect(progressAfter(p, { offset: 2n, eventId: ID_B, timestamp: 2n }).rangeStart).toBe(2n);
    // A rewind later: the row covers only what was applied after the dead letter.
    const later = newPartitionProgress({ rangeStart: 2n, lastOffset: 2n, lastEventId: ID_B, lastTimestamp: 2n });
    beginBatch(later, 0n, records([0, ID_A, 1], [1, null, 1], [2, ID_B, 2]));
    expect([0n, 1n, 2n].map((o) => isProvenHandled(later, o))).toEqual([false, false, true]);
  });
});

describe('claimWithProgressText', () => {
  // The progress claim of the group "it's a group", its values inlined (the row's own group ignored).
  const text = (row: InboxRow, progress: StoredProgress): string =>
    claimWithProgressSql(
      { schemaSql: '"outboxkit"', row: { ...row, groupId: "it's a group" }, progress },
      inlineLiterals(),
    ).text;
  const row = { groupId: 'ignored', eventId: ID_A, topic: "o'rders", partition: 2, offset: '20' };

  it('writes the progress only when the claim inserted, and answers one row `claimed`', () => {
    const sql = text(row, STORED);
    expect(sql).toMatch(/^WITH claim AS \(INSERT INTO "outboxkit"\.inbox .* RETURNING 1\), progress AS \(/);
    expect(sql).toContain('WHERE EXISTS (SELECT 1 FROM claim)');
    expect(sql).toMatch(/SELECT count\(\*\)::int AS claimed FROM claim$/);
    // Literals quoted once, the values of the row inlined.
    expect(sql).toContain("'it''s a group', 'o''rders', 2, 10, 20, '" + ID_A + "', 1000, now()");
  });

  it("writes the progress row's own anchor, which may be another record's than the claimed one", () => {
    // The union with a trusted row ending after this record keeps that row's anchor.
    const sql = text(row, { ...STORED, lastEventId: ID_B });
    expect(sql).toContain(", 10, 20, '" + ID_B + "', 1000, now()");
    expect(() => text(row, { ...STORED, lastEventId: 'nope' })).toThrow(/Refusing to inline the progress event id/);
  });

  it('refuses values that are not of their strict shape (the inbox claim checks them)', () => {
    expect(() => text({ ...row, eventId: "x'; DROP TABLE t; --" }, STORED)).toThrow(/Refusing to inline/);
    expect(() => text({ ...row, offset: '1; SELECT' }, STORED)).toThrow(/Refusing to inline/);
  });
});
