/**
 * The partition progress rules (consumer/progress.ts), without infrastructure: when a batch
 * continues a stream, when a stored row is trusted, what is skipped, and what row is written.
 */
import { describe, expect, it } from 'vitest';
import {
  claimWithProgressText,
  continuesStream,
  isProvenHandled,
  markHandled,
  markWritten,
  newStream,
  progressAfter,
  verifyAnchor,
  type RecordIdentity,
  type StoredProgress,
} from '../../../consumer/progress.js';
import { inboxClaimText } from '../../../consumer/inbox-sql.js';

const ID_A = '0190a1b2-0000-7000-8000-00000000000a';
const ID_B = '0190a1b2-0000-7000-8000-00000000000b';

/** A stored row: offsets 10..20 handled, the record at 20 was ID_A at timestamp 1000. */
const STORED: StoredProgress = { rangeStart: 10n, lastOffset: 20n, lastEventId: ID_A, lastTimestamp: 1000n };

/** A batch's lookup from records given as [offset, event id, timestamp]. */
function batch(...records: [number, string | null, number][]): [(o: bigint) => RecordIdentity | undefined, bigint] {
  const byOffset = new Map<bigint, RecordIdentity>(
    records.map(([offset, eventId, timestamp]) => [
      BigInt(offset),
      { offset: BigInt(offset), eventId, timestamp: BigInt(timestamp) },
    ]),
  );
  return [(o) => byOffset.get(o), BigInt(records[records.length - 1]![0])];
}

describe('continuesStream', () => {
  it('continues only at the offset after the last handled message', () => {
    const s = newStream(5n, null);
    expect(continuesStream(s, 5n)).toBe(true); // nothing handled yet: its own start
    markHandled(s, 9n);
    expect(continuesStream(s, 10n)).toBe(true); // the next fetch
    // Back into handled offsets: a seek, an offset reset, or a topic recreated under the
    // running consumer (kafkajs reads the new log from its start): a new stream.
    expect(continuesStream(s, 7n)).toBe(false);
    expect(continuesStream(s, 0n)).toBe(false);
    expect(continuesStream(s, 11n)).toBe(false); // a gap: a seek or reset forwards
    expect(continuesStream(undefined, 0n)).toBe(false);
  });
});

describe('verifyAnchor', () => {
  it('trusts the stored row when the batch holds its last record, same event id and timestamp', () => {
    const s = newStream(15n, STORED);
    expect(verifyAnchor(s, ...batch([15, ID_B, 900], [20, ID_A, 1000], [21, ID_B, 1001]))).toBe(true);
    expect(s.trusted).toEqual(STORED);
    expect(isProvenHandled(s, 15n)).toBe(true);
    expect(isProvenHandled(s, 20n)).toBe(true);
    expect(isProvenHandled(s, 21n)).toBe(false);
    expect(isProvenHandled(s, 9n)).toBe(false);
  });

  it('never trusts another record at the anchor offset: a recreated topic (other id) or a later copy (other timestamp)', () => {
    const recreated = newStream(0n, STORED);
    expect(verifyAnchor(recreated, ...batch([0, ID_B, 5], [20, ID_B, 1000]))).toBe(false);
    expect(recreated.candidate).toBeNull();
    expect(isProvenHandled(recreated, 15n)).toBe(false);

    const copy = newStream(0n, STORED);
    expect(verifyAnchor(copy, ...batch([20, ID_A, 5000]))).toBe(false);
    expect(copy.candidate).toBeNull();
    expect(isProvenHandled(copy, 20n)).toBe(false);
  });

  it('keeps the candidate while batches end before the anchor, drops it once one passes the offset without it', () => {
    const s = newStream(10n, STORED);
    expect(verifyAnchor(s, ...batch([10, ID_B, 1], [15, ID_B, 2]))).toBe(false);
    expect(s.candidate).toEqual(STORED);
    expect(isProvenHandled(s, 12n)).toBe(false); // not trusted yet: through the inbox
    // Compacted away: the batch goes past offset 20 without a record there.
    expect(verifyAnchor(s, ...batch([19, ID_B, 3], [22, ID_B, 4]))).toBe(false);
    expect(s.candidate).toBeNull();
  });

  it('is a no-op without a stored row', () => {
    const s = newStream(0n, null);
    expect(verifyAnchor(s, ...batch([0, ID_A, 1]))).toBe(false);
    expect(isProvenHandled(s, 0n)).toBe(false);
  });
});

describe('progressAfter', () => {
  it('writes the stream’s own range while it trusts nothing', () => {
    const s = newStream(30n, STORED); // starts after the stored range: cannot see its anchor
    markHandled(s, 31n);
    expect(progressAfter(s, { offset: 32n, eventId: ID_B, timestamp: 7n })).toEqual({
      rangeStart: 30n,
      lastOffset: 32n,
      lastEventId: ID_B,
      lastTimestamp: 7n,
    });
  });

  it('joins the trusted row when the stream began inside it', () => {
    const inside = newStream(15n, STORED);
    verifyAnchor(inside, ...batch([20, ID_A, 1000]));
    expect(progressAfter(inside, { offset: 21n, eventId: ID_B, timestamp: 1001n })).toEqual({
      rangeStart: 10n,
      lastOffset: 21n,
      lastEventId: ID_B,
      lastTimestamp: 1001n,
    });
  });

  it('an offset reset to before the trusted range: own range until the stream reaches it, then one range with its anchor', () => {
    const s = newStream(3n, STORED);
    verifyAnchor(s, ...batch([3, ID_B, 1], [20, ID_A, 1000]));
    // 3..8 are not proven (below the range): applied, each writing the stream's own range.
    for (let o = 3n; o <= 8n; o++) {
      expect(isProvenHandled(s, o)).toBe(false);
      const row = progressAfter(s, { offset: o, eventId: ID_B, timestamp: o });
      expect(row).toEqual({ rangeStart: 3n, lastOffset: o, lastEventId: ID_B, lastTimestamp: o });
      markWritten(s, row);
      markHandled(s, o);
    }
    // 9 is the last one before the range: the union 3..20, anchored at the trusted row's record.
    const joined = progressAfter(s, { offset: 9n, eventId: ID_B, timestamp: 9n });
    expect(joined).toEqual({ rangeStart: 3n, lastOffset: 20n, lastEventId: ID_A, lastTimestamp: 1000n });
    markWritten(s, joined);
    markHandled(s, 9n);
    for (const o of [10n, 15n, 20n]) expect(isProvenHandled(s, o)).toBe(true);
    expect(isProvenHandled(s, 21n)).toBe(false);
    expect(progressAfter(s, { offset: 21n, eventId: ID_B, timestamp: 21n }).rangeStart).toBe(3n);
  });

  it('after a write, the stream proves its own row and extends it', () => {
    const s = newStream(40n, null);
    const row = progressAfter(s, { offset: 40n, eventId: ID_A, timestamp: 1n });
    markWritten(s, row);
    markHandled(s, 40n);
    expect(isProvenHandled(s, 40n)).toBe(true); // its transaction committed: proven, if fetched again
    expect(isProvenHandled(s, 41n)).toBe(false);
    expect(progressAfter(s, { offset: 41n, eventId: ID_B, timestamp: 2n }).rangeStart).toBe(40n);
  });
});

describe('claimWithProgressText', () => {
  const text = claimWithProgressText('"outboxkit"', "it's a group", inboxClaimText('"outboxkit"', "it's a group"));
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
