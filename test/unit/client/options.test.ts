import { describe, expect, it } from 'vitest';
import { encodeKeyHeader } from '../../../src/client/client.js';
import { CLIENT_DEFAULTS, resolveClientOptions } from '../../../src/client/options.js';
import { isOutboxkitError } from '../../../src/errors.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : String(err);
  }
  return undefined;
}

describe('resolveClientOptions', () => {
  it('applies the documented defaults and strips the trailing slash of baseUrl', () => {
    const o = resolveClientOptions({ baseUrl: 'http://127.0.0.1:3000/api/' });
    expect(o).toMatchObject({
      baseUrl: 'http://127.0.0.1:3000/api',
      maxAttempts: 5,
      deadlineMs: 30_000,
      initialDelayMs: 100,
      maxDelayMs: 5_000,
      timeoutMs: 10_000,
    });
    expect([...o.retryStatuses]).toEqual([408, 409, 425, 429, 502, 503, 504]);
    expect(Object.isFrozen(o)).toBe(true);
    expect(Object.isFrozen(CLIENT_DEFAULTS)).toBe(true);
  });

  it.each([
    ['no baseUrl', { baseUrl: '' }],
    ['a relative baseUrl', { baseUrl: '/orders' }],
    ['a non-http baseUrl', { baseUrl: 'ftp://x' }],
    ['a baseUrl with a query', { baseUrl: 'http://x/?a=1' }],
    ['maxAttempts 0', { baseUrl: 'http://x', maxAttempts: 0 }],
    ['fractional deadline', { baseUrl: 'http://x', deadlineMs: 1.5 }],
    ['maxDelayMs below initialDelayMs', { baseUrl: 'http://x', initialDelayMs: 500, maxDelayMs: 100 }],
    ['422 in retryStatuses', { baseUrl: 'http://x', retryStatuses: [503, 422] }],
    ['400 in retryStatuses', { baseUrl: 'http://x', retryStatuses: [400] }],
    ['413 in retryStatuses', { baseUrl: 'http://x', retryStatuses: [413] }],
    ['a 2xx in retryStatuses', { baseUrl: 'http://x', retryStatuses: [201] }],
    ['a default Idempotency-Key header', { baseUrl: 'http://x', headers: { 'Idempotency-Key': 'k' } }],
  ])('refuses %s with InvalidOptionsError', (_name, options) => {
    expect(codeOf(() => resolveClientOptions(options))).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });
});

describe('encodeKeyHeader', () => {
  it('sends a token bare and anything else printable as an RFC 8941 string', () => {
    expect(encodeKeyHeader('0190b6f0-0000-7000-8000-000000000000')).toBe('0190b6f0-0000-7000-8000-000000000000');
    expect(encodeKeyHeader('order 42')).toBe('"order 42"');
    expect(encodeKeyHeader('a"b\\c')).toBe('"a\\"b\\\\c"');
    expect(encodeKeyHeader('a,b')).toBe('"a,b"');
    // `;` would read as parameters bare: quoted, the server accepts it as part of the key.
    expect(encodeKeyHeader('a;b=c')).toBe('"a;b=c"');
  });

  it('refuses an empty, too long or non-ASCII key', () => {
    for (const key of ['', 'x'.repeat(256), 'clé', 'a\nb']) {
      expect(codeOf(() => encodeKeyHeader(key))).toBe('OUTBOXKIT_INVALID_OPTIONS');
    }
  });
});
