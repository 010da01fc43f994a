/**
 * Request fingerprints: SHA-256 over the RFC 8785 (JCS) canonical JSON of what makes two requests
 * "the same request". Pure logic, no I/O.
 *
 * ## What is hashed (version 1)
 * `canonicalize({ v: 1, tenant, operation, method?, target?, headers, body? })` encoded as UTF-8, where
 * - `method` is the upper-cased HTTP method, present only when given;
 * - `target` is the request target (path and query, as received), present only when given: the
 *   HTTP adapters give it, so a key reused on another resource of one operation
 *   (`POST /orders/111/cancel`, then `/orders/222/cancel`) is a different request (422), never a
 *   replay of the first one's response;
 * - `headers` holds the semantic headers the operation declares, names lower-cased (always
 *   present, possibly `{}`); tracing and transport headers must not be declared;
 * - `body` is the parsed JSON body, absent when the body is empty (zero bytes or only JSON
 *   whitespace), so an empty body and a JSON `null` body differ.
 *
 * ## Equivalence rules, all following RFC 8785 (test/unit/idempotency/fingerprint.test.ts, "the same JSON written differently")
 * - Member order is irrelevant: `{"a":1,"b":2}` ≡ `{"b":2,"a":1}` (nested objects too). Members
 *   are sorted by their UTF-16 code units (RFC 8785 §3.2.3), not by code points: `"\uFB01"` sorts
 *   after `"\uD83D\uDE00"` (😀), although U+FB01 < U+1F600.
 * - Array order matters: `[1,2]` ≢ `[2,1]`.
 * - Numbers compare by value, serialised as ECMAScript does (RFC 8785 §3.2.2.3): `1`, `1.0`,
 *   `1e0`, `10e-1` and `-0` ≡ `0` are the same number.
 * - A missing member is not `null`: `{"a":1}` ≢ `{"a":1,"b":null}`.
 * - Strings are compared as sent, without Unicode normalisation: NFC `"é"` (U+00E9) ≢ NFD
 *   `"é"` (U+0065 U+0301). Escapes do not matter: `"\u0061"` ≡ `"a"`.
 * - Header values are compared exactly; header names case-insensitively.
 *
 * ## Bodies that are refused ({@link BodyInvalidError}, HTTP 400, nothing recorded)
 * The body must be I-JSON (RFC 7493), which RFC 8785 requires of its input:
 * - not UTF-8, or not JSON (a byte order mark included), unless empty;
 * - a duplicate member name in one object (`{"a":1,"a":2}`): JSON.parse would keep the last one
 *   silently;
 * - arrays and objects nested more than {@link MAX_JSON_DEPTH} (1,000) levels deep, and more
 *   than {@link MAX_JSON_MEMBER_NAMES} (1,000) distinct member names: limits that keep parsing
 *   linear in the body's size (docs/security.md);
 * - a lone surrogate (`"\uD800"`);
 * - a `__proto__` member, or a `constructor` member whose value has a `prototype` member, at any
 *   depth (escaped spellings such as `"\u005f_proto__"` included): refused as Fastify's own JSON
 *   parser refuses them by default (secure-json-parse), since a handler that merges the body
 *   into another object would change that object's prototype;
 * - **a number that JSON.parse would round**: an integer beyond ±(2^53 − 1) that no double
 *   holds (`9007199254740993`), a fraction with more digits than a double keeps
 *   (`0.10000000000000000001`), an overflow (`1e400`) or an underflow (`1e-400`).
 *   The exact rule: the number's decimal value must equal the value of the shortest decimal that
 *   round-trips the double it parses to (what `JSON.stringify` prints). Otherwise JSON.parse
 *   would map two different numbers to one double, two different requests would share a
 *   fingerprint, and the second would get the first one's stored result. Accepted numbers that
 *   differ in value therefore never share a fingerprint. Send such values as JSON strings.
 *   `9007199254740992` (2^53), `0.1` and `1e21` are accepted (each is its double's shortest form).
 */
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import secureJson from 'secure-json-parse';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import { MAX_JSON_DEPTH } from '../json-text.js';
import { BodyInvalidError, BodyTooLargeError } from './errors.js';
import { assertValidOperation, assertValidTenant } from './text.js';

/** The current fingerprint version; stored beside the digest so that the rules can evolve. */
export const FINGERPRINT_VERSION = 1;

export { MAX_JSON_DEPTH };

/** A request fingerprint: the SHA-256 digest (32 bytes) and the version of the rules that made it. */
export interface Fingerprint {
  version: typeof FINGERPRINT_VERSION;
  digest: Buffer;
}

/** Input of {@link fingerprintRequest}. */
export interface FingerprintInput {
  /** The caller's scope (authenticated account or tenant id). Non-empty. */
  tenant: string;
  /** The operation, for example `create-order` or `POST /orders`. Non-empty. */
  operation: string;
  /** The HTTP method; upper-cased. Omit it when `operation` already names it. */
  method?: string;
  /**
   * The request target: the path and query as received (`/orders/111/cancel?notify=1`), compared
   * exactly (no reordering of the query, no percent-decoding). Give it whenever the URL carries
   * parameters that change the request: without it, the same key and body on another resource
   * would replay the first resource's response. The HTTP adapters always give it.
   */
  target?: string;
  /** The raw request body: bytes (UTF-8 JSON) or text. Empty or `undefined`: no body. */
  body: Buffer | Uint8Array | string | undefined;
  /**
   * The semantic headers the operation declares (for example `{ 'Accept-Language': 'fr' }`),
   * and only those: never tracing (`traceparent`) or transport (`content-length`) headers.
   * Names are lower-cased; an absent header is simply left out.
   */
  semanticHeaders?: Readonly<Record<string, string>>;
  /** Largest body fingerprinted, in bytes; larger bodies are refused (HTTP 413). */
  maxBodyBytes: number;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
// RFC 8259 whitespace.
const JSON_WS_ONLY = /^[ \t\n\r]*$/;

/**
 * Computes the fingerprint of a request. See the module documentation for the canonical form,
 * the equivalence rules and the refused bodies.
 *
 * @returns `{ version: 1, digest }`, `digest` being 32 bytes.
 * @throws {@link BodyTooLargeError} when the body has more than `maxBodyBytes` bytes (413).
 * @throws {@link BodyInvalidError} when the body is not empty and not I-JSON, holds a number a
 *   double cannot represent exactly, or holds a `__proto__` or `constructor.prototype` member (400).
 * @throws {@link TenantUnresolvedError} when `tenant` is empty, longer than 1,024 UTF-8 bytes, or
 *   holds a NUL character or a lone surrogate.
 * @throws {@link InvalidOptionsError} on an empty operation, an invalid limit, two semantic
 *   headers whose names differ only by case, or a field `FingerprintInput` does not have (a typo
 *   such as `semanticHeader` would otherwise leave the headers out of the fingerprint).
 */
export function fingerprintRequest(input: FingerprintInput): Fingerprint {
  // A misspelt field (`semanticHeader`) would silently leave its part out of the fingerprint.
  refuseUnknownOptions(input, FINGERPRINT_INPUT_FIELDS, 'fingerprintRequest');
  return fingerprintAndParse(input).fingerprint;
}

/** Every field of {@link FingerprintInput}; the compiler keeps it in step with the interface. */
const FINGERPRINT_INPUT_FIELDS = optionNames<FingerprintInput>({
  tenant: true,
  operation: true,
  method: true,
  target: true,
  body: true,
  semanticHeaders: true,
  maxBodyBytes: true,
});

/**
 * Like {@link fingerprintRequest}, and also returns the parsed body (`undefined` when empty), so
 * that an adapter hands the handler exactly the value that was fingerprinted, parsed once.
 * @internal
 */
export function fingerprintAndParse(input: FingerprintInput): { fingerprint: Fingerprint; body: unknown } {
  const canonical = canonicalRequest(input);
  const digest = createHash('sha256').update(canonical.json, 'utf8').digest();
  return { fingerprint: { version: FINGERPRINT_VERSION, digest }, body: canonical.body };
}

/**
 * The canonical JSON text that {@link fingerprintRequest} hashes, and the parsed body.
 * Exposed for tests and debugging.
 * @internal
 */
export function canonicalRequest(input: FingerprintInput): { json: string; body: unknown } {
  const { method, semanticHeaders, maxBodyBytes } = input;
  // The same rules as the store's (./text.ts): a tenant or operation that cannot be stored is
  // refused here already, with its own error (not as an invalid body).
  const tenant = assertValidTenant(input.tenant);
  const operation = assertValidOperation(input.operation, 'The idempotent operation');
  if (!Number.isSafeInteger(maxBodyBytes) || maxBodyBytes < 0) {
    throw new InvalidOptionsError(`maxBodyBytes must be a non-negative integer (bytes), got ${maxBodyBytes}.`);
  }
  const body = parseJsonBody(input.body, maxBodyBytes);
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(semanticHeaders ?? {})) {
    const lower = name.toLowerCase();
    if (Object.hasOwn(headers, lower)) {
      throw new InvalidOptionsError(
        `Semantic header ${JSON.stringify(lower)} is given twice (names are case-insensitive).`,
      );
    }
    if (typeof value !== 'string') {
      throw new InvalidOptionsError(`Semantic header ${JSON.stringify(lower)} must have a string value.`);
    }
    headers[lower] = value;
  }
  const subject: Record<string, unknown> = { v: FINGERPRINT_VERSION, tenant, operation, headers };
  if (method !== undefined) subject.method = method.toUpperCase();
  if (input.target !== undefined) {
    if (typeof input.target !== 'string') throw new InvalidOptionsError('target must be a string (path and query).');
    subject.target = input.target;
  }
  if (body.present) subject.body = body.value;
  let json: string | undefined;
  try {
    json = canonicalize(subject);
  } catch (err) {
    // Lone surrogates, in the body or in the tenant/operation/header strings.
    throw new BodyInvalidError(`The request cannot be canonicalised (RFC 8785): ${(err as Error).message}.`, {
      cause: err,
    });
  }
  if (json === undefined) throw new BodyInvalidError('The request cannot be canonicalised (RFC 8785).');
  return { json, body: body.present ? body.value : undefined };
}

/** A body parsed by {@link parseJsonBody}: absent (empty) or a JSON value. */
export type ParsedBody = { present: false } | { present: true; value: unknown };

/**
 * Checks the size of a raw body and parses it as I-JSON, with the rules of
 * {@link fingerprintRequest}: empty (zero bytes or JSON whitespace) → absent.
 *
 * @throws {@link BodyTooLargeError} over `maxBodyBytes`.
 * @throws {@link BodyInvalidError} when not empty and not I-JSON, holding a number JSON.parse rounds,
 *   or holding a `__proto__` or `constructor.prototype` member.
 */
export function parseJsonBody(raw: FingerprintInput['body'], maxBodyBytes: number): ParsedBody {
  if (raw === undefined || raw === null) return { present: false };
  let text: string;
  if (typeof raw === 'string') {
    const size = Buffer.byteLength(raw, 'utf8');
    if (size > maxBodyBytes) throw tooLarge(size, maxBodyBytes);
    text = raw;
  } else if (raw instanceof Uint8Array) {
    if (raw.byteLength > maxBodyBytes) throw tooLarge(raw.byteLength, maxBodyBytes);
    try {
      text = UTF8.decode(raw);
    } catch (err) {
      throw new BodyInvalidError('The request body is not valid UTF-8; send UTF-8 JSON (RFC 8259).', { cause: err });
    }
  } else {
    throw new InvalidOptionsError(
      'The body to fingerprint must be the raw bytes (Buffer) or text; register a raw body parser instead of a JSON parser.',
    );
  }
  if (JSON_WS_ONLY.test(text)) return { present: false };
  // The walk runs first: it refuses what JSON.parse would take super-linear time over (deep
  // nesting, very many distinct member names) before JSON.parse sees it.
  const violation = scanJson(text);
  const value = parseRefusingPrototypeKeys(text);
  if (violation !== undefined) throw new BodyInvalidError(violation);
  return { present: true, value };
}

/** Fastify's defaults (`onProtoPoisoning`, `onConstructorPoisoning`): refuse, never strip. */
const PROTOTYPE_KEYS_REFUSED = Object.freeze({ protoAction: 'error', constructorAction: 'error' } as const);

/**
 * JSON.parse through secure-json-parse, the parser Fastify itself uses, with Fastify's defaults:
 * a `__proto__` member, or a `constructor` member whose value has a `prototype` member, at any
 * depth, is refused. JSON.parse keeps them as plain members, but a handler that merges the body
 * into another object (`Object.assign`, a deep merge) would then set that object's prototype.
 */
function parseRefusingPrototypeKeys(text: string): unknown {
  // secure-json-parse drops a leading byte order mark; JSON text must not start with one (RFC 8259 §8.1).
  if (text.charCodeAt(0) === 0xfeff) throw notJson();
  try {
    return secureJson.parse(text, null, PROTOTYPE_KEYS_REFUSED);
  } catch (err) {
    // Both refusals are SyntaxErrors: JSON.parse tells them apart (on this error path only).
    try {
      JSON.parse(text);
    } catch (syntax) {
      throw notJson(syntax);
    }
    throw new BodyInvalidError(
      'The request body has a "__proto__" member, or a "constructor" member holding a "prototype" member; they are refused (prototype poisoning, docs/http-contract.md). Rename the member.',
      { cause: err },
    );
  }
}

function notJson(cause?: unknown): BodyInvalidError {
  return new BodyInvalidError('The request body is not JSON; send a JSON body (RFC 8259) or none.', { cause });
}

function tooLarge(size: number, limit: number): BodyTooLargeError {
  return new BodyTooLargeError(
    `The request body has ${size} bytes; idempotent requests are limited to ${limit} bytes.`,
    limit,
  );
}

/** Significant digits that every double round-trips (DBL_DIG, IEEE 754 binary64). */
const MAX_EXACT_DIGITS = 15;

/**
 * Most distinct member names in one body: 1,000. V8 builds a hidden class for each new shape of
 * object, and JSON.parse's time grows with the square of the number of member names it has not
 * seen before (measured on Node.js 20: 870 distinct names in a 10 KiB body cost 0.7 ms, 8,700 in
 * 100 KiB cost 17 ms). Bodies that repeat the same names (an array of records) are not limited.
 * The same limit, for the same reason, as PHP's `max_input_vars` (default 1,000).
 */
export const MAX_JSON_MEMBER_NAMES = 1_000;

interface Container {
  object: boolean;
  expectKey: boolean;
  /** The object's member names so far: an array while small (cheaper than a Set), then a Set. */
  keys: string[] | Set<string> | undefined;
}

/** Member names of one object kept in an array (searched linearly) before a Set takes over. */
const SMALL_OBJECT_MEMBERS = 8;

/** Adds `name` to an object's member names; false when it was there already. */
function addMember(container: Container, name: string): boolean {
  const keys = container.keys!;
  if (keys instanceof Set) {
    if (keys.has(name)) return false;
    keys.add(name);
  } else {
    if (keys.includes(name)) return false;
    keys.push(name);
    if (keys.length > SMALL_OBJECT_MEMBERS) container.keys = new Set(keys);
  }
  return true;
}

/**
 * Walks JSON text in one linear pass, before JSON.parse, and
 * - throws {@link BodyInvalidError} when the text exceeds a limit: nesting deeper than
 *   {@link MAX_JSON_DEPTH}, more than {@link MAX_JSON_MEMBER_NAMES} distinct member names;
 * - returns the first thing that RFC 8785 / I-JSON forbid and JSON.parse lets through silently
 *   (a duplicate member name in one object, a number a double cannot hold exactly), for the caller
 *   to throw once JSON.parse has accepted the text (so invalid JSON is reported as such); or
 *   undefined. Lone surrogates are refused later by canonicalize.
 * Any text is walked in linear time, JSON or not.
 */
function scanJson(text: string): string | undefined {
  const stack: Container[] = [];
  const names = new Set<string>();
  let violation: string | undefined;
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      const object = c === 0x7b;
      stack.push({ object, expectKey: object, keys: object ? [] : undefined });
      if (stack.length > MAX_JSON_DEPTH) {
        throw new BodyInvalidError(
          `The request body nests arrays and objects more than ${MAX_JSON_DEPTH} levels deep; send a flatter body.`,
        );
      }
      i++;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      stack.pop();
      i++;
    } else if (c === 0x2c /* , */) {
      const top = stack[stack.length - 1];
      if (top?.object) top.expectKey = true;
      i++;
    } else if (c === 0x3a /* : */) {
      const top = stack[stack.length - 1];
      if (top) top.expectKey = false;
      i++;
    } else if (c === 0x22 /* " */) {
      let j = i + 1;
      let escaped = false;
      while (j < n) {
        const d = text.charCodeAt(j);
        if (d === 0x5c) {
          escaped = true;
          j += 2;
        } else if (d === 0x22) break;
        else j++;
      }
      const top = stack[stack.length - 1];
      if (top?.object && top.expectKey && top.keys) {
        const name = escaped ? unescapeName(text.slice(i, j + 1)) : text.slice(i + 1, j);
        if (name !== undefined) {
          if (!addMember(top, name)) {
            violation ??= `The request body has the member ${JSON.stringify(shorten(name))} twice in one object; I-JSON (RFC 7493) forbids duplicate names.`;
          }
          names.add(name);
          if (names.size > MAX_JSON_MEMBER_NAMES) {
            throw new BodyInvalidError(
              `The request body has more than ${MAX_JSON_MEMBER_NAMES} distinct member names; send a map with more entries as an array of records.`,
            );
          }
        }
      }
      i = j + 1;
    } else if (c === 0x2d /* - */ || (c >= 0x30 && c <= 0x39)) {
      let j = c === 0x2d ? i + 1 : i;
      let digits = 0;
      for (; j < n; j++) {
        const d = text.charCodeAt(j);
        if (d >= 0x30 && d <= 0x39) digits++;
        else if (d !== 0x2e /* . */) break;
      }
      // e E: the exponent and its sign, if any.
      const exponent = j < n && (text.charCodeAt(j) | 0x20) === 0x65;
      for (; j < n; j++) {
        const d = text.charCodeAt(j);
        if (!((d >= 0x30 && d <= 0x39) || d === 0x65 || d === 0x45 || d === 0x2b || d === 0x2d)) break;
      }
      // Without an exponent, a number of at most 15 digits (DBL_DIG) keeps its value through a
      // double: its magnitude lies between 1e-15 and 1e15, and no other decimal of 15 digits or
      // fewer shares its double, so the shortest round-trip form has the same value. Skipping
      // the exact check for these keeps the common case cheap; the rest are checked.
      if (violation === undefined && (exponent || digits > MAX_EXACT_DIGITS))
        violation = numberProblem(text.slice(i, j));
      i = j;
    } else {
      i++; // whitespace, or the letters of true/false/null
    }
  }
  return violation;
}

/** A member name written with escapes, unescaped; undefined when it is not a JSON string. */
function unescapeName(quoted: string): string | undefined {
  try {
    const name: unknown = JSON.parse(quoted);
    return typeof name === 'string' ? name : undefined;
  } catch {
    return undefined; // not JSON: JSON.parse refuses the whole body next
  }
}

function shorten(text: string): string {
  return text.length > 40 ? `${text.slice(0, 37)}...` : text;
}

/** A decimal number as sign, significant digits without leading/trailing zeros, and exponent. */
interface Decimal {
  negative: boolean;
  digits: string;
  exponent: bigint;
}

const NUMBER = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/;

/** Parses JSON number text, or `String(double)` output, into its exact decimal value. */
export function decimalOf(text: string): Decimal | undefined {
  const m = NUMBER.exec(text);
  if (!m) return undefined;
  const intPart = m[2] ?? '';
  const fracPart = m[3] ?? '';
  const digits = intPart + fracPart;
  // Index loops, not /^0+/ and /0+$/: an unanchored /0+$/ backtracks quadratically over a long run
  // of zeros followed by another digit (docs/security.md).
  let start = 0;
  while (start < digits.length && digits.charCodeAt(start) === 0x30) start++;
  if (start === digits.length) return { negative: false, digits: '', exponent: 0n }; // zero, whatever its sign
  let end = digits.length;
  while (digits.charCodeAt(end - 1) === 0x30) end--;
  const exponent = BigInt(m[4] ?? '0') - BigInt(fracPart.length) + BigInt(digits.length - end);
  return { negative: m[1] === '-', digits: digits.slice(start, end), exponent };
}

/**
 * Whether JSON.parse keeps the exact value of the JSON number `text`: true when the decimal value
 * of `text` equals that of the shortest round-trip form of the double it parses to.
 */
export function isLosslessNumber(text: string): boolean {
  const value = Number(text);
  if (!Number.isFinite(value)) return false;
  const written = decimalOf(text);
  const parsed = decimalOf(String(value));
  if (!written || !parsed) return false;
  return (
    written.negative === parsed.negative && written.digits === parsed.digits && written.exponent === parsed.exponent
  );
}

function numberProblem(text: string): string | undefined {
  if (isLosslessNumber(text)) return undefined;
  return `The request body has the number ${shorten(text)}, which JSON cannot hold without rounding (beyond IEEE 754 double precision); send it as a string.`;
}
