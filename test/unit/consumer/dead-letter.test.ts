import type { KafkaMessage } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { deadLetterMessage, MAX_DLQ_REASON_LENGTH, reasonOf } from '../../../consumer/dead-letter.js';

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
  it('names the error and cuts long messages', () => {
    expect(reasonOf(new TypeError('bad'))).toBe('TypeError: bad');
    expect(reasonOf('a string')).toBe('non-error thrown: a string');
    const long = reasonOf(new Error('x'.repeat(5_000)));
    expect(long).toHaveLength(MAX_DLQ_REASON_LENGTH);
    expect(long.endsWith('…')).toBe(true);
  });
});
