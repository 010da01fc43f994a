/**
 * Bounding a wait: a promise raced against a timer. Pure logic, no dependencies.
 */

/**
 * `promise`, or a rejection with `timeoutError()` after `ms` ms: the promise goes on, and its
 * outcome is then ignored (its rejection is never unhandled). The timer is cleared as soon as one
 * side settles.
 *
 * @param options.unref - the timer does not keep the process alive (a watchdog). @defaultValue false
 */
export function withTimeout<T>(
  promise: Promise<T>,
  ms: number,
  timeoutError: () => Error,
  options: { unref?: boolean } = {},
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(timeoutError()), ms);
    if (options.unref) timer.unref();
  });
  promise.catch(() => undefined); // lost the race: its rejection is not unhandled
  return Promise.race([promise, timedOut]).finally(() => clearTimeout(timer));
}
