/**
 * Prototype-poisoning members (`__proto__`, `constructor.prototype`) are refused by the fingerprint
 * parser, as Fastify's own JSON parser refuses them by default (secure-json-parse): every path
 * that fingerprints a body (both HTTP adapters, `fingerprintRequest()`) uses it.
 */
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import { fingerprintRequest, parseJsonBody } from '../../../src/idempotency/fingerprint.js';

const base = { tenant: 'acme', operation: 'create-order', maxBodyBytes: 10_000 } as const;

function errorOf(fn: () => unknown): { code: string; message: string } | undefined {
  try {
    fn();
  } catch (err) {
    if (!isOutboxkitError(err)) return { code: `not an outboxkit error: ${String(err)}`, message: '' };
    return { code: err.code, message: err.message };
  }
  return undefined;
}

describe('prototype-poisoning members', () => {
  it.each([
    ['__proto__ at the top', '{"__proto__":{"isAdmin":true},"amount":1}'],
    ['__proto__ nested in an array', '{"items":[{"sku":"a"},{"__proto__":{"isAdmin":true}}]}'],
    ['__proto__ written with escapes', '{"\\u005f_proto__":{"isAdmin":true}}'],
    ['__proto__ holding a non-object', '{"__proto__":null}'],
    ['constructor.prototype', '{"constructor":{"prototype":{"isAdmin":true}}}'],
    ['a nested constructor.prototype', '{"a":{"b":{"constructor":{"prototype":{}}}}}'],
  ])('refuses %s with BodyInvalidError naming the member, as a Buffer and as text', (_name, body) => {
    for (const raw of [body, Buffer.from(body, 'utf8')]) {
      const err = errorOf(() => fingerprintRequest({ ...base, body: raw }));
      expect(err?.code).toBe('OUTBOXKIT_BODY_INVALID');
      expect(err?.message).toMatch(/prototype poisoning/);
      expect(errorOf(() => parseJsonBody(raw, 10_000))?.code).toBe('OUTBOXKIT_BODY_INVALID');
    }
  });

  it.each([
    ['a constructor member without prototype', '{"constructor":{"name":"x"}}'],
    ['a constructor string', '{"constructor":"Object"}'],
    ['prototype elsewhere', '{"prototype":{"a":1}}'],
    ['__proto__ as a string value', '{"note":"__proto__"}'],
  ])('accepts %s', (_name, body) => {
    expect(errorOf(() => fingerprintRequest({ ...base, body }))).toBeUndefined();
  });

  it('still refuses malformed JSON and a byte order mark as "not JSON"', () => {
    for (const body of ['{"__proto__":', '\uFEFF{"a":1}', '\uFEFF{"__proto__":{}}']) {
      const err = errorOf(() => fingerprintRequest({ ...base, body }));
      expect(err?.code).toBe('OUTBOXKIT_BODY_INVALID');
      expect(err?.message).toMatch(/not JSON/);
    }
  });
});
