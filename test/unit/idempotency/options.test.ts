import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import {
  IDEMPOTENCY_DEFAULTS,
  REPRESENTATION_HEADERS,
  resolveIdempotencyOptions,
} from '../../../src/idempotency/options.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : String(err);
  }
  return undefined;
}

describe('resolveIdempotencyOptions', () => {
  it('applies the documented defaults', () => {
    const o = resolveIdempotencyOptions();
    expect(o).toMatchObject({
      schema: 'outboxkit',
      quotedSchema: '"outboxkit"',
      policy: 'reject',
      lockTimeoutMs: 100,
      waitTimeoutMs: 10_000,
      retentionMs: 86_400_000,
      retryAfterSeconds: 1,
    });
    expect([...o.replayHeaders]).toContain('content-type');
    expect([...o.replayHeaders]).toContain('location');
    expect([...o.replayHeaders]).not.toContain('set-cookie');
    expect(Object.isFrozen(o)).toBe(true);
    expect(Object.isFrozen(IDEMPOTENCY_DEFAULTS)).toBe(true);
    expect(Object.isFrozen(IDEMPOTENCY_DEFAULTS.replayHeaders)).toBe(true);
  });

  it('returns an already resolved object as is', () => {
    const o = resolveIdempotencyOptions({ policy: 'wait' });
    expect(resolveIdempotencyOptions(o)).toBe(o);
  });

  it('C32 always keeps the representation headers (a replay is read with them) and lower-cases the allow-list', () => {
    const o = resolveIdempotencyOptions({ replayHeaders: ['ETag'] });
    expect([...o.replayHeaders].sort()).toEqual([
      'content-disposition',
      'content-encoding',
      'content-language',
      'content-location',
      'content-range',
      'content-type',
      'etag',
      'vary',
    ]);
    expect([...resolveIdempotencyOptions({ replayHeaders: [] }).replayHeaders].sort()).toEqual(
      [...REPRESENTATION_HEADERS].sort(),
    );
    // The defaults add the validators, location and caching headers.
    expect([...resolveIdempotencyOptions().replayHeaders]).toEqual(
      expect.arrayContaining([...REPRESENTATION_HEADERS, 'location', 'etag', 'last-modified']),
    );
  });

  it.each([
    ['an unknown policy', { policy: 'async' }],
    ['lockTimeoutMs 0 (would wait forever)', { lockTimeoutMs: 0 }],
    ['a fractional waitTimeoutMs', { waitTimeoutMs: 1.5 }],
    ['a negative retention', { retentionMs: -1 }],
    ['set-cookie in replayHeaders', { replayHeaders: ['Set-Cookie'] }],
    ['content-length in replayHeaders', { replayHeaders: ['content-length'] }],
    ['an invalid header name', { replayHeaders: ['a b'] }],
    ['an invalid schema', { schema: 'Bad-Schema' }],
  ])('refuses %s with InvalidOptionsError', (_name, options) => {
    expect(codeOf(() => resolveIdempotencyOptions(options as never))).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });
});
