/**
 * Exponential backoff: without jitter ({@link exponentialBackoffMs}, a waiter's growing poll
 * interval) and with full jitter ({@link fullJitterBackoffMs}, retries of many clients that failed
 * together).
 */

/**
 * The `attempt`-th delay of an exponential backoff: `initialMs * 2^(attempt-1)`, at most `maxMs`.
 *
 * @param attempt - 1 for the first delay.
 * @param initialMs - the first delay, in ms.
 * @param maxMs - the largest delay, in ms.
 * @returns the delay in ms.
 */
export function exponentialBackoffMs(attempt: number, initialMs: number, maxMs: number): number {
  return Math.min(maxMs, initialMs * 2 ** Math.max(0, Math.min(attempt - 1, 30)));
}

/**
 * Exponential backoff with full jitter ("Exponential Backoff And Jitter", AWS Architecture Blog,
 * 2015): a uniformly random delay in [0, min(maxMs, initialMs * 2^(attempt-1))]. Full jitter keeps
 * many clients or relays that failed together from retrying in lock step.
 *
 * @param attempt - 1 for the first retry.
 * @param initialMs - the cap of the first delay, in ms.
 * @param maxMs - the largest cap, in ms.
 * @param random - a source of [0, 1) numbers. @defaultValue Math.random
 * @returns the delay in ms (an integer).
 */
export function fullJitterBackoffMs(
  attempt: number,
  initialMs: number,
  maxMs: number,
  random: () => number = Math.random,
): number {
  return Math.floor(random() * exponentialBackoffMs(attempt, initialMs, maxMs));
}
