/**
 * When the idempotent client retries: pure logic, no I/O, no clock of its own (times are passed in).
 */
import { fullJitterBackoffMs } from '../backoff.js';

/** Largest `Retry-After` taken into account, in ms (a day); larger values are clamped. */
export const MAX_RETRY_AFTER_MS = 86_400_000;

/**
 * Parses a `Retry-After` response header (RFC 9110 §10.2.3): either delay-seconds (`"120"`) or an
 * HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`).
 *
 * @param value - the header value, or `null` when absent.
 * @param nowMs - the current time (ms since the epoch), for an HTTP-date.
 * @returns the delay in ms (0 for a date in the past, at most {@link MAX_RETRY_AFTER_MS}), or
 *   `undefined` when the header is absent or malformed (then only the backoff applies).
 */
export function parseRetryAfterMs(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1_000, MAX_RETRY_AFTER_MS);
  // An HTTP-date: IMF-fixdate, or the obsolete RFC 850 / asctime forms, which Date.parse reads.
  // Refuse bare numbers with signs or fractions ("1.5", "-1") and anything without a letter.
  if (!/[A-Za-z]/.test(text)) return undefined;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.min(Math.max(0, at - nowMs), MAX_RETRY_AFTER_MS);
}

/** Input of {@link planRetry}. */
export interface RetryPlanInput {
  /** 1 for the first retry (after the first failed attempt), 2 for the second, ... */
  retry: number;
  /** The cap of the first retry's backoff, in ms. */
  initialDelayMs: number;
  /** The largest backoff cap, in ms. */
  maxDelayMs: number;
  /** The server's `Retry-After`, in ms, if it sent one (see {@link parseRetryAfterMs}). */
  retryAfterMs: number | undefined;
  /** Time left before the operation's deadline, in ms. */
  remainingMs: number;
  /** A source of numbers in [0, 1). */
  random: () => number;
}

/** The decision of {@link planRetry}. */
export type RetryPlan = { retry: true; delayMs: number } | { retry: false; reason: 'deadline'; delayMs: number };

/**
 * The delay before the next attempt: `Retry-After` (or 0) **plus** a full-jitter exponential
 * backoff, uniform in [0, min(maxDelayMs, initialDelayMs × 2^(retry−1))).
 *
 * - Full jitter ("Exponential Backoff And Jitter", AWS Architecture Blog): clients that failed
 *   together spread their retries over the whole window instead of coming back in lock step.
 * - `Retry-After` is a lower bound, never the delay itself: a server in trouble tells every client
 *   the same `Retry-After: 1`, and clients that all wait exactly 1 s return as one synchronised
 *   wave. The jitter on top keeps them spread.
 * - The deadline caps everything: when the delay would reach the deadline (in particular a
 *   `Retry-After` longer than the time left), there is no point in waiting and the answer is
 *   "give up now".
 */
export function planRetry(input: RetryPlanInput): RetryPlan {
  const jitter = fullJitterBackoffMs(input.retry, input.initialDelayMs, input.maxDelayMs, input.random);
  const delayMs = (input.retryAfterMs ?? 0) + jitter;
  if (delayMs >= input.remainingMs) return { retry: false, reason: 'deadline', delayMs };
  return { retry: true, delayMs };
}
