import { describe, expect, it } from 'vitest';
import { isConnectionError, isInvalidMessage } from '../../../consumer/classify-error.js';
import { InvalidMessageError } from '../../../consumer/errors.js';
import { OutboxkitError } from '../../../src/errors.js';

const withCode = (code: string) => Object.assign(new Error(code), { code });

describe('isConnectionError', () => {
  it.each(['08006', '08001', '57P01', '57P03', '53300', 'ECONNREFUSED', 'ECONNRESET'])('is true for %s', (code) => {
    expect(isConnectionError(withCode(code))).toBe(true);
  });

  it.each(['23505', '40001', '40P01', '55P03', '25P02', '42P01'])(
    'is false for %s (the statement, not the connection)',
    (code) => {
      expect(isConnectionError(withCode(code))).toBe(false);
    },
  );

  it('looks through the cause chain (drizzle wraps driver errors)', () => {
    expect(isConnectionError(new Error('Failed query', { cause: withCode('57P01') }))).toBe(true);
    expect(isConnectionError(new Error('plain'))).toBe(false);
    expect(isConnectionError('not an error')).toBe(false);
  });
});

describe('isInvalidMessage', () => {
  it('recognises OUTBOXKIT_INVALID_MESSAGE by code, whatever the class', () => {
    expect(isInvalidMessage(new InvalidMessageError('bad'))).toBe(true);
    expect(isInvalidMessage(new OutboxkitError('OUTBOXKIT_INVALID_MESSAGE', 'from another copy'))).toBe(true);
    expect(isInvalidMessage(new OutboxkitError('OUTBOXKIT_INVALID_EVENT', 'other'))).toBe(false);
    expect(isInvalidMessage(new Error('bad'))).toBe(false);
  });
});
