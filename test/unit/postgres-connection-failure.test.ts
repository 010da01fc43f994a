/**
 * `isConnectionFailure()` (src/postgres.ts) tells a failed connection to PostgreSQL from a failed
 * statement by codes only, through wrappers: the WAL relay counts the first as a `database` error.
 */
import { describe, expect, it } from 'vitest';
import { WalStreamError } from '../../src/errors.js';
import { isConnectionFailure } from '../../src/postgres.js';

const coded = (code: string) => Object.assign(new Error(code), { code });

describe('isConnectionFailure', () => {
  it('a socket code, class 08, or a shutdown/recovery/too-many SQLSTATE, also as a cause', () => {
    for (const code of ['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', '08006', '08001', '57P01', '57P03', '53300']) {
      expect(isConnectionFailure(coded(code)), code).toBe(true);
      expect(isConnectionFailure(new WalStreamError('lost', { cause: coded(code) })), code).toBe(true);
    }
    expect(isConnectionFailure(new AggregateError([coded('ECONNREFUSED')]))).toBe(true);
  });

  it('not a statement error, a slot held by another reader, an uncoded error', () => {
    for (const code of ['42501', '42P01', '55006', '42704', 'OUTBOXKIT_WAL_STREAM_FAILED']) {
      expect(isConnectionFailure(coded(code)), code).toBe(false);
      expect(isConnectionFailure(new WalStreamError('refused', { cause: coded(code) })), code).toBe(false);
    }
    expect(isConnectionFailure(new WalStreamError('another relay checks the slot'))).toBe(false);
    expect(isConnectionFailure(new Error('Connection terminated unexpectedly'))).toBe(false);
    expect(isConnectionFailure(undefined)).toBe(false);
  });
});
