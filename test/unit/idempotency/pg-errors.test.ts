import { describe, expect, it } from 'vitest';
import { classifyStoreError, sqlStateOf } from '../../../src/idempotency/pg-errors.js';
import { InvalidOptionsError } from '../../../src/errors.js';

function pgError(code: string): Error {
  return Object.assign(new Error('message text is never read'), { code, severity: 'ERROR' });
}

describe('classifyStoreError', () => {
  it('classifies by SQLSTATE', () => {
    expect(classifyStoreError(pgError('55P03'))).toBe('lock-timeout');
    expect(classifyStoreError(pgError('40001'))).toBe('serialization');
    for (const code of [
      '08000',
      '08003',
      '08006',
      '08001',
      '57P01',
      '57P02',
      '57P03',
      '53300',
      '53100',
      '58030',
      '57014',
      '25006',
    ]) {
      expect(classifyStoreError(pgError(code)), code).toBe('unavailable');
    }
    for (const code of ['42P01', '23505', '22P02', '40P01'])
      expect(classifyStoreError(pgError(code)), code).toBe('other');
  });

  it('looks through wrappers (drizzle DrizzleQueryError keeps the driver error as cause) and AggregateError', () => {
    const wrapped = new Error('Failed query', { cause: pgError('55P03') });
    expect(sqlStateOf(wrapped)).toBe('55P03');
    expect(classifyStoreError(wrapped)).toBe('lock-timeout');
    const refused = Object.assign(new Error('connect'), { code: 'ECONNREFUSED' });
    expect(classifyStoreError(new AggregateError([refused, refused]))).toBe('unavailable');
  });

  it('treats network errors and uncoded driver errors as unavailable, programming errors as other', () => {
    expect(classifyStoreError(Object.assign(new Error('x'), { code: 'ECONNRESET' }))).toBe('unavailable');
    expect(classifyStoreError(new Error('Connection terminated unexpectedly'))).toBe('unavailable');
    expect(classifyStoreError(new Error('a completely different text'))).toBe('unavailable');
    expect(classifyStoreError(new TypeError('x is not a function'))).toBe('other');
    expect(classifyStoreError(new InvalidOptionsError('bad'))).toBe('other');
    expect(classifyStoreError('a string')).toBe('other');
  });
});
