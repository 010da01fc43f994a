import { describe, expect, it } from 'vitest';
import { fullJitterBackoffMs } from '../../src/backoff.js';

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
