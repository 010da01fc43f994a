import { describe, expect, it } from 'vitest';
import { InvalidOptionsError } from '../../../src/errors.js';
import {
  BodyInvalidError,
  BodyTooLargeError,
  DeadlineInvalidError,
  KeyInProgressError,
  KeyInvalidError,
  KeyMismatchError,
  KeyMissingError,
  ReplayNotAcceptableError,
  StoreUnavailableError,
  TenantUnresolvedError,
} from '../../../src/idempotency/errors.js';
import { isProblemError, toProblem } from '../../../src/http/problem.js';

describe('toProblem (RFC 9457)', () => {
  it.each([
    [new KeyMissingError(), 400, 'key-missing', undefined],
    [new KeyInvalidError('bad'), 400, 'key-invalid', undefined],
    [new TenantUnresolvedError(), 400, 'tenant-unresolved', undefined],
    [new BodyTooLargeError('big', 10), 413, 'body-too-large', undefined],
    [new BodyInvalidError('bad'), 400, 'body-invalid', undefined],
    [new KeyMismatchError(), 422, 'key-mismatch', undefined],
    [new KeyInProgressError(undefined, { retryAfterSeconds: 2 }), 409, 'key-in-progress', '2'],
    [new StoreUnavailableError(), 503, 'store-unavailable', '1'],
    [new DeadlineInvalidError(), 400, 'deadline-invalid', undefined],
    [new ReplayNotAcceptableError(['br']), 406, 'replay-not-acceptable', undefined],
  ])('%s → %i %s', (err, status, slug, retryAfter) => {
    const p = toProblem(err);
    expect(p.status).toBe(status);
    expect(p.headers['content-type']).toBe('application/problem+json');
    expect(p.headers['cache-control']).toBe('no-store');
    expect(p.headers['retry-after']).toBe(retryAfter);
    expect(p.body).toEqual({
      type: `https://outboxkit.dev/problems/${slug}`,
      title: expect.any(String),
      status,
      detail: err.message,
      code: err.code,
    });
    expect(isProblemError(err)).toBe(true);
  });

  it('answers other errors with a generic 500 that discloses nothing', () => {
    for (const err of [new Error('secret connection string'), new InvalidOptionsError('secret')]) {
      const p = toProblem(err);
      expect(p.status).toBe(500);
      expect(JSON.stringify(p.body)).not.toContain('secret');
      expect(p.body.type).toBe('https://outboxkit.dev/problems/internal');
      expect(isProblemError(err)).toBe(false);
    }
  });

  it('a mismatch message says how to fix it and holds neither key nor body', () => {
    const p = toProblem(new KeyMismatchError());
    expect(p.body.detail).toMatch(/send a new key/);
  });
});
