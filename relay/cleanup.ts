/**
 * The retention cleanup's pace: the relay deletes published rows past their retention in batches
 * (relay/sql.ts, `deletePublishedSql`) and waits between them, so that a large backlog is deleted
 * at a steady rate beside the writers instead of in bursts that raise their latency (issue 17,
 * point 6; bench/cleanup.ts).
 */

/**
 * How long to wait after a batch of `deleted` rows that took `tookMs` (ms), so that the cleanup
 * deletes at most `rowsPerSecond` rows per second on average: the batch's share of a second minus
 * the time it took, never negative. `rowsPerSecond` 0 means unpaced (0 ms).
 */
export function cleanupPauseMs(deleted: number, tookMs: number, rowsPerSecond: number): number {
  if (rowsPerSecond <= 0 || deleted <= 0) return 0;
  return Math.max(0, (deleted * 1000) / rowsPerSecond - tookMs);
}

/** A wait that `cancel()` ends at once, now and for every later `sleep()` (the relay is stopping). */
export class Pause {
  private cancelled = false;
  private wakeUp: (() => void) | undefined;

  /** Resolves after `ms` (ms), or at once when cancelled. */
  sleep(ms: number): Promise<void> {
    if (this.cancelled || ms <= 0) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakeUp = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      timer.unref();
      this.wakeUp = done;
    });
  }

  /** Ends the wait in progress and every later one. */
  cancel(): void {
    this.cancelled = true;
    this.wakeUp?.();
  }
}
