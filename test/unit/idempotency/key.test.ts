import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import { assertValidKey, parseIdempotencyKey, redactKey } from '../../../src/idempotency/key.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : `not an outboxkit error: ${String(err)}`;
  }
  return undefined;
}

const required = { required: true } as const;

describe('parseIdempotencyKey', () => {
  it('accepts a bare token (a UUID, as Stripe clients send it)', () => {
    expect(parseIdempotencyKey('9b4b0a6f-8fd3-40ee-9e31-8b2b6dc9e2cb', required)).toBe(
      '9b4b0a6f-8fd3-40ee-9e31-8b2b6dc9e2cb',
    );
    expect(parseIdempotencyKey('a', required)).toBe('a');
    expect(parseIdempotencyKey("!#$%&'()*+-./:<=>?@[\\]^_`{|}~", required)).toBe("!#$%&'()*+-./:<=>?@[\\]^_`{|}~");
    // `;` only quoted: bare, it starts structured-field parameters.
    expect(parseIdempotencyKey('"a;b=c"', required)).toBe('a;b=c');
  });

  it('accepts an RFC 8941 sf-string and returns the unescaped value', () => {
    expect(parseIdempotencyKey('"abc"', required)).toBe('abc');
    expect(parseIdempotencyKey('"a b"', required)).toBe('a b');
    expect(parseIdempotencyKey('"a,b"', required)).toBe('a,b');
    expect(parseIdempotencyKey('"say \\"hi\\" \\\\ ok"', required)).toBe('say "hi" \\ ok');
  });

  it('ignores optional whitespace around the field value', () => {
    expect(parseIdempotencyKey('  abc\t', required)).toBe('abc');
    expect(parseIdempotencyKey(' "abc" ', required)).toBe('abc');
  });

  it('measures the length on the unquoted value: 255 accepted, 256 refused', () => {
    const k255 = 'k'.repeat(255);
    expect(parseIdempotencyKey(k255, required)).toBe(k255);
    expect(parseIdempotencyKey(`"${k255}"`, required)).toBe(k255); // 257 characters on the wire
    expect(parseIdempotencyKey(`"${'\\"'.repeat(255)}"`, required)).toBe('"'.repeat(255)); // 512 on the wire
    expect(codeOf(() => parseIdempotencyKey('k'.repeat(256), required))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => parseIdempotencyKey(`"${'k'.repeat(256)}"`, required))).toBe('OUTBOXKIT_KEY_INVALID');
  });

  it('refuses a value longer than any key can be written (512 characters) before parsing it', () => {
    expect(() => parseIdempotencyKey(`"${'\\"'.repeat(255)}\\"`, required)).toThrow(/has 513 characters/);
    expect(() => parseIdempotencyKey(`a${' '.repeat(600)}b`, required)).toThrow(/has 602 characters/);
    // Whitespace around the value does not count.
    expect(parseIdempotencyKey(`${' '.repeat(600)}abc${'\t'.repeat(600)}`, required)).toBe('abc');
  });

  it('missing: KeyMissingError when required, undefined otherwise', () => {
    expect(codeOf(() => parseIdempotencyKey(undefined, required))).toBe('OUTBOXKIT_KEY_MISSING');
    expect(codeOf(() => parseIdempotencyKey([], required))).toBe('OUTBOXKIT_KEY_MISSING');
    expect(parseIdempotencyKey(undefined, { required: false })).toBeUndefined();
  });

  it.each([
    ['empty', ''],
    ['blank', '   '],
    ['empty sf-string', '""'],
    ['inner space in a bare token', 'a b'],
    ['non-ASCII', 'clé'],
    ['control character', 'a\u0001b'],
    ['DEL', 'a\u007fb'],
    ['unterminated string', '"abc'],
    ['a quote inside a bare token', 'ab"c'],
    ['bad escape', '"a\\nb"'],
    ['non-ASCII in a string', '"é"'],
    ['tab in a string', '"a\tb"'],
    ['parameters', '"abc";x=1'],
    ['parameters after a bare token (as an RFC 8941 parser reads it)', 'a;b=c'],
    ['a bare parameter marker', 'abc;'],
    ['content after the string', '"abc" d'],
    ['comma-joined list of tokens', 'k1, k2'],
    ['comma-joined list without space', 'k1,k2'],
    ['comma-joined list of strings', '"k1", "k2"'],
  ])('refuses %s with KeyInvalidError', (_name, value) => {
    expect(codeOf(() => parseIdempotencyKey(value, required))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => parseIdempotencyKey(value, { required: false }))).toBe('OUTBOXKIT_KEY_INVALID');
  });

  it('refuses a repeated header (array of several values), accepts an array of one', () => {
    expect(codeOf(() => parseIdempotencyKey(['a', 'b'], required))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => parseIdempotencyKey(['a', 'a'], required))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(parseIdempotencyKey(['a'], required)).toBe('a');
  });
});

describe('assertValidKey', () => {
  it('accepts printable ASCII of 1-255 characters, refuses the rest', () => {
    expect(() => assertValidKey('a b')).not.toThrow();
    expect(codeOf(() => assertValidKey(''))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => assertValidKey('x'.repeat(256)))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => assertValidKey('ü'))).toBe('OUTBOXKIT_KEY_INVALID');
    expect(codeOf(() => assertValidKey(42))).toBe('OUTBOXKIT_KEY_INVALID');
  });
});

describe('redactKey', () => {
  it('shows at most 4 characters (a quarter of the key) and the length', () => {
    expect(redactKey('9b4b0a6f-8fd3-40ee-9e31-8b2b6dc9e2cb')).toBe('9b4b…(36)');
    expect(redactKey('abcdefgh')).toBe('ab…(8)');
    expect(redactKey('abc')).toBe('…(3)');
    expect(redactKey('9b4b0a6f-8fd3-40ee-9e31-8b2b6dc9e2cb')).not.toContain('8fd3');
  });
});
