/**
 * Hostile input: every parser that outboxkit applies to input from outside (the HTTP layer's key
 * and body, the fingerprint, the idempotent client's view of a response, the dedup consumer's view
 * of a Kafka message) runs in time linear in the input's size. A regular expression or a loop that
 * backtracks over a long run of one character (a run of zeros in a number, of spaces in a key)
 * would let one request of a few hundred KiB block the event loop for seconds (docs/security.md).
 *
 * Each parser gets adversarial inputs (runs of one character, alternations, nesting) at sizes from
 * 1 KiB up to the HTTP layer's body limit. The time at the limit must stay within 15× the time at
 * a tenth of it (quadratic growth gives 100×) and under 250 ms. Times are this process's CPU time
 * (`process.cpuUsage()`: vitest runs each file in a process of its own), over several rounds (see
 * expectLinear), so that other processes on a loaded machine slow the test down without making it
 * fail.
 */
import { describe, expect, it } from 'vitest';
import { parseProblem } from '../../src/client/client.js';
import { parseRetryAfterMs } from '../../src/client/retry-delay.js';
import { DEFAULT_MAX_BODY_BYTES } from '../../src/http/route-options.js';
import { fingerprintRequest, parseJsonBody } from '../../src/idempotency/fingerprint.js';
import { assertValidKey, parseIdempotencyKey } from '../../src/idempotency/key.js';
import { assertValidTenant } from '../../src/idempotency/text.js';
import { decodeHeaders, readEventId, toConsumedEvent } from '../../consumer/consumed-event.js';
import { reasonOf, summarizeDeadLetter } from '../../consumer/dead-letter.js';
import { printable, printableJson } from '../../cli/printable.js';

const LIMIT = DEFAULT_MAX_BODY_BYTES;
const SIZES = [1_024, 10_240, LIMIT / 10, LIMIT].map(Math.floor);
const MAX_GROWTH = 15;
const MAX_MS_AT_LIMIT = 250;
// Below this a measurement is noise (timer resolution, a minor GC): the growth is judged against it.
const NOISE_FLOOR_MS = 1;

/** `unit` repeated to `bytes` characters, between `head` and `tail`. */
function run(unit: string, bytes: number, head = '', tail = ''): string {
  const count = Math.max(1, Math.floor((bytes - head.length - tail.length) / unit.length));
  return head + unit.repeat(count) + tail;
}

/** The CPU time of one `parse(input)`, in ms; a refusal (a throw) counts as a result. */
function cpuMs<I>(parse: (input: I) => unknown, input: I): number {
  const start = process.cpuUsage();
  try {
    parse(input);
  } catch {
    // Refused: what matters here is how long it took.
  }
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1_000;
}

/** Rounds over every size. */
const ROUNDS = 9;

interface Attack {
  name: string;
  make: (bytes: number) => string;
}

/**
 * Times `parse` on the attack at every size, in rounds that measure each size right after the one
 * a tenth of it, and checks each size: its fastest time under the limit, and its growth over the
 * size before within {@link MAX_GROWTH}×. The growth is the lowest over the rounds of the ratio of
 * the two times of one round: both measured within milliseconds of each other, under the same
 * load of the machine (the second CPU of a 2-core machine busy or not, caches shared or not), so
 * that the ratio reflects the parser, not the moment. The first round stops at the first size over
 * the limit or growing far beyond the bound: a quadratic parser fails at a small size, in seconds,
 * instead of running for minutes at the limit.
 *
 * @param prepare - turns the attack's text into the parser's input, outside the time measured.
 */
function expectLinear<I = string>(
  parse: (input: I) => unknown,
  attack: Attack,
  prepare: (text: string) => I = (text) => text as I,
): void {
  const inputs = SIZES.map((bytes) => prepare(attack.make(bytes)));
  const best = SIZES.map(() => Infinity);
  const growth = SIZES.map(() => Infinity);
  const shown = (count = SIZES.length) =>
    SIZES.slice(0, count)
      .map((bytes, i) => `${bytes} B: ${best[i]!.toFixed(2)} ms${i > 0 ? ` (×${growth[i]!.toFixed(1)})` : ''}`)
      .join(', ');
  for (let round = 0; round < ROUNDS; round++) {
    let previous = 0;
    for (let i = 0; i < SIZES.length; i++) {
      if (round === 0) cpuMs(parse, inputs[i]!); // warm-up: JIT and inline caches
      const ms = cpuMs(parse, inputs[i]!);
      best[i] = Math.min(best[i]!, ms);
      if (i > 0) growth[i] = Math.min(growth[i]!, ms / Math.max(previous, NOISE_FLOOR_MS));
      previous = ms;
      if (round === 0 && (ms >= MAX_MS_AT_LIMIT || (i > 0 && growth[i]! > 3 * MAX_GROWTH))) {
        expect.fail(`${attack.name} grows faster than linearly (${shown(i + 1)})`);
      }
    }
  }
  for (let i = 0; i < SIZES.length; i++) {
    expect(best[i], `${attack.name} (${shown()})`).toBeLessThan(MAX_MS_AT_LIMIT);
    if (i > 0)
      expect(growth[i], `${attack.name} grows faster than linearly (${shown()})`).toBeLessThanOrEqual(MAX_GROWTH);
  }
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

describe('hostile input: every parser of outside input runs in linear time', () => {
  describe('the request body (the HTTP layer and the fingerprint)', () => {
    const fingerprint = (body: Buffer) =>
      fingerprintRequest({ tenant: 't', operation: 'create-order', body, maxBodyBytes: LIMIT });
    it.each(JSON_ATTACKS)('$name', (attack) => expectLinear(fingerprint, attack, (text) => Buffer.from(text)));

    it('text bodies take the same path as bytes', () => {
      expectLinear((text) => parseJsonBody(text, LIMIT), JSON_ATTACKS[0]!);
    });
  });

  describe('the Idempotency-Key header', () => {
    it.each(KEY_ATTACKS)('$name', (attack) => {
      expectLinear((value) => parseIdempotencyKey(value, { required: true }), attack);
      expectLinear((value) => assertValidKey(value), attack);
    });
  });

  describe('the tenant a resolver returns', () => {
    it.each([
      { name: 'a long tenant', make: (n: number) => run('t', n) },
      { name: 'alternating surrogates', make: (n: number) => run('\uD83D\uDE00\uD800', n) },
    ])('$name', (attack) => expectLinear((value) => assertValidTenant(value), attack));
  });

  describe('the idempotent client (a response from the server)', () => {
    it.each([
      { name: 'a long Retry-After of digits', make: (n: number) => run('9', n) },
      { name: 'a long Retry-After of spaces', make: (n: number) => run(' ', n, '1', 'a') },
      { name: 'a long Retry-After date', make: (n: number) => run('Wed, ', n, '', '21 Oct 2015 07:28:00 GMT') },
    ])('$name', (attack) => expectLinear((value) => parseRetryAfterMs(value, 0), attack));

    it.each([
      { name: 'a long problem body', make: (n: number) => run('"a",', n, '[', '0]') },
      { name: 'a nested problem body', make: (n: number) => '['.repeat(n / 2) + ']'.repeat(n / 2) },
    ])('$name', (attack) =>
      expectLinear(
        (value) =>
          parseProblem(new Headers({ 'content-type': 'application/problem+json' }), new TextEncoder().encode(value)),
        attack,
      ),
    );

    it('a long content type', () => {
      const body = new TextEncoder().encode('{}');
      expectLinear((type) => parseProblem(new Headers({ 'content-type': type }), body), {
        name: 'content type',
        make: (n) => run('json', n, 'application/'),
      });
    });
  });

  describe('the dedup consumer (a Kafka message)', () => {
    const message = (value: string) => ({
      key: Buffer.from(value),
      value: Buffer.from(value),
      timestamp: '0',
      attributes: 0,
      offset: '0',
      headers: { 'event-id': value, 'event-type': value, 'dlq-original-partition': value, 'dlq-reason': value },
    });
    const attacks: Attack[] = [
      { name: 'a long header of hex digits', make: (n) => run('a', n) },
      { name: 'a UUID-like run', make: (n) => run('0000-', n) },
      { name: 'a long JSON value', make: (n) => run('1.10,', n, '[', '1]') },
      { name: 'a nested JSON value', make: (n) => '['.repeat(n / 2) + ']'.repeat(n / 2) },
    ];
    it.each(attacks)('$name', (attack) => {
      expectLinear((value) => {
        const m = message(value);
        const headers = decodeHeaders(m.headers);
        const id = readEventId(headers, 'event-id');
        toConsumedEvent('t', 0, m, id ?? '', headers).json();
      }, attack);
      expectLinear(
        (value) => summarizeDeadLetter(message(value), { topic: 't.dlq', partition: 0 }, null, null),
        attack,
      );
    });

    it.each([
      { name: 'words of the value in a long error message', make: (n: number) => run('abc ', n) },
      { name: 'a long word of the value', make: (n: number) => run('abcd', n) },
      { name: 'punctuation around words', make: (n: number) => run('"!a"', n) },
    ])('the dead-letter reason of $name', (attack) => {
      // The handler's message and the message value are both the attack: the worst case for the
      // search of the value's words in the reason.
      expectLinear((text) => reasonOf(new Error(text), Buffer.from(JSON.stringify([text, text.length]))), attack);
      expectLinear((text) => reasonOf(new Error(text), Buffer.from(text)), attack);
    });
  });

  describe('the CLI (strings from dead letters, parked events and keys)', () => {
    it.each([
      { name: 'control characters', make: (n: number) => run('\x1b[2J\u202e\r', n) },
      { name: 'plain text', make: (n: number) => run('a', n) },
    ])('$name', (attack) => {
      expectLinear((text) => printable(text), attack);
      expectLinear((text) => printableJson(JSON.stringify(text)), attack);
    });
  });
});
