import { describe, expect, it } from 'vitest';
import {
  afterFailedRollback,
  ConnectionLostError,
  HandlerFailure,
  isInvalidMessage,
  retryLaterOf,
} from '../../../consumer/classify-error.js';
import { InvalidMessageError, RetryLaterError } from '../../../consumer/errors.js';
import { isOutboxkitError, OutboxkitError } from '../../../src/errors.js';

describe('isInvalidMessage', () => {
  it('recognises OUTBOXKIT_INVALID_MESSAGE by code, whatever the class', () => {
    expect(isInvalidMessage(new InvalidMessageError('bad'))).toBe(true);
    expect(isInvalidMessage(new OutboxkitError('OUTBOXKIT_INVALID_MESSAGE', 'from another copy'))).toBe(true);
    expect(isInvalidMessage(new OutboxkitError('OUTBOXKIT_INVALID_EVENT', 'other'))).toBe(false);
    expect(isInvalidMessage(new Error('bad'))).toBe(false);
  });
});

describe('RetryLaterError and retryLaterOf', () => {
  it('is an outboxkit error, retriable, with the delay asked for (or none)', () => {
    const cause = Object.assign(new Error('503'), { code: 'E503' });
    const err = new RetryLaterError('payments API unavailable', { delayMs: 30_000, cause });
    expect(isOutboxkitError(err, 'OUTBOXKIT_RETRY_LATER')).toBe(true);
    expect(err).toMatchObject({ name: 'RetryLaterError', retriable: true, delayMs: 30_000, cause });
    expect(retryLaterOf(err)).toEqual({ delayMs: 30_000 });
    expect(retryLaterOf(new RetryLaterError('no delay'))).toEqual({ delayMs: undefined });
  });

  it('refuses a delay that is not a finite number ≥ 0 with InvalidOptionsError', () => {
    for (const delayMs of [-1, Number.NaN, Number.POSITIVE_INFINITY, '100']) {
      let thrown: unknown;
      try {
        new RetryLaterError('x', { delayMs: delayMs as number });
      } catch (err) {
        thrown = err;
      }
      expect(isOutboxkitError(thrown, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    }
  });

  it('recognises another copy’s error by code, and ignores a bad delay there', () => {
    const other = Object.assign(new OutboxkitError('OUTBOXKIT_RETRY_LATER', 'from another copy'), { delayMs: -5 });
    expect(retryLaterOf(other)).toEqual({ delayMs: undefined });
    expect(retryLaterOf(new Error('later'))).toBeUndefined();
    // Only the error the handler threw itself: not one in a cause chain.
    expect(retryLaterOf(new Error('wrapped', { cause: new RetryLaterError('x') }))).toBeUndefined();
  });
});

describe('afterFailedRollback', () => {
  it('makes a handler failure whose rollback failed a ConnectionLostError (not an attempt), whatever it threw', () => {
    const handlerError = new Error('fetch failed');
    const rollbackError = new Error('Connection terminated unexpectedly');
    const lost = afterFailedRollback(new HandlerFailure(handlerError), rollbackError, 'other');
    expect(lost).toBeInstanceOf(ConnectionLostError);
    expect(lost).not.toBeInstanceOf(HandlerFailure);
    expect(lost).toMatchObject({ handlerError, cause: rollbackError, retriable: true });
    expect(isOutboxkitError(lost, 'OUTBOXKIT_STORE_UNAVAILABLE')).toBe(true);
  });

  it('leaves any other failure as the caller says', () => {
    const claimError = Object.assign(new Error('lock timeout'), { code: '55P03' });
    expect(afterFailedRollback(claimError, new Error('rollback'), claimError)).toBe(claimError);
  });
});
