/**
 * The retention cleanup's pace: the relay deletes published rows past their retention in batches
 * (relay/sql.ts, `deletePublishedSql`) and waits between them, so that a large backlog is deleted
 * at a steady rate beside the writers instead of in bursts that raise their latency (issue 17,
 * point 6; bench/cleanup.ts). {@link RetentionCleaner} runs it, in the table relay (by the holder of
 * lane 0) and in the WAL relay (by the holder of the slot's reader lease).
 */
import { performance } from 'node:perf_hooks';
import type { Queryable } from '../src/database.js';
import type { Logger } from '../src/logger.js';
import { deletePublished } from './sql.js';

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

/** What a {@link RetentionCleaner} needs: where it deletes, how, when it may, and whom it tells. */
export interface RetentionCleanerOptions {
  /** Where the statements run (the relay's pool). */
  db: Queryable;
  /** The schema holding `outbox_events`, quoted (`quoteSchema()`). */
  schema: string;
  /** How long published rows are kept, in ms; at least `EVENT_ID_REUSE_WINDOW_MS` in effect (./sql.ts). */
  publishedRetentionMs: number;
  /** How often the cleanup looks for rows past retention, in ms. */
  cleanupIntervalMs: number;
  /** Most rows deleted by one statement. */
  cleanupBatchSize: number;
  /** Most rows deleted per second on average (0: batches back to back). */
  cleanupRowsPerSecond: number;
  /**
   * Whether this relay is the one that cleans now (the table relay: it holds lane 0; the WAL
   * relay: it holds the slot's reader lease). Asked before each batch: a relay that loses the
   * right stops between batches.
   */
  mayRun: () => boolean;
  /** Gets a warning when a cleanup fails (the next interval tries again). */
  logger: Logger;
  /** Called after each batch that deleted rows, with their number. */
  onCleaned: (deleted: number) => void;
}

/**
 * The relays' retention cleanup (the table relay's and the WAL relay's): every `cleanupIntervalMs`
 * it deletes published rows past `publishedRetentionMs`, batch after batch until none is left,
 * paced to `cleanupRowsPerSecond` ({@link cleanupPauseMs}), while `mayRun()` says so. One cleanup
 * at a time, on a timer of its own: a long cleanup never delays the relay's other work (lease
 * renewals). A failed cleanup is logged as a warning and tried again at the next interval; it
 * never stops the relay.
 */
export class RetentionCleaner {
  private timer: NodeJS.Timeout | undefined;
  /** The cleanup in flight (settled, never rejecting). */
  private cleaning: Promise<void> | undefined;
  /** The wait between batches, cut short by stop(). */
  private readonly pause = new Pause();
  private stopping = false;
  private stopped: Promise<void> | undefined;

  constructor(private readonly o: RetentionCleanerOptions) {}

  /** Starts the timer; the first cleanup runs one interval from now. A no-op once started or stopped. */
  start(): void {
    if (this.timer !== undefined || this.stopping) return;
    this.timer = setInterval(() => {
      if (this.cleaning) return;
      this.cleaning = this.clean()
        .catch((err: Error) => this.o.logger.warn({ err }, 'published-row cleanup failed'))
        .finally(() => (this.cleaning = undefined));
    }, this.o.cleanupIntervalMs);
    this.timer.unref();
  }

  /**
   * Stops the timer, ends a pause between batches at once and waits for the statement in flight,
   * if any. Idempotent: later calls return the same promise.
   */
  stop(): Promise<void> {
    this.stopped ??= (async () => {
      this.stopping = true;
      clearInterval(this.timer);
      this.pause.cancel();
      await this.cleaning;
    })();
    return this.stopped;
  }

  /**
   * Deletes published rows past their retention, batch after batch until none is left, paced to
   * `cleanupRowsPerSecond`; it stops between batches when stop() is called or `mayRun()` turns
   * false.
   */
  private async clean(): Promise<void> {
    const { cleanupBatchSize: batchSize, cleanupRowsPerSecond: rowsPerSecond } = this.o;
    while (!this.stopping && this.o.mayRun()) {
      const started = performance.now();
      const deleted = await deletePublished(this.o.db, this.o.schema, {
        retentionMs: this.o.publishedRetentionMs,
        batchSize,
      });
      if (deleted > 0) this.o.onCleaned(deleted);
      if (deleted < batchSize) break;
      await this.pause.sleep(cleanupPauseMs(deleted, performance.now() - started, rowsPerSecond));
    }
  }
}
