import type { KafkaMessage } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import {
  deadLetterMessage,
  MAX_DLQ_REASON_LENGTH,
  reasonOf,
  replayMessage,
  summarizeDeadLetter,
  reducedDeadLetter,
  HEADER_DLQ_OMITTED,
} from '../../../consumer/dead-letter.js';
import { InvalidMessageError } from '../../../consumer/errors.js';

describe('deadLetterMessage', () => {
  const original: KafkaMessage = {
    key: Buffer.from([0xff, 0x00]),
    value: Buffer.from([1, 2, 3]),
    timestamp: '0',
    attributes: 0,
    offset: '7',
    headers: {
      'event-id': Buffer.from('x'),
      multi: [Buffer.from('a'), Buffer.from('b')],
      'dlq-reason': 'older failure',
    },
  };

  it('keeps key, value and headers byte for byte and adds the dlq-* headers (replacing older ones)', () => {
    const failedAt = new Date('2026-01-02T03:04:05.678Z');
    const m = deadLetterMessage(original, {
      reason: 'Error: boom',
      topic: 'orders',
      partition: 1,
      attempts: 5,
      groupId: 'g',
      failedAt,
    });
    expect(m.key).toBe(original.key);
    expect(m.value).toBe(original.value);
    expect(m.headers).toEqual({
      'event-id': Buffer.from('x'),
      multi: [Buffer.from('a'), Buffer.from('b')],
      'dlq-reason': 'Error: boom',
      'dlq-original-topic': 'orders',
      'dlq-original-partition': '1',
      'dlq-original-offset': '7',
      'dlq-attempts': '5',
      'dlq-failed-at': '2026-01-02T03:04:05.678Z',
      'dlq-consumer-group': 'g',
    });
  });
});

describe('reasonOf', () => {
  const CARD = '4111111111111111';
  it('never carries bytes of the message value', () => {
    const json = Buffer.from(JSON.stringify({ card: CARD, holder: 'Ada Lovelace', amount: 4200, note: 'ok' }));
    let syntaxError: unknown;
    try {
      JSON.parse(`card ${CARD}`);
    } catch (err) {
      syntaxError = err;
    }
    // V8 quotes the text JSON.parse failed on: the whole message is withheld, its position kept.
    expect((syntaxError as Error).message).toContain('"card 41111"');
    expect(reasonOf(syntaxError, json)).toMatch(/^SyntaxError: message withheld \(it may quote the message value\)/);
    expect(reasonOf(syntaxError, json)).not.toContain('41111');
    // Words found in the value's strings and numbers go; the field names and other words stay.
    expect(reasonOf(new Error(`card ${CARD} of Ada Lovelace declined (amount 4200)`), json)).toBe(
      'Error: card … of … … declined (amount …)',
    );
    expect(reasonOf(new Error(`card="${CARD}",`), json)).toBe('Error: …",');
    expect(reasonOf(new Error(`invalid input syntax for type integer: "${CARD}"`), json)).toBe(
      'Error: invalid input syntax for type integer: "…"',
    );
    // A value that is not JSON: words found in its text.
    expect(reasonOf(new Error('token s3cr3t-t0ken refused'), Buffer.from('auth=s3cr3t-t0ken'))).toBe(
      'Error: token … refused',
    );
    expect(reasonOf('s3cr3t-t0ken', Buffer.from('s3cr3t-t0ken'))).toBe('non-error thrown: …');
  });

  it('names the error and cuts long messages', () => {
    expect(reasonOf(new TypeError('bad'))).toBe('TypeError: bad');
    expect(reasonOf('a string')).toBe('non-error thrown: a string');
    const long = reasonOf(new Error('x'.repeat(5_000)));
    expect(long).toHaveLength(MAX_DLQ_REASON_LENGTH);
    expect(long.endsWith('…')).toBe(true);
  });

  it('C31 names the code and the cause chain of a network error, and withholds value words and JSON text there too', () => {
    const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
    expect(reasonOf(reset)).toBe('Error: socket hang up [ECONNRESET]');
    const timeout = Object.assign(
      new Error('Connect Timeout Error (attempted address: 10.0.0.1:443, timeout: 10000ms)'),
      {
        name: 'ConnectTimeoutError',
        code: 'UND_ERR_CONNECT_TIMEOUT',
      },
    );
    expect(reasonOf(new TypeError('fetch failed', { cause: timeout }))).toBe(
      'TypeError: fetch failed; cause: ConnectTimeoutError: Connect Timeout Error (attempted address: 10.0.0.1:443, ' +
        'timeout: 10000ms) [UND_ERR_CONNECT_TIMEOUT]',
    );
    // A code the message already shows is not repeated; outboxkit's own codes are left out.
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
    expect(reasonOf(refused)).toBe('Error: connect ECONNREFUSED 127.0.0.1:1');
    expect(reasonOf(new InvalidMessageError('bad'))).toBe('InvalidMessageError: bad');
    // At most three causes.
    let chain: Error = new Error('e4');
    for (const n of [3, 2, 1, 0]) chain = new Error(`e${n}`, { cause: chain });
    expect(reasonOf(chain)).toBe('Error: e0; cause: Error: e1; cause: Error: e2; cause: Error: e3');
    let syntaxError: unknown;
    try {
      JSON.parse('{"card": 4111111111111111');
    } catch (err) {
      syntaxError = err;
    }
    const wrapped = new Error('parse of card 4111111111111111 failed', { cause: syntaxError });
    const reason = reasonOf(wrapped, Buffer.from(JSON.stringify({ card: '4111111111111111' })));
    expect(reason).toMatch(/^Error: parse of card … failed; cause: SyntaxError: message withheld/);
    expect(reason).not.toContain('41111');
  });

  it("reads a JSON value's long strings, and a string that never ends, in one pass", () => {
    // A backtracking regular expression ran out of stack on a string of 8 MiB (RangeError).
    const long = Buffer.from(JSON.stringify({ note: 'x'.repeat(8 * 1024 * 1024), card: CARD }));
    expect(reasonOf(new Error(`card ${CARD} declined`), long)).toBe('Error: card … declined');
    // No string ends (each quote after the first is escaped): no word of one is withheld, the
    // numbers in it are.
    const unterminated = Buffer.from(`"note \\"${CARD}\\" abc`);
    expect(reasonOf(new Error(`card ${CARD} note abc`), unterminated)).toBe('Error: card … note abc');
  });
});

describe('summarizeDeadLetter and replayMessage', () => {
  const failed: KafkaMessage = {
    key: Buffer.from('order-1'),
    value: Buffer.from('{"secret":"s3cr3t"}'),
    timestamp: '0',
    attributes: 0,
    offset: '3',
    headers: {},
  };
  const dead = {
    ...failed,
    offset: '11',
    ...deadLetterMessage(failed, {
      reason: 'Error: boom',
      topic: 'orders',
      partition: 2,
      attempts: 4,
      groupId: 'shipping',
      failedAt: new Date('2026-01-02T03:04:05.678Z'),
    }),
  } as KafkaMessage;
  dead.headers!['event-id'] = Buffer.from('0190a6e2-8f4b-7cc3-9d2e-0123456789ab');
  dead.headers!.multi = [Buffer.from('a'), Buffer.from('b')];

  it('reads origin, reason, attempts and failed-at, and gives the payload size only', () => {
    const s = summarizeDeadLetter(dead, { topic: 'orders.dlq', partition: 0 }, 'id-1', 'order.created');
    expect(s).toEqual({
      dlq: { topic: 'orders.dlq', partition: 0, offset: '11' },
      originalTopic: 'orders',
      originalPartition: 2,
      originalOffset: '3',
      reason: 'Error: boom',
      attempts: 4,
      failedAt: '2026-01-02T03:04:05.678Z',
      consumerGroup: 'shipping',
      eventId: 'id-1',
      invalidEventId: null,
      omitted: null,
      eventType: 'order.created',
      key: 'order-1',
      valueBytes: 19,
    });
    expect(JSON.stringify(s)).not.toContain('s3cr3t');
  });

  it('gives nulls for a record without dlq-* headers and cuts long keys', () => {
    const s = summarizeDeadLetter(
      { ...failed, key: Buffer.from('k'.repeat(500)), value: null, headers: {} },
      { topic: 't', partition: 1 },
      null,
      null,
    );
    expect(s).toMatchObject({ originalTopic: null, originalPartition: null, attempts: null, valueBytes: null });
    expect(s.key).toHaveLength(64);
  });

  it('shows what an unusable event id header held, cut like keys', () => {
    const withHeader = (value: string) => ({ ...failed, headers: { 'event-id': Buffer.from(value) } });
    const s = summarizeDeadLetter(withHeader('garbage'), { topic: 't', partition: 0 }, null, null);
    expect(s.invalidEventId).toBe('garbage');
    expect(
      summarizeDeadLetter(withHeader('x'.repeat(300)), { topic: 't', partition: 0 }, null, null).invalidEventId,
    ).toHaveLength(64);
    const usable = summarizeDeadLetter(
      withHeader('0190a6e2-8f4b-7cc3-9d2e-0123456789ab'),
      { topic: 't', partition: 0 },
      '0190a6e2-8f4b-7cc3-9d2e-0123456789ab',
      null,
    );
    expect(usable.invalidEventId).toBeNull();
  });

  it('replays the original key, value and headers without the dlq-* ones', () => {
    const m = replayMessage(dead);
    expect(m.key).toBe(dead.key);
    expect(m.value).toBe(dead.value);
    expect(m.headers).toEqual({
      'event-id': Buffer.from('0190a6e2-8f4b-7cc3-9d2e-0123456789ab'),
      multi: [Buffer.from('a'), Buffer.from('b')],
    });
  });
});

describe('reducedDeadLetter', () => {
  const original: KafkaMessage = {
    key: Buffer.from('order-9'),
    value: Buffer.alloc(1_048_000, 1),
    timestamp: '0',
    attributes: 0,
    offset: '41',
    headers: {
      'event-id': Buffer.from('0190a6e2-8f4b-7cc3-9d2e-0123456789ab'),
      'event-type': Buffer.from('order.created'),
      traceparent: Buffer.from('00-abc'),
      big: Buffer.alloc(20_000, 2),
    },
  };
  const letter = deadLetterMessage(original, {
    reason: 'Error: boom',
    topic: 'orders',
    partition: 1,
    attempts: 5,
    groupId: 'shipping',
    failedAt: new Date('2026-01-02T03:04:05.678Z'),
  });

  it('keeps the key, the dlq-* headers and the event id and type; leaves out the value and the other headers, and says so', () => {
    const reduced = reducedDeadLetter(letter, ['event-id', 'event-type']);
    expect(reduced.key).toBe(original.key);
    expect(reduced.value).toBeNull();
    const headers = reduced.headers!;
    expect(Object.keys(headers).sort()).toEqual(
      [
        'dlq-attempts',
        'dlq-consumer-group',
        'dlq-failed-at',
        'dlq-omitted',
        'dlq-original-offset',
        'dlq-original-partition',
        'dlq-original-topic',
        'dlq-reason',
        'event-id',
        'event-type',
      ].sort(),
    );
    expect(headers['dlq-original-offset']).toBe('41');
    expect(String(headers[HEADER_DLQ_OMITTED])).toContain('value (1048000 bytes), 2 headers:');
    const s = summarizeDeadLetter(
      { ...original, ...reduced, offset: '7' } as KafkaMessage,
      { topic: 'orders.dlq', partition: 0 },
      '0190a6e2-8f4b-7cc3-9d2e-0123456789ab',
      'order.created',
    );
    expect(s.omitted).toContain('value (1048000 bytes)');
    expect(s.valueBytes).toBeNull();
  });

  it('is small whatever the original: an oversized key or event id header, and dlq-* headers of the original, are left out', () => {
    const hostile: KafkaMessage = {
      ...original,
      key: Buffer.alloc(300_000, 3),
      headers: {
        'event-id': Buffer.alloc(300_000, 4),
        'event-type': Buffer.from('order.created'),
        'dlq-trace': Buffer.alloc(300_000, 5),
      },
    };
    const reduced = reducedDeadLetter(
      deadLetterMessage(hostile, {
        reason: reasonOf(new Error('r'.repeat(5_000))), // cut to 1,000 characters, as the consumer does
        topic: 'orders',
        partition: 1,
        attempts: 0,
        groupId: 'shipping',
        failedAt: new Date('2026-01-02T03:04:05.678Z'),
      }),
      ['event-id', 'event-type'],
    );
    expect(reduced.key).toBeNull();
    expect(reduced.headers!['event-id']).toBeUndefined();
    expect(reduced.headers!['dlq-trace']).toBeUndefined();
    expect(reduced.headers!['event-type']).toEqual(Buffer.from('order.created'));
    expect(String(reduced.headers![HEADER_DLQ_OMITTED])).toMatch(
      /^value \(1048000 bytes\), 2 headers, key \(300000 bytes\): /,
    );
    const size = Object.entries(reduced.headers!).reduce(
      (n, [k, v]) => n + k.length + Buffer.byteLength(v as string | Buffer),
      0,
    );
    expect(size).toBeLessThan(3_072);
  });
});
