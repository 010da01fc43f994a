import { describe, expect, it } from 'vitest';
import type { Queryable } from '../../../src/database.js';
import type { Logger } from '../../../src/logger.js';
import { cleanupPauseMs, Pause, RetentionCleaner, type RetentionCleanerOptions } from '../../../relay/cleanup.js';
import { waitFor } from '../../helpers/wait-for.js';

describe('cleanupPauseMs()', () => {
  it('spreads batches to the rate: a batch of 1,000 rows at 2,000 rows/s takes 500 ms in all', () => {
    expect(cleanupPauseMs(1_000, 120, 2_000)).toBe(380);
    expect(cleanupPauseMs(250, 0, 2_000)).toBe(125);
  });
  it('never waits when the batch took its whole share or more, when unpaced, or after an empty batch', () => {
    expect(cleanupPauseMs(1_000, 900, 2_000)).toBe(0);
    expect(cleanupPauseMs(1_000, 10, 0)).toBe(0);
    expect(cleanupPauseMs(0, 10, 2_000)).toBe(0);
  });
});

describe('Pause', () => {
  it('cancel() ends the wait in progress and every later one at once', async () => {
    const pause = new Pause();
    const started = performance.now();
    const waiting = pause.sleep(60_000);
    setTimeout(() => pause.cancel(), 20);
    await waiting;
    await pause.sleep(60_000);
    expect(performance.now() - started).toBeLessThan(30_000);
  });
  it('waits the time it is given', async () => {
    const started = performance.now();
    await new Pause().sleep(50);
    expect(performance.now() - started).toBeGreaterThanOrEqual(45);
  });
});

/**
 * A database that answers each cleanup statement with the next of `answers` (a number of rows
 * deleted, or an error thrown), then 0; it records when each statement came.
 */
function fakeDatabase(answers: (number | Error)[]): Queryable & { calls: number[] } {
  const calls: number[] = [];
  return {
    calls,
    query: async <R>() => {
      calls.push(performance.now());
      const next = answers.shift() ?? 0;
      if (next instanceof Error) throw next;
      return { rows: [{ deleted: next }] as R[], rowCount: 1 };
    },
  };
}

function recordingLogger(): Logger & { warnings: [Record<string, unknown>, string][] } {
  const warnings: [Record<string, unknown>, string][] = [];
  return { warnings, debug() {}, info() {}, error() {}, warn: (obj, msg) => warnings.push([obj, msg]) };
}

function cleaner(db: Queryable, o: Partial<RetentionCleanerOptions> = {}): RetentionCleaner & { cleaned: number[] } {
  const cleaned: number[] = [];
  const c = new RetentionCleaner({
    db,
    schema: '"outboxkit"',
    publishedRetentionMs: 0,
    cleanupIntervalMs: 10,
    cleanupBatchSize: 10,
    cleanupRowsPerSecond: 0,
    mayRun: () => true,
    logger: recordingLogger(),
    onCleaned: (deleted) => cleaned.push(deleted),
    ...o,
  });
  return Object.assign(c, { cleaned });
}

describe('RetentionCleaner', () => {
  // Breach caught: a standby (or a relay that lost lane 0 or the slot's lease) deleting rows, or a
  // cleaner that goes on with its backlog after it lost the right to clean.
  it('deletes only while mayRun() says so, and stops between batches when it turns false', async () => {
    const db = fakeDatabase([10, 10, 10, 10, 10]);
    let may = false;
    const asked: boolean[] = [];
    const c = cleaner(db, {
      mayRun: () => {
        asked.push(may);
        return may;
      },
      // Lost after its second batch (full: it would go on with the backlog).
      onCleaned: (deleted) => {
        c.cleaned.push(deleted);
        if (c.cleaned.length === 2) may = false;
      },
    });
    c.start();
    await waitFor(() => asked.length >= 5, { timeoutMs: 5_000 });
    expect(db.calls).toEqual([]);
    may = true;
    await waitFor(() => c.cleaned.length === 2, { timeoutMs: 5_000 });
    const askedThen = asked.length;
    await waitFor(() => asked.length >= askedThen + 5, { timeoutMs: 5_000 });
    expect(c.cleaned).toEqual([10, 10]);
    expect(db.calls).toHaveLength(2);
    await c.stop();
  });

  // Breach caught: a failed cleanup that ends the cleaner (nothing deleted again until a restart)
  // or that goes unreported, or that rejects where its caller (a relay's stream) would stop on it.
  it('logs a failed cleanup as a warning and tries again at the next interval', async () => {
    const db = fakeDatabase([new Error('canceling statement due to statement timeout'), 3]);
    const logger = recordingLogger();
    const c = cleaner(db, { logger });
    c.start();
    await waitFor(() => c.cleaned.length === 1, { timeoutMs: 5_000 });
    expect(c.cleaned).toEqual([3]);
    expect(logger.warnings).toHaveLength(1);
    expect(logger.warnings[0]![1]).toBe('published-row cleanup failed');
    expect((logger.warnings[0]![0].err as Error).message).toContain('statement timeout');
    await c.stop();
  });

  // Breach caught: a paced cleanup that holds stop() for its pause (10 s here), or that runs
  // another statement after stop().
  it('stop() ends a pause between batches at once and runs no statement after it', async () => {
    const db = fakeDatabase([10, 10, 10]);
    const c = cleaner(db, { cleanupRowsPerSecond: 1 }); // 10 s after each full batch
    c.start();
    await waitFor(() => c.cleaned.length === 1, { timeoutMs: 5_000 });
    const started = performance.now();
    await c.stop();
    expect(performance.now() - started).toBeLessThan(1_000);
    const calls = db.calls.length;
    await new Promise((r) => setTimeout(r, 50));
    expect(db.calls).toHaveLength(calls);
    expect(c.cleaned).toEqual([10]);
  });
});
