import { describe, expect, it } from 'vitest';
import { cleanupPauseMs, Pause } from '../../../relay/cleanup.js';

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
