import { describe, expect, it } from 'vitest';
import { exponentialBackoffMs, fullJitterBackoffMs } from '../../src/backoff.js';

describe('fullJitterBackoffMs', () => {
  it('grows the cap exponentially up to the maximum', () => {
    const top = () => 0.999999;
    expect(fullJitterBackoffMs(1, 100, 10_000, top)).toBe(99);
    expect(fullJitterBackoffMs(2, 100, 10_000, top)).toBe(199);
    expect(fullJitterBackoffMs(5, 100, 10_000, top)).toBe(1599);
    expect(fullJitterBackoffMs(50, 100, 10_000, top)).toBe(9999);
  });

  it('draws from the whole range [0, cap) (full jitter, not equal jitter)', () => {
    expect(fullJitterBackoffMs(3, 100, 10_000, () => 0)).toBe(0);
    const samples = Array.from({ length: 2000 }, () => fullJitterBackoffMs(4, 100, 10_000));
    expect(Math.min(...samples)).toBeLessThan(80);
    expect(Math.max(...samples)).toBeGreaterThan(720);
  });
});

describe('exponentialBackoffMs', () => {
  it('doubles from the first delay up to the maximum, without jitter', () => {
    expect([1, 2, 3, 4, 5, 6, 7].map((a) => exponentialBackoffMs(a, 25, 500))).toEqual([
      25, 50, 100, 200, 400, 500, 500,
    ]);
    expect(exponentialBackoffMs(1_000, 25, 60_000)).toBe(60_000);
  });
});
