/**
 * The CLI's integer arguments (cli/shared.ts `int`): decimal digits only. Found by a new-user
 * trial: `OUTBOXKIT_CLEANUP_ROWS_PER_SECOND=` (an empty variable of a deployment template) started
 * the relay with unpaced cleanup, since Number('') is 0; '0x10' was read as 16.
 */
import { describe, expect, it } from 'vitest';
import { int, positiveInt } from '../../../cli/shared.js';

describe('CLI integer arguments', () => {
  it.each(['0', '42', '-1', '+7', ' 5 ', '9007199254740991'])('accepts %j', (value) => {
    expect(int(value)).toBe(Number(value));
  });

  it.each(['', ' ', '0x10', '1e3', '1.5', 'abc', '1_000', '12abc'])('refuses %j as not an integer', (value) => {
    expect(() => int(value)).toThrow('Not an integer.');
  });

  it('refuses an integer past 2^53 - 1, naming the bound', () => {
    expect(() => int('99999999999999999999')).toThrow('Out of range: at most 9007199254740991.');
  });

  it('positiveInt refuses an empty value too', () => {
    expect(() => positiveInt('')).toThrow('Not an integer.');
  });
});
