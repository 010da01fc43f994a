/**
 * The fast paths of the I-JSON check (short integers, member names without escapes) must decide
 * exactly as the full rule (`isLosslessNumber`, JSON.parse of the name). Pure, no I/O.
 */
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { fingerprintRequest, isLosslessNumber } from '../../src/idempotency/fingerprint.js';

function accepted(body: string): boolean {
  try {
    fingerprintRequest({ tenant: 't', operation: 'op', body, maxBodyBytes: 10_000 });
    return true;
  } catch (err) {
    if (isOutboxkitError(err, 'OUTBOXKIT_BODY_INVALID')) return false;
    throw err;
  }
}

describe('I-JSON check fast paths', () => {
  it('integer literals of 1 to 22 digits are accepted exactly when a double holds them (around 2^53 too)', () => {
    const literals = ['0', '-0', '7', '-7'];
    for (let digits = 1; digits <= 22; digits++) {
      literals.push('9'.repeat(digits), `-${'9'.repeat(digits)}`, `1${'0'.repeat(digits - 1)}`);
      literals.push(String(2 ** Math.min(digits * 3, 70) + 1).replace(/e.*/, ''));
    }
    literals.push('9007199254740991', '9007199254740992', '9007199254740993', '-9007199254740993', '123456789012345');
    for (const literal of literals) {
      expect(accepted(`{"n":${literal}}`), literal).toBe(isLosslessNumber(literal));
      expect(accepted(`[${literal},1]`), literal).toBe(isLosslessNumber(literal));
    }
    expect(accepted('{"n":9007199254740993}')).toBe(false);
    expect(accepted('{"n":999999999999999}')).toBe(true); // 15 digits
  });

  it('member names with and without escapes: duplicates are found either way, escapes decoded', () => {
    expect(accepted('{"ab":1,"ab":2}')).toBe(false);
    expect(accepted('{"ab":1,"a\\u0062":2}')).toBe(false);
    expect(accepted('{"a\\"b":1,"a\\"b":2}')).toBe(false);
    expect(accepted('{"a\\"b":1,"a\\\\b":2}')).toBe(true);
    expect(accepted('{"ab":1,"abc":2,"x":{"ab":3}}')).toBe(true);
  });
});
