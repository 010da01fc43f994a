import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import {
  canonicalRequest,
  fingerprintRequest,
  isLosslessNumber,
  MAX_JSON_DEPTH,
  MAX_JSON_MEMBER_NAMES,
  type FingerprintInput,
} from '../../../src/idempotency/fingerprint.js';

const base = { tenant: 'acme', operation: 'create-order', maxBodyBytes: 10_000 } as const;

function fp(body: FingerprintInput['body'], extra: Partial<FingerprintInput> = {}): string {
  return fingerprintRequest({ ...base, body, ...extra }).digest.toString('hex');
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : `not an outboxkit error: ${String(err)}`;
  }
  return undefined;
}

describe('fingerprintRequest', () => {
  it('refuses a field FingerprintInput does not have: a misspelt semanticHeaders would leave the headers out', () => {
    const typo = { ...base, body: '{}', semanticHeader: { 'accept-language': 'fr' } } as unknown as FingerprintInput;
    expect(codeOf(() => fingerprintRequest(typo))).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(() => fingerprintRequest(typo)).toThrow(/unknown option "semanticHeader"/);
    // Every field it has is accepted.
    expect(
      codeOf(() =>
        fingerprintRequest({ ...base, method: 'POST', target: '/orders', body: '{}', semanticHeaders: { a: 'b' } }),
      ),
    ).toBeUndefined();
  });

  it('is version 1 and a 32-byte SHA-256 of the canonical JSON', () => {
    const input = { ...base, method: 'post', body: '{"b":2,"a":1}', semanticHeaders: { 'Accept-Language': 'fr' } };
    const canonical = canonicalRequest(input).json;
    expect(canonical).toBe(
      '{"body":{"a":1,"b":2},"headers":{"accept-language":"fr"},"method":"POST","operation":"create-order","tenant":"acme","v":1}',
    );
    const result = fingerprintRequest(input);
    expect(result.version).toBe(1);
    expect(result.digest).toHaveLength(32);
    expect(result.digest.equals(createHash('sha256').update(canonical, 'utf8').digest())).toBe(true);
    // Pinned: stored fingerprints of version 1 must stay comparable across releases.
    expect(result.digest.toString('hex')).toBe('4e2c3ec7c426710fe1e88278a1bce6ef43105946f7144537d3083d0eac5d8524');
  });

  it('accepts the same body as a Buffer, a Uint8Array or a string', () => {
    const text = '{"amount":10}';
    expect(fp(Buffer.from(text))).toBe(fp(text));
    expect(fp(new Uint8Array(Buffer.from(text)))).toBe(fp(text));
  });

  it('is scoped by tenant, operation, method, request target and declared headers', () => {
    const body = '{"amount":10}';
    const ref = fp(body);
    expect(fp(body, { tenant: 'other' })).not.toBe(ref);
    expect(fp(body, { operation: 'create-refund' })).not.toBe(ref);
    expect(fp(body, { method: 'POST' })).not.toBe(ref);
    expect(fp(body, { method: 'post' })).toBe(fp(body, { method: 'POST' }));
    // The request target: another resource or another query is another request.
    expect(fp(body, { target: '/orders/111/cancel' })).not.toBe(ref);
    expect(fp(body, { target: '/orders/111/cancel' })).not.toBe(fp(body, { target: '/orders/222/cancel' }));
    expect(fp(body, { target: '/orders/111/cancel' })).not.toBe(fp(body, { target: '/orders/111/cancel?x=1' }));
    expect(fp(body, { target: '/orders/111/cancel' })).toBe(fp(body, { target: '/orders/111/cancel' }));
    expect(fp(body, { semanticHeaders: { 'accept-language': 'fr' } })).not.toBe(ref);
    expect(fp(body, { semanticHeaders: { 'Accept-Language': 'fr' } })).toBe(
      fp(body, { semanticHeaders: { 'accept-language': 'fr' } }),
    );
    expect(fp(body, { semanticHeaders: { 'accept-language': 'fr' } })).not.toBe(
      fp(body, { semanticHeaders: { 'accept-language': 'de' } }),
    );
    expect(fp(body, { semanticHeaders: {} })).toBe(ref);
  });

  it('treats an empty body (zero bytes, JSON whitespace, undefined) as no body, distinct from null', () => {
    expect(fp(undefined)).toBe(fp(''));
    expect(fp(Buffer.alloc(0))).toBe(fp(''));
    expect(fp(' \n\t\r')).toBe(fp(''));
    expect(fp('null')).not.toBe(fp(''));
    expect(canonicalRequest({ ...base, body: '' }).json).not.toContain('"body"');
  });

  it('refuses a body over maxBodyBytes with BodyTooLargeError, counting UTF-8 bytes', () => {
    expect(codeOf(() => fp('"' + 'x'.repeat(100) + '"', { maxBodyBytes: 50 }))).toBe('OUTBOXKIT_BODY_TOO_LARGE');
    expect(codeOf(() => fp(Buffer.alloc(51, 0x20), { maxBodyBytes: 50 }))).toBe('OUTBOXKIT_BODY_TOO_LARGE');
    expect(codeOf(() => fp('"éé"', { maxBodyBytes: 5 }))).toBe('OUTBOXKIT_BODY_TOO_LARGE'); // 6 bytes
    expect(codeOf(() => fp('"éé"', { maxBodyBytes: 6 }))).toBeUndefined();
  });

  it.each([
    ['not JSON', 'amount=10'],
    ['truncated JSON', '{"a":1'],
    ['a byte order mark', '\uFEFF{"a":1}'],
    ['a duplicate member name', '{"a":1,"a":2}'],
    ['a duplicate member name written with an escape', '{"a":1,"\\u0061":1}'],
    ['a nested duplicate', '{"x":[{"k":1,"k":1}]}'],
    ['a lone surrogate', '{"a":"\\ud800"}'],
    ['a lone surrogate in a member name', '{"\\udc00":1}'],
  ])('refuses a body with %s (BodyInvalidError)', (_name, body) => {
    expect(codeOf(() => fp(body))).toBe('OUTBOXKIT_BODY_INVALID');
  });

  it('refuses invalid UTF-8 bytes', () => {
    expect(codeOf(() => fp(Buffer.from([0x22, 0xff, 0x22])))).toBe('OUTBOXKIT_BODY_INVALID');
  });

  it('accepts the same member name in different objects', () => {
    expect(codeOf(() => fp('{"a":{"a":1},"b":[{"a":1},{"a":2}]}'))).toBeUndefined();
  });

  it('refuses bad options with InvalidOptionsError and an empty tenant with TenantUnresolvedError', () => {
    expect(codeOf(() => fp('{}', { tenant: '' }))).toBe('OUTBOXKIT_TENANT_UNRESOLVED');
    expect(codeOf(() => fp('{}', { operation: '' }))).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(codeOf(() => fp('{}', { maxBodyBytes: -1 }))).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(codeOf(() => fp('{}', { semanticHeaders: { 'X-A': '1', 'x-a': '2' } }))).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });
});

describe('C19 the same JSON written differently', () => {
  it('member order is irrelevant, at every depth (a replay, not a mismatch)', () => {
    expect(fp('{"a":1,"b":{"x":1,"y":2}}')).toBe(fp('{"b":{"y":2,"x":1},"a":1}'));
    expect(fp('{ "a" : 1 ,\n "b" : { "x" : 1 , "y" : 2 } }')).toBe(fp('{"a":1,"b":{"x":1,"y":2}}'));
  });

  it('array order matters', () => {
    expect(fp('{"items":[1,2]}')).not.toBe(fp('{"items":[2,1]}'));
    expect(fp('[{"a":1},{"b":2}]')).not.toBe(fp('[{"b":2},{"a":1}]'));
  });

  it('1, 1.0, 1e0, 10e-1 and 1E+0 are the same number; -0 is 0; 1 and 1.5 differ', () => {
    const one = fp('{"n":1}');
    for (const text of ['1.0', '1e0', '10e-1', '1E+0', '1.000', '0.1e1']) expect(fp(`{"n":${text}}`)).toBe(one);
    expect(fp('{"n":-0}')).toBe(fp('{"n":0}'));
    expect(fp('{"n":1.5}')).not.toBe(one);
    expect(fp('{"n":"1"}')).not.toBe(one); // a string is not a number
  });

  it('a missing member is not null', () => {
    expect(fp('{"a":1}')).not.toBe(fp('{"a":1,"b":null}'));
  });

  it('NFC and NFD are different requests (no Unicode normalisation); escapes do not matter', () => {
    const nfc = '{"name":"\u00e9"}';
    const nfd = '{"name":"e\u0301"}';
    expect(nfc.normalize('NFD')).toBe(nfd);
    expect(fp(nfc)).not.toBe(fp(nfd));
    expect(fp('{"name":"\\u00e9"}')).toBe(fp(nfc));
    expect(fp('{"\\u0061":1}')).toBe(fp('{"a":1}'));
  });

  it('members are ordered by UTF-16 code units, not code points (RFC 8785 §3.2.3)', () => {
    // U+1F600 (😀, UTF-16 D83D DE00) > U+FB01 (ﬁ) by code point, but D83D < FB01 by code unit.
    const { json } = canonicalRequest({ ...base, body: '{"\uFB01":1,"\u{1F600}":2,"a":3,"\u00e9":4}' });
    expect(json).toContain('{"a":3,"\u00e9":4,"\u{1F600}":2,"\uFB01":1}');
    expect(fp('{"\uFB01":1,"\u{1F600}":2}')).toBe(fp('{"\u{1F600}":2,"\uFB01":1}'));
  });
});

describe('numbers JSON.parse would round are refused, never collide', () => {
  it.each([
    '9007199254740993', // 2^53 + 1: parses to 2^53
    '-9007199254740993',
    '12345678901234567890',
    '0.10000000000000000001',
    '1.00000000000000000001',
    '1e400',
    '-1e400',
    '1e-400',
    '99999999999999991611392', // the exact value of the double 1e23, whose shortest form is 1e+23
  ])('refuses %s', (text) => {
    expect(isLosslessNumber(text)).toBe(false);
    expect(codeOf(() => fp(`{"n":${text}}`))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(codeOf(() => fp(`[1,${text}]`))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(codeOf(() => fp(text))).toBe('OUTBOXKIT_BODY_INVALID');
  });

  it.each([
    '9007199254740991', // 2^53 - 1
    '-9007199254740991',
    '9007199254740992', // 2^53 is a double
    '18014398509481984', // 2^54
    '0.1',
    '3.141592653589793',
    '1e21',
    '1E+21',
    '100000000000000000000000', // 1e23
    '5e-324',
    '1.7976931348623157e308',
    '0',
    '-0',
    '0.0',
    '123.456e-2',
  ])('accepts %s', (text) => {
    expect(isLosslessNumber(text)).toBe(true);
    expect(codeOf(() => fp(`{"n":${text}}`))).toBeUndefined();
  });

  it('two large integers that JSON.parse maps to one double do not share a fingerprint', () => {
    expect(JSON.parse('9007199254740993')).toBe(JSON.parse('9007199254740992'));
    expect(codeOf(() => fp('{"id":9007199254740993}'))).toBe('OUTBOXKIT_BODY_INVALID');
    // Sent as strings (the documented workaround), they differ.
    expect(fp('{"id":"9007199254740993"}')).not.toBe(fp('{"id":"9007199254740992"}'));
  });

  it('ignores digits inside strings', () => {
    expect(codeOf(() => fp('{"note":"9007199254740993 and 1e400"}'))).toBeUndefined();
    expect(codeOf(() => fp('{"9007199254740993":true}'))).toBeUndefined();
  });
});

describe('numbers of at most 15 digits without an exponent skip the exact check, and keep their value', () => {
  it('agrees with the exact check on 20,000 random decimals of 1 to 15 digits', () => {
    let seed = 7;
    const random = () => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648) / 2_147_483_648;
    for (let n = 0; n < 20_000; n++) {
      const digits = 1 + Math.floor(random() * 15);
      let text = '';
      for (let d = 0; d < digits; d++) text += String(Math.floor(random() * 10));
      text = text.replace(/^0+(?=\d)/, '');
      const point = Math.floor(random() * text.length);
      const written = point === 0 ? text : `${text.slice(0, point)}.${text.slice(point)}`;
      expect(isLosslessNumber(written), written).toBe(true);
      expect(
        codeOf(() => fp(`[${written}]`)),
        written,
      ).toBeUndefined();
    }
    // A correctness sweep, not a timing: about 1 s alone, over 5 s beside other tests on 2 cores.
  }, 60_000);

  it('still checks 16 digits, and any exponent', () => {
    expect(codeOf(() => fp('[0.1000000000000001]'))).toBeUndefined(); // 16 digits, a double's shortest form
    expect(codeOf(() => fp('[0.10000000000000001]'))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(codeOf(() => fp('[1e400]'))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(codeOf(() => fp('[-0.000000000000001]'))).toBeUndefined();
  });
});

describe('limits that keep parsing linear (docs/security.md)', () => {
  const big = { maxBodyBytes: 1_048_576 };

  it(`accepts ${MAX_JSON_DEPTH} levels of nesting and refuses one more, strings aside`, () => {
    const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);
    expect(codeOf(() => fp(nested(MAX_JSON_DEPTH), big))).toBeUndefined();
    expect(codeOf(() => fp(nested(MAX_JSON_DEPTH + 1), big))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(() => fp(`{"a":${nested(MAX_JSON_DEPTH)}}`, big)).toThrow(/more than 1000 levels deep/);
    // Brackets inside strings, escaped quotes included, are not nesting.
    expect(codeOf(() => fp(JSON.stringify(['[\\"[{'.repeat(MAX_JSON_DEPTH)]), big))).toBeUndefined();
  });

  it(`accepts ${MAX_JSON_MEMBER_NAMES} distinct member names and refuses one more; repeated names do not count`, () => {
    const names = (count: number) => JSON.stringify(Array.from({ length: count }, (_, i) => ({ [`k${i}`]: i })));
    expect(codeOf(() => fp(names(MAX_JSON_MEMBER_NAMES), big))).toBeUndefined();
    expect(codeOf(() => fp(names(MAX_JSON_MEMBER_NAMES + 1), big))).toBe('OUTBOXKIT_BODY_INVALID');
    expect(() => fp(names(MAX_JSON_MEMBER_NAMES + 1), big)).toThrow(/more than 1000 distinct member names/);
    const records = JSON.stringify(Array.from({ length: 20_000 }, (_, i) => ({ id: i, sku: 'a', qty: 1 })));
    expect(codeOf(() => fp(records, big))).toBeUndefined();
    // An escaped name is the same name.
    expect(codeOf(() => fp('{"a":1,"\\u0061":2}'))).toBe('OUTBOXKIT_BODY_INVALID');
  });

  it('reports text that is not JSON as such, even when it also breaks an I-JSON rule', () => {
    expect(() => fp('{"a":1,"a":2')).toThrow(/not JSON/);
    expect(() => fp('[9007199254740993,')).toThrow(/not JSON/);
    expect(() => fp('{"a":1,"a":2}')).toThrow(/twice in one object/);
  });
});
