import { describe, expect, it } from 'vitest';
import { recordBytes, splitByTopicLimit } from '../../../src/kafka/topic-limits.js';
import type { OutboundRecord } from '../../../src/kafka/types.js';

const rec = (topic: string, key: string, bytes: number): OutboundRecord => ({
  topic,
  key,
  value: Buffer.alloc(bytes),
  headers: {},
});

describe('splitByTopicLimit', () => {
  it('keeps every topic of a chunk within its limit and the records in order', () => {
    const records = Array.from({ length: 20 }, (_, i) => rec(i % 2 ? 'small' : 'big', `k${i % 3}`, 100));
    const limit = (t: string) => (t === 'small' ? 2 * recordBytes(records[1]!) : 10_000);
    const chunks = splitByTopicLimit(records, limit);
    expect(chunks.flat()).toEqual(records);
    for (const chunk of chunks) {
      const small = chunk.filter((r) => r.topic === 'small').reduce((n, r) => n + recordBytes(r), 0);
      expect(small).toBeLessThanOrEqual(limit('small'));
    }
    expect(chunks).toHaveLength(5);
  });

  it('puts a record larger than the limit in a chunk of its own, and returns nothing for nothing', () => {
    const records = [rec('t', 'a', 10), rec('t', 'b', 5_000), rec('t', 'c', 10)];
    expect(splitByTopicLimit(records, () => 1_000).map((c) => c.map((r) => r.key))).toEqual([['a'], ['b'], ['c']]);
    expect(splitByTopicLimit([], () => 1)).toEqual([]);
  });
});
