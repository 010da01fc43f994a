/**
 * Adversarial inputs for every parser that outboxkit applies to input from outside, and the
 * measurement of how their time grows with the input's size. Used by
 * test/unit/hostile-input.test.ts (which asserts linear growth) and bench/hostile-input.ts (which
 * prints the worst case of each parser at the body limit). Pure logic, no I/O.
 */
import { parseProblem } from '../../src/client/client.js';
import { parseRetryAfterMs } from '../../src/client/retry-delay.js';
import { DEFAULT_MAX_BODY_BYTES } from '../../src/http/route-options.js';
import { fingerprintRequest, parseJsonBody } from '../../src/idempotency/fingerprint.js';
import { assertValidKey, parseIdempotencyKey } from '../../src/idempotency/key.js';
import { assertValidTenant } from '../../src/idempotency/text.js';
import { decodeHeaders, readEventId, toConsumedEvent } from '../../consumer/consumed-event.js';
import { reasonOf, summarizeDeadLetter } from '../../consumer/dead-letter.js';
import { printable, printableJson } from '../../cli/printable.js';

/** The largest input: the HTTP layer's default body limit (1 MiB). */
export const LIMIT = DEFAULT_MAX_BODY_BYTES;
/** Input sizes, in bytes: from 1 KiB up to the limit, each ten times the one before. */
export const SIZES = [1_024, 10_240, LIMIT / 10, LIMIT].map(Math.floor);
/** Most growth of the time from one size to the next (ten times larger): linear gives 10×, quadratic 100×. */
export const MAX_GROWTH = 15;
/** Most CPU time of one parse at any size, in ms. */
export const MAX_MS_AT_LIMIT = 250;
/** Below this a measurement is noise (timer resolution, a minor GC): growth is judged against it. */
const NOISE_FLOOR_MS = 1;

/** `unit` repeated to `bytes` characters, between `head` and `tail`. */
export function run(unit: string, bytes: number, head = '', tail = ''): string {
  const count = Math.max(1, Math.floor((bytes - head.length - tail.length) / unit.length));
  return head + unit.repeat(count) + tail;
}

/** `gc()` where node runs with `--expose-gc` (the unit project of vitest.config.ts), else nothing. */
const collect = (globalThis as { gc?: () => void }).gc ?? (() => undefined);

/**
 * The user CPU time of one `parse(input)`, in ms, on a collected heap; a refusal (a throw) counts
 * as a result. System time is left out: it is the kernel's work of mapping fresh memory pages for a
 * large input (which a machine that hands freed memory back to its host does on every run), not
 * the parser's, and it grows by steps, not with the input.
 */
function cpuMs<I>(parse: (input: I) => unknown, input: I): number {
  collect();
  const start = process.cpuUsage();
  try {
    parse(input);
  } catch {
    // Refused: what matters here is how long it took.
  }
  const used = process.cpuUsage(start);
  return used.user / 1_000;
}

/** An adversarial input, made at any size. */
export interface Attack {
  name: string;
  make: (bytes: number) => string;
}

/** One parser fed one attack: `parse(prepare(attack.make(bytes)))`, only `parse` timed. */
export interface HostileCase {
  attack: Attack;
  // The input type differs per case; each case's prepare and parse agree on it.
  parse: (input: never) => unknown;
  prepare?: (text: string) => unknown;
}

/** What {@link measure} found, per size of {@link SIZES}. */
export interface Measurement {
  /** The fastest time at each size, in ms of CPU. */
  best: number[];
  /** The lowest ratio, over the rounds, of a size's time to the time of the size before it in the same round. */
  growth: number[];
  /** The first round stopped at a size over {@link MAX_MS_AT_LIMIT} or growing far beyond {@link MAX_GROWTH}: the sizes measured. */
  stoppedAt: number | undefined;
}

/**
 * Times a case at every size, in rounds that measure each size right after the one a tenth of
 * it. Times are this process's CPU time (`process.cpuUsage()`), so other processes on a loaded
 * machine do not count. A size's growth is the lowest over the rounds of the ratio of its time to
 * the size before's time in the same round: both measured within milliseconds of each other,
 * under the same load (the second CPU of a 2-core machine busy or not, caches shared or not), so
 * that the ratio reflects the parser, not the moment. The first round stops at the first size over
 * the limit or growing three times beyond the bound (confirmed by two more pairs): a quadratic
 * parser is found at a small size, in seconds, instead of running for minutes at the limit.
 */
export function measure(c: HostileCase, rounds: number): Measurement {
  const parse = c.parse as (input: unknown) => unknown;
  const inputs = SIZES.map((bytes) => (c.prepare ?? ((text: string) => text))(c.attack.make(bytes)));
  const best = SIZES.map(() => Infinity);
  const growth = SIZES.map(() => Infinity);
  for (let round = 0; round < rounds; round++) {
    let previous = 0;
    for (let i = 0; i < SIZES.length; i++) {
      if (round === 0) cpuMs(parse, inputs[i]); // warm-up: JIT and inline caches
      const ms = cpuMs(parse, inputs[i]);
      best[i] = Math.min(best[i]!, ms);
      if (i > 0) growth[i] = Math.min(growth[i]!, ms / Math.max(previous, NOISE_FLOOR_MS));
      // One measurement may meet a busy core: a growth far beyond the bound is confirmed by two
      // more pairs before the round stops (a slow parser is still slow; a pause is gone).
      for (
        let again = 0;
        again < 2 && round === 0 && i > 0 && growth[i]! > 3 * MAX_GROWTH && ms < MAX_MS_AT_LIMIT;
        again++
      ) {
        const before = cpuMs(parse, inputs[i - 1]);
        const now = cpuMs(parse, inputs[i]);
        best[i] = Math.min(best[i]!, now);
        growth[i] = Math.min(growth[i]!, now / Math.max(before, NOISE_FLOOR_MS));
      }
      previous = ms;
      if (round === 0 && (ms >= MAX_MS_AT_LIMIT || (i > 0 && growth[i]! > 3 * MAX_GROWTH))) {
        return { best, growth, stoppedAt: i + 1 };
      }
    }
  }
  return { best, growth, stoppedAt: undefined };
}

/** A measurement as text: `1024 B: 0.05 ms, 10240 B: 0.40 ms (×8.0), ...`. */
export function describeMeasurement(m: Measurement): string {
  return SIZES.slice(0, m.stoppedAt ?? SIZES.length)
    .map((bytes, i) => `${bytes} B: ${m.best[i]!.toFixed(2)} ms${i > 0 ? ` (×${m.growth[i]!.toFixed(1)})` : ''}`)
    .join(', ');
}

const JSON_ATTACKS: Attack[] = [
  { name: 'a run of zeros in a fraction', make: (n) => run('0', n, '1.', '1') },
  { name: 'a run of zeros in an integer', make: (n) => run('0', n, '1', '1') },
  { name: 'a run of zeros in an exponent', make: (n) => run('0', n, '1e', '1') },
  { name: 'a run of nines in an exponent', make: (n) => run('9', n, '1e') },
  { name: 'a run of zeros after a minus and a point', make: (n) => run('0', n, '-0.') },
  { name: 'many numbers that need the exact check', make: (n) => run('1.10,', n, '[', '1]') },
  { name: 'many long numbers', make: (n) => run('1234567890.1234567890,', n, '[', '1]') },
  { name: 'alternating value types', make: (n) => run('1,"a",{},[],true,null,-0.5e-3,', n, '[', '0]') },
  { name: 'nested arrays', make: (n) => '['.repeat(n / 2) + ']'.repeat(n / 2) },
  { name: 'nested objects', make: (n) => '{"a":'.repeat(n / 6) + '1' + '}'.repeat(n / 6) },
  { name: 'unclosed nesting', make: (n) => run('[{"a":', n) },
  { name: 'many member names', make: (n) => `{${Array.from({ length: n / 12 }, (_, i) => `"k${i}":1`).join(',')}}` },
  {
    name: 'escaped member names',
    make: (n) => `{${Array.from({ length: n / 14 }, (_, i) => `"\\u006b${i}":1`).join(',')}}`,
  },
  {
    name: 'one-member objects with distinct names',
    make: (n) => `[${Array.from({ length: n / 12 }, (_, i) => `{"k${i}":1}`).join(',')}]`,
  },
  {
    name: 'records with distinct names',
    make: (n) => `[${Array.from({ length: n / 60 }, (_, i) => `{"a${i}":1,"b${i}":2,"c${i}":3,"d${i}":4}`).join(',')}]`,
  },
  {
    name: 'records that share their names',
    make: (n) => run('{"id":1,"sku":"a","qty":2,"price":1.5},', n, '[', '{}]'),
  },
  { name: 'one member name repeated', make: (n) => run('"a":1,', n, '{', '"b":1}') },
  { name: 'a long string', make: (n) => run('a', n, '"', '"') },
  { name: 'a string of escapes', make: (n) => run('\\n', n, '"', '"') },
  { name: 'a run of backslashes', make: (n) => run('\\\\', n, '"', '"') },
  { name: 'an unterminated string', make: (n) => run('a', n, '"') },
  { name: 'whitespace only', make: (n) => run(' ', n) },
  { name: 'whitespace, then garbage', make: (n) => run(' \t\r\n', n, '', 'x') },
  { name: 'a run of zeros, then garbage', make: (n) => run('0', n, '1.', 'x') },
];

const KEY_ATTACKS: Attack[] = [
  { name: 'spaces inside a key', make: (n) => run(' ', n, 'a', 'b') },
  { name: 'tabs and spaces around a key', make: (n) => run(' \t', n / 2) + 'key' + run('\t ', n / 2) },
  { name: 'a long bare key', make: (n) => run('a', n) },
  { name: 'a long quoted key', make: (n) => run('a', n, '"', '"') },
  { name: 'a quoted key of escapes', make: (n) => run('\\"', n, '"', '"') },
  { name: 'an unterminated quoted key', make: (n) => run('a', n, '"') },
  { name: 'a list of keys', make: (n) => run('a, ', n) },
  { name: 'parameters', make: (n) => run(';a=b', n, 'k') },
  { name: 'spaces before a comma after a quoted key', make: (n) => run(' ', n, '"k"', 'x') },
];

const MESSAGE_ATTACKS: Attack[] = [
  { name: 'a long header of hex digits', make: (n) => run('a', n) },
  { name: 'a UUID-like run', make: (n) => run('0000-', n) },
  { name: 'a long JSON value', make: (n) => run('1.10,', n, '[', '1]') },
  { name: 'a nested JSON value', make: (n) => '['.repeat(n / 2) + ']'.repeat(n / 2) },
];

const REASON_ATTACKS: Attack[] = [
  { name: 'words of the value in a long error message', make: (n) => run('abc ', n) },
  { name: 'a long word of the value', make: (n) => run('abcd', n) },
  { name: 'punctuation around words', make: (n) => run('"!a"', n) },
  // A string that never ends, each quote in it escaped: read as JSON (it starts with a quote), and
  // a search that tries again from each quote reads on to the end each time (quadratic).
  { name: 'escaped quotes in an unterminated string', make: (n) => run('\\"', n, '"') },
];

/** A Kafka message whose key, value and headers are all `value`. */
function message(value: string) {
  return {
    key: Buffer.from(value),
    value: Buffer.from(value),
    timestamp: '0',
    attributes: 0,
    offset: '0',
    headers: { 'event-id': value, 'event-type': value, 'dlq-original-partition': value, 'dlq-reason': value },
  };
}

const withEach = (attacks: Attack[], parse: (input: string) => unknown): HostileCase[] =>
  attacks.map((attack) => ({ attack, parse }));

/** Every parser of outside input, with the attacks it gets. */
export const HOSTILE_SUITES: { parser: string; cases: HostileCase[] }[] = [
  {
    parser: 'the request body (fingerprint, I-JSON checks, prototype members)',
    cases: [
      ...JSON_ATTACKS.map((attack) => ({
        attack,
        parse: (body: Buffer) =>
          fingerprintRequest({ tenant: 't', operation: 'create-order', body, maxBodyBytes: LIMIT }),
        prepare: (text: string) => Buffer.from(text),
      })),
      { attack: { ...JSON_ATTACKS[0]!, name: 'a text body' }, parse: (text: string) => parseJsonBody(text, LIMIT) },
    ],
  },
  {
    parser: 'the Idempotency-Key header',
    cases: [
      ...withEach(KEY_ATTACKS, (value) => parseIdempotencyKey(value, { required: true })),
      ...withEach(KEY_ATTACKS, (value) => assertValidKey(value)).map((c) => ({
        ...c,
        attack: { ...c.attack, name: `${c.attack.name} (assertValidKey)` },
      })),
    ],
  },
  {
    parser: 'the tenant a resolver returns',
    cases: withEach(
      [
        { name: 'a long tenant', make: (n) => run('t', n) },
        { name: 'alternating surrogates', make: (n) => run('\uD83D\uDE00\uD800', n) },
      ],
      (value) => assertValidTenant(value),
    ),
  },
  {
    parser: "the idempotent client's Retry-After",
    cases: withEach(
      [
        { name: 'a long Retry-After of digits', make: (n) => run('9', n) },
        { name: 'a long Retry-After of spaces', make: (n) => run(' ', n, '1', 'a') },
        { name: 'a long Retry-After date', make: (n) => run('Wed, ', n, '', '21 Oct 2015 07:28:00 GMT') },
      ],
      (value) => parseRetryAfterMs(value, 0),
    ),
  },
  {
    parser: "the idempotent client's problem details",
    cases: [
      ...withEach(
        [
          { name: 'a long problem body', make: (n) => run('"a",', n, '[', '0]') },
          { name: 'a nested problem body', make: (n) => '['.repeat(n / 2) + ']'.repeat(n / 2) },
        ],
        (value) =>
          parseProblem(new Headers({ 'content-type': 'application/problem+json' }), new TextEncoder().encode(value)),
      ),
      {
        attack: { name: 'a long content type', make: (n) => run('json', n, 'application/') },
        parse: (type: string) => parseProblem(new Headers({ 'content-type': type }), new TextEncoder().encode('{}')),
      },
    ],
  },
  {
    parser: "the dedup consumer's message (headers, event id, JSON value)",
    cases: withEach(MESSAGE_ATTACKS, (value) => {
      const m = message(value);
      const headers = decodeHeaders(m.headers);
      const id = readEventId(headers, 'event-id');
      toConsumedEvent('t', 0, m, id ?? '', headers).json();
    }),
  },
  {
    parser: "a dead letter's summary (dlq list)",
    cases: withEach(MESSAGE_ATTACKS, (value) =>
      summarizeDeadLetter(message(value), { topic: 't.dlq', partition: 0 }, null, null),
    ),
  },
  {
    parser: "a dead letter's reason (the handler's message, the value's words withheld)",
    cases: [
      // The handler's message and the message value are both the attack: the worst case for the
      // search of the value's words in the reason.
      ...withEach(REASON_ATTACKS, (text) =>
        reasonOf(new Error(text), Buffer.from(JSON.stringify([text, text.length]))),
      ),
      ...withEach(REASON_ATTACKS, (text) => reasonOf(new Error(text), Buffer.from(text))).map((c) => ({
        ...c,
        attack: { ...c.attack, name: `${c.attack.name} (a text value)` },
      })),
    ],
  },
  {
    parser: "the CLI's text and JSON output",
    cases: [
      ...withEach(
        [
          { name: 'control characters', make: (n) => run('\x1b[2J\u202e\r', n) },
          { name: 'plain text', make: (n) => run('a', n) },
        ],
        (text) => printable(text),
      ),
      {
        attack: { name: 'control characters in JSON', make: (n) => run('\x1b[2J\u202e\r', n) },
        parse: (json: string) => printableJson(json),
        prepare: (text) => JSON.stringify(text),
      },
    ],
  },
];
