/**
 * Parsing and redaction of the `Idempotency-Key` header: pure logic, no I/O.
 *
 * Source: draft-ietf-httpapi-idempotency-key-header ("Idempotency-Key is an Item Structured Header
 * [RFC 8941] whose value MUST be a String") and Stripe's de facto form (a bare UUID).
 */
import { optionNames, refuseUnknownOptions } from '../errors.js';
import { KeyInvalidError, KeyMissingError } from './errors.js';

/** Longest key accepted, in characters (after removing the sf-string quotes and escapes). */
export const MAX_KEY_LENGTH = 255;

/** The header name, as Node.js exposes it (lower case). */
export const IDEMPOTENCY_KEY_HEADER = 'idempotency-key';

/** Options of {@link parseIdempotencyKey}. */
export interface ParseKeyOptions {
  /** Whether a missing header is an error ({@link KeyMissingError}) or `undefined`. */
  required: boolean;
}

/** Every option name of {@link ParseKeyOptions}; the compiler keeps it in step with the interface. */
const PARSE_KEY_OPTION_NAMES = optionNames<ParseKeyOptions>({ required: true });

// A bare key: visible ASCII (0x21-0x7E) without `"` (reserved for sf-strings), `,` (a list: the
// header was sent twice and joined by a proxy or by Node.js) and `;` (structured-field parameters,
// refused as in the quoted form: `a;b=c` is the item `a` with a parameter to an RFC 8941 parser).
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x3a\x3c-\x7e]+$/;

/** Characters a key may contain once unquoted: visible ASCII plus space. */
const KEY_CHARS = /^[\x20-\x7e]+$/;

/**
 * Parses the `Idempotency-Key` request header.
 *
 * Accepted forms:
 * - an RFC 8941 sf-string: `"abc"`; inside the quotes printable ASCII 0x20-0x7E with `\"` and
 *   `\\` escapes (RFC 8941 §3.3.3); the returned key is the unescaped value;
 * - a bare token: 1-255 visible ASCII characters (0x21-0x7E) other than `"`, `,` and `;`.
 *
 * The unquoted key must have 1-255 characters. Surrounding spaces/tabs are ignored. Structured
 * field parameters (`"abc";x=1`) are refused, as is anything after the closing quote.
 *
 * @param headerValue - the raw header value: `req.headers['idempotency-key']`.
 * @param options.required - whether a missing header is an error.
 * @returns the key, or `undefined` when it is absent and not required.
 * @throws {@link KeyMissingError} when the header is absent (or an empty array) and `required`.
 * @throws {@link KeyInvalidError} when it is empty, too long, malformed, or repeated (an array of
 *   several values, or a comma-joined list).
 * @throws {@link InvalidOptionsError} on an unknown option name (a misspelt `required` would
 *   otherwise make the key optional).
 */
export function parseIdempotencyKey(
  headerValue: string | readonly string[] | undefined,
  options: { required: true },
): string;
export function parseIdempotencyKey(
  headerValue: string | readonly string[] | undefined,
  options: ParseKeyOptions,
): string | undefined;
export function parseIdempotencyKey(
  headerValue: string | readonly string[] | undefined,
  options: ParseKeyOptions,
): string | undefined {
  refuseUnknownOptions(options, PARSE_KEY_OPTION_NAMES, 'parseIdempotencyKey');
  let value: string | undefined;
  if (Array.isArray(headerValue)) {
    if (headerValue.length > 1) {
      throw new KeyInvalidError('The Idempotency-Key header was sent more than once; send it exactly once.');
    }
    value = headerValue[0];
  } else {
    value = headerValue as string | undefined;
  }
  if (value === undefined) {
    if (options.required) throw new KeyMissingError();
    return undefined;
  }
  if (typeof value !== 'string') throw new KeyInvalidError('The Idempotency-Key header value is not a string.');
  const trimmed = trimOws(value);
  if (trimmed.length === 0) {
    throw new KeyInvalidError(
      'The Idempotency-Key header is empty; send 1-255 visible ASCII characters (a UUID is typical).',
    );
  }
  // No form of a valid key is longer than this (a quoted key whose every character is escaped):
  // longer values are refused before any parsing.
  if (trimmed.length > 2 * MAX_KEY_LENGTH + 2) {
    throw new KeyInvalidError(
      `The Idempotency-Key header has ${trimmed.length} characters; a key has at most ${MAX_KEY_LENGTH}.`,
    );
  }
  const key = trimmed.startsWith('"') ? parseSfString(trimmed) : parseBareKey(trimmed);
  checkKeyLength(key);
  return key;
}

/**
 * Removes optional whitespace around a field value (RFC 9110 §5.5: SP and HTAB). An index loop, not
 * /^[ \t]+|[ \t]+$/: that regex backtracks quadratically over a long run of spaces inside a key
 * (docs/security.md).
 */
function trimOws(value: string): string {
  let start = 0;
  let end = value.length;
  while (start < end && isOws(value.charCodeAt(start))) start++;
  while (end > start && isOws(value.charCodeAt(end - 1))) end--;
  return value.slice(start, end);
}

function isOws(c: number): boolean {
  return c === 0x20 || c === 0x09;
}

function parseBareKey(text: string): string {
  if (BARE_KEY.test(text)) return text;
  if (text.includes(',')) {
    throw new KeyInvalidError(
      'The Idempotency-Key header holds a list (it was sent more than once); send exactly one key.',
    );
  }
  if (text.includes(';')) {
    throw new KeyInvalidError(
      'The Idempotency-Key header has structured-field parameters (`;`), which are not supported; send the key alone, ' +
        'or quote a key that contains `;` ("a;b").',
    );
  }
  throw new KeyInvalidError(
    'The Idempotency-Key header is malformed: use 1-255 visible ASCII characters, or an RFC 8941 string in double quotes.',
  );
}

/** RFC 8941 §4.2.5 (Parsing a String), then requires the end of input. */
function parseSfString(text: string): string {
  let out = '';
  for (let i = 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x5c /* \ */) {
      i++;
      const next = text.charCodeAt(i);
      if (next !== 0x22 && next !== 0x5c) {
        throw new KeyInvalidError(
          'The Idempotency-Key string has an invalid escape; only \\" and \\\\ are allowed (RFC 8941).',
        );
      }
      out += text[i];
    } else if (c === 0x22 /* " */) {
      const rest = text.slice(i + 1);
      if (rest.length === 0) return out;
      if (/^[ \t]*,/.test(rest)) {
        throw new KeyInvalidError(
          'The Idempotency-Key header holds a list (it was sent more than once); send exactly one key.',
        );
      }
      throw new KeyInvalidError(
        'The Idempotency-Key header has extra content after the closing quote (parameters are not supported).',
      );
    } else if (c < 0x20 || c > 0x7e) {
      throw new KeyInvalidError('The Idempotency-Key string contains a character outside printable ASCII.');
    } else {
      out += text[i];
    }
  }
  throw new KeyInvalidError('The Idempotency-Key string has no closing double quote.');
}

function checkKeyLength(key: string): void {
  if (key.length === 0) {
    throw new KeyInvalidError('The Idempotency-Key is empty; send 1-255 visible ASCII characters (a UUID is typical).');
  }
  if (key.length > MAX_KEY_LENGTH) {
    throw new KeyInvalidError(`The Idempotency-Key has ${key.length} characters; the limit is ${MAX_KEY_LENGTH}.`);
  }
}

/**
 * Checks a key that did not come through {@link parseIdempotencyKey} (for example one an
 * application passes to `executeIdempotent()` directly): 1-255 characters of printable ASCII.
 *
 * @throws {@link KeyInvalidError} otherwise.
 */
export function assertValidKey(key: unknown): asserts key is string {
  if (typeof key !== 'string') throw new KeyInvalidError('The idempotency key must be a string.');
  checkKeyLength(key);
  if (!KEY_CHARS.test(key)) {
    throw new KeyInvalidError('The idempotency key contains a character outside printable ASCII (0x20-0x7E).');
  }
}

/**
 * A form of `key` safe for logs and error messages: a prefix of at most 4 characters (a quarter of
 * the key, so short keys reveal little) and the length, for example `9b4b…(36)`. Never use a key,
 * even redacted, as a metric label.
 */
export function redactKey(key: string): string {
  const shown = key.slice(0, Math.min(4, Math.floor(key.length / 4)));
  return `${shown}…(${key.length})`;
}
