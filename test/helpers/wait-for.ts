/**
 * Polls `condition` until it returns a truthy value, or throws after `timeoutMs`. Never a bare sleep.
 * `message` may be a function, called at the timeout to describe the state then.
 */
export async function waitFor<T>(
  condition: () => T | Promise<T>,
  options: { timeoutMs?: number; intervalMs?: number; message?: string | (() => string) } = {},
): Promise<NonNullable<T>> {
  const deadline = Date.now() + (options.timeoutMs ?? 20_000);
  let last: unknown;
  for (;;) {
    try {
      const v = await condition();
      if (v) return v as NonNullable<T>;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const message = typeof options.message === 'function' ? options.message() : options.message;
      throw new Error(
        `waitFor timed out${message ? `: ${message}` : ''}${last ? ` (last error: ${String(last)})` : ''}`,
      );
    }
    await new Promise((r) => setTimeout(r, options.intervalMs ?? 50));
  }
}
