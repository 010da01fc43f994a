import { describe, expect, it } from 'vitest';
import {
  MAX_RETRY_AFTER_MS,
  parseRetryAfterMs,
  planRetry,
  type RetryPlanInput,
} from '../../../src/client/retry-delay.js';

describe('parseRetryAfterMs', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');

  it('reads delay-seconds', () => {
    expect(parseRetryAfterMs('0', now)).toBe(0);
    expect(parseRetryAfterMs('3', now)).toBe(3_000);
    expect(parseRetryAfterMs(' 120 ', now)).toBe(120_000);
  });

  it('reads an HTTP-date (IMF-fixdate and the obsolete forms), relative to now; a past date is 0', () => {
    expect(parseRetryAfterMs('Thu, 01 Jan 2026 00:00:05 GMT', now)).toBe(5_000);
    expect(parseRetryAfterMs('Thursday, 01-Jan-26 00:00:07 GMT', now)).toBe(7_000);
    expect(parseRetryAfterMs('Wed, 31 Dec 2025 23:59:00 GMT', now)).toBe(0);
  });

  it('ignores an absent or malformed value', () => {
    for (const v of [null, undefined, '', 'soon', '-1', '1.5', '1e3', '+2']) {
      expect(parseRetryAfterMs(v, now), String(v)).toBeUndefined();
    }
  });

  it('clamps absurd values to a day', () => {
    expect(parseRetryAfterMs('999999999999', now)).toBe(MAX_RETRY_AFTER_MS);
    expect(parseRetryAfterMs('Fri, 01 Jan 2100 00:00:00 GMT', now)).toBe(MAX_RETRY_AFTER_MS);
  });
});

describe('planRetry', () => {
  const base: RetryPlanInput = {
    retry: 1,
    initialDelayMs: 100,
    maxDelayMs: 1_000,
    retryAfterMs: undefined,
    remainingMs: 60_000,
    random: Math.random,
  };

  it('is full jitter: uniform in [0, cap) with the cap doubling up to maxDelayMs', () => {
    const top = () => 0.999_999;
    expect(planRetry({ ...base, random: () => 0 })).toEqual({ retry: true, delayMs: 0 });
    expect(planRetry({ ...base, random: top }).delayMs).toBe(99);
    expect(planRetry({ ...base, retry: 3, random: top }).delayMs).toBe(399);
    expect(planRetry({ ...base, retry: 20, random: top }).delayMs).toBe(999);
    // The whole range is used, not only its upper half (p-retry's `randomize` keeps >= the base).
    const samples = Array.from({ length: 4_000 }, () => planRetry({ ...base, retry: 4 }).delayMs);
    expect(Math.min(...samples)).toBeLessThan(40);
    expect(Math.max(...samples)).toBeGreaterThan(760);
    const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
    expect(mean).toBeGreaterThan(350);
    expect(mean).toBeLessThan(450);
  });

  it('takes Retry-After as a lower bound and adds the jitter on top, so equal Retry-After values do not align', () => {
    expect(planRetry({ ...base, retryAfterMs: 1_000, random: () => 0 }).delayMs).toBe(1_000);
    expect(planRetry({ ...base, retryAfterMs: 1_000, random: () => 0.5 }).delayMs).toBe(1_050);
    const delays = Array.from({ length: 1_000 }, () => planRetry({ ...base, retry: 4, retryAfterMs: 1_000 }).delayMs);
    expect(Math.min(...delays)).toBeGreaterThanOrEqual(1_000);
    expect(new Set(delays).size).toBeGreaterThan(300);
  });

  it('gives up at once when the wait would reach the deadline (a Retry-After longer than the time left included)', () => {
    expect(planRetry({ ...base, retryAfterMs: 5_000, remainingMs: 3_000, random: () => 0 })).toEqual({
      retry: false,
      reason: 'deadline',
      delayMs: 5_000,
    });
    expect(planRetry({ ...base, retry: 10, remainingMs: 500, random: () => 0.9 })).toMatchObject({ retry: false });
    expect(planRetry({ ...base, remainingMs: 0, random: () => 0 })).toMatchObject({ retry: false });
    expect(planRetry({ ...base, remainingMs: 500, random: () => 0.5 })).toEqual({ retry: true, delayMs: 50 });
  });
});
