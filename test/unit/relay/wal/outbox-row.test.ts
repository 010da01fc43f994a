import { describe, expect, it } from 'vitest';
import { toRecord } from '../../../../relay/record.js';
import { decodeOutboxRow } from '../../../../relay/wal/outbox-row.js';
import { createWalRelay } from '../../../../relay/wal/wal-relay.js';
import { isOutboxkitError } from '../../../../src/errors.js';

const row = {
  seq: '42',
  event_id: '0190b2f4-7c1e-7000-8000-000000000001',
  topic: 'orders',
  key: 'k',
  lane: 3,
  type: 'order.placed',
  payload: Buffer.from([0, 1, 255]),
  headers: { traceparent: '00-abc' },
  created_at: new Date(),
};

describe('decodeOutboxRow', () => {
  // Breach caught: the row as node-postgres's default parsers give it decoded into another record
  // than the table relay's (relay/record.ts).
  it('decodes the parsed row into the table relay record', () => {
    const decoded = decodeOutboxRow(row);
    expect(decoded.ok).toBe(true);
    if (!decoded.ok) return;
    expect(decoded.row.seq).toBe('42');
    expect(toRecord(decoded.row)).toEqual({
      topic: 'orders',
      key: 'k',
      value: Buffer.from([0, 1, 255]),
      headers: { traceparent: '00-abc', 'event-id': row.event_id, 'event-type': 'order.placed' },
    });
  });

  // Breach caught: an application's global pg type parsers (bytea and jsonb left as text, bigint as
  // BigInt) changing the published bytes or headers.
  it('decodes the text forms of bytea, jsonb and bigint to the same values', () => {
    const decoded = decodeOutboxRow({ ...row, seq: 42n, payload: '\\x0001ff', headers: '{"traceparent":"00-abc"}' });
    expect(decoded).toEqual(decodeOutboxRow(row));
  });

  // Breach caught: a malformed row skipped silently or throwing (the relay must park it by seq, or
  // stop when even the seq is unreadable).
  it('reports a row it cannot decode, with its seq when readable', () => {
    expect(decodeOutboxRow({ ...row, payload: 'not hex' })).toMatchObject({ ok: false, seq: '42' });
    expect(decodeOutboxRow({ ...row, headers: { a: 1 } })).toMatchObject({ ok: false, seq: '42' });
    expect(decodeOutboxRow({ ...row, topic: null })).toMatchObject({ ok: false, seq: '42' });
    const noSeq = decodeOutboxRow({ ...row, seq: 'x' });
    expect(noSeq.ok).toBe(false);
    expect(noSeq).not.toHaveProperty('seq');
  });

  it('keeps a null key null', () => {
    const decoded = decodeOutboxRow({ ...row, key: null });
    expect(decoded.ok && decoded.row.key).toBeNull();
  });
});

describe('createWalRelay options', () => {
  // Breach caught: a relay made without a way to Kafka, or with an unknown option, failing only later.
  it('refuses unknown options and a missing Kafka with InvalidOptionsError', () => {
    const base = { connection: 'postgres://x', slot: 's', publication: 'p' };
    for (const options of [base, { ...base, brokers: ['b:1'], batchSzie: 3 }]) {
      let error: unknown;
      try {
        createWalRelay(options as never);
      } catch (err) {
        error = err;
      }
      expect(isOutboxkitError(error, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    }
  });
});
